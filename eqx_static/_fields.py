"""Per-class facts about an `eqx.Module`'s fields, computed once per class."""

import dataclasses
import difflib
import operator
import sys
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

import equinox as eqx
import jaxtyping


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


# The C-level getter of a module's instance dictionary. `module.__dict__` would go
# through `eqx.Module.__getattribute__`, a Python function, on every access.
instance_dict: Final[Callable[[object], dict[str, Any]]] = eqx.Module.__dict__[
    "__dict__"
].__get__


def drop_cached(d: dict[str, Any], info: "FieldInfo") -> None:
    """Remove from a new instance's dictionary what is neither a field nor a dunder
    (`functools.cached_property` values of the old instance, which may be stale)."""
    if len(d) != len(info.names):
        for k in [k for k in d if k not in info.static and k not in info.dynamic]:
            if not k.startswith("__"):
                del d[k]


infos: Final[weakref.WeakKeyDictionary[type, FieldInfo]] = weakref.WeakKeyDictionary()


def field_info(cls: type) -> FieldInfo:
    """The cached `FieldInfo` of the `eqx.Module` subclass `cls`."""
    try:
        return infos[cls]
    except KeyError:
        info = infos[cls] = _make_info(cls)
        return info


def _reads_as_default(cls: type, f: dataclasses.Field) -> bool:
    """Whether a field that a custom `__init__` leaves unset reads as its plain
    default. Equinox then reads the class attribute, found through the MRO: when a
    subclass overrides it, or it is a descriptor (a property), that is what is
    read, and the field is left unset, as Equinox leaves it."""
    if f.default is dataclasses.MISSING or hasattr(type(f.default), "__get__"):
        return False
    owner = next((k for k in cls.__mro__ if f.name in k.__dict__), None)
    return owner is not None and owner.__dict__[f.name] is f.default


def _make_info(cls: type) -> FieldInfo:
    fields = dataclasses.fields(cls)
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    dynamic = tuple(f.name for f in fields if f.name not in static)
    converters = {
        f.name: f.metadata["converter"]
        for f in fields
        if f.metadata.get("converter") is not None
    }
    defaults = {f.name: f.default for f in fields if _reads_as_default(cls, f)}
    check_inits = tuple(
        k.__dict__["__check_init__"]
        for k in cls.__mro__
        if "__check_init__" in k.__dict__
        and not getattr(k.__dict__["__check_init__"], "_es_construction_only", False)
    )
    annotations = _annotations(cls, {f.name for f in fields})
    arrays = {
        name: ann
        for name, ann in annotations.items()
        if name not in static and _is_array_annotation(ann)
    }
    return FieldInfo(
        cls=cls,
        names=tuple(f.name for f in fields),
        static_names=static,
        dynamic_names=dynamic,
        static=frozenset(static),
        dynamic=frozenset(dynamic),
        converters=converters,
        defaults=defaults,
        check_inits=check_inits,
        array_annotations=arrays,
        annotations=annotations,
        get_static=getter(static),
        get_dynamic=getter(dynamic),
        stores_arrays=is_es_module_class(cls),
    )


def is_es_module_class(cls: type) -> bool:
    """Whether `cls` subclasses `es.Module` (safe while the class is being made)."""
    return any(
        k.__module__ == "eqx_static._module" and k.__name__ == "Module"
        for k in cls.__mro__
    )


def getter(names: tuple[str, ...]) -> Callable[[dict], tuple]:
    """`d -> tuple(d[n] for n in names)`, in C where possible."""
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
    except Exception:  # one unresolvable forward reference: resolve field by field
        hints = {}
        for k in reversed(cls.__mro__):
            globalns = getattr(sys.modules.get(k.__module__), "__dict__", {})
            for name, ann in k.__dict__.get("__annotations__", {}).items():
                hints[name] = _resolve(ann, globalns, vars(k))
    return {k: v for k, v in hints.items() if k in names and not isinstance(v, str)}


def _resolve(ann: Any, globalns: Mapping[str, Any], localns: Mapping[str, Any]) -> Any:
    """`ann` evaluated if it is a string, else unchanged; a string if that fails."""
    if not isinstance(ann, str):
        return ann
    try:
        return eval(ann, dict(globalns), localns)  # what `get_type_hints` does
    except Exception:  # e.g. a name imported only under `TYPE_CHECKING`
        return ann


def is_jaxtyping_array(ann: Any) -> bool:
    """Whether `ann` is a jaxtyping array annotation, such as `Float[Array, "n"]`."""
    return isinstance(ann, type) and issubclass(ann, jaxtyping.AbstractArray)


def _is_array_annotation(ann: Any) -> bool:
    if is_jaxtyping_array(ann):
        return True
    args = typing.get_args(ann)
    return typing.get_origin(ann) in UNIONS and any(
        _is_array_annotation(a) for a in args
    )


UNIONS: Final = (typing.Union, types.UnionType)  # `Union[a, b]` and `a | b`


def unknown_field_error(cls: type, name: str, names: tuple[str, ...]) -> AttributeError:
    """`AttributeError` naming the valid fields and the closest match."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    valid = ", ".join(repr(n) for n in names) or "(none)"
    return AttributeError(
        f"`{cls.__qualname__}` has no field {name!r}.{hint} Its fields are: {valid}."
    )


_module_types: Final[dict[type, bool]] = {}


def is_module(x: object) -> bool:
    """Whether `x` is an `eqx.Module` instance (cached per type: `isinstance` with
    Equinox's metaclass is slow)."""
    return is_module_type(type(x))


def is_module_type(t: type) -> bool:
    try:
        return _module_types[t]
    except KeyError:
        r = _module_types[t] = issubclass(t, eqx.Module)
        return r


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
