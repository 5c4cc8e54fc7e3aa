"""The checks every new field value goes through: construction, updates, edits."""

import typing
from collections.abc import Collection, Mapping
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

from ._fields import FieldInfo, is_jaxtyping_array, UNIONS
from ._key import CyclicValue, deep
from ._typecheck import check_fields
from ._typed import is_hashable


def check_hashable(cls: type, name: str, value: object) -> None:
    """Raise `TypeError` if the static field `name` of `cls` holds an unhashable
    value. (The hash is the compile key's, kept for the key: hashed once.)"""
    if not deep(is_hashable, value):
        raise TypeError(_unhashable_message(cls, name, value))


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


_NUMBERS: Final = frozenset({bool, int, float, complex})


def default_dtype(t: type) -> Any:
    """JAX's default dtype for a Python number type (its 64-bit one under x64)."""
    return jax.dtypes.canonicalize_dtype(_WIDE[t])


_WIDE: Final = {
    bool: np.bool_,
    int: np.int64,
    float: np.float64,
    complex: np.complex128,
}
_CONTAINERS: Final = frozenset({tuple, list, dict})


def as_data(cls: type, name: str, value: Any) -> Any:
    """`value` for the dynamic field `name` of an `es.Module` class: Python numbers,
    at any depth of plain tuples, lists and dicts, become 0-d JAX arrays of JAX's
    default dtype for their kind (`float32`, `int32`, `bool`, `complex64`; 64-bit
    under `jax_enable_x64`), strongly typed, as an optimiser's update or a
    deserialised leaf is. Anything else, modules included, is returned as is; so
    is a container in which nothing changed."""
    if type(value) not in _CONTAINERS:
        return _as_data(cls, name, value)
    try:
        return deep(_as_data, cls, name, value)
    except CyclicValue as e:
        where = name + e.path.removeprefix("[2]")
        raise ValueError(
            f"Field {name!r} of `{cls.__qualname__}` got a value that contains "
            f"itself: {where} is the value again. A module's fields are a tree; "
            "break the cycle before storing it."
        ) from None


def _as_data(cls: type, name: str, value: Any) -> Any:
    t = type(value)
    if t in _NUMBERS:
        dtype = default_dtype(t)
        try:
            return jnp.asarray(value, dtype=dtype)
        except OverflowError:
            raise OverflowError(
                f"Field {name!r} of `{cls.__qualname__}` got the Python int {value}, "
                f"which does not fit in {dtype}, JAX's default integer. Dynamic "
                "fields store numbers as arrays: pass a float, enable "
                f"`jax_enable_x64`, or declare {name!r} static with "
                "`eqx.field(static=True)`."
            ) from None
    if t not in _CONTAINERS:
        return value
    items = value.values() if t is dict else value
    kinds = set(map(type, items))  # in C: a tuple of 10,000 arrays is one type
    if kinds.isdisjoint(_NUMBERS) and kinds.isdisjoint(_CONTAINERS):
        return value
    new = [_as_data(cls, name, x) for x in items]
    if all(a is b for a, b in zip(new, items)):
        return value
    return dict(zip(value, new)) if t is dict else t(new)


def check_array_annotation(
    cls: type, name: str, ann: Any, value: object, current: Any = None
) -> None:
    """Raise `TypeError` if `value` does not match the jaxtyping annotation `ann`.

    A module stacked by `eqx.filter_vmap` holds fields with leading axes that the
    annotation does not name: if the `current` value does not match `ann` either,
    the new value must have its shape and dtype instead."""
    if _matches(value, ann):
        return
    if current is not None and not _matches(current, ann):
        if _same_layout(value, current):
            return
        raise TypeError(
            f"Field {name!r} of `{cls.__qualname__}` holds a stacked value "
            f"{_describe(current)} (a module batched by `eqx.filter_vmap`), so the "
            f"new value must have the same shape and dtype; got {_describe(value)}."
        )
    got = _describe(value)
    raise TypeError(
        f"Field {name!r} of `{cls.__qualname__}` is annotated `{_ann_repr(ann)}`, "
        f"but got {got}. Pass a value of that dtype and shape."
    )


def _describe(value: object) -> str:
    if isinstance(value, jax.Array | np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


def _same_layout(a: object, b: object) -> bool:
    return getattr(a, "shape", None) == getattr(b, "shape", None) and getattr(
        a, "dtype", None
    ) == getattr(b, "dtype", None)


def _matches(value: object, ann: Any) -> bool:
    # `isinstance` against a `typing.Union` only checks `type(value)`, which cannot
    # see a jaxtyping shape or dtype, so unions are checked member by member.
    if typing.get_origin(ann) in UNIONS:
        return any(_matches(value, a) for a in typing.get_args(ann))
    try:
        return isinstance(value, ann)
    except TypeError:  # not checkable at run time, such as `list[int]`
        return True


def _ann_repr(ann: Any) -> str:
    if typing.get_origin(ann) in UNIONS:
        return " | ".join(_ann_repr(a) for a in typing.get_args(ann))
    if ann is type(None):
        return "None"
    if is_jaxtyping_array(ann):
        array = "Array" if ann.array_type is jax.Array else ann.array_type.__name__
        return f"{ann.dtype.__name__}[{array}, {ann.dim_str!r}]"
    return getattr(ann, "__name__", None) or repr(ann)


def convert_and_check(
    info: FieldInfo,
    changes: Mapping[str, Any],
    convert: Collection[str],
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply converters to the fields in `convert`, then check every changed value:
    hashability for static fields; for dynamic ones, numbers stored as arrays (in
    an `es.Module`) and jaxtyping annotations checked against the new value, or
    against the `current` one's layout in a stacked module."""
    out = {}
    for name, value in changes.items():
        converter = info.converters.get(name)
        if converter is not None and name in convert:
            value = converter(value)
        if name in info.static:
            check_hashable(info.cls, name, value)
        else:
            if info.stores_arrays:
                value = as_data(info.cls, name, value)
            ann = info.array_annotations.get(name)
            if ann is not None:
                old = None if current is None else current.get(name)
                check_array_annotation(info.cls, name, ann, value, old)
        out[name] = value
    return out


def run_check_inits(info: FieldInfo, module: object) -> None:
    """Run the class's `__check_init__`s, as Equinox does at construction, and its
    field type checks (if it asked for them). The per-field checks were done
    already, on the changed fields only."""
    for check_init in info.check_inits:
        check_init(module)
    check_fields(module)
