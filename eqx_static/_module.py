"""`es.Module`, its updates `with_static` / `with_dynamic` (one line, touching only
what changes), and the checks every new field value goes through: at construction
(when `__init__` has finished), on updates, on leaving `es.edit`. Type checks of
the fields run in one jaxtyping scope, so that named dimensions bind across
fields."""

import dataclasses
import difflib
import inspect
import logging
import operator
import re
import types
import typing
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, Literal, TYPE_CHECKING, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
from jax.core import Tracer


try:  # `typecheck=True` (an optional dependency)
    import beartype
except ImportError:  # pragma: no cover
    beartype = None

from ._fields import (
    cycle_in,
    field_info,
    FieldInfo,
    hashable_instead,
    instance_dict,
    is_array_annotation,
    is_module,
    token,
    UnhashableError,
    UNIONS,
)
from ._jax import BOUND_METHOD_FIELDS, BoundMethod, is_named_dim, jaxtyped_class


def unknown_field_error(
    cls: type, name: str, names: Collection[str], kind: "Kind" = "any"
) -> AttributeError:
    """An unknown field's error, naming the fields `with_<kind>` takes (all for
    "any")."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    valid = ", ".join(repr(n) for n in names) or "(none)"
    which = "Its fields are" if kind == "any" else f"The fields `with_{kind}` takes are"
    return AttributeError(
        f"`{cls.__qualname__}` has no field {name!r}.{hint} {which}: {valid}."
    )


# Python number types, and their dtypes under `jax_enable_x64`.
_WIDE: Final = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
_NUMBERS: Final = frozenset({int, float, complex})  # a `bool` stays a `bool`
_INEXACT: Final = frozenset({float, complex})
CONTAINERS: Final = frozenset({tuple, list, dict})
_ARRAYS: Final = (jax.Array, np.ndarray)


def default_dtype(t: type) -> Any:
    """JAX's default dtype for a Python number type (64-bit under x64)."""
    return jax.dtypes.canonicalize_dtype(_WIDE[t])


def _as_data(cls: type, name: str, value: Any, kind: Any, floats: dict) -> Any:
    """`value` for the dynamic field `name` of an `es.Module`: Python numbers (not
    bools), also in plain tuples, lists and dicts, become strongly typed 0-d arrays
    of JAX's default dtype for their kind (an `int` in a field annotated `float` or
    `complex`: of that kind). Unchanged containers are returned as they are. The
    first float or complex stored is put in `floats`, under `name`."""
    t = type(value)
    if t in _NUMBERS:
        if t in _INEXACT:
            floats.setdefault(name, value)
        dtype = default_dtype(kind if t is int and kind in _INEXACT else t)
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
    if t not in CONTAINERS:
        return value
    items = value.values() if t is dict else value
    kinds = set(map(type, items))  # in C: a tuple of 10,000 arrays is one type
    if kinds.isdisjoint(_NUMBERS) and kinds.isdisjoint(CONTAINERS):
        return value
    new = [_as_data(cls, name, x, None, floats) for x in items]
    if all(map(operator.is_, new, items)):
        return value
    return dict(zip(value, new)) if t is dict else t(new)


_warned: Final = weakref.WeakKeyDictionary[type, set[str]]()


def _warn_trainable(info: FieldInfo, floats: Mapping[str, Any]) -> None:
    """Say once, in one warning naming them all, which fields store a float as an
    array (where Equinox would keep the float out of training and of the traced
    program), unless their annotations say array; a field is named once."""
    warned = _warned.setdefault(info.cls, set())
    plain = [n for n in floats if n not in warned]
    new = [n for n in plain if not is_array_annotation(info.annotations.get(n), True)]
    if not new:
        return
    warned.update(new)
    name, kind = new[0], type(floats[new[0]]).__name__
    what = "floats" if all(type(floats[n]) is float for n in new) else "numbers"
    logging.getLogger("eqx_static").warning(
        f"`{info.cls.__qualname__}` stores Python {what} as arrays in fields not "
        "annotated as arrays, where an `eqx.Module` keeps them as constants: "
        f"{', '.join(f'{n!r} ({floats[n]!r})' for n in new)}.\nAs data, "
        "`eqx.filter_grad` differentiates them, an optimiser trains them, and "
        "results may change: traced, not folded into the compiled program, a value "
        "can round differently (by an ulp, or more after many iterations). Say what "
        f"each field is, as for {name!r}:\n"
        f"- a constant: `{name}: {kind} = eqx.field(static=True)`;\n"
        "- changes but must not be trained: pass it as an argument, or keep it out "
        "of the optimiser;\n"
        f"- a parameter: `{name}: jax.Array`, which also silences this warning."
    )


def convert_and_check(
    info: FieldInfo,
    changes: Mapping[str, Any],
    convert: Collection[str],
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply converters to the fields in `convert`, then check every changed value:
    static ones are hashable; dynamic ones are stored as data (`_as_data`) and match
    their jaxtyping annotations (in a module stacked by `eqx.filter_vmap`: the
    `current` value's shape and dtype)."""
    out, floats, cls, anns = {}, {}, info.cls, info.annotations
    for name, value in changes.items():
        if name in convert and name in info.converters:
            value = info.converters[name](value)
        if name in info.static:
            try:  # a static value keys the cache
                token(value)
            except UnhashableError:
                raise TypeError(
                    f"Static field {name!r} of `{cls.__qualname__}` holds an "
                    f"unhashable {type(value).__name__}: a static field keys the "
                    f"compilation cache. {hashable_instead(value, name, 'Store')}"
                ) from None
        else:
            try:
                if info.stores_arrays:
                    value = _as_data(cls, name, value, anns.get(name), floats)
            except RecursionError:
                if (path := cycle_in(value)) is None:
                    raise
                raise ValueError(
                    f"Field {name!r} of `{cls.__qualname__}` got a value that "
                    f"contains itself: {name}{path} is the value again. A module's "
                    "fields are a tree; break the cycle before storing it."
                ) from None
            _check_array(info, name, value, (current or {}).get(name))
        out[name] = value
    if floats:
        _warn_trainable(info, floats)
    return out


def _check_array(info: FieldInfo, name: str, value: Any, old: Any) -> None:
    ann = info.array_annotations.get(name)
    if ann is not None:
        if _matches(value, ann):
            return
        if old is None or _matches(old, ann):
            raise TypeError(
                f"Field {name!r} of `{info.cls.__qualname__}` is annotated "
                f"`{_ann_repr(ann)}`, but got {_shown(value)}. Pass a value of "
                "that dtype and shape."
            )
    elif info.annotations.get(name) not in _WIDE or not (
        isinstance(old, _ARRAYS) and old.ndim > 0
    ):
        return
    # Fields of a module stacked by `eqx.filter_vmap` have leading axes that their
    # annotations do not name: a new value must have the old one's shape and dtype.
    if any(
        getattr(value, k, None) != getattr(old, k, None) for k in ("shape", "dtype")
    ):
        raise TypeError(
            f"Field {name!r} of `{info.cls.__qualname__}` holds a stacked value "
            f"{_shown(old)} (a module batched by `eqx.filter_vmap`), so the "
            f"new value must have the same shape and dtype; got {_shown(value)}."
        )


def _shown(value: object) -> str:
    """A value as a type error shows it: `float32[3]` for an array, else its type."""
    if isinstance(value, _ARRAYS):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


def _matches(value: object, ann: Any) -> bool:
    # `isinstance` with a `typing.Union` looks at `type(value)` only, blind to a
    # jaxtyping shape or dtype: unions are checked member by member.
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
    if is_array_annotation(ann):
        array = "Array" if ann.array_type is jax.Array else ann.array_type.__name__
        return f"{ann.dtype.__name__}[{array}, {ann.dim_str!r}]"
    return getattr(ann, "__name__", None) or repr(ann)


def run_check_inits(info: FieldInfo, module: object) -> None:
    """After an update: drop what is neither a field nor a dunder (stale
    `cached_property` values), and run the class's `__check_init__`s, as Equinox
    does, and its field type checks."""
    d = instance_dict(module)
    if len(d) != len(info.names):
        for k in [k for k in d if k not in info.names and not k.startswith("__")]:
            del d[k]
    for check_init in info.check_inits:
        check_init(module)
    check_fields(module)


# ----------------------------------------------------------------------------------
# Type checks of the fields, in one jaxtyping scope (`typecheck=` class option).

Typechecker = Callable[[Callable], Callable]
# The `typecheck=` option of each class that set one (None: switched off).
_options: Final = weakref.WeakKeyDictionary[type, Typechecker | None]()
_Checker = tuple[Callable, tuple[str, ...]]  # the check, and the names it takes
_checkers: Final = weakref.WeakKeyDictionary[type, _Checker | None]()
# A stored number may carry the leading axes of an `eqx.filter_vmap` ensemble.
_NUMBER_ARRAYS: Final[dict[Any, Any]] = {
    t: getattr(jaxtyping, t.__name__.capitalize())[jaxtyping.Array, "..."]
    for t in (bool, int, float, complex)
}


def _beartype() -> Typechecker:
    if beartype is None:
        raise ImportError(
            "`typecheck=True` uses beartype, which is not installed: "
            "`pip install beartype`, or pass another typechecker, as in "
            "`typecheck=typeguard.typechecked`."
        )
    return beartype.beartype


def check_fields(module: object) -> None:
    """Type-check every annotated field of `module` in one jaxtyping scope."""
    cls = type(module)
    try:
        checker = _checkers[cls]
    except KeyError:
        checker = _checkers[cls] = _make_checker(cls)
    if checker is None:
        return
    d = instance_dict(module)
    values = {n: d[n] for n in checker[1]}
    try:
        checker[0](**values)
    except jaxtyping.TypeCheckError as e:
        raise TypeError(_type_message(cls, values, e)) from None


def _make_checker(cls: type) -> _Checker | None:
    """A function of the annotated fields, as keywords, that checks them; and their
    names. None if `cls` asks for no checks, or has no annotations."""
    own = [_options[k] for k in cls.__mro__ if k in _options]
    typechecker = own[0] if own else _beartype() if jaxtyped_class(cls) else None
    info = field_info(cls)
    anns = dict(info.annotations)
    if typechecker is None or not anns:
        return None
    if info.stores_arrays:  # a number in a dynamic field is stored as a 0-d array
        for name in info.dynamic_names:
            if anns.get(name) in _NUMBER_ARRAYS:
                anns[name] |= _NUMBER_ARRAYS[anns[name]]

    def fields(**kwargs: Any) -> None: ...

    fields.__qualname__ = f"{cls.__qualname__}.fields"
    fields.__annotations__ = anns
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields.__signature__ = inspect.Signature(  # pyright: ignore
        [inspect.Parameter(n, keyword, annotation=a) for n, a in anns.items()]
    )
    return jaxtyping.jaxtyped(typechecker=typechecker)(fields), tuple(anns)


def _type_message(cls: type, values: dict[str, Any], e: Exception) -> str:
    found = re.search(r"typechecking parameter '(\w+)'", str(e))
    if found is None:
        return f"A field of `{cls.__qualname__}` does not match its annotation.\n\n{e}"
    name, anns = found.group(1), field_info(cls).annotations
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


# ----------------------------------------------------------------------------------

_M = TypeVar("_M", bound=eqx.Module)


def _as_number(x: Any) -> Any:
    """A concrete 0-d array of JAX's default dtype for its kind as a Python number."""
    number = isinstance(x, jax.Array) and not isinstance(x, Tracer) and x.ndim == 0
    # (Each time: `jax_enable_x64` may change the default dtypes.)
    return x.item() if number and x.dtype in map(default_dtype, _NUMBERS) else x


class Module(eqx.Module):
    """An `eqx.Module` whose fields are static or dynamic by declaration, with
    checked static fields and one-line updates.

    A field is static if and only if it is declared `eqx.field(static=True)`; it
    keys the compile cache of [`eqx_static.jit`][], so it must hold a hashable
    value. Every other field is dynamic: data, traced, so changing it never
    recompiles. A Python `int`/`float`/`complex` landing in a dynamic field (also in
    plain tuples, lists and dicts) is stored as a strongly typed 0-d array of JAX's
    default dtype for its kind, as an optimiser step gives it back, so eager code
    sees what compiled code sees; a `bool` stays a `bool`. The numbers are stored
    when `__init__` has finished, as Equinox runs converters: a custom `__init__`
    reads back what it assigned. Being data, a stored float is differentiated by
    `eqx.filter_grad` and trained by optax: to keep it fixed, declare it static or
    keep it out of the optimiser. A dynamic field annotated with a jaxtyping array
    type must match it. A plain default that a custom `__init__` leaves unset is
    set, as a dataclass's `__init__` would.

    These checks run at construction and on every update:
    `module.with_static(**changes)`, `module.with_dynamic(**changes)` (see
    [`eqx_static.with_static`][]) and [`eqx_static.edit`][]. With the class option
    `typecheck=True` (beartype; or `typecheck=<a typechecker>`), every annotated
    field is type-checked too, in one jaxtyping scope, so that named dimensions bind
    across fields. Everything else Equinox offers keeps working.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Scaler(es.Module):
            scale: float                        # dynamic: stored as a float32 array
            square: bool = eqx.field(static=True)

        s = Scaler(scale=2.0, square=False)
        print(s)                                # Scaler(scale=2.0, square=False)
        assert s.scale.dtype == "float32" and s.with_static(square=True).square
        ```

    !!! example "Dimensions bound across fields"

        ```python
        import jax.numpy as jnp
        import pytest
        from jaxtyping import Array, Float
        import eqx_static as es

        class Affine(es.Module, typecheck=True):
            w: Float[Array, "n m"]
            b: Float[Array, " n"]

        a = Affine(jnp.ones((2, 3)), jnp.zeros(2))
        with pytest.raises(TypeError, match="disagree on dimension 'n'"):
            a.with_dynamic(b=jnp.zeros(5))
        ```
    """

    def __init_subclass__(
        cls, *, typecheck: "bool | Typechecker | None" = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if typecheck is True:
            typecheck = _beartype()
        elif not (typecheck is None or typecheck is False or callable(typecheck)):
            raise TypeError(
                f"`typecheck=` on `{cls.__qualname__}` takes True, False or a "
                f"typechecker such as `beartype.beartype`; got {typecheck!r}."
            )
        if typecheck is not None:
            _options[cls] = None if typecheck is False else typecheck

    def __check_init__(self) -> None:
        # At construction only (updates check what they change), when `__init__`
        # has finished and Equinox has run the converters (and the subclasses'
        # own `__check_init__`s: it runs them in MRO order). An unset field gets its
        # plain default, and numbers in dynamic fields are stored as arrays.
        info, d = field_info(type(self)), instance_dict(self)
        for name, default in info.defaults.items():
            d.setdefault(name, default)
        d.update(convert_and_check(info, {n: d[n] for n in info.names if n in d}, ()))
        check_fields(self)

    def __repr__(self) -> str:
        # A number stored as a 0-d array shows as the number: `Model(scale=2.0)`.
        return eqx.tree_pformat(jax.tree.map(_as_number, self))

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str, /) -> Any:
            # Equinox's own, plus: an `es.edit` copy copies on write, a failed
            # one's refuses every read, and bound methods skip Equinox's walk (an
            # `es.jit` one is a `BoundJit`).
            d = instance_dict(self)
            if type(d) is not dict:  # an `es.edit` copy's: its `on_read` says
                d = d.on_read(self, name)  # which dict to read (or raises)
            if name == "__dict__":  # Equinox's flatten, on every `jax.tree.map`
                return d
            out = object.__getattribute__(self, name)
            if type(out) is types.MethodType and out.__self__ is self:
                # An `es.jit` method's:
                if (bind := getattr(out.__func__, "es_bind", None)) is not None:
                    return bind(self)
                # Dunders and the updates stay plain bound methods: an update needs
                # no pytree, and a `BoundMethod` took `m.with_dynamic(w=...)` from
                # 2.6 to 4.3 µs. Other methods become Equinox's `BoundMethod`.
                plain = name.startswith("__") and name.endswith("__")
                if not plain and out.__func__ not in _UPDATES:
                    if BoundMethod is None:  # pragma: no cover  (Equinox's own)
                        return eqx.Module.__getattribute__(self, name)
                    return _bound_method(out.__func__, self)
            return out

        def __setattr__(self, name: str, value: Any) -> None:
            info = field_info(type(self))
            if name in info.static or name in info.dynamic or name.startswith("__"):
                return super().__setattr__(name, value)
            hint = unknown_field_error(info.cls, name, info.names)
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: {hint} Only fields can be assigned, "
                "in `__init__` or inside `es.edit`."
            )

    def with_static(self: _M, /, **changes: Any) -> _M:
        """Return a copy with static fields replaced; see `es.with_static`."""
        return _update(self, changes, "static")

    def with_dynamic(self: _M, /, **changes: Any) -> _M:
        """Return a copy with dynamic fields replaced; see `es.with_dynamic`."""
        return _update(self, changes, "dynamic")


_UPDATES: Final = frozenset({Module.with_static, Module.with_dynamic})


def _bound_method(func: Any, obj: Any) -> Any:
    """Equinox's `BoundMethod(func, obj)`, the same pytree, made without the
    metaclass call, which walks every leaf of `obj` (about 120 µs at 100 leaves)."""
    method = object.__new__(BoundMethod)
    d = instance_dict(method)
    d["__func__"], d["__self__"] = func, obj
    for k in BOUND_METHOD_FIELDS:  # the ones Equinox's own `BoundMethod` keeps
        try:
            d[k] = getattr(func, k)
        except AttributeError:
            pass
    return method


# ----------------------------------------------------------------------------------
# Updates: `with_static` / `with_dynamic`, touching only what changes.

Kind = Literal["static", "dynamic", "any"]
_OTHER: Final = {"static": "with_dynamic", "dynamic": "with_static"}


class _Trie(dict):
    """A node of a trie of dotted paths: each segment maps to the new value of its
    path, or to the `_Trie` of the paths that go on through it."""


def with_static(module: _M, /, **changes: Any) -> _M:
    """Return a copy of `module` with some static fields replaced.

    Static fields, declared `eqx.field(static=True)`, key the compile cache of
    [`eqx_static.jit`][]: the next call compiles once per new combination of values.

    **Arguments:**

    - `module`: any `eqx.Module`.
    - `**changes`: field names, or dotted paths into nested modules and sequences
        (`**{"encoder.act": "tanh"}`), mapped to their new values.

    **Returns:**

    A new instance of the same class, sharing every field not named with `module`,
    which is unchanged. Converters run on the new values, static values must be
    hashable, and the class's `__check_init__` runs on the result.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

        m = Model(scale=2.0, square=False)
        m2 = es.with_static(m, square=True)
        assert m2.square and not m.square and m2.scale is m.scale
        ```
    """
    return _update(module, changes, "static")


def with_dynamic(module: _M, /, **changes: Any) -> _M:
    """Return a copy of `module` with some dynamic (traced) fields replaced.

    [`eqx_static.jit`][] traces dynamic fields: changing them never recompiles while
    shapes and dtypes stay the same. Arguments, result and checks are those of
    [`eqx_static.with_static`][]; in addition, a value for a field annotated with a
    jaxtyping array type (such as `Float[Array, "3"]`) must match it.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

        m = Model(scale=2.0, square=False)
        assert es.with_dynamic(m, scale=3.0).scale == 3.0
        ```
    """
    return _update(module, changes, "dynamic")


def _update(module: _M, changes: Mapping[str, Any], kind: Kind) -> _M:
    if not is_module(module):
        raise TypeError(
            f"`with_{kind}` takes an `eqx.Module`, got {type(module).__name__}."
        )
    if any("." in k for k in changes):
        return apply_trie(module, _trie(changes), kind, (), kind)
    # The common case, fields of `module` itself, spared the cost of a trie.
    info, d = field_info(type(module)), instance_dict(module)
    for name, value in changes.items():
        _check_field(info, d, name, kind, (), value)
    return rebuild(module, info, changes, changes)


def _trie(changes: Mapping[str, Any]) -> _Trie:
    root = _Trie()
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = root
        for i, seg in enumerate(parents):
            node = node.setdefault(seg, _Trie())
            if type(node) is not _Trie:  # a new value
                raise _conflict(".".join(parents[: i + 1]), path)
        if last in node:  # a `_Trie` (the paths are distinct): name a path inside
            raise _conflict(path, next(p for p in changes if p.startswith(f"{path}.")))
        node[last] = value
    return root


def _conflict(prefix: str, path: str) -> ValueError:
    return ValueError(
        f"Conflicting updates: {path!r} changes inside {prefix!r}, which is also "
        "replaced as a whole. Name either the whole value or the parts inside it."
    )


def apply_trie(obj: Any, trie: _Trie, kind: Kind, path: tuple, outer: str) -> Any:
    """Rebuild `obj` with the changes in `trie`, copying only the nodes on the paths.
    `kind` is what the caller may change; `outer`, the kind of the module field that
    holds `obj`, is the kind of anything inside a list, tuple or dict."""
    if is_module(obj):
        info, d = field_info(type(obj)), instance_dict(obj)
        values = dict(trie)
        for seg, sub in trie.items():
            if type(sub) is _Trie:
                _check_field(info, d, seg, "any", path, None)
                field_kind = "static" if seg in info.static else "dynamic"
                values[seg] = apply_trie(d[seg], sub, kind, (*path, seg), field_kind)
            else:
                _check_field(info, d, seg, kind, path, sub)
        # Converters run on the new values given, not on rebuilt nested values.
        given = [k for k, sub in trie.items() if type(sub) is not _Trie]
        return rebuild(obj, info, values, given)
    if not isinstance(obj, list | tuple | dict):
        what = f"a {type(obj).__name__}"
        if getattr(obj, "shape", None) is not None and hasattr(obj, "dtype"):
            what = f"a {obj.dtype}{list(obj.shape)} array"
        raise TypeError(
            f"Cannot follow path segment {next(iter(trie))!r} at {'.'.join(path)!r}: "
            f"the value there is {what}, not a module, list, tuple or dict."
        )
    items: Any = dict(obj) if isinstance(obj, dict) else list(obj)
    segs: dict[Any, str] = {}
    for seg, sub in trie.items():
        key = _container_key(obj, seg, path)
        if key in segs:  # such as "layers.0" and "layers.-2" into a 2-list
            raise ValueError(
                f"Conflicting updates: segments {segs[key]!r} and {seg!r} both name "
                f"the same item of {'.'.join(path)!r}. Name each item once."
            )
        segs[key] = seg
        if type(sub) is _Trie:
            items[key] = apply_trie(items[key], sub, kind, (*path, seg), outer)
        elif kind == outer or (kind == "static" and _leaf(items[key]) and _leaf(sub)):
            items[key] = sub
        else:
            raise TypeError(
                f"`with_{kind}` got {'.'.join((*path, seg))!r}, which lies inside a "
                f"{outer} field. Use `{_OTHER[kind]}` for it instead (or `es.edit`, "
                "which takes both kinds)."
            )
    t: Any = type(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_make"):  # a named tuple
        return t._make(items)
    return items if t is dict or t is list else t(items)


def _container_key(obj: Any, seg: str, path: tuple) -> Any:
    where = ".".join((*path, seg))
    if isinstance(obj, dict):
        found = [seg] if seg in obj else [k for k in obj if str(k) == seg]
        if len(found) == 1:  # `"by_id.0"` finds the key `0`
            return found[0]
        raise KeyError(
            f"No key {seg!r} at {where!r}; the keys are {list(obj)!r}."
            if not found
            else f"Path segment {seg!r} at {where!r} names several keys: {found!r}."
        )
    if hasattr(obj, "_fields") and seg in obj._fields:
        return obj._fields.index(seg)
    try:
        index = int(seg)
    except ValueError:
        index = len(obj)  # out of range
    if not -len(obj) <= index < len(obj):
        raise IndexError(
            f"Path segment {seg!r} at {where!r} is not a valid index into a "
            f"{type(obj).__name__} of length {len(obj)}."
        )
    return index % len(obj)


def rebuild(
    obj: eqx.Module, info: FieldInfo, values: Mapping[str, Any], direct: Collection[str]
) -> Any:
    """A copy of `obj` with `values` set, converted if `direct`, and checked."""
    old, new = instance_dict(obj), object.__new__(info.cls)
    instance_dict(new).update(old, **convert_and_check(info, values, direct, old))
    run_check_inits(info, new)
    return new


def _check_field(
    info: FieldInfo, d: dict, name: str, kind: Kind, path: tuple, value: Any
) -> None:
    """Raise unless `with_<kind>` takes the field `name`: `with_static` a static
    field, or a dynamic one holding a leaf that `es.jit` keys statically (a Python
    bool, a string, a function) for another such; `with_dynamic` a dynamic field."""
    if name not in info.static and name not in info.dynamic:
        takes = [n for n in info.names if _takes(info, d, n, kind)]
        raise unknown_field_error(info.cls, name, takes, kind)
    if _takes(info, d, name, kind):
        if not (kind == "static" and name in info.dynamic and not _leaf(value)):
            return
        raise TypeError(
            f"`with_static` got {'.'.join((*path, name))!r}: the dynamic field "
            f"{name!r} of `{info.cls.__qualname__}` holds a Python "
            f"{type(d[name]).__name__}, which `es.jit` keys statically, and "
            "`with_static` replaces it with another such value; got "
            f"{_kind_of(value)}. To store data there, use `with_dynamic`."
        )
    cls, full = info.cls.__qualname__, ".".join((*path, name))
    call = f"**{{{full!r}: ...}}" if path else f"{full}=..."
    what = "static field", "declared `eqx.field(static=True)`"
    if name in info.dynamic:
        what = "dynamic field", f"holding {_kind_of(d.get(name))}, traced by `es.jit`"
    raise TypeError(
        f"`with_{kind}` got {full!r}, but {name!r} is a {what[0]} of `{cls}` "
        f"({what[1]}). Use `{_OTHER[kind]}({call})` instead (or `es.edit`, which "
        "takes both kinds)."
    )


def _takes(info: FieldInfo, d: dict, name: str, kind: Kind) -> bool:
    if kind == "dynamic":
        return name in info.dynamic
    return kind == "any" or name in info.static or _leaf(d.get(name))


def _leaf(v: Any) -> bool:
    """A value `es.jit` keys statically: not an array, module or container."""
    return not (isinstance(v, list | tuple | dict) or is_module(v) or eqx.is_array(v))


def _kind_of(v: Any) -> str:
    """The kind of `v`, with its article: "an array", "a module", "a float"."""
    if eqx.is_array(v):
        return "an array"
    return "a module" if is_module(v) else f"a {type(v).__name__}"
