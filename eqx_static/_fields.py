"""The facts of a module class's fields (made once per class), and static values as
compile-key tokens: compared by type *and* value, so that `1`, `True` and `1.0` are
three tokens, and so are `0.0` and `-0.0`."""

import contextlib
import copy
import dataclasses
import enum
import functools
import operator
import struct
import sys
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

import equinox as eqx
import jax
import jax.tree_util as jtu
import jaxtyping
import numpy as np
from jax.core import Tracer


class Sentinel:
    """A named marker, compared by identity."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNSET: Final = Sentinel("<unset>")  # a field not set: during `__init__`, or left so
TRUE: Final = Sentinel("True")  # the bools as tokens: `True == 1` in Python
FALSE: Final = Sentinel("False")

# The C-level `__dict__` descriptor (`module.__dict__` runs Equinox's Python code):
# its getter reads a module's dict; its setter gives an `es.edit` copy its own.
DICT: Final = eqx.Module.__dict__["__dict__"]
instance_dict: Final[Callable[[object], dict[str, Any]]] = DICT.__get__


class FieldInfo:
    """The fields of one `eqx.Module` class, and what checking them needs. One
    object per class, compared by identity: it is the class's token in a key."""

    def __init__(self, cls: type):
        fields = dataclasses.fields(cls)
        self.cls = cls
        self.names = tuple(f.name for f in fields)
        self.static_names = tuple(f.name for f in fields if f.metadata.get("static"))
        self.dynamic_names = tuple(n for n in self.names if n not in self.static_names)
        self.static = frozenset(self.static_names)
        self.dynamic = frozenset(self.dynamic_names)
        self.converters: Mapping[str, Callable[[Any], Any]] = {
            f.name: c for f in fields if (c := f.metadata.get("converter")) is not None
        }
        # What an unset field reads as: its plain default, unless a subclass or a
        # descriptor (a property) answers the read instead. (Any other field left
        # unset stays unset, as Equinox leaves it.)
        self.defaults = {f.name: f.default for f in fields if _plain_default(cls, f)}
        self.check_inits = tuple(
            k.__dict__["__check_init__"]
            for k in cls.__mro__
            if "__check_init__" in k.__dict__ and not _is_es_module(k)
        )
        anns = self.annotations = _annotations(cls, set(self.names))
        # Dynamic fields annotated with a jaxtyping array type: values are checked.
        self.array_annotations = {
            k: anns[k] for k in self.dynamic_names if is_array_annotation(anns.get(k))
        }
        self.stores_arrays = any(map(_is_es_module, cls.__mro__))
        self.get_static = _getter(self.static_names)
        self.get_dynamic = _getter(self.dynamic_names)

    def __repr__(self) -> str:
        return f"<fields of {self.cls.__qualname__}>"


_infos: Final = weakref.WeakKeyDictionary[type, FieldInfo]()


def field_info(cls: type) -> FieldInfo:
    """The field facts of the `eqx.Module` subclass `cls`, made once."""
    if (info := _infos.get(cls)) is None:
        info = _infos[cls] = FieldInfo(cls)
    return info


def _is_es_module(k: type) -> bool:
    # `es.Module` itself, found without importing `_module` (which imports this).
    return k.__name__ == "Module" and k.__module__ == "eqx_static._module"


def _plain_default(cls: type, f: dataclasses.Field) -> bool:
    if f.default is dataclasses.MISSING or hasattr(type(f.default), "__get__"):
        return False
    owner = next((k for k in cls.__mro__ if f.name in k.__dict__), None)
    return owner is not None and owner.__dict__[f.name] is f.default


def _getter(names: tuple[str, ...]) -> Callable[[dict], tuple]:
    """`d -> tuple(d[n] for n in names)`, in C."""
    if len(names) == 1:
        return lambda d, _get=operator.itemgetter(names[0]): (_get(d),)
    return operator.itemgetter(*names) if names else lambda d: ()


def _annotations(cls: type, names: set[str]) -> dict[str, Any]:
    """Resolved annotations of the fields; an unresolvable one is left out."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # one unresolvable forward reference: field by field
        hints = {}
        for k in reversed(cls.__mro__):
            ns = dict(getattr(sys.modules.get(k.__module__), "__dict__", {}))
            for name, ann in k.__dict__.get("__annotations__", {}).items():
                # Left out: one naming what is imported only under `TYPE_CHECKING`.
                with contextlib.suppress(Exception):
                    hints[name] = eval(ann, ns, vars(k)) if type(ann) is str else ann
    return {k: v for k, v in hints.items() if k in names and type(v) is not str}


UNIONS: Final = (typing.Union, types.UnionType)  # `Union[a, b]` and `a | b`


def is_array_annotation(ann: Any, plain: bool = False) -> bool:
    """Whether `ann` (or a union member) is a jaxtyping array type; or, if `plain`,
    `jax.Array` or `np.ndarray`, also as the items of a container annotation."""
    origin = typing.get_origin(ann)
    if origin in UNIONS or (plain and origin is not None):
        return any(is_array_annotation(a, plain) for a in typing.get_args(ann))
    jaxtyped = isinstance(ann, type) and issubclass(ann, jaxtyping.AbstractArray)
    return jaxtyped or (plain and ann in (jax.Array, np.ndarray))


_module_types: Final[dict[type, bool]] = {}


def is_module_type(t: type) -> bool:
    """`issubclass(t, eqx.Module)`, cached (slow with Equinox's metaclass)."""
    if (found := _module_types.get(t)) is None:
        found = _module_types[t] = issubclass(t, eqx.Module)
    return found


def is_module(x: object) -> bool:
    return is_module_type(type(x))


# ----------------------------------------------------------------------------------
# Static values as tokens. A token of a hashable value is compared by its *form*:
# floats by their bits (a nan equals a nan of the same bits); tuples, frozensets,
# frozen dataclasses and modules item by item (a dataclass by its fields, whatever
# its `__eq__` says), with each item's type; anything else by its own `==`. A value
# Python cannot hash has no token: `UnhashableError` is raised, and the caller says
# where it is and what to pass instead; but a plain `eqx.Module` may hold one in a
# static field, and there its lists, dicts, sets and dataclasses are read item by
# item too (`field_token`), never by their own `==` (`[1] == [1.0]`).

# Types whose `==` tells their values apart from every other type's.
SIMPLE: Final = frozenset({int, str, bytes, type(None), type})


class UnhashableError(TypeError):
    """A static value Python cannot hash (`__hash__` is None)."""

    def __init__(self, value: object):
        super().__init__(f"unhashable static value: {type(value).__name__}")
        self.value = value


class Typed:
    """A hashable static value as a key token: compared by its form, hashed once.
    `fixed`: nothing in it can change its form, so the same object is the same
    token (not so a frozen dataclass, changed with `object.__setattr__`)."""

    __slots__ = ("fixed", "form", "hash", "value")

    def __init__(self, value: Any, form: Any, fixed: bool):
        self.value, self.form, self.fixed = value, form, fixed
        self.hash = hash(form)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Typed or self.hash != other.hash:
            return False
        try:
            return bool(self.form == other.form)
        except Exception:  # an `__eq__` that raises: another value
            return False

    def __hash__(self) -> int:
        return self.hash

    def __repr__(self) -> str:
        return repr(self.value)


class _Copy:
    """A part of a static field's value that has no form of its own and Python
    cannot hash: a copy taken when keyed (so that a change in place is another
    value), compared by type and `==`, as other values of no form are. (Only forms
    hold one: `Typed.__eq__` takes an `==` that raises, or that is not a bool.)"""

    __slots__ = ("value",)

    def __init__(self, value: object):
        try:
            self.value = copy.deepcopy(value)
        except Exception:  # not copyable: compared as it is now
            self.value = value

    def __eq__(self, other: object) -> Any:
        if type(other) is not _Copy or type(other.value) is not type(self.value):
            return False
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(type(self.value))


def token(v: Any) -> Any:
    """A static value as a key token; `UnhashableError` if Python cannot hash it."""
    t = type(v)
    if t in SIMPLE:
        return v
    if t is bool:
        return TRUE if v else FALSE
    try:
        return Typed(v, *fixed_form(v))
    except TypeError:
        raise UnhashableError(v) from None


def field_token(v: Any, shown: bool = True) -> Any:
    """A static *field's* token: a value Python cannot hash (a plain `eqx.Module`
    may hold a list there) by its form too (`fixed_form(v, mutable=True)`), with a
    copy to show in reports if `shown` (the value itself may change later)."""
    if type(v).__hash__ is not None:
        with contextlib.suppress(UnhashableError):  # a tuple that holds a list
            return token(v)
    try:
        form = fixed_form(v, mutable=True)[0]
    except TypeError:  # a part whose own `__hash__` raises: compared whole
        form = (_Copy(v),)
    return Typed(_Copy(v).value if shown else None, form, False)


def hashable_instead(value: object, name: str, verb: str) -> str:
    """What to do instead of keying the unhashable `value` (a field or argument
    `name`), as a sentence that starts with `verb` ("Store", "Pass") if it can."""
    if isinstance(value, np.ndarray | jax.Array) and value.ndim == 0:
        data = f"`{name}={type(value.item()).__name__}({name})`"
        return f"{verb} the Python number (a 0-d array is data): {data}."
    if isinstance(value, np.ndarray | jax.Array):
        return (
            "Arrays are data, not program structure: make it a dynamic field (drop "
            "`static=True`), so that changing it never recompiles."
        )
    if isinstance(value, list):
        return f"{verb} a tuple instead: `{name}=tuple(...)`."
    if isinstance(value, dict):
        return f"{verb} a hashable mapping instead, e.g. `{name}=tuple(d.items())`."
    if isinstance(value, set):
        return f"{verb} a frozenset instead: `{name}=frozenset(...)`."
    if dataclasses.is_dataclass(value):
        return f"{verb} a frozen dataclass instead: `@dataclass(frozen=True)`."
    return f"{verb} a hashable value instead, or an array if it is data."


def value_of(tok: Any) -> Any:
    """The Python value a token stands for."""
    if type(tok) is Typed:
        return tok.value
    return True if tok is TRUE else False if tok is FALSE else tok


def fixed_form(v: Any, mutable: bool = False) -> tuple[tuple, bool]:
    """What `v` is compared by: a flat tuple, so that a value nested thousands deep
    hashes and compares without recursion (`TypeError` if a part is unhashable);
    and whether every part of `v` is immutable or compared by identity (numbers,
    strings, tuples and frozensets of them, functions, enums). If `mutable`, parts
    Python cannot hash have forms too (`_mutable_form`), and none is fixed."""
    out: list[Any] = []
    stack, fixed = [v], True
    met: dict[int, tuple[int, Any]] = {}  # the mutable containers read, by `id`
    while stack:
        x = stack.pop()
        t = type(x)
        out.append(t)
        if t in SIMPLE or t is bool:
            out.append(x)
        elif t is float:  # every bit: `-0.0` is not `0.0`, each nan payload its own
            out.append(struct.pack("<d", x))
        elif t is complex:
            out += (struct.pack("<d", x.real), struct.pack("<d", x.imag))
        elif isinstance(x, np.generic):
            out += (x.dtype.str, x.tobytes())
        elif t is frozenset:  # unordered: each item's form, as a set
            forms = [fixed_form(item) for item in x]
            out.append(frozenset(f for f, _ in forms))
            fixed = fixed and all(k for _, k in forms)
        elif t is jtu.PyTreeDef:  # its own `==` compares metadata with `==`
            out.append(_treedef_form(x))
            fixed = False
        elif t is tuple or isinstance(x, tuple) and (t.__eq__, t.__hash__) == _TUPLE:
            # its stored items, as tuple's own `==` and `hash` read them
            out.append(tuple.__len__(x))
            stack += tuple.__getitem__(x, _BACKWARDS)
        elif mutable and t.__hash__ is None:  # a list, a dict: in a static field
            out += _mutable_form(x, stack, met)
            fixed = False
        elif (names := _field_names(t)) is not None:
            out.append(len(names))
            stack += reversed([getattr(x, n, UNSET) for n in names])
            fixed = False  # its fields can be set with `object.__setattr__`
        else:
            hash(x)  # its own `==` and hash: `TypeError` if it has none
            out.append(x)
            # Fixed if `==` on a `t` is identity and its hash cannot change.
            own_hash = t.__hash__ is object.__hash__ or issubclass(t, enum.Enum)
            fixed = fixed and t.__eq__ is object.__eq__ and own_hash
    return tuple(out), fixed


_MET: Final = Sentinel("<met before>")


def _mutable_form(x: Any, stack: list, met: dict[int, tuple[int, Any]]) -> tuple:
    """The head of the form of `x`, which Python cannot hash, with its parts pushed
    on `stack`: a list's items, a dict's keys and values in its own order (the
    order the trace reads them in; a dict argument is flattened in sorted order, and
    read so), a dataclass's fields; a set's items as a `frozenset`; an array's
    dtype, shape and bytes; anything else a copy (`_Copy`). A container met before
    (inside itself, or twice) is its number: a cycle ends, and a value shared in two
    places is another key than two equal copies (more compiles, never a wrong one)."""
    t = type(x)
    if t is set:
        return (frozenset(fixed_form(item)[0] for item in x),)
    if t is list or t is dict or dataclasses.is_dataclass(x):
        if id(x) in met:
            return (_MET, met[id(x)][0])
        met[id(x)] = (len(met), x)  # kept, so that no other value takes its `id`
        if t is list:
            parts = list(x)  # pyright: ignore (narrowed by `is_dataclass` above)
        elif t is dict:
            parts = [part for item in x.items() for part in item]  # pyright: ignore
        else:
            parts = [getattr(x, f.name, UNSET) for f in dataclasses.fields(x)]
        stack += reversed(parts)
        return (len(parts),)
    if isinstance(x, np.ndarray | jax.Array) and not isinstance(x, Tracer):
        a = np.asarray(x)
        if not a.dtype.hasobject:
            return (a.dtype.str, a.shape, a.tobytes())
    return (_Copy(x),)


_BACKWARDS: Final = slice(None, None, -1)
_TUPLE: Final = (tuple.__eq__, tuple.__hash__)  # a subclass with both: read as a tuple


def _treedef_form(t: Any) -> tuple:
    data = t.node_data()  # a dict's: its keys, in a list
    aux = None if data is None else tuple(data[1]) if type(data[1]) is list else data[1]
    here = None if data is None else (data[0], fixed_form(aux)[0])
    return (t.num_leaves, here, tuple(map(_treedef_form, t.children())))


def _field_names(t: type) -> tuple[str, ...] | None:
    """The fields a frozen dataclass or a module is compared by; None otherwise."""
    params = getattr(t, "__dataclass_params__", None)
    if params is None or not (params.frozen or is_module_type(t)):
        return None
    return tuple(f.name for f in dataclasses.fields(t))


# ----------------------------------------------------------------------------------
# What `eqx.is_array` accepts. (A tracer is a `jax.Array` to `isinstance` only.)
ARRAY_TYPES: Final = (jax.Array, np.ndarray, np.generic, Tracer)
array_types: Final[set[type]] = set()  # the concrete array types seen so far


def is_array_type(t: type) -> bool:
    if t not in array_types and issubclass(t, ARRAY_TYPES):
        array_types.add(t)
    return t in array_types


def all_arrays(values: Any) -> bool:
    """Whether every value is an array (in C, once their types have been seen)."""
    return array_types.issuperset(map(type, values)) or all(
        is_array_type(type(x)) for x in values
    )


# ----------------------------------------------------------------------------------
# Values as JAX's flatten walks them: the kind of each type (read by the key walk and
# by the guards it makes), and the search for a value inside itself.

# How values of a type are walked, decided once per type.
# (None is 0, so that `kinds.get(t) or kind_of(t, v)` looks a type up once.)
IS_ARRAY, IS_MODULE, IS_LIST, IS_DICT, IS_NONE, IS_NAMED, IS_OTHER = range(1, 8)
kinds: Final[dict[type, int]] = {}
_BUILTIN: Final = {tuple: IS_LIST, list: IS_LIST, dict: IS_DICT, type(None): IS_NONE}
# A tuple subclass is indexed as JAX's flatten reads it unless it has one of these.
_READS: Final = ("__getitem__", "__iter__", "__len__", "__reversed__")


def kind_of(t: type, v: Any) -> int:
    """How a value of type `t` is walked (`v` is one): decided once per type."""
    k = IS_MODULE if is_module_type(t) else _BUILTIN.get(t, IS_OTHER)
    if k == IS_OTHER and is_array_type(t):
        k = IS_ARRAY
    elif k == IS_OTHER and issubclass(t, tuple):
        as_stored = all(getattr(t, r, None) is getattr(tuple, r, None) for r in _READS)
        if as_stored and one_level(v)[1].node_data() == (t, None):
            k = IS_NAMED  # a named tuple, which JAX flattens as its items
    kinds[t] = k
    return k


def one_level(v: Any) -> tuple[list, Any]:
    """The children of the pytree node `v`, and its one-level treedef."""
    return jtu.tree_flatten(v, is_leaf=functools.partial(operator.is_not, v))


_ITSELF: Final = Sentinel("<a value inside itself>")


def cycle_in(root: Any) -> str | None:
    """The path to the first value found inside itself (`[i]`, `['k']`, `.field`
    segments from `root`), or None."""
    return path_to(root, _ITSELF)


def path_to(root: Any, target: object) -> str | None:
    """The path (`[i]`, `['k']`, `.field` segments) of `target` inside `root`, each
    value looked into once (a cycle's way back is not taken); or None. With
    `_ITSELF`, of the first value found inside itself."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(root, "", False)]
    while stack:
        v, path, leaving = stack.pop()
        if leaving:
            on_path.discard(id(v))
            done.add(id(v))
        elif v is target or (target is _ITSELF and id(v) in on_path):
            return path
        elif id(v) not in done and id(v) not in on_path and (inside := children(v)):
            on_path.add(id(v))
            stack.append((v, path, True))
            stack += [(c, f"{path}{seg}", False) for seg, c in reversed(inside)]
    return None


# Values that hold no other: a cycle search does not look inside them.
_ATOMS: Final = SIMPLE | {bool, float, complex}


def children(v: Any) -> list[tuple[str, Any]]:
    """The values `v` holds, each with its path segment (`[i]`, `['k']`, `.f`)."""
    t = type(v)
    if t is dict:
        return [(f"[{k!r}]", x) for k, x in v.items() if type(x) not in _ATOMS]
    if is_module_type(t):
        return [(f".{k}", x) for k, x in instance_dict(v).items()]
    k = kinds.get(t) or kind_of(t, v)
    if k == IS_LIST or k == IS_NAMED:
        return [(f"[{i}]", x) for i, x in enumerate(v) if type(x) not in _ATOMS]
    if k == IS_OTHER:
        with contextlib.suppress(Exception):  # else not a pytree JAX can open
            flat = one_level(v)[0]
            if len(flat) != 1 or flat[0] is not v:  # not a leaf
                return [(f"[{i}]", x) for i, x in enumerate(flat)]
    return []
