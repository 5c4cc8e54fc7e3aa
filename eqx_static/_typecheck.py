"""Runtime type checks of a module's fields, with jaxtyping dimensions bound across
fields: `w: Float[Array, "n m"]` and `b: Float[Array, "m"]` must agree on `m`."""

import inspect
import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

import jaxtyping

from . import _module
from ._compat import is_named_dim, jaxtyped_class


Typechecker = Callable[[Callable], Callable]

# The `typecheck=` class option of each class that set one (None: switched off).
_options: Final[weakref.WeakKeyDictionary[type, Typechecker | None]] = (
    weakref.WeakKeyDictionary()
)
_checkers: Final[dict[type, Callable | None]] = {}


def set_option(cls: type, typecheck: bool | Typechecker | None) -> None:
    """Record the `typecheck=` class option of `cls`."""
    if typecheck is True:
        typecheck = _beartype()
    elif typecheck is False:
        typecheck = None
    elif not callable(typecheck):
        raise TypeError(
            f"`typecheck=` on `{cls.__qualname__}` takes True, False or a typechecker "
            f"such as `beartype.beartype`; got {typecheck!r}."
        )
    _options[cls] = typecheck


def _beartype() -> Typechecker:
    try:
        from beartype import beartype
    except ImportError:
        raise ImportError(
            "`typecheck=True` uses beartype, which is not installed: "
            "`pip install beartype`, or pass another typechecker, as in "
            "`typecheck=typeguard.typechecked`."
        ) from None
    return beartype


def _typechecker(cls: type) -> Typechecker | None:
    for k in cls.__mro__:
        if k in _options:
            return _options[k]
    return _beartype() if jaxtyped_class(cls) else None


# A stored number may carry the leading axes of an `eqx.filter_vmap` ensemble.
_NUMBER_ARRAYS: Final = {
    bool: jaxtyping.Bool[jaxtyping.Array, "..."],
    int: jaxtyping.Int[jaxtyping.Array, "..."],
    float: jaxtyping.Float[jaxtyping.Array, "..."],
    complex: jaxtyping.Complex[jaxtyping.Array, "..."],
}


def check_fields(module: object) -> None:
    """Type-check every annotated field of `module` in one jaxtyping scope."""
    cls = type(module)
    try:
        checker = _checkers[cls]
    except KeyError:
        checker = _checkers[cls] = _make_checker(cls)
    if checker is None:
        return
    d = _module.instance_dict(module)
    values = {n: d[n] for n in inspect.signature(checker).parameters}
    try:
        checker(**values)
    except jaxtyping.TypeCheckError as e:
        raise TypeError(_message(cls, values, e)) from None


def _make_checker(cls: type) -> Callable | None:
    typechecker = _typechecker(cls)
    if typechecker is None:
        return None
    info = _module.field_info(cls)
    anns = dict(info.annotations)
    if not anns:
        return None
    if info.stores_arrays:  # a number in a dynamic field is stored as a 0-d array
        for name in info.dynamic_names:
            number = _NUMBER_ARRAYS.get(anns.get(name))
            if number is not None:
                anns[name] = anns[name] | number

    def fields(**kwargs: Any) -> None:
        del kwargs

    fields.__qualname__ = f"{cls.__qualname__}.fields"
    fields.__signature__ = inspect.Signature(  # pyright: ignore[reportFunctionMemberAccess]
        [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a)
            for n, a in anns.items()
        ]
    )
    fields.__annotations__ = dict(anns)
    checked = jaxtyping.jaxtyped(typechecker=typechecker)(fields)
    checked.__signature__ = fields.__signature__  # pyright: ignore[reportFunctionMemberAccess]
    return checked


def _message(cls: type, values: dict[str, Any], e: Exception) -> str:
    found = re.search(r"typechecking parameter '(\w+)'", str(e))
    name = found.group(1) if found else None
    anns = _module.field_info(cls).annotations
    if name is None:
        return f"A field of `{cls.__qualname__}` does not match its annotation.\n\n{e}"
    clash = _dimension_clash(name, values, anns)
    if clash is not None:
        return clash.format(cls=cls.__qualname__)
    return (
        f"The field {name!r} of `{cls.__qualname__}` does not match its annotation "
        f"`{_show(anns.get(name))}`: got {_value(values.get(name))}. Pass a value "
        f"of the annotated type.\n\n{e}"
    )


def _dimension_clash(
    name: str, values: dict[str, Any], anns: Mapping[str, Any]
) -> str | None:
    mine = _named_sizes(anns.get(name), values.get(name))
    for other, ann in anns.items():
        if other == name:
            continue
        theirs = _named_sizes(ann, values.get(other))
        for dim, size in mine.items():
            if dim in theirs and theirs[dim] != size:
                return (
                    f"Fields {other!r} and {name!r} of `{{cls}}` disagree on dimension "
                    f"{dim!r}: {other!r} has {dim}={theirs[dim]} (shape "
                    f"{tuple(values[other].shape)}), {name!r} has {dim}={size} (shape "
                    f"{tuple(values[name].shape)}). Give them matching shapes."
                )
    return None


def _named_sizes(ann: Any, value: Any) -> dict[str, int]:
    dims = getattr(ann, "dims", None)
    shape = getattr(value, "shape", None)
    if dims is None or shape is None or len(dims) != len(shape):
        return {}
    return {
        d.name: size
        for d, size in zip(dims, shape)
        if is_named_dim(d) and not d.broadcastable
    }


def _show(ann: Any) -> str:
    return ann.__name__ if isinstance(ann, type) else repr(ann)


def _value(v: Any) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"{v.dtype}{list(v.shape)}"
    return repr(v)
