"""The compile key: the one description of a call that everything else reads.

`es.jit` partitions a call exactly as `eqx.filter_jit` does: every leaf for which
`eqx.is_array` holds is traced, every other leaf is static. A key is a tree of
hashable tuples mirroring the call's arguments:

- `LEAF` marks a traced array; its shape, dtype, weak type and sharding are checked
  by `jax.jit`'s own dispatch;
- `(LEAVES, type, n)` is a plain tuple or list of `n` traced arrays;
- `(MODULE, cls, statics, children, extras, types)` is an `eqx.Module`: its static
  field values and their types (so compared by type *and* value, see `typed`), the
  keys of its dynamic fields, and Equinox's wrapper attributes if any;
- `(SEQ, type, children)` is a plain list or tuple, `(TREE, treedef, children)`
  any other pytree node, `(STATIC, type, typed_value)` a leaf that is not an array.

`build` turns a key and the traced leaves back into the arguments.
"""

import math
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from ._compat import currently_initialising as _initialising, WRAPPER_FIELD_NAMES
from ._fields import _infos, field_info, FieldInfo, instance_dict


LEAF: Final = "·"
MODULE: Final = 0
SEQ: Final = 1
TREE: Final = 2
STATIC: Final = 3
LEAVES: Final = 4

# What `eqx.is_array` accepts: these leaves are traced, everything else is static.
# (A tracer is a `jax.Array` to `isinstance`, not to `issubclass`.)
ARRAY_TYPES: Final = (jax.Array, np.ndarray, np.generic, Tracer)


def deep(f: Callable[..., Any], *args: Any) -> Any:
    """`f(*args)`, again with a higher recursion limit if it ran out: the walks of
    a key recurse once per level of nesting, and JAX's own flatten, in C++, has no
    such limit. (Python 3.11+ calls between Python functions use no C stack.)"""
    try:
        return f(*args)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 100_000))
        try:
            return f(*args)
        finally:
            sys.setrecursionlimit(limit)


def plan(cls: type) -> FieldInfo:
    """The field names of a module class (`_infos.get` first: this is hot)."""
    return _infos.get(cls) or field_info(cls)


class _Missing:
    """A field not set yet: a module whose `__init__` is still running."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


MISSING: Final = _Missing()


# ----------------------------------------------------------------------------------
# Typed static values: `1`, `True` and `1.0` are different keys, at any depth.


class Typed:
    """A static value in a key that compares by type as well as by value.

    `1`, `True` and `1.0` differ; so do `-0.0` and `0.0`; `nan` equals itself. This
    holds inside tuples, frozensets, named tuples, dataclasses and modules; a type
    that defines its own `__eq__` (a tuple subclass, say) is compared by it. The
    hash is computed once: a large static tuple is hashed once per object."""

    __slots__ = ("_hash", "form", "value")

    def __init__(self, value: Any, form: Any):
        self.value = value
        self.form = form
        try:
            self._hash: int | None = hash(form)
        except TypeError:  # raised again, with the culprit named, by the caller
            self._hash = None

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Typed
            and self._hash == other._hash
            and self.form == other.form
        )

    def __hash__(self) -> int:
        if self._hash is None:
            raise TypeError(f"unhashable static value: {type(self.value).__name__}")
        return self._hash

    def __repr__(self) -> str:
        return repr(self.value)


# Value types whose `==` already tells types apart from each other's values.
SIMPLE: Final = frozenset({bool, int, str, bytes, type(None), type, _Missing})


def typed(v: Any) -> Any:
    """`v` as a key, to be paired with `type(v)`: itself if its type is `SIMPLE`,
    else a `Typed` form (made once per object while the object is recent)."""
    t = type(v)
    if t in SIMPLE:
        return v
    hit = _typed_memo.get(id(v))
    if hit is not None and hit.value is v:
        return hit
    out = Typed(v, (t, _form(v)))
    if len(_typed_memo) >= 4096:
        _typed_memo.clear()
    _typed_memo[id(v)] = out  # keeps `v` alive while it is here, so the id is safe
    return out


_typed_memo: Final[dict[int, Typed]] = {}


def _form(v: Any) -> Any:
    """What `v` is compared by: its type and value, recursively (iteratively)."""
    t = type(v)
    if t in SIMPLE:
        return v
    if t is float:
        if math.isnan(v):  # every nan is one key; its sign is kept (copysign)
            return "-nan" if math.copysign(1.0, v) < 0 else "nan"
        return v.hex()
    if t is complex:
        return (_form(v.real), _form(v.imag))
    if isinstance(v, np.generic):
        return (v.dtype.str, v.tobytes())
    if t is tuple or (isinstance(v, tuple) and _default_eq(t, tuple)):
        return tuple([(type(x), _form(x)) for x in v])
    if t is frozenset:
        return frozenset([(type(x), _form(x)) for x in v])
    fields = getattr(t, "__dataclass_fields__", None)
    if fields is not None and _dataclass_eq(t):
        d = getattr(v, "__dict__", None)
        if d is not None:
            items = [(k, d.get(k, MISSING)) for k in fields]
            return tuple([(k, type(x), _form(x)) for k, x in items])
    return v  # compared by its own `__eq__`


def _default_eq(t: type, base: type) -> bool:
    return t.__eq__ is base.__eq__ and t.__hash__ is base.__hash__


def _dataclass_eq(t: type) -> bool:
    """Whether `t`'s equality is the field-by-field one of `dataclasses` or Equinox
    (then its fields are compared typed); a hand-written `__eq__` is respected."""
    from ._compat import module_eq

    eq = t.__eq__
    if eq is module_eq:
        return True
    code = getattr(eq, "__code__", None)
    return (
        code is not None
        and code.co_filename.startswith("<")
        and (getattr(eq, "__qualname__", "").endswith("__eq__"))
    )


# ----------------------------------------------------------------------------------
# Walking the arguments.


_ARR, _MOD, _SEQ, _NONE, _OTHER = range(1, 6)
_kinds: Final[dict[type, int]] = {}
array_types: Final[set[type]] = set()  # the concrete array types seen so far


def kind_of(t: type) -> int:
    """How to key a value of type `t` (cached: `isinstance` on ABCs is slow)."""
    k = _kinds.get(t)
    if k is not None:
        return k
    from ._fields import is_module_type

    if is_module_type(t):
        k = _MOD
    elif issubclass(t, ARRAY_TYPES):
        k = _ARR
        array_types.add(t)
    elif t is tuple or t is list:
        k = _SEQ
    elif t is type(None):
        k = _NONE
    else:
        k = _OTHER
    _kinds[t] = k
    return k


def array_types_only(values: Any) -> bool:
    """Whether every value in `values` is an array (in C when the types are known)."""
    if array_types.issuperset(map(type, values)):
        return True
    for t in map(type, values):
        if (_kinds.get(t) or kind_of(t)) is not _ARR:
            return False
    return True


def make_key(args: tuple, kwargs: dict[str, Any], leaves: list) -> tuple:
    """The key of a call; appends its traced leaves to `leaves`, in key order."""
    nodes = []
    for a in args:  # the common cases first: this is the hot path
        kind = _kinds.get(type(a)) or kind_of(type(a))
        if kind is _ARR:
            leaves.append(a)
            nodes.append(LEAF)
        elif kind is _MOD:
            nodes.append(top_node(a, leaves))
        else:
            nodes.append(node(a, leaves))
    if kwargs:
        names = tuple(sorted(kwargs))
        return tuple(nodes), names, tuple([node(kwargs[k], leaves) for k in names])
    return tuple(nodes), (), ()


def key_and_leaves(args: tuple, kwargs: dict[str, Any], first: tuple) -> tuple:
    """The key of a call and its traced leaves, after the leaves `first`; at any
    depth of nesting (see `deep`)."""

    def attempt() -> tuple:
        leaves = [*first]
        return make_key(args, kwargs, leaves), leaves

    return deep(attempt)


# A module is frozen, so its key and leaves are computed once per instance and kept
# while the instance lives: `id` -> (weak reference, key, leaves). Instances whose
# key could change (holding a list, a dict or another mutable pytree; made while a
# module is being initialised or edited) are never memoised. A key holds the
# module's static values; one that refers back to the module (a callable field)
# keeps it alive until the memo is emptied: at `_MEMO_MAX` entries, or by
# `cache_clear()`.
_memo: Final[dict[int, tuple]] = {}
_MEMO_MAX: Final = 4096
# Equinox's modules being initialised (and `es.edit`'s copies), by id. (Copying or
# unpickling a module adds it and never removes it: so test membership, not size.)
_being_made: Final[dict[int, Any]] = _initialising._dict  # pyright: ignore[reportAttributeAccessIssue]


def top_node(v: Any, leaves: list) -> Any:
    """The key of the module `v`, from the memo when `v` was seen before."""
    e = _memo.get(id(v))
    if e is not None and e[0]() is v:
        leaves += e[2]
        return e[1]
    start = len(leaves)
    mutable: list = []
    n = node(v, leaves, mutable)
    if not mutable:
        if len(_memo) >= _MEMO_MAX:  # bounds what a module referring to itself keeps
            _memo.clear()
        ref = _Ref(v, _forget)
        ref.i = id(v)
        _memo[ref.i] = (ref, n, leaves[start:])
    return n


class _Ref(weakref.ref):
    __slots__ = ("i",)


def _forget(ref: _Ref) -> None:
    e = _memo.get(ref.i)
    if e is not None and e[0] is ref:
        del _memo[ref.i]


def forget_all() -> None:
    """Drop every memoised key (they hold static values, never instances)."""
    _memo.clear()
    _typed_memo.clear()
    _big_tuples.clear()


def node(v: Any, leaves: list, mutable: list | None = None) -> Any:
    """The key of `v`. Appends to `mutable` if `v` holds a list, dict or other
    pytree that could change after the call."""
    t = type(v)
    kind = _kinds.get(t) or kind_of(t)
    if kind is _ARR:
        leaves.append(v)
        return LEAF
    if kind is _MOD:
        p = _infos.get(t) or field_info(t)
        d = instance_dict(v)
        if _being_made and id(v) in _being_made and mutable is not None:
            mutable.append(v)  # still being initialised or edited: never memoised
        try:
            statics = p.get_static(d)
            dynamic = p.get_dynamic(d)
        except KeyError:  # inside `__init__`: some fields are not set yet
            statics = tuple([d.get(k, MISSING) for k in p.static_names])
            dynamic = tuple([d.get(k, MISSING) for k in p.dynamic_names])
        types = tuple(map(type, statics))
        if not SIMPLE.issuperset(types):
            statics = tuple(map(typed, statics))
        if array_types_only(dynamic):
            leaves += dynamic
            children = p.all_leaves
        else:
            children = tuple([node(x, leaves, mutable) for x in dynamic])
        extras = _extras(d, p) if len(d) != len(p.names) else None
        return (MODULE, t, statics, children, extras, types)
    if kind is _SEQ:
        if t is list and mutable is not None:
            mutable.append(v)
        if t is tuple and len(v) >= _BIG and (hit := _big_tuples.get(id(v))):
            if hit[0] is v:
                return hit[1]
        if array_types_only(v):
            leaves += v
            return (LEAVES, t, len(v))
        if t is tuple and len(v) >= _BIG:
            return _big_tuple(v, leaves, mutable)
        return (SEQ, t, tuple([node(x, leaves, mutable) for x in v]))
    if kind is _NONE:
        return None
    flat, treedef = jtu.tree_flatten(v, is_leaf=_is_module_value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0] is v:
        return (STATIC, t, typed(v))
    if mutable is not None:
        mutable.append(v)
    return (TREE, treedef, tuple([node(x, leaves, mutable) for x in flat]))


# A large tuple of static values (a lookup table passed as an argument) is keyed
# once per object: its key holds no traced leaf and nothing mutable, so it is the
# same on every call while the tuple lives (kept here, so its id is not reused).
_BIG: Final = 64
_big_tuples: Final[dict[int, tuple]] = {}


class _HashOnce(tuple):
    """The children of a large key node: hashed once, not on every look-up."""

    def __hash__(self) -> int:
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = tuple.__hash__(self)
        return h


def _big_tuple(v: tuple, leaves: list, mutable: list | None) -> Any:
    start, inner = len(leaves), []
    n = (SEQ, tuple, _HashOnce([node(x, leaves, inner) for x in v]))
    if mutable is not None:
        mutable += inner
    if len(leaves) == start and not inner:
        if len(_big_tuples) >= 64:
            _big_tuples.clear()
        _big_tuples[id(v)] = (v, n)
    return n


def _is_module_value(x: Any) -> bool:
    return (_kinds.get(type(x)) or kind_of(type(x))) is _MOD


def _extras(d: dict, p: FieldInfo) -> tuple | None:
    # As in Equinox's flatten: the wrapper attributes of `eqx.module_update_wrapper`
    # are part of the structure; anything else (a cached property) is not.
    out = tuple(
        (k, typed(d[k]) if hashable(d[k]) else _ByEq(d[k]))
        for k in WRAPPER_FIELD_NAMES
        if k in d
    )
    return out or None


class _ByEq:
    """An unhashable bookkeeping attribute of a module (a wrapper's
    `__annotations__` dict): compared with `==`, as Equinox's treedef compares it."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not _ByEq:
            return False
        try:
            return other.value is self.value or bool(other.value == self.value)
        except Exception:
            return False

    def __hash__(self) -> int:
        return hash(type(self.value))


def hashable(v: object) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def value_of(s: Any) -> Any:
    """The Python value of a static entry of a key."""
    return s.value if type(s) is Typed or type(s) is _ByEq else s


# ----------------------------------------------------------------------------------
# Rebuilding the arguments from a key and the traced leaves.


def build_call(key: tuple, leaves: Sequence) -> tuple[tuple, dict[str, Any]]:
    it = iter(leaves)
    args, names, kw = key
    return (
        tuple([build(n, it) for n in args]),
        {k: build(n, it) for k, n in zip(names, kw)},
    )


def build(n: Any, it: Iterator) -> Any:
    if n is LEAF:
        return next(it)
    if n is None:
        return None
    tag = n[0]
    if tag == MODULE:
        _, cls, statics, children, extras, _ = n
        p = plan(cls)
        obj = object.__new__(cls)
        d = instance_dict(obj)
        values = dict(zip(p.static_names, map(value_of, statics)))
        values.update(zip(p.dynamic_names, [build(c, it) for c in children]))
        # Declaration order, as Equinox's unflatten; unset fields stay unset.
        d.update((k, values[k]) for k in p.names if values[k] is not MISSING)
        if extras is not None:
            d.update((k, value_of(v)) for k, v in extras)
        return obj
    if tag == LEAVES:
        items = [next(it) for _ in range(n[2])]
        return items if n[1] is list else n[1](items)
    if tag == SEQ:
        return n[1]([build(c, it) for c in n[2]])
    if tag == TREE:
        return n[1].unflatten([build(c, it) for c in n[2]])
    return value_of(n[2])


def children_of(n: Any) -> tuple:
    """The child nodes of a SEQ, TREE or LEAVES node."""
    return (LEAF,) * n[2] if n[0] == LEAVES else n[2]
