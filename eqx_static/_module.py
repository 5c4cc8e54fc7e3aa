"""`es.Module`, the field facts of a module class (made once), and the checks every
new field value goes through: at construction, on updates, on leaving `es.edit`."""

import dataclasses
import difflib
import functools
import logging
import operator
import sys
import types
import typing
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, TYPE_CHECKING, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
from jax.core import Tracer

from ._compat import currently_initialising, WRAPPER_FIELD_NAMES
from ._typecheck import check_fields, set_option, Typechecker


class Unset:
    """A field not set (yet): while `__init__` runs, or left unset as Equinox allows."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = Unset()


class FieldInfo(typing.NamedTuple):
    """The field facts of one class, for the updates and `es.jit`."""

    cls: type
    names: tuple[str, ...]
    static_names: tuple[str, ...]
    dynamic_names: tuple[str, ...]
    static: frozenset[str]
    dynamic: frozenset[str]
    converters: Mapping[str, Callable[[Any], Any]]
    defaults: Mapping[str, Any]  # what an unset field reads as: plain defaults only
    check_inits: tuple[Callable[[Any], None], ...]
    array_annotations: Mapping[str, Any]  # dynamic fields with a jaxtyping array type
    annotations: Mapping[str, Any]
    get_static: Callable[[dict], tuple]  # instance dict -> static values, in order
    get_dynamic: Callable[[dict], tuple]  # instance dict -> dynamic values, in order
    stores_arrays: bool  # an `es.Module`: Python numbers in dynamic fields -> arrays


# The C-level `__dict__` descriptor (`module.__dict__` runs Equinox's Python code).
DICT: Final = eqx.Module.__dict__["__dict__"]
instance_dict: Final[Callable[[object], dict[str, Any]]] = DICT.__get__
_infos: Final[weakref.WeakKeyDictionary[type, FieldInfo]] = weakref.WeakKeyDictionary()


def field_info(cls: type) -> FieldInfo:
    """The field facts of the `eqx.Module` subclass `cls`, made once."""
    try:
        return _infos[cls]
    except KeyError:
        pass
    fields = dataclasses.fields(cls)
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    dynamic = tuple(f.name for f in fields if f.name not in static)
    annotations = _annotations(cls, {f.name for f in fields})
    info = _infos[cls] = FieldInfo(
        cls=cls,
        names=tuple(f.name for f in fields),
        static_names=static,
        dynamic_names=dynamic,
        static=frozenset(static),
        dynamic=frozenset(dynamic),
        converters={
            f.name: f.metadata["converter"]
            for f in fields
            if f.metadata.get("converter") is not None
        },
        defaults={f.name: f.default for f in fields if _reads_as_default(cls, f)},
        check_inits=tuple(
            k.__dict__["__check_init__"]
            for k in cls.__mro__
            if "__check_init__" in k.__dict__ and k is not Module
        ),
        array_annotations={
            name: ann
            for name, ann in annotations.items()
            if name not in static and _is_array(ann)
        },
        annotations=annotations,
        get_static=_getter(static),
        get_dynamic=_getter(dynamic),
        stores_arrays=is_es_module_class(cls),
    )
    return info


def _reads_as_default(cls: type, f: dataclasses.Field) -> bool:
    """Whether the field, left unset by a custom `__init__`, reads as its default (a
    subclass's class attribute, or a descriptor such as a property, is read then)."""
    if f.default is dataclasses.MISSING or hasattr(type(f.default), "__get__"):
        return False
    owner = next((k for k in cls.__mro__ if f.name in k.__dict__), None)
    return owner is not None and owner.__dict__[f.name] is f.default


def is_es_module_class(cls: type) -> bool:
    """Whether `cls` subclasses `es.Module` (safe while the class is being made)."""
    return any(k.__module__ == __name__ and k.__name__ == "Module" for k in cls.__mro__)


def _getter(names: tuple[str, ...]) -> Callable[[dict], tuple]:
    """`d -> tuple(d[n] for n in names)`, in C."""
    if not names:
        return lambda d: ()
    if len(names) == 1:
        (name,) = names
        return lambda d: (d[name],)
    return operator.itemgetter(*names)


def _annotations(cls: type, names: set[str]) -> dict[str, Any]:
    """Resolved annotations of the fields; unresolvable strings are skipped."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # one unresolvable forward reference: field by field
        hints = {}
        for k in reversed(cls.__mro__):
            ns = dict(getattr(sys.modules.get(k.__module__), "__dict__", {}))
            for name, ann in k.__dict__.get("__annotations__", {}).items():
                try:  # as `get_type_hints` does
                    ann = eval(ann, ns, vars(k)) if isinstance(ann, str) else ann
                except Exception:  # a name imported only under `TYPE_CHECKING`, say
                    pass
                hints[name] = ann
    return {k: v for k, v in hints.items() if k in names and not isinstance(v, str)}


UNIONS: Final = (typing.Union, types.UnionType)  # `Union[a, b]` and `a | b`


def _is_array(ann: Any, plain: bool = False) -> bool:
    """Whether `ann` (or a union member) is a jaxtyping array type; or, if `plain`,
    `jax.Array` or `np.ndarray`, also as the items of a container annotation."""
    origin = typing.get_origin(ann)
    if origin in UNIONS or (plain and origin is not None):
        return any(_is_array(a, plain) for a in typing.get_args(ann))
    jaxtyped = isinstance(ann, type) and issubclass(ann, jaxtyping.AbstractArray)
    return jaxtyped or (plain and ann in (jax.Array, np.ndarray))


def unknown_field_error(
    cls: type, name: str, names: Collection[str], helper: str | None = None
) -> AttributeError:
    """An unknown field's error, naming the fields `helper` takes (all if None)."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    valid = ", ".join(repr(n) for n in names) or "(none)"
    which = f"The fields `{helper}` takes are" if helper else "Its fields are"
    return AttributeError(
        f"`{cls.__qualname__}` has no field {name!r}.{hint} {which}: {valid}."
    )


_module_types: Final[dict[type, bool]] = {}


def is_module_type(t: type) -> bool:
    """`issubclass(t, eqx.Module)`, cached (slow with Equinox's metaclass)."""
    try:
        return _module_types[t]
    except KeyError:
        r = _module_types[t] = issubclass(t, eqx.Module)
        return r


def is_module(x: object) -> bool:
    return is_module_type(type(x))


def drop_cached(d: dict[str, Any], info: FieldInfo) -> None:
    """Drop what is neither a field nor a dunder (stale `cached_property` values)."""
    if len(d) != len(info.names):
        fields = info.static | info.dynamic
        for k in [k for k in d if k not in fields and not k.startswith("__")]:
            del d[k]


# Python number types, and their dtypes under `jax_enable_x64`.
_WIDE: Final = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
_NUMBERS: Final = frozenset({int, float, complex})  # a `bool` stays a `bool`
_INEXACT: Final = frozenset({float, complex})
CONTAINERS: Final = frozenset({tuple, list, dict})
_ARRAYS: Final = (jax.Array, np.ndarray)


def default_dtype(t: type) -> Any:
    """JAX's default dtype for a Python number type (64-bit under x64)."""
    return jax.dtypes.canonicalize_dtype(_WIDE[t])


def check_hashable(info: FieldInfo, name: str, value: object) -> None:
    """Raise `TypeError` if `value` is unhashable, as the compile key hashes it."""
    from ._key import deep, is_hashable

    if deep(is_hashable, value):
        return
    if isinstance(value, _ARRAYS) and value.ndim == 0:
        number = info.annotations.get(name)
        number = number if number in (bool, int, float, complex) else type(value.item())
        fix = (
            "A static field keys the compilation cache, and a 0-d array is data: "
            f"pass the Python number, `{name}={number.__name__}({name})`."
        )
    elif isinstance(value, _ARRAYS):
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
    raise TypeError(
        f"Static field {name!r} of `{info.cls.__qualname__}` holds an unhashable "
        f"{type(value).__name__}. {fix}"
    )


def as_data(info: FieldInfo, name: str, value: Any) -> Any:
    """`value` for the dynamic field `name` of an `es.Module`: Python numbers (not
    bools), also in plain tuples, lists and dicts, become strongly typed 0-d arrays
    of JAX's default dtype for their kind (an `int` in a field annotated `float` or
    `complex`: of that kind). Unchanged containers are returned as they are."""
    from ._key import CyclicValue, deep

    kind = info.annotations.get(name)
    kind = kind if kind in _INEXACT else None
    found: list[Any] = []
    try:
        out = deep(_as_data, info.cls, name, value, kind, found)
    except CyclicValue as e:
        where = name + e.path.removeprefix("[2]")
        raise ValueError(
            f"Field {name!r} of `{info.cls.__qualname__}` got a value that contains "
            f"itself: {where} is the value again. A module's fields are a tree; "
            "break the cycle before storing it."
        ) from None
    if found:
        _warn_trainable(info, name, found[0])
    return out


def _as_data(cls: type, name: str, value: Any, kind: type | None, found: list) -> Any:
    t = type(value)
    if t in _NUMBERS:
        if t in _INEXACT:
            found.append(value)
        dtype = default_dtype(kind if t is int and kind is not None else t)
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
    new = [_as_data(cls, name, x, None, found) for x in items]
    if all(map(operator.is_, new, items)):
        return value
    return dict(zip(value, new)) if t is dict else t(new)


_warned: Final[weakref.WeakKeyDictionary[type, set[str]]] = weakref.WeakKeyDictionary()


def _warn_trainable(info: FieldInfo, name: str, value: Any) -> None:
    """Say once per field, unless its annotation says it is an array, that a float
    stored as an array is trained (where Equinox would keep the float out)."""
    warned = _warned.setdefault(info.cls, set())
    if name in warned or _is_array(info.annotations.get(name), plain=True):
        return
    warned.add(name)
    logging.getLogger("eqx_static").warning(
        "Field %r of `%s` holds the Python %s %r, stored as an array: it is data, so "
        "`eqx.filter_grad` differentiates it and an optimiser trains it (under "
        "`eqx.Module` it would stay a Python number). If it is a constant, declare "
        "it static: `%s: float = eqx.field(static=True)`. If it changes but must "
        "not be trained, pass it as an argument, or keep it out of the optimiser. "
        "If it is a parameter, annotate it as an array (`%s: jax.Array`), which "
        "also silences this warning.",
        name, info.cls.__qualname__, type(value).__name__, value, name, name,
    )  # fmt: skip


def convert_and_check(
    info: FieldInfo,
    changes: Mapping[str, Any],
    convert: Collection[str],
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply converters to the fields in `convert`, then check every changed value:
    static ones are hashable; dynamic ones are stored as data (`as_data`) and match
    their jaxtyping annotations (in a module stacked by `eqx.filter_vmap`: the
    `current` value's shape and dtype)."""
    out = {}
    for name, value in changes.items():
        converter = info.converters.get(name)
        if converter is not None and name in convert:
            value = converter(value)
        if name in info.static:
            check_hashable(info, name, value)
        else:
            if info.stores_arrays:
                value = as_data(info, name, value)
            ann = info.array_annotations.get(name)
            old = None if current is None else current.get(name)
            if ann is not None and not _matches(value, ann):
                if old is None or _matches(old, ann):
                    raise TypeError(
                        f"Field {name!r} of `{info.cls.__qualname__}` is annotated "
                        f"`{_ann_repr(ann)}`, but got {_describe(value)}. Pass a "
                        "value of that dtype and shape."
                    )
                _check_stacked(info.cls, name, value, old)
            elif ann is None and info.annotations.get(name) in _WIDE:
                if isinstance(old, _ARRAYS) and old.ndim > 0:
                    _check_stacked(info.cls, name, value, old)
        out[name] = value
    return out


def _check_stacked(cls: type, name: str, value: object, old: Any) -> None:
    """Fields of a module stacked by `eqx.filter_vmap` have leading axes that their
    annotations do not name: a new value must have the old one's shape and dtype."""
    if any(
        getattr(value, k, None) != getattr(old, k, None) for k in ("shape", "dtype")
    ):
        raise TypeError(
            f"Field {name!r} of `{cls.__qualname__}` holds a stacked value "
            f"{_describe(old)} (a module batched by `eqx.filter_vmap`), so the "
            f"new value must have the same shape and dtype; got {_describe(value)}."
        )


def _describe(value: object) -> str:
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
    if _is_array(ann):
        array = "Array" if ann.array_type is jax.Array else ann.array_type.__name__
        return f"{ann.dtype.__name__}[{array}, {ann.dim_str!r}]"
    return getattr(ann, "__name__", None) or repr(ann)


def run_check_inits(info: FieldInfo, module: object) -> None:
    """Run the class's `__check_init__`s, as Equinox does, and its field type checks."""
    for check_init in info.check_inits:
        check_init(module)
    check_fields(module)


# `es.edit`'s copies of `es.Module`s, by id, each with what to call before a read of
# one of its fields (copy on write). Filled and emptied by `_update.edit`.
editing: Final[dict[int, Callable[[Any, str], None]]] = {}


_Self = TypeVar("_Self", bound="Module")


class _PartialMethod:
    """Binds an `_update` function to an instance with `functools.partial`, where a
    plain method read off an `eqx.Module` would become an Equinox `BoundMethod`,
    made by walking every leaf of the module."""

    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        from . import _update

        fn = getattr(_update, self.name)
        return fn if obj is None else functools.partial(fn, obj)


def _as_number(x: Any) -> Any:
    """A concrete 0-d array of JAX's default dtype for its kind as a Python number."""
    if (
        isinstance(x, jax.Array)
        and not isinstance(x, Tracer)
        and x.ndim == 0
        and x.dtype in [default_dtype(t) for t in _NUMBERS]  # x64 may change
    ):
        return x.item()
    return x


class Module(eqx.Module):
    """An `eqx.Module` whose fields are static or dynamic by declaration, with
    checked static fields and one-line updates.

    A field is static if and only if it is declared `eqx.field(static=True)`; it
    keys the compile cache of [`eqx_static.jit`][], so it must hold a hashable
    value. Every other field is dynamic: data, traced, so changing it never
    recompiles. A Python `bool`/`int`/`float`/`complex` landing in a dynamic field
    (also in plain tuples, lists and dicts) is stored as a strongly typed 0-d array
    of JAX's default dtype for its kind, as an optimiser step gives it back, so eager
    code sees what compiled code sees. Being data, it is differentiated by
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
        if typecheck is not None:
            set_option(cls, typecheck)

    def __check_init__(self) -> None:
        # At construction only (updates check what they change), after Equinox has
        # applied the converters. An unset field gets its plain default (`defaults`).
        info = field_info(type(self))
        d = instance_dict(self)
        for name, default in info.defaults.items():
            d.setdefault(name, default)
        d.update(convert_and_check(info, {n: d[n] for n in info.names if n in d}, ()))
        check_fields(self)

    def __repr__(self) -> str:
        # A number stored as a 0-d array shows as the number: `Model(scale=2.0)`.
        return eqx.tree_pformat(jax.tree.map(_as_number, self))

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str, /) -> Any:
            # Equinox's own, plus: a failed `es.edit`'s copy refuses every read, an
            # `es.edit` copy copies on write, and bound methods skip Equinox's walk.
            d = instance_dict(self)
            if type(d) is not dict:  # a failed edit's copy: raises, saying why
                d.on_read(name)
            if editing and id(self) in editing:
                editing[id(self)](self, name)
            if name == "__dict__":  # Equinox's flatten, on every `jax.tree.map`
                return d
            out = object.__getattribute__(self, name)
            if type(out) is types.MethodType and out.__self__ is self:
                func = out.__func__
                if not (name.startswith("__") and name.endswith("__")):
                    if name != "_abc_impl":
                        return _bound_method(func, self)
                elif hasattr(func, "es_jit"):  # an installed `es.jit` special method
                    from ._jit import BoundJit

                    return BoundJit(func, self)
            return out

        def __setattr__(self, name: str, value: Any) -> None:
            info = field_info(type(self))
            if name in info.dynamic:
                # A converter sees the value as given; `__check_init__` stores its
                # result. (Outside `__init__` and `es.edit`, Equinox refuses below.)
                if name not in info.converters and self in currently_initialising:
                    value = as_data(info, name, value)
                return super().__setattr__(name, value)
            if name in info.static or name.startswith("__"):
                return super().__setattr__(name, value)
            hint = unknown_field_error(info.cls, name, info.names)
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: {hint} Only fields can be assigned, "
                "in `__init__` or inside `es.edit`."
            )

        with_static = _PartialMethod("with_static", "See `es.with_static`.")
        with_dynamic = _PartialMethod("with_dynamic", "See `es.with_dynamic`.")

    else:

        def with_static(self: _Self, **changes: Any) -> _Self:
            """Return a copy with static fields replaced; see `es.with_static`."""
            ...

        def with_dynamic(self: _Self, **changes: Any) -> _Self:
            """Return a copy with dynamic fields replaced; see `es.with_dynamic`."""
            ...


def _bound_method(func: Any, obj: Any) -> Any:
    """Equinox's `BoundMethod(func, obj)`, the same pytree, made without the
    metaclass call, which walks every leaf of `obj` (about 120 µs at 100 leaves)."""
    from ._compat import BoundMethod

    bound = object.__new__(BoundMethod)
    d = instance_dict(bound)
    d["__func__"], d["__self__"] = func, obj
    for k in WRAPPER_FIELD_NAMES:  # as `BoundMethod.__post_init__` sets them
        try:
            d[k] = getattr(func, k)
        except AttributeError:
            pass
    return bound
