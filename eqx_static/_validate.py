"""The checks every new field value goes through: construction, updates, edits."""

import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, Final

import jax
import numpy as np

from ._fields import FieldInfo
from ._typecheck import check_fields


def check_hashable(cls: type, name: str, value: object) -> None:
    """Raise `TypeError` if the static field `name` of `cls` holds an unhashable value."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(_unhashable_message(cls, name, value)) from None


def _unhashable_message(cls: type, name: str, value: object) -> str:
    kind = type(value).__name__
    where = f"Static field {name!r} of `{cls.__qualname__}` holds an unhashable {kind}"
    if isinstance(value, jax.Array | np.ndarray):
        fix = (
            "Arrays are data, not program structure: make it a dynamic field "
            "(drop `static=True`), so that changing it never recompiles."
        )
    elif isinstance(value, list):
        fix = f"Store a tuple instead: `{name}=tuple(...)`."
    elif isinstance(value, dict):
        fix = f"Store a hashable mapping instead, e.g. `{name}=tuple(d.items())`."
    elif isinstance(value, set):
        fix = f"Store a frozenset instead: `{name}=frozenset(...)`."
    else:
        fix = (
            "Static values key the compilation cache, so they must be hashable: "
            "use a hashable value, or make it a dynamic field."
        )
    return f"{where}. {fix}"


def check_array_annotation(cls: type, name: str, ann: Any, value: object) -> None:
    """Raise `TypeError` if `value` does not match the jaxtyping annotation `ann`."""
    if _matches(value, ann):
        return
    got = (
        f"{value.dtype}{list(value.shape)}"
        if isinstance(value, jax.Array | np.ndarray)
        else type(value).__name__
    )
    raise TypeError(
        f"Field {name!r} of `{cls.__qualname__}` is annotated `{_ann_repr(ann)}`, "
        f"but the new value is {got}. Pass a value of that dtype and shape."
    )


def _matches(value: object, ann: Any) -> bool:
    # `isinstance` against a `typing.Union` only checks `type(value)`, which cannot
    # see a jaxtyping shape or dtype, so unions are checked member by member.
    if typing.get_origin(ann) in _UNIONS:
        return any(_matches(value, a) for a in typing.get_args(ann))
    try:
        return isinstance(value, ann)
    except TypeError:  # not checkable at run time, such as `list[int]`
        return True


def _ann_repr(ann: Any) -> str:
    if typing.get_origin(ann) in _UNIONS:
        return " | ".join(_ann_repr(a) for a in typing.get_args(ann))
    if ann is type(None):
        return "None"
    return getattr(ann, "__name__", None) or repr(ann)


_UNIONS: Final = (typing.Union, types.UnionType)


def convert_and_check(
    info: FieldInfo, changes: Mapping[str, Any], convert: Collection[str]
) -> dict[str, Any]:
    """Apply converters to the fields in `convert`, then check every changed value:
    hashability for static fields, jaxtyping annotations for dynamic ones."""
    out = {}
    for name, value in changes.items():
        converter = info.converters.get(name)
        if converter is not None and name in convert:
            value = converter(value)
        if name in info.static:
            check_hashable(info.cls, name, value)
        else:
            ann = info.array_annotations.get(name)
            if ann is not None:
                check_array_annotation(info.cls, name, ann, value)
        out[name] = value
    return out


def run_check_inits(info: FieldInfo, module: object) -> None:
    """Run the class's `__check_init__`s, as Equinox does at construction, and its
    field type checks (if it asked for them). The per-field checks were done
    already, on the changed fields only."""
    for check_init in info.check_inits:
        check_init(module)
    check_fields(module)
