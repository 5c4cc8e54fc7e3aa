"""`es.Module`, and what every module class and every new field value is checked
against: the field facts of a class (computed once), and the checks a value goes
through at construction, on `with_static`/`with_dynamic` and on leaving `es.edit`."""

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


# ----------------------------------------------------------------------------------
# Field facts.


class Unset:
    """A field not set (yet): a module whose `__init__` is still running, or one
    that left a field unset, as Equinox allows."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = Unset()


class FieldInfo(typing.NamedTuple):
    """What the update helpers and `es.jit` need to know about one class."""

    cls: type
    names: tuple[str, ...]
    static_names: tuple[str, ...]
    dynamic_names: tuple[str, ...]
    static: frozenset[str]
    dynamic: frozenset[str]
    converters: Mapping[str, Callable[[Any], Any]]
    defaults: Mapping[str, Any]  # what an unset field reads as: plain defaults only
    check_inits: tuple[Callable[[Any], None], ...]
    array_annotations: Mapping[str, Any]
    annotations: Mapping[str, Any]
    get_static: Callable[[dict], tuple]  # instance dict -> static values, in order
    get_dynamic: Callable[[dict], tuple]  # instance dict -> dynamic values, in order
    stores_arrays: bool  # an `es.Module`: Python numbers in dynamic fields -> arrays


# The C-level getter of a module's instance dictionary: `module.__dict__` would go
# through `eqx.Module.__getattribute__`, a Python function.
instance_dict: Final[Callable[[object], dict[str, Any]]] = eqx.Module.__dict__[
    "__dict__"
].__get__

_infos: Final[weakref.WeakKeyDictionary[type, FieldInfo]] = weakref.WeakKeyDictionary()


def field_info(cls: type) -> FieldInfo:
    """The field facts of the `eqx.Module` subclass `cls`, made once."""
    try:
        return _infos[cls]
    except KeyError:
        info = _infos[cls] = _make_info(cls)
        return info


def _make_info(cls: type) -> FieldInfo:
    fields = dataclasses.fields(cls)
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    dynamic = tuple(f.name for f in fields if f.name not in static)
    annotations = _annotations(cls, {f.name for f in fields})
    return FieldInfo(
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
            if name not in static and _is_array_annotation(ann)
        },
        annotations=annotations,
        get_static=_getter(static),
        get_dynamic=_getter(dynamic),
        stores_arrays=is_es_module_class(cls),
    )


def _reads_as_default(cls: type, f: dataclasses.Field) -> bool:
    """Whether a field that a custom `__init__` leaves unset reads as its plain
    default. (Equinox reads the class attribute through the MRO: a subclass's
    override, or a descriptor such as a property, is what is read then.)"""
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
            globalns = getattr(sys.modules.get(k.__module__), "__dict__", {})
            for name, ann in k.__dict__.get("__annotations__", {}).items():
                hints[name] = _resolve(ann, globalns, vars(k))
    return {k: v for k, v in hints.items() if k in names and not isinstance(v, str)}


def _resolve(ann: Any, globalns: Mapping[str, Any], localns: Mapping[str, Any]) -> Any:
    if not isinstance(ann, str):
        return ann
    try:
        return eval(ann, dict(globalns), localns)  # what `get_type_hints` does
    except Exception:  # a name imported only under `TYPE_CHECKING`, say
        return ann


UNIONS: Final = (typing.Union, types.UnionType)  # `Union[a, b]` and `a | b`


def is_jaxtyping_array(ann: Any) -> bool:
    """Whether `ann` is a jaxtyping array annotation, such as `Float[Array, "n"]`."""
    return isinstance(ann, type) and issubclass(ann, jaxtyping.AbstractArray)


def _is_array_annotation(ann: Any) -> bool:
    if is_jaxtyping_array(ann):
        return True
    return typing.get_origin(ann) in UNIONS and any(
        map(_is_array_annotation, typing.get_args(ann))
    )


def unknown_field_error(
    cls: type, name: str, names: Collection[str], helper: str | None = None
) -> AttributeError:
    """`AttributeError` naming the fields `helper` takes (all fields if None) and
    the closest of them."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    valid = ", ".join(repr(n) for n in names) or "(none)"
    which = f"The fields `{helper}` takes are" if helper else "Its fields are"
    return AttributeError(
        f"`{cls.__qualname__}` has no field {name!r}.{hint} {which}: {valid}."
    )


_module_types: Final[dict[type, bool]] = {}


def is_module_type(t: type) -> bool:
    """Whether `t` subclasses `eqx.Module` (cached: `issubclass` with Equinox's
    metaclass is slow)."""
    try:
        return _module_types[t]
    except KeyError:
        r = _module_types[t] = issubclass(t, eqx.Module)
        return r


def is_module(x: object) -> bool:
    return is_module_type(type(x))


def drop_cached(d: dict[str, Any], info: FieldInfo) -> None:
    """Remove from a new instance's dictionary what is neither a field nor a dunder
    (`functools.cached_property` values of the old instance, which may be stale)."""
    if len(d) != len(info.names):
        for k in [k for k in d if k not in info.static and k not in info.dynamic]:
            if not k.startswith("__"):
                del d[k]


# ----------------------------------------------------------------------------------
# Value checks.


def check_hashable(info: FieldInfo, name: str, value: object) -> None:
    """Raise `TypeError` if the static field `name` holds an unhashable value
    (hashed as the compile key hashes it, once, and kept for the key)."""
    from ._key import deep, is_hashable

    if not deep(is_hashable, value):
        raise TypeError(_unhashable_message(info, name, value))


def _unhashable_message(info: FieldInfo, name: str, value: object) -> str:
    kind = type(value).__name__
    cls = info.cls.__qualname__
    where = f"Static field {name!r} of `{cls}` holds an unhashable {kind}"
    if isinstance(value, jax.Array | np.ndarray) and value.ndim == 0:
        number = info.annotations.get(name)
        number = number if number in (bool, int, float, complex) else type(value.item())
        fix = (
            "A static field keys the compilation cache, and a 0-d array is data: "
            f"pass the Python number, `{name}={number.__name__}({name})`."
        )
    elif isinstance(value, jax.Array | np.ndarray):
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


_NUMBERS: Final = frozenset({int, float, complex})  # a `bool` stays a `bool`
_INEXACT: Final = frozenset({float, complex})
_CONTAINERS: Final = frozenset({tuple, list, dict})
_WIDE: Final = {
    bool: np.bool_,
    int: np.int64,
    float: np.float64,
    complex: np.complex128,
}


def default_dtype(t: type) -> Any:
    """JAX's default dtype for a Python number type (64-bit under x64)."""
    return jax.dtypes.canonicalize_dtype(_WIDE[t])


def as_data(info: FieldInfo, name: str, value: Any) -> Any:
    """`value` for the dynamic field `name` of an `es.Module` class: Python numbers
    (not bools), at any depth of plain tuples, lists and dicts, become 0-d JAX
    arrays of JAX's default dtype for their kind, strongly typed, as an optimiser's
    update or a deserialised leaf is; an `int` in a field annotated `float` (or
    `complex`) becomes that kind. Anything else is returned as is; so is a container
    in which nothing changed. A float stored in a field whose annotation does not
    say it is an array is announced once (see `_warn_trainable`)."""
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
    if t not in _CONTAINERS:
        return value
    items = value.values() if t is dict else value
    kinds = set(map(type, items))  # in C: a tuple of 10,000 arrays is one type
    if kinds.isdisjoint(_NUMBERS) and kinds.isdisjoint(_CONTAINERS):
        return value
    new = [_as_data(cls, name, x, None, found) for x in items]
    if all(a is b for a, b in zip(new, items)):
        return value
    return dict(zip(value, new)) if t is dict else t(new)


_warned: Final[weakref.WeakKeyDictionary[type, set[str]]] = weakref.WeakKeyDictionary()


def _warn_trainable(info: FieldInfo, name: str, value: Any) -> None:
    """A Python float stored as an array is data: `eqx.filter_grad` differentiates
    it and an optimiser over `eqx.is_inexact_array` trains it, where Equinox would
    have kept the float out. Say so once per field, before any training step,
    unless the field's annotation says it is an array."""
    if _says_array(info.annotations.get(name)) or name in _warned.setdefault(
        info.cls, set()
    ):
        return
    _warned[info.cls].add(name)
    cls = info.cls.__qualname__
    logging.getLogger("eqx_static").warning(
        "Field %r of `%s` holds the Python %s %r, stored as an array: it is data, so "
        "`eqx.filter_grad` differentiates it and an optimiser trains it (under "
        "`eqx.Module` it would stay a Python number). If it is a constant, declare "
        "it static: `%s: float = eqx.field(static=True)`. If it changes but must "
        "not be trained, pass it as an argument, or keep it out of the optimiser. "
        "If it is a parameter, annotate it as an array (`%s: jax.Array`), which "
        "also silences this warning.",
        name, cls, type(value).__name__, value, name, name,
    )  # fmt: skip


def _says_array(ann: Any) -> bool:
    if typing.get_origin(ann) in UNIONS:
        return any(map(_says_array, typing.get_args(ann)))
    return is_jaxtyping_array(ann) or ann in (jax.Array, np.ndarray)


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
        return _check_stacked(cls, name, value, current)
    raise TypeError(
        f"Field {name!r} of `{cls.__qualname__}` is annotated `{_ann_repr(ann)}`, "
        f"but got {_describe(value)}. Pass a value of that dtype and shape."
    )


def _stacked_number(v: object) -> bool:
    """A field annotated as a number that holds an array with axes: stacked by
    `eqx.filter_vmap` (an ensemble of modules)."""
    return isinstance(v, jax.Array | np.ndarray) and v.ndim > 0


def _check_stacked(cls: type, name: str, value: object, current: Any) -> None:
    if not _same_layout(value, current):
        raise TypeError(
            f"Field {name!r} of `{cls.__qualname__}` holds a stacked value "
            f"{_describe(current)} (a module batched by `eqx.filter_vmap`), so the "
            f"new value must have the same shape and dtype; got {_describe(value)}."
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
            check_hashable(info, name, value)
        else:
            if info.stores_arrays:
                value = as_data(info, name, value)
            ann = info.array_annotations.get(name)
            old = None if current is None else current.get(name)
            if ann is not None:
                check_array_annotation(info.cls, name, ann, value, old)
            elif info.annotations.get(name) in _WIDE and _stacked_number(old):
                _check_stacked(info.cls, name, value, old)
        out[name] = value
    return out


def run_check_inits(info: FieldInfo, module: object) -> None:
    """Run the class's `__check_init__`s, as Equinox does at construction, and its
    field type checks (if it asked for them)."""
    for check_init in info.check_inits:
        check_init(module)
    check_fields(module)


# ----------------------------------------------------------------------------------
# Copies that are being edited, and copies an edit discarded.

# `es.edit`'s copies of `es.Module`s, by id: reading a field first copies what it
# holds (copy on write). Filled and emptied by `_update.edit`.
editing: Final[dict[int, Callable[[Any, str], None]]] = {}

_MSG_DEFUNCT: Final = (
    "This `{cls}` is the copy made by an `es.edit` block that raised: it was "
    "discarded, and any use of it is an error. The module you edited is unchanged; "
    "edit it again."
)


class Defunct(dict):
    """The instance dictionary of a copy discarded by a failed `es.edit`: every
    read raises, naming the cause (through `es.Module.__getattribute__`, and
    through Equinox's flatten, which reads `__dict__.get`)."""

    __slots__ = ("cls",)

    def on_read(self, name: str) -> None:
        raise RuntimeError(_MSG_DEFUNCT.format(cls=self.cls))

    def get(self, key: Any, default: Any = None) -> Any:
        self.on_read(key)

    def __getitem__(self, key: Any) -> Any:
        self.on_read(key)

    def __len__(self) -> int:
        self.on_read("")
        return 0


# ----------------------------------------------------------------------------------
# `es.Module`.

_Self = TypeVar("_Self", bound="Module")


class _PartialMethod:
    """Binds a function to an instance with `functools.partial`: a plain method read
    off an `eqx.Module` becomes an Equinox `BoundMethod`, whose construction walks
    every leaf of the module."""

    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        from . import _update

        fn = getattr(_update, self.name)
        return fn if obj is None else functools.partial(fn, obj)


class _Number:
    """Shows a 0-d concrete array of JAX's default dtype for its kind (a stored
    Python number, or one that looks exactly like it) as the number."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)

    @staticmethod
    def of(x: Any) -> Any:
        if (
            isinstance(x, jax.Array)
            and not isinstance(x, Tracer)
            and x.ndim == 0
            and x.dtype in [default_dtype(t) for t in _NUMBERS]  # x64 may change
        ):
            return _Number(x.item())
        return x


class Module(eqx.Module):
    """An `eqx.Module` whose fields are static or dynamic by declaration, with
    checked static fields and one-line updates.

    A field is static if and only if it is declared `eqx.field(static=True)`. Every
    other field is dynamic: data. A Python `bool`/`int`/`float`/`complex` that lands
    in a dynamic field (in `__init__`, as a default, through a converter or an
    update), also inside plain tuples, lists and dicts, is stored as a 0-d JAX
    array of JAX's default dtype for its kind (`float32`, `int32`, `bool`,
    `complex64`), strongly typed, as an optimiser step or deserialisation gives it
    back. So eager code sees what compiled code sees, and [`eqx_static.jit`][]
    (like `eqx.filter_jit`) traces it: changing it never recompiles. A plain default
    that a custom `__init__` leaves unset is set, as a dataclass's `__init__` would
    (a subclass's class attribute or a property is left to be read). The
    consequence to know: a dynamic field is data, so `eqx.filter_grad`
    differentiates it and optax updates it. To keep a number fixed in training,
    keep it out of the optimiser (a filter spec, or `optax.multi_transform` with
    `optax.set_to_zero()`), or declare it static (one compile per value).

    Everything Equinox offers keeps working: custom `__init__`, `__check_init__`,
    converters, abstract fields, `eqx.tree_at`, serialisation, `eqx.filter_*` and
    `eqx.filter_vmap`-stacked ensembles. On top of that:

    - at construction, every static field (`eqx.field(static=True)`) must hold a
        hashable value, because static values key the compilation cache of
        [`eqx_static.jit`][], and a dynamic field annotated with a jaxtyping array
        type must match it (dtype, shape), the same checks as on updates;
    - `module.with_static(**changes)` and `module.with_dynamic(**changes)` return
        updated copies (see [`eqx_static.with_static`][]);
    - with the class option `typecheck=True` (beartype; or `typecheck=<a
        typechecker>`), every annotated field is type-checked in one jaxtyping
        scope at construction, on `with_static`/`with_dynamic` and on exit from
        [`eqx_static.edit`][], so that named dimensions bind across fields.

    !!! example

        ```python
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import eqx_static as es

        class Scaler(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        s = Scaler(scale=2.0, square=False)
        assert isinstance(s.scale, jax.Array) and s.scale.dtype == jnp.float32
        print(s)                                  # Scaler(scale=2.0, square=False)
        assert s(jnp.array(3.0)) == 6.0
        assert s.with_static(square=True)(jnp.array(3.0)) == 18.0
        assert s.with_dynamic(scale=1.0)(jnp.array(3.0)) == 3.0
        ```

    !!! example "Shape errors caught on construction, on update, and on first call"

        ```python
        import beartype
        import jax.numpy as jnp
        import pytest
        from jaxtyping import Array, Float, TypeCheckError, jaxtyped
        import eqx_static as es

        class Affine(es.Module, typecheck=True):
            w: Float[Array, "n m"]
            b: Float[Array, " n"]

            @es.jit
            @jaxtyped(typechecker=beartype.beartype)
            def __call__(self, x: Float[Array, " m"]) -> Float[Array, " n"]:
                return self.w @ x + self.b

        with pytest.raises(TypeError, match="disagree on dimension 'n'"):
            Affine(jnp.ones((2, 3)), jnp.zeros(4))          # construction

        a = Affine(jnp.ones((2, 3)), jnp.zeros(2))
        with pytest.raises(TypeError, match="disagree on dimension 'n'"):
            a.with_dynamic(b=jnp.zeros(5))                  # update

        with pytest.raises(TypeCheckError):
            a(jnp.ones((3, 1)))                             # first call (traced)
        assert a(jnp.ones(3)).shape == (2,)                 # later hits: no check
        ```
    """

    def __init_subclass__(
        cls, *, typecheck: "bool | Typechecker | None" = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if typecheck is not None:
            set_option(cls, typecheck)

    def __check_init__(self) -> None:
        # At construction only (updates check what they change). Runs after the
        # converters, which Equinox has applied. A field that a custom `__init__`
        # left unset gets its plain default, as a dataclass's own `__init__` would.
        info = field_info(type(self))
        d = instance_dict(self)
        for name, default in info.defaults.items():
            d.setdefault(name, default)
        d.update(convert_and_check(info, {n: d[n] for n in info.names if n in d}, ()))
        check_fields(self)

    def __repr__(self) -> str:
        # A number stored as a 0-d array shows as the number: `Model(scale=2.0)`.
        return eqx.tree_pformat(jax.tree.map(_Number.of, self))

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str, /) -> Any:
            # Equinox's own `__getattribute__`, plus: a copy discarded by a failed
            # `es.edit` refuses every read, an `es.edit` copy copies on write, and a
            # bound method is made without Equinox's walk over every leaf.
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

    if TYPE_CHECKING:

        def with_static(self: _Self, **changes: Any) -> _Self:
            """Return a copy with some static fields replaced; see `es.with_static`."""
            ...

        def with_dynamic(self: _Self, **changes: Any) -> _Self:
            """Return a copy with some dynamic fields replaced; see `es.with_dynamic`."""
            ...

    else:
        with_static = _PartialMethod("with_static", "See `es.with_static`.")
        with_dynamic = _PartialMethod("with_dynamic", "See `es.with_dynamic`.")


def _bound_method(func: Any, obj: Any) -> Any:
    """Equinox's `BoundMethod(func, obj)`, the same pytree, made without the
    metaclass call, which walks every leaf of `obj` (about 120 µs at 100 leaves)."""
    from ._compat import BoundMethod

    bound = object.__new__(BoundMethod)
    d = instance_dict(bound)
    d["__func__"] = func
    d["__self__"] = obj
    for k in WRAPPER_FIELD_NAMES:  # as `BoundMethod.__post_init__` sets them
        try:
            d[k] = getattr(func, k)
        except AttributeError:
            pass
    return bound
