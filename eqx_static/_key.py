"""The compile key: the one description of a call that the cache, the explanations
and the budget read. The leaves for which `eqx.is_array` holds are traced, as under
`eqx.filter_jit`; everything else is keyed by type *and* value (`1`, `True`, `1.0`
are three keys; so are `0.0` and `-0.0`) at any depth, pytree metadata included.

Nodes (traced leaves are listed apart): `LEAF`, a traced array (`jax.jit` checks its
aval and sharding); a module, `(cls, statics, static_types, children, wrapper)`,
`children` a count when all dynamic fields are traced; `(SEQ, type, children)`,
`(ARRAYS, type, n)`, `(NAMED, type, children)`, `(DICT, keys, key_types, children)`,
`(TREE, treedef, aux, children)`, `(STATIC, type, value)`; `None`.
"""

import functools
import math
import operator
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from . import _compat as jx
from ._module import field_info, instance_dict, is_module_type, UNSET


# ----------------------------------------------------------------------------------
# Static values, compared by type and value.

# Value types whose `==` already tells types apart from each other's values.
SIMPLE: Final = frozenset({bool, int, str, bytes, type(None), type})


class Typed:
    """A hashable static value as a key: compared by its `form`, hashed once."""

    __slots__ = ("_hash", "form", "value")

    def __init__(self, value: Any, form: Any):
        self.value, self.form = value, form
        try:
            self._hash: int | None = hash(form)
        except TypeError:  # `static_value` compares it with `==` instead
            self._hash = None

    def __eq__(self, other: object) -> bool:
        if type(other) is not Typed or self._hash != other._hash:
            return False
        try:
            return bool(self.form == other.form)
        except Exception:  # an `__eq__` that raises: unequal
            return False

    def __hash__(self) -> int:
        if self._hash is None:
            raise TypeError(f"unhashable static value: {type(self.value).__name__}")
        return self._hash

    def __repr__(self) -> str:
        return repr(self.value)


class ByEq:
    """An unhashable static value of an `eqx.Module`: compared with `==`, as Equinox
    compares it."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not ByEq:
            return False
        try:
            return other.value is self.value or bool(other.value == self.value)
        except Exception:
            return False

    def __hash__(self) -> int:
        return hash(type(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


_typed_memo: Final[dict[int, Typed]] = {}


def typed(v: Any) -> Any:
    """`v` as a key: itself if `SIMPLE`, else a `Typed`, made once per recent object
    (the memo keeps it alive, so its id is safe)."""
    if type(v) in SIMPLE:
        return v
    hit = _typed_memo.get(id(v))
    if hit is not None and hit.value is v:
        return hit
    out = Typed(v, (type(v), form(v)))
    if len(_typed_memo) >= 4096:
        _typed_memo.clear()
    _typed_memo[id(v)] = out
    return out


def static_value(v: Any) -> Any:
    """A module's static value as a key: typed if hashable, else compared by `==`."""
    if type(v) in SIMPLE:
        return v
    key = typed(v)
    return key if key._hash is not None else ByEq(v)


def is_hashable(v: object) -> bool:
    return type(v) in SIMPLE or typed(v)._hash is not None


def value_of(s: Any) -> Any:
    """The Python value of a static entry of a key."""
    return s.value if type(s) is Typed or type(s) is ByEq else s


def form(v: Any) -> Any:
    """What `v` is compared by, with its type: floats by their bits (every nan one
    value, its sign kept); tuples, frozensets, treedefs, dataclasses and modules with
    the generated `__eq__` item by item; anything else by its own `__eq__`."""
    t = type(v)
    if t in SIMPLE:
        return v
    if t is float:
        if math.isnan(v):
            return "-nan" if math.copysign(1.0, v) < 0 else "nan"
        return v.hex()
    if t is complex:
        return (form(v.real), form(v.imag))
    if isinstance(v, np.generic):
        return (v.dtype.str, v.tobytes())
    if t is jtu.PyTreeDef:  # its own `==` compares metadata with `==`: 0.0 == -0.0
        data = v.node_data()
        here = None if data is None else (data[0], type(data[1]), form(data[1]))
        return (v.num_leaves, here, tuple(map(form, v.children())))
    if t is tuple or (isinstance(v, tuple) and _default_eq(t)):
        return tuple([(type(x), form(x)) for x in v])
    if t is frozenset:
        return frozenset([(type(x), form(x)) for x in v])
    fields = getattr(t, "__dataclass_fields__", None)
    if fields is not None and (
        t.__eq__ is jx.module_eq or jx.generated_dataclass_eq(t)
    ):
        d = getattr(v, "__dict__", None)
        if d is not None:
            items = [(k, d.get(k, UNSET)) for k in fields]
            return tuple([(k, type(x), form(x)) for k, x in items])
    return v


def _default_eq(t: type) -> bool:
    return t.__eq__ is tuple.__eq__ and t.__hash__ is tuple.__hash__


# ----------------------------------------------------------------------------------
# Making a key.


class Kind:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


LEAF: Final = Kind("·")
SEQ, ARRAYS, NAMED, DICT, TREE, STATIC = map(
    Kind, ("sequence", "arrays", "named tuple", "dict", "pytree", "static")
)

# What `eqx.is_array` accepts. (A tracer is a `jax.Array` to `isinstance` only.)
ARRAY_TYPES: Final = (jax.Array, np.ndarray, np.generic, Tracer)
array_types: Final[set[type]] = set()  # the concrete array types seen so far

Walker = Callable[[Any, list, int], Any]  # (value, leaves, depth) -> node
_walkers: Final[dict[type, Walker]] = {}


def node(v: Any, leaves: list, depth: int = 0) -> Any:
    """The key node of `v`; appends its traced leaves to `leaves`."""
    t = type(v)
    return (_walkers.get(t) or _walker(t, v))(v, leaves, depth)


def _walker(t: type, v: Any) -> Walker:
    """How to key values of type `t` (`v` is one), decided once per type."""
    w = _walkers.get(t)
    if w is not None:
        return w
    if is_module_type(t):
        w = _module_walker(t)
    elif issubclass(t, ARRAY_TYPES):
        array_types.add(t)
        w = _leaf
    elif t is tuple or t is list:
        w = _seq
    elif t is dict:
        w = _dict
    elif t is type(None):
        w = _none
    elif issubclass(t, tuple) and one_level(v)[1].node_data() == (t, None):
        w = _named  # a named tuple, which JAX flattens as its items
    else:
        w = _other
    _walkers[t] = w
    return w


def _leaf(v: Any, leaves: list, depth: int) -> Any:
    leaves.append(v)
    return LEAF


def _none(v: Any, leaves: list, depth: int) -> Any:
    return None


def all_arrays(values: Any) -> bool:
    """Whether every value is an array (in C when their types were seen before)."""
    if array_types.issuperset(map(type, values)):
        return True
    return all(_walker(type(x), x) is _leaf for x in values)


# A large tuple of static values (a lookup table passed as an argument) is keyed
# once per object: its node holds no traced leaf and nothing mutable, so it is the
# same while the tuple lives (kept here, so that its id is not reused).
_BIG: Final = 64
_big_tuples: Final[dict[int, tuple]] = {}


def _seq(v: Any, leaves: list, depth: int) -> Any:
    if all_arrays(v):
        leaves += v
        return (ARRAYS, type(v), len(v))
    if type(v) is tuple and len(v) >= _BIG:
        hit = _big_tuples.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        start = len(leaves)
        n = (SEQ, tuple, tuple([node(x, leaves, depth + 1) for x in v]))
        if len(leaves) == start and _memoisable(v):
            if len(_big_tuples) >= 64:
                _big_tuples.clear()
            _big_tuples[id(v)] = (v, n)
        return n
    return (SEQ, type(v), tuple([node(x, leaves, depth + 1) for x in v]))


def _named(v: Any, leaves: list, depth: int) -> Any:
    return (NAMED, type(v), tuple([node(x, leaves, depth + 1) for x in v]))


def _dict(v: dict, leaves: list, depth: int) -> Any:
    try:
        keys = tuple(sorted(v))  # as JAX flattens a dict
    except TypeError:  # keys that do not sort: JAX's flatten says so
        return _other(v, leaves, depth)
    children = tuple([node(v[k], leaves, depth + 1) for k in keys])
    # The keys' types, or their typed forms if a type's `==` does not tell types apart.
    types = tuple(map(type, keys))
    if not SIMPLE.issuperset(types):
        types = Typed(keys, (tuple, form(keys)))
    return (DICT, keys, types, children)


def _other(v: Any, leaves: list, depth: int) -> Any:
    """A pytree node, one level at a time, its metadata typed; or a static leaf."""
    if depth > _max_depth[0]:  # never near the recursion limit inside JAX's C++
        raise RecursionError("es.jit: nested too deep for this recursion limit")
    flat, treedef = one_level(v)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0] is v:
        return (STATIC, type(v), typed(v))
    data = treedef.node_data()
    aux = None if data is None else typed(data[1])
    return (TREE, treedef, aux, tuple([node(x, leaves, depth + 1) for x in flat]))


def one_level(v: Any) -> tuple[list, Any]:
    """The children of pytree node `v` and its treedef. (Walked in Python, a value
    that contains itself raises `RecursionError`; in JAX's C++ it would not.)"""
    return jtu.tree_flatten(v, is_leaf=functools.partial(operator.is_not, v))


def _module_walker(cls: type) -> Walker:
    """A module class's walker, generated as Equinox generates its flatten (half the
    time of the generic walk, which takes any case it does not, to the same node)."""
    info = field_info(cls)
    slow = _generic_walker(cls)
    names = [*info.dynamic_names, *info.static_names]
    if not names or len(names) > 32:  # a very wide class: the C getters win
        return slow
    dynamic = [f"d{i}" for i in range(len(info.dynamic_names))]
    static = [f"s{i}" for i in range(len(info.static_names))]
    tests = [f"type({d}) in AT" for d in dynamic]
    tests += [f"type({s}) in SIMPLE" for s in static]
    node_ = "PLAIN"
    if static:
        types = ", ".join(f"type({s})" for s in static)
        node_ = f"(cls, ({', '.join(static)},), ({types},), {len(dynamic)}, None)"
    source = f"""
def walk(v, leaves, depth):
    d = get_dict(v)
    if len(d) == {len(names)}:
        try:
            ({", ".join([*dynamic, *static])},) = ({", ".join(f"d[{k!r}]" for k in names)},)
        except KeyError:
            return slow(v, leaves, depth)
        if {" and ".join(tests)}:
            {f"leaves += ({', '.join(dynamic)},)" if dynamic else "pass"}
            return {node_}
    return slow(v, leaves, depth)
"""
    namespace = {"get_dict": instance_dict, "AT": array_types, "SIMPLE": SIMPLE}
    namespace.update(slow=slow, cls=cls, PLAIN=(cls, (), (), len(dynamic), None))
    exec(compile(source, f"<es.jit key walk of {cls.__qualname__}>", "exec"), namespace)
    return namespace["walk"]


def _generic_walker(cls: type) -> Walker:
    info = field_info(cls)
    get_dynamic, get_static = info.get_dynamic, info.get_static
    n_fields, n_dynamic = len(info.names), len(info.dynamic_names)
    plain = (cls, (), (), n_dynamic, None)

    def walk(v: Any, leaves: list, depth: int) -> Any:
        d = instance_dict(v)
        try:
            if len(d) != n_fields:
                raise KeyError
            dynamic, statics = get_dynamic(d), get_static(d)
            wrapper = None
        except KeyError:  # unset fields, wrapper attributes, cached properties
            dynamic = tuple([d.get(k, UNSET) for k in info.dynamic_names])
            statics = tuple([d.get(k, UNSET) for k in info.static_names])
            wrapper = None
            if len(d) != n_fields:  # as Equinox flattens it: `MISSING` where absent
                w = [d.get(k, jx.EQX_MISSING) for k in jx.WRAPPER_FIELD_NAMES]
                wrapper = tuple(map(static_value, w))
        if all_arrays(dynamic):
            leaves += dynamic
            children: Any = n_dynamic
            if not statics and wrapper is None:
                return plain
        else:
            children = tuple([node(x, leaves, depth + 1) for x in dynamic])
        types = tuple(map(type, statics))
        if not SIMPLE.issuperset(types):
            statics = tuple(map(static_value, statics))
        return (cls, statics, types, children, wrapper)

    return walk


class Key(NamedTuple):
    args: tuple  # a node per positional argument
    names: tuple[str, ...]  # the keyword arguments' names, sorted
    kwargs: tuple  # and their nodes


def key_and_leaves(args: tuple, kwargs: dict[str, Any], first: tuple) -> tuple:
    """The key of a call and its traced leaves, after `first` (under `deep`)."""
    leaves = [*first]
    nodes = []
    for a in args:
        if type(a) in array_types:
            leaves.append(a)
            nodes.append(LEAF)
        else:
            nodes.append(node(a, leaves))
    if not kwargs:
        return tuple.__new__(Key, (tuple(nodes), (), ())), leaves
    names = tuple(sorted(kwargs))
    kw = tuple([node(kwargs[k], leaves) for k in names])
    return tuple.__new__(Key, (tuple(nodes), names, kw)), leaves


# ----------------------------------------------------------------------------------
# The per-instance memo: a module called again keys in one look-up. A frozen module's
# node and leaves stay the same while it lives, unless it holds something mutable (a
# list, a dict, another pytree, an unhashable static value) or is being initialised
# or edited: never memoised. It is memoised the second time in a row it is seen, so
# that a loop making a new module every step pays nothing for the memo.

_memo: Final[dict[int, tuple]] = {}
_last: Final[list[Callable[[], Any]]] = [lambda: None]  # the module keyed last


def top_node(v: Any, leaves: list) -> Any:
    """The node of a method call's `self`: from the memo for a module seen before."""
    e = _memo.get(id(v))
    if e is not None and e[0]() is v:
        leaves += e[2]
        return e[1]
    start = len(leaves)
    n = node(v, leaves)
    if not is_module_type(type(v)):
        return n
    if _last[0]() is not v:
        _last[0] = weakref.ref(v)
    elif _memoisable(v):  # the second call in a row: memoise it
        if len(_memo) >= 4096:
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


def _memoisable(root: Any) -> bool:
    """Whether `root`'s key cannot change while it lives: only modules, tuples,
    arrays and hashable static values below it, and no module being initialised."""
    stack = [root]
    while stack:
        v = stack.pop()
        t = type(v)
        w = _walker(t, v)
        if w is _leaf or w is _none:
            continue
        if w is _seq and t is tuple:
            stack += v
        elif is_module_type(t):
            d, info = instance_dict(v), field_info(t)
            if id(v) in jx.initialising_ids or not all(
                is_hashable(d.get(k)) for k in info.static_names
            ):
                return False
            stack += [d.get(k) for k in info.dynamic_names]
        elif w is not _other or one_level(v)[1].num_nodes != 1:
            return False  # a list, a dict or another pytree: may change in place
    return True


def forget_all() -> None:
    """Drop every memoised key and typed form (they hold static values)."""
    _memo.clear()
    _typed_memo.clear()
    _big_tuples.clear()


# ----------------------------------------------------------------------------------
# Deep nesting, and values that contain themselves.

_max_depth: Final = [sys.getrecursionlimit() // 4]


def deep(f: Callable[..., Any], *args: Any) -> Any:
    """`f(*args)`, again with a higher recursion limit if it ran out (JAX's C++ has
    none); `CyclicValue` if a value contains itself."""
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
    """A value contains itself, at `path` (`[i]` for the i-th value walked, then
    `[key]` and `.field` down to the repeat)."""

    def __init__(self, path: str):
        super().__init__(f"a value contains itself, at {path}")
        self.path = path


def cycle_in(root: Any) -> str | None:
    """The path to the first value found inside itself, or None."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(root, "", False)]
    while stack:
        v, path, leaving = stack.pop()
        if leaving:
            on_path.discard(id(v))
            done.add(id(v))
        elif id(v) in on_path:
            return path
        elif id(v) not in done and (children := _children(v)):
            on_path.add(id(v))
            stack.append((v, path, True))
            stack += [(c, f"{path}{seg}", False) for seg, c in reversed(children)]
    return None


def _children(v: Any) -> list[tuple[str, Any]]:
    t = type(v)
    if t is tuple or t is list:
        return [(f"[{i}]", x) for i, x in enumerate(v)]
    if t is dict:
        return [(f"[{k!r}]", x) for k, x in v.items()]
    if is_module_type(t):
        return [(f".{k}", x) for k, x in instance_dict(v).items()]
    if _walker(t, v) is not _other:
        return []
    try:
        flat = one_level(v)[0]
    except Exception:  # not a pytree JAX can open one level of
        return []
    if len(flat) == 1 and flat[0] is v:
        return []
    return [(f"[{i}]", x) for i, x in enumerate(flat)]


# ----------------------------------------------------------------------------------
# Rebuilding the arguments from a key and the traced leaves.


def build_call(key: Key, leaves: Sequence) -> tuple[tuple, dict[str, Any]]:
    it = iter(leaves)
    args = tuple([build(n, it) for n in key.args])
    return args, {k: build(n, it) for k, n in zip(key.names, key.kwargs)}


def build(n: Any, it: Iterator) -> Any:
    if n is LEAF:
        return next(it)
    if n is None:
        return None
    kind = n[0]
    if kind is SEQ:
        return n[1]([build(c, it) for c in n[2]])
    if kind is ARRAYS:
        items = [next(it) for _ in range(n[2])]
        return items if n[1] is list else tuple(items)
    if kind is NAMED:
        return n[1](*[build(c, it) for c in n[2]])
    if kind is DICT:
        return dict(zip(n[1], [build(c, it) for c in n[3]]))
    if kind is TREE:
        return n[1].unflatten([build(c, it) for c in n[3]])
    if kind is STATIC:
        return value_of(n[2])
    # A module, in the order of Equinox's unflatten: dynamic fields, the wrapper
    # attributes if the key holds them, static fields; unset fields stay unset.
    cls, statics, _, children, wrapper = n
    info = field_info(cls)
    obj = object.__new__(cls)
    d = instance_dict(obj)
    if type(children) is int:
        d.update(zip(info.dynamic_names, [next(it) for _ in range(children)]))
    else:
        dynamic = [build(c, it) for c in children]
        d.update((k, v) for k, v in zip(info.dynamic_names, dynamic) if v is not UNSET)
    if wrapper is not None:
        d.update(zip(jx.WRAPPER_FIELD_NAMES, map(value_of, wrapper)))
    values = zip(info.static_names, map(value_of, statics))
    d.update((k, v) for k, v in values if v is not UNSET)
    return obj


# ----------------------------------------------------------------------------------
# Walking a key, for the explanations.


class Visit(NamedTuple):
    """A node of a key, where it is, and the module field it belongs to."""

    path: str  # printable: `x`, `self.encoder.w`, `y['a'][0]`
    node: Any
    cls: type | None  # the class of the nearest module holding it
    field: str | None  # and the field of that module
    parent: str | None  # the path of the node above (None for an argument)


def walk(key: Key, argnames: Sequence[str]) -> Iterator[Visit]:
    """Every node of `key`, parents first; traced leaves in the order of the call's."""
    tops = [(argname(argnames, i), n) for i, n in enumerate(key.args)]
    tops += zip(key.names, key.kwargs)
    stack = [Visit(path, n, None, None, None) for path, n in reversed(tops)]
    while stack:
        v = stack.pop()
        yield v
        stack += reversed(_below(v))


def _below(v: Visit) -> list[Visit]:
    n, path = v.node, v.path
    children = _child_nodes(n)
    if is_module_node(n):
        names = field_info(n[0]).dynamic_names
        return [Visit(f"{path}.{k}", c, n[0], k, path) for k, c in zip(names, children)]
    labels = n[1] if children and n[0] is DICT else range(len(children))
    return [
        Visit(f"{path}[{k!r}]", c, v.cls, v.field, path)
        for k, c in zip(labels, children)
    ]


def _child_nodes(n: Any) -> tuple:
    """The nodes right below `n` (traced leaves as `LEAF`)."""
    if n is LEAF or n is None or n[0] is STATIC:
        return ()
    children = n[3] if is_module_node(n) else n[2] if n[0] is ARRAYS else n[-1]
    return (LEAF,) * children if type(children) is int else children


def is_module_node(n: Any) -> bool:
    return type(n) is tuple and type(n[0]) is not Kind


def count_leaves(n: Any) -> int:
    """The number of traced leaves below the node `n`."""
    return 1 if n is LEAF else sum(map(count_leaves, _child_nodes(n)))


def argname(argnames: Sequence[str], i: int) -> str:
    return argnames[i] if i < len(argnames) else f"args[{i}]"
