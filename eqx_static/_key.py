"""The compile key: the one description of a call that everything else reads.

`es.jit` partitions a call exactly as `eqx.filter_jit` does: every leaf for which
`eqx.is_array` holds is traced, every other leaf is static. A `Key` mirrors the
call's arguments as a tree of hashable nodes:

- `LEAF`, a traced array: its shape, dtype, weak type and sharding are checked by
  `jax.jit`'s own dispatch, not held here;
- `ModuleNode`: an `eqx.Module`, with its class, its static field values compared
  by type and value (`_typed.py`), the nodes of its dynamic fields, and Equinox's
  wrapper attributes when its dictionary holds other than exactly its fields;
- `SeqNode`, `ArraysNode`, `DictNode`: a plain tuple or list, one holding only
  arrays, a plain dict (keys sorted, as JAX sorts them);
- `TreeNode`: any other pytree node (a named tuple, a registered class), one level;
- `StaticNode`: a leaf that is not an array, compared by type and value; `None`.

Every node's first field is its kind, so nodes of two kinds never compare equal.
`build` turns a key and the traced leaves back into the arguments; `walk` visits a
key's nodes with their paths, for the explanations.
"""

import functools
import operator
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from ._compat import EQX_MISSING, initialising_ids, WRAPPER_FIELD_NAMES
from ._fields import field_info, FieldInfo, infos, instance_dict, is_module_type
from ._typed import ByEq, forget, SIMPLE, static_value, typed, UNSET, value_of


class Kind:
    """The first field of every node: what kind of node it is."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


MODULE, SEQ, ARRAYS, DICT, TREE, STATIC = map(
    Kind, ("module", "sequence", "arrays", "dict", "pytree", "static")
)


class _Leaf:
    __slots__ = ()

    def __repr__(self) -> str:
        return "·"


LEAF: Final = _Leaf()


class ModuleNode(NamedTuple):
    kind: Kind
    cls: type
    statics: tuple  # the static field values, in declaration order, as keys
    static_types: tuple  # and their types: `1` and `True` are equal as values
    children: tuple  # the nodes of the dynamic fields, in declaration order
    wrapper: tuple | None  # Equinox's wrapper attributes (see `_wrapper`)


class SeqNode(NamedTuple):
    kind: Kind
    type: type  # tuple or list
    children: tuple


class ArraysNode(NamedTuple):
    kind: Kind
    type: type  # tuple or list
    n: int  # of arrays, each a traced leaf


class DictNode(NamedTuple):
    kind: Kind
    keys: tuple  # sorted, as JAX flattens a dict
    children: tuple


class TreeNode(NamedTuple):
    kind: Kind
    treedef: Any  # one level: its leaves are the children
    children: tuple


class StaticNode(NamedTuple):
    kind: Kind
    type: type
    value: Any  # typed: compared by type and value


class Key(NamedTuple):
    args: tuple  # a node per positional argument
    names: tuple[str, ...]  # the keyword arguments' names, sorted
    kwargs: tuple  # and their nodes


_new: Final = tuple.__new__  # a node without the named tuple's Python `__new__`

# What `eqx.is_array` accepts: these leaves are traced, everything else is static.
# (A tracer is a `jax.Array` to `isinstance`, not to `issubclass`.)
ARRAY_TYPES: Final = (jax.Array, np.ndarray, np.generic, Tracer)


def plan(cls: type) -> FieldInfo:
    """The field facts of a module class (`infos.get` first: this is hot)."""
    return infos.get(cls) or field_info(cls)


# ----------------------------------------------------------------------------------
# Making a key.


_ARR, _MOD, _SEQ, _DICT, _NONE, _OTHER = range(1, 7)
_kinds: Final[dict[type, int]] = {}
array_types: Final[set[type]] = set()  # the concrete array types seen so far


def kind_of(t: type) -> int:
    """How to key a value of type `t` (cached: `isinstance` on ABCs is slow)."""
    k = _kinds.get(t)
    if k is not None:
        return k
    if is_module_type(t):
        k = _MOD
    elif issubclass(t, ARRAY_TYPES):
        k = _ARR
        array_types.add(t)
    elif t is tuple or t is list:
        k = _SEQ
    elif t is dict:
        k = _DICT
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


def make_key(args: tuple, kwargs: dict[str, Any], leaves: list) -> Key:
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
        kw = tuple([node(kwargs[k], leaves) for k in names])
        return _new(Key, (tuple(nodes), names, kw))
    return _new(Key, (tuple(nodes), (), ()))


def key_and_leaves(args: tuple, kwargs: dict[str, Any], first: tuple) -> tuple:
    """The key of a call and its traced leaves, after the leaves `first`; at any
    depth of nesting (see `deep`)."""

    def attempt(args: tuple, kwargs: dict[str, Any]) -> tuple:
        leaves = [*first]
        return make_key(args, kwargs, leaves), leaves

    return deep(attempt, args, kwargs)


def node(v: Any, leaves: list, mutable: list | None = None, depth: int = 0) -> Any:
    """The key of `v`, `depth` levels down. Appends to `mutable` if `v` holds a
    list, dict or other pytree that could change after the call."""
    t = type(v)
    kind = _kinds.get(t) or kind_of(t)
    if kind is _ARR:
        leaves.append(v)
        return LEAF
    if kind is _MOD:
        return _module_node(v, t, leaves, mutable, depth)
    if kind is _SEQ:
        if t is list and mutable is not None:
            mutable.append(v)
        if t is tuple and len(v) >= _BIG and (hit := _big_tuples.get(id(v))):
            if hit[0] is v:
                return hit[1]
        if array_types_only(v):
            leaves += v
            return _new(ArraysNode, (ARRAYS, t, len(v)))
        if t is tuple and len(v) >= _BIG:
            return _big_tuple(v, leaves, mutable, depth)
        children = tuple([node(x, leaves, mutable, depth + 1) for x in v])
        return _new(SeqNode, (SEQ, t, children))
    if kind is _NONE:
        return None
    if kind is _DICT:
        try:
            keys = tuple(sorted(v))
        except TypeError:  # keys that do not sort: JAX's flatten says so
            return _tree_node(v, t, leaves, mutable, depth)
        if mutable is not None:
            mutable.append(v)
        values = [v[k] for k in keys]
        children = tuple([node(x, leaves, mutable, depth + 1) for x in values])
        return _new(DictNode, (DICT, keys, children))
    return _tree_node(v, t, leaves, mutable, depth)


def _module_node(v: Any, t: type, leaves: list, mutable: list | None, depth: int):
    p = infos.get(t) or field_info(t)
    d = instance_dict(v)
    if _being_made and id(v) in _being_made and mutable is not None:
        mutable.append(v)  # still being initialised or edited: never memoised
    try:
        statics = p.get_static(d)
        dynamic = p.get_dynamic(d)
    except KeyError:  # a field not set (yet), as Equinox allows
        statics = tuple([d.get(k, UNSET) for k in p.static_names])
        dynamic = tuple([d.get(k, UNSET) for k in p.dynamic_names])
    types = tuple(map(type, statics))
    if not SIMPLE.issuperset(types):
        statics = tuple(map(static_value, statics))
        if mutable is not None and any(type(s) is ByEq for s in statics):
            mutable.append(v)  # a list in a static field may change: no memo
    if array_types_only(dynamic):
        leaves += dynamic
        children = _leaf_runs.get(len(dynamic)) or _leaf_run(len(dynamic))
    else:
        children = tuple([node(x, leaves, mutable, depth + 1) for x in dynamic])
    wrapper = None if len(d) == len(p.names) else _wrapper(d)
    return _new(ModuleNode, (MODULE, t, statics, types, children, wrapper))


_leaf_runs: Final[dict[int, tuple]] = {}


def _leaf_run(n: int) -> tuple:
    """`(LEAF,) * n`, made once per `n`: the children of a module of arrays."""
    run = _leaf_runs[n] = (LEAF,) * n
    return run


def _wrapper(d: dict) -> tuple:
    """As in Equinox's flatten, for a module whose dictionary does not hold exactly
    its fields: the wrapper attributes (`eqx.module_update_wrapper`), Equinox's
    `MISSING` where absent. So a module whose `__init__` left a field unset keys
    the same before and after a `jax.tree.map` (whose unflatten sets them all)."""
    return tuple([static_value(d.get(k, EQX_MISSING)) for k in WRAPPER_FIELD_NAMES])


def _tree_node(v: Any, t: type, leaves: list, mutable: list | None, depth: int):
    if depth > _max_depth[0]:  # never near the recursion limit inside JAX's C++
        raise RecursionError("es.jit: nested too deep for this recursion limit")
    flat, treedef = one_level(v)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0] is v:
        return _new(StaticNode, (STATIC, t, typed(v)))
    if mutable is not None:
        mutable.append(v)
    children = tuple([node(x, leaves, mutable, depth + 1) for x in flat])
    return _new(TreeNode, (TREE, treedef, children))


def one_level(v: Any) -> tuple[list, Any]:
    """The children of the pytree node `v` and its structure, one level deep: the
    walk below recurses in Python, where a value that contains itself, or is
    nested too deep, raises a clean `RecursionError`. (Raised inside JAX's C++
    flatten, while it calls `is_leaf`, it leaves the interpreter unusable: so the
    flatten is one level, and `_tree_node` stops well before the limit.)"""
    return jtu.tree_flatten(v, is_leaf=functools.partial(operator.is_not, v))


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


def _big_tuple(v: tuple, leaves: list, mutable: list | None, depth: int) -> Any:
    start, inner = len(leaves), []
    children = _HashOnce([node(x, leaves, inner, depth + 1) for x in v])
    n = _new(SeqNode, (SEQ, tuple, children))
    if mutable is not None:
        mutable += inner
    if len(leaves) == start and not inner:
        if len(_big_tuples) >= 64:
            _big_tuples.clear()
        _big_tuples[id(v)] = (v, n)
    return n


# ----------------------------------------------------------------------------------
# Deep nesting, and values that contain themselves.


_max_depth: Final = [sys.getrecursionlimit() // 4]  # levels before `_tree_node` stops


def deep(f: Callable[..., Any], *args: Any) -> Any:
    """`f(*args)`, again with a higher recursion limit if it ran out: the walks of
    a key recurse once per level of nesting, and JAX's own flatten, in C++, has no
    such limit. (Python 3.11+ calls between Python functions use no C stack.) A
    value that contains itself has no end to walk: `CyclicValue` says where."""
    try:
        return f(*args)
    except RecursionError:
        path = cycle_in(args)
        if path is not None:
            raise CyclicValue(path) from None
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 100_000))
        _max_depth[0] = sys.getrecursionlimit() // 4
        try:
            return f(*args)
        finally:
            sys.setrecursionlimit(limit)
            _max_depth[0] = limit // 4


class CyclicValue(ValueError):  # noqa: N818  (caught and reworded, never shown)
    """A value contains itself. `path` is where, from the values walked: `[i]`
    for the i-th of them, then `[key]` and `.field` down to the repeat."""

    def __init__(self, path: str):
        super().__init__(f"a value contains itself, at {path}")
        self.path = path


def cycle_in(root: Any) -> str | None:
    """The path to the first value found inside itself, or None: containers,
    modules (by field) and other pytrees, walked once each, iteratively."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(root, "", False)]
    while stack:
        v, path, leaving = stack.pop()
        if leaving:
            on_path.discard(id(v))
            done.add(id(v))
            continue
        if id(v) in on_path:
            return path
        children = _children(v)
        if not children or id(v) in done:
            continue
        on_path.add(id(v))
        stack.append((v, path, True))
        stack.extend((c, f"{path}{seg}", False) for seg, c in reversed(children))
    return None


def _children(v: Any) -> list[tuple[str, Any]]:
    t = type(v)
    kind = _kinds.get(t) or kind_of(t)
    if kind is _SEQ:
        return [(f"[{i}]", x) for i, x in enumerate(v)]
    if kind is _DICT:
        return [(f"[{k!r}]", x) for k, x in v.items()]
    if kind is _MOD:
        return [(f".{k}", x) for k, x in instance_dict(v).items()]
    if kind is not _OTHER:
        return []
    try:
        flat = one_level(v)[0]
    except Exception:  # not a pytree JAX can open one level of
        return []
    if len(flat) == 1 and flat[0] is v:
        return []
    return [(f"[{i}]", x) for i, x in enumerate(flat)]


# ----------------------------------------------------------------------------------
# The per-instance memo.
#
# A module is frozen, so its key and leaves are computed once per instance and kept
# while the instance lives: `id` -> (weak reference, key, leaves). It serves a loop
# that calls one model again and again (inference); a training loop makes a new
# module every step and gains nothing. Instances whose key could change (holding a
# list, a dict or another mutable pytree; made while a module is being initialised
# or edited) are never memoised. A key holds the module's static values; one that
# refers back to the module (a callable field) keeps it alive until the memo is
# emptied: at `_MEMO_MAX` entries, or by `cache_clear()`.

_memo: Final[dict[int, tuple]] = {}
_MEMO_MAX: Final = 4096
_being_made: Final = (
    initialising_ids  # Equinox's modules being made, `es.edit`'s copies
)


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
    _big_tuples.clear()
    forget()


# ----------------------------------------------------------------------------------
# Rebuilding the arguments from a key and the traced leaves.


def build_call(key: Key, leaves: Sequence) -> tuple[tuple, dict[str, Any]]:
    it = iter(leaves)
    return (
        tuple([build(n, it) for n in key.args]),
        {k: build(n, it) for k, n in zip(key.names, key.kwargs)},
    )


def build(n: Any, it: Iterator) -> Any:
    if n is LEAF:
        return next(it)
    if n is None:
        return None
    kind = n[0]
    if kind is MODULE:
        return _build_module(n, it)
    if kind is ARRAYS:
        items = [next(it) for _ in range(n.n)]
        return items if n.type is list else tuple(items)
    if kind is SEQ:
        return n.type([build(c, it) for c in n.children])
    if kind is DICT:
        return dict(zip(n.keys, [build(c, it) for c in n.children]))
    if kind is TREE:
        return n.treedef.unflatten([build(c, it) for c in n.children])
    return value_of(n.value)


def _build_module(n: ModuleNode, it: Iterator) -> Any:
    p = plan(n.cls)
    obj = object.__new__(n.cls)
    d = instance_dict(obj)
    # In the order of Equinox's unflatten: dynamic fields, the wrapper attributes
    # if the key holds them, static fields; unset fields stay unset.
    dynamic = [build(c, it) for c in n.children]
    d.update((k, v) for k, v in zip(p.dynamic_names, dynamic) if v is not UNSET)
    if n.wrapper is not None:
        d.update(zip(WRAPPER_FIELD_NAMES, map(value_of, n.wrapper)))
    statics = zip(p.static_names, n.statics)
    d.update((k, value_of(v)) for k, v in statics if v is not UNSET)
    return obj


# ----------------------------------------------------------------------------------
# Walking a key.


class Visit(NamedTuple):
    """A node of a key, where it is, and the module field it belongs to."""

    path: str  # printable: `x`, `self.encoder.w`, `y['a'][0]`
    node: Any
    cls: type | None  # the class of the nearest module holding it, if any
    field: str | None  # and the field of that module
    parent: str | None  # the path of the node above (None for an argument)


def walk(key: Key, argnames: Sequence[str]) -> Iterator[Visit]:
    """Every node of `key`, parents first, in key order: traced leaves come in the
    order of the call's leaves."""
    tops = [(n, argname(argnames, i)) for i, n in enumerate(key.args)]
    tops += list(zip(key.kwargs, key.names))
    stack = [Visit(path, n, None, None, None) for n, path in reversed(tops)]
    while stack:
        visit = stack.pop()
        yield visit
        stack += reversed(list(_below(visit)))


def _below(v: Visit) -> Iterator[Visit]:
    n = v.node
    if n is LEAF or n is None:
        return
    kind = n[0]
    if kind is MODULE:
        for name, child in zip(plan(n.cls).dynamic_names, n.children):
            yield Visit(f"{v.path}.{name}", child, n.cls, name, v.path)
    elif kind is ARRAYS:
        for i in range(n.n):
            yield Visit(f"{v.path}[{i}]", LEAF, v.cls, v.field, v.path)
    elif kind is DICT:
        for k, child in zip(n.keys, n.children):
            yield Visit(f"{v.path}[{k!r}]", child, v.cls, v.field, v.path)
    elif kind is SEQ or kind is TREE:
        for i, child in enumerate(n.children):
            yield Visit(f"{v.path}[{i}]", child, v.cls, v.field, v.path)


def argname(argnames: Sequence[str], i: int) -> str:
    return argnames[i] if i < len(argnames) else f"args[{i}]"
