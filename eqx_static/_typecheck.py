"""Runtime type checks of a module's fields in one jaxtyping scope, so that named
dimensions bind across fields: `w: Float[Array, "n m"]` and `b: Float[Array, " m"]`
must agree on `m`."""

import inspect
import re
import weakref
from collections.abc import Callable
from typing import Any, Final

import jaxtyping

from . import _module
from ._compat import is_named_dim, jaxtyped_class


Typechecker = Callable[[Callable], Callable]
# The `typecheck=` class option of each class that set one (None: switched off).
_options: Final = weakref.WeakKeyDictionary[type, Typechecker | None]()
_checkers: Final[dict[type, tuple[Callable, tuple[str, ...]] | None]] = {}
# A stored number may carry the leading axes of an `eqx.filter_vmap` ensemble.
_NUMBER_ARRAYS: Final[dict[Any, Any]] = {
    t: getattr(jaxtyping, t.__name__.capitalize())[jaxtyping.Array, "..."]
    for t in (bool, int, float, complex)
}


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
    values = {n: d[n] for n in checker[1]}
    try:
        checker[0](**values)
    except jaxtyping.TypeCheckError as e:
        raise TypeError(_message(cls, values, e)) from None


def _make_checker(cls: type) -> tuple[Callable, tuple[str, ...]] | None:
    """A function of the annotated fields, as keywords, that checks them; and their
    names. None if `cls` asks for no checks, or has no annotations."""
    for k in cls.__mro__:
        if k in _options:
            typechecker = _options[k]
            break
    else:
        typechecker = _beartype() if jaxtyped_class(cls) else None
    if typechecker is None:
        return None
    info = _module.field_info(cls)
    anns = dict(info.annotations)
    if not anns:
        return None
    if info.stores_arrays:  # a number in a dynamic field is stored as a 0-d array
        for name in info.dynamic_names:
            if anns.get(name) in _NUMBER_ARRAYS:
                anns[name] |= _NUMBER_ARRAYS[anns[name]]

    def fields(**kwargs: Any) -> None:
        del kwargs

    fields.__qualname__ = f"{cls.__qualname__}.fields"
    fields.__annotations__ = anns
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields.__signature__ = inspect.Signature(  # pyright: ignore[reportFunctionMemberAccess]
        [inspect.Parameter(n, keyword, annotation=a) for n, a in anns.items()]
    )
    return jaxtyping.jaxtyped(typechecker=typechecker)(fields), tuple(anns)


def _message(cls: type, values: dict[str, Any], e: Exception) -> str:
    found = re.search(r"typechecking parameter '(\w+)'", str(e))
    if found is None:
        return f"A field of `{cls.__qualname__}` does not match its annotation.\n\n{e}"
    name, anns = found.group(1), _module.field_info(cls).annotations
    mine = _named_sizes(anns.get(name), values.get(name))
    for other, ann in anns.items():
        theirs = {} if other == name else _named_sizes(ann, values.get(other))
        for dim, size in mine.items():
            if dim in theirs and theirs[dim] != size:
                return (
                    f"Fields {other!r} and {name!r} of `{cls.__qualname__}` disagree "
                    f"on dimension {dim!r}: {other!r} has {dim}={theirs[dim]} (shape "
                    f"{tuple(values[other].shape)}), {name!r} has {dim}={size} "
                    f"(shape {tuple(values[name].shape)}). Give them matching shapes."
                )
    ann = anns.get(name)
    v: Any = values.get(name)
    shown = ann.__name__ if isinstance(ann, type) else repr(ann)
    array = hasattr(v, "shape") and hasattr(v, "dtype")
    got = f"{v.dtype}{list(v.shape)}" if array else repr(v)
    return (
        f"The field {name!r} of `{cls.__qualname__}` does not match its annotation "
        f"`{shown}`: got {got}. Pass a value of the annotated type.\n\n{e}"
    )


def _named_sizes(ann: Any, value: Any) -> dict[str, int]:
    """The sizes that `value` gives the named dimensions of `ann`."""
    dims, shape = getattr(ann, "dims", None), getattr(value, "shape", None)
    if dims is None or shape is None or len(dims) != len(shape):
        return {}
    return {
        d.name: size
        for d, size in zip(dims, shape)
        if is_named_dim(d) and not d.broadcastable
    }
