"""The compile key: how a call's values become one (`key_and_leaves`, `Layout`),
and how it is read back, node by node (`node_at`, `steps`, `visits`).

A key is one flat tuple: the tokens of a call's values (the function's parameters
in order: `Layout`, which the key does not hold: each function has its own cache),
in preorder. Leaves for which `eqx.is_array` holds are traced (listed apart, in the
same order); every other leaf is a static token (`_fields.token`: by type and
value). A node is self-delimiting:

- `LEAF`, a traced array; `None`; `UNSET`, a field a module lacks;
- a module whose instance dictionary holds exactly its fields: its `FieldInfo`, a
  token per static field, then `ALL` if every dynamic field holds a traced array,
  or else a node per dynamic field; any other module: `(ODD, info, wrapper)`, a
  token per static field (`UNSET` if absent), a node per dynamic field;
- `(ARRAYS, type, n)`, a tuple or list of `n` traced arrays; `(SEQ, type, n)`,
  `(NAMED, type, n)`, `(DICT, key tokens, n)` and `(TREE, treedef, aux token)`,
  followed by their children.

Flat, the key hashes and compares without recursion, however deep the nesting.
`key_and_leaves` writes this grammar; `node_at`, `ends` and `steps` read it
back, for the explanations' paths (`visits`) and the guards' checks (`_guard`)
alike."""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

from ._fields import (
    all_arrays,
    cycle_in,
    field_info,
    field_token,
    FieldInfo,
    instance_dict,
    IS_ARRAY,
    IS_LIST,
    IS_MODULE,
    IS_NAMED,
    kind_of,
    kinds,
    one_level,
    Sentinel,
    token,
    UNSET,
    value_of,
)
from ._jax import EQX_MISSING, hide_frames, WRAPPER_FIELD_NAMES


hide_frames(__file__)

LEAF, ALL = Sentinel("·"), Sentinel("all traced")
ODD, ARRAYS, SEQ, NAMED, DICT, TREE = map(
    Sentinel, ("module", "arrays", "sequence", "named tuple", "dict", "pytree")
)

Key = tuple  # the tokens of a call's values, in preorder


class CyclicValue(ValueError):  # noqa: N818  (reworded by the caller, never shown)
    """A value contains itself, at `path`."""

    def __init__(self, path: str):
        super().__init__(f"a value contains itself, at {path}")
        self.path = path


_CHECK_CYCLES_AFTER: Final = 100_000  # tokens; then at twice as many, and so on


def key_and_leaves(values: tuple) -> tuple[Key, list]:
    """The key of a call's values (its parameters in order: `Layout`) and its
    traced leaves, in preorder (`UnhashableError`, `CyclicValue`)."""
    tokens: list[Any] = []
    leaves: list[Any] = []
    stack = list(values)[::-1]
    limit = _CHECK_CYCLES_AFTER
    while stack:
        v = stack.pop()
        t = type(v)
        k = kinds.get(t) or kind_of(t, v)  # no kind is 0
        if k == IS_ARRAY:
            tokens.append(LEAF)
            leaves.append(v)
        elif k == IS_MODULE:
            _module(v, field_info(t), tokens, leaves, stack)
        elif k == IS_LIST and all_arrays(v):
            tokens.append((ARRAYS, t, len(v)))
            leaves += v
        elif k == IS_LIST or k == IS_NAMED:
            tokens.append((SEQ if k == IS_LIST else NAMED, t, len(v)))
            stack += reversed(v)
        elif v is None:
            tokens.append(None)
        elif t is dict:
            try:
                keys = sorted(v)  # as JAX flattens a dict
            except TypeError:  # keys that do not sort: as JAX's flatten says
                _other(v, tokens, stack)
                continue
            tokens.append((DICT, tuple(map(token, keys)), len(keys)))
            stack += [v[key] for key in reversed(keys)]
        else:
            _other(v, tokens, stack)
        if len(tokens) > limit:  # so a finite walk checks at most twice its length
            if (path := cycle_in(list(values))) is not None:
                raise CyclicValue(path)
            limit = 2 * len(tokens)
    return tuple(tokens), leaves


def _module(v: Any, info: FieldInfo, tokens: list, leaves: list, stack: list) -> None:
    d = instance_dict(v)
    if len(d) == len(info.names):
        try:
            dynamic, statics = info.get_dynamic(d), info.get_static(d)
        except KeyError:
            pass
        else:
            tokens.append(info)
            tokens += map(field_token, statics)
            if all_arrays(dynamic):
                tokens.append(ALL)
                leaves += dynamic
            else:
                stack += reversed(dynamic)
            return
    # Unset fields, Equinox's wrapper attributes or a cached property: the
    # structure Equinox's flatten gives it (wrapper attributes, `MISSING` where
    # absent), `UNSET` for an absent field; or, not knowing those, JAX's flatten.
    if WRAPPER_FIELD_NAMES is None:  # pragma: no cover
        return _other(v, tokens, stack)
    wrapper = None
    if len(d) != len(info.names):
        wrapper = tuple(field_token(d.get(k, EQX_MISSING)) for k in WRAPPER_FIELD_NAMES)
    tokens.append((ODD, info, wrapper))
    tokens += [field_token(d[k]) if k in d else UNSET for k in info.static_names]
    stack += [d.get(k, UNSET) for k in reversed(info.dynamic_names)]


def _other(v: Any, tokens: list, stack: list) -> None:
    """A registered pytree node, one level at a time; or a static leaf."""
    if v is UNSET:
        tokens.append(UNSET)
        return
    flat, treedef = one_level(v)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0] is v:
        tokens.append(token(v))
        return
    data = treedef.node_data()
    tokens.append((TREE, treedef, None if data is None else field_token(data[1])))
    stack += reversed(flat)


class Own(Sentinel):
    """The value of a parameter left to a default that is the function's own: one
    that cannot be keyed, or that holds arrays where `donate` would give them
    away. Python fills it when the function is called, as under `eqx.filter_jit`
    (the program holds it as a constant); its key is this marker, one per default
    object."""

    __slots__ = ()


class Layout(NamedTuple):
    """How a call's arguments become the values its key is made of: the function's
    parameters in order, with `*args` as one tuple and `**kwargs` as one dict (an
    `Own` for one left to its default). A callable whose signature cannot be read
    has the layout `(args, kwargs)`: what the caller passed."""

    names: tuple[str, ...]  # one per value
    positional: int  # the parameters before `*args` or the keyword-only ones
    star: int | None = None  # the index of `*args`
    star_star: int | None = None  # the index of `**kwargs`
    only: int = 0  # the positional-only parameters, first

    def call(self, fn: Callable, values: Sequence) -> Any:
        """`fn` called with `values`, as the caller passed them, an `Own` left out.
        After one among the positional parameters, the caller passed no more
        positionally: `*args` is empty, a positional-only parameter holds its
        default (left out: Python fills it), and the rest go by keyword."""
        n, star, star_star = self.positional, self.star, self.star_star
        cut = next((i for i in range(n) if type(values[i]) is Own), n)
        args = values[:cut]
        if star is not None and cut == n:
            args = (*args, *values[star])
        keywords = {
            self.names[i]: values[i]
            for i in range(max(cut, self.only), len(values))
            if i != star and i != star_star and type(values[i]) is not Own
        }
        if star_star is not None:
            kwargs = values[star_star].items()
            keywords.update((k, v) for k, v in kwargs if type(v) is not Own)
        return fn(*args, **keywords)


GENERIC: Final = Layout(("args", "kwargs"), 0, 0, 1)


# ----------------------------------------------------------------------------------
# Reading a key back: its nodes, with their paths.


class Node(NamedTuple):
    """The head of the node at `key[start]`; its children follow from `next`."""

    kind: str  # "traced", "None", "unset", "static", "module", or a container's name
    head: Any  # the token that opens it
    statics: tuple  # a module's static tokens
    children: int  # nodes below it; -1: a module's dynamic fields, all traced leaves
    leaves: int  # traced leaves it holds directly (a module's or an `ARRAYS`)
    next: int  # the index after its head


def node_at(key: Key, i: int) -> Node:
    tok = key[i]
    if tok is LEAF:
        return Node("traced", tok, (), 0, 1, i + 1)
    if type(tok) is FieldInfo or (type(tok) is tuple and tok[0] is ODD):
        info = module_info(tok)
        j = i + 1 + len(info.static_names)
        statics, n = key[i + 1 : j], len(info.dynamic_names)
        if type(tok) is FieldInfo and key[j] is ALL:  # then no node follows
            return Node("module", tok, statics, -1, n, j + 1)
        return Node("module", tok, statics, n, 0, j)
    if type(tok) is tuple:
        n = tok[1].num_leaves if tok[0] is TREE else tok[2]
        children, leaves = (0, n) if tok[0] is ARRAYS else (n, 0)
        return Node(tok[0].name, tok, (), children, leaves, i + 1)
    kind = "None" if tok is None else "unset" if tok is UNSET else "static"
    return Node(kind, tok, (), 0, 0, i + 1)


def module_info(head: Any) -> FieldInfo:
    return head if type(head) is FieldInfo else head[1]


def ends(key: Key) -> dict[int, int]:
    """The index after the whole node that starts at `key[i]`, for every node of
    `key`, by `i`, in one pass (a writer that walked each node's subtree to find its
    end would read a chain once per node)."""
    out: dict[int, int] = {}
    # [where it starts, children still to come], under a root that never closes
    open_nodes: list[list[int]] = [[-1, -1]]
    i = 0
    while i < len(key):
        n = node_at(key, i)
        open_nodes.append([i, max(n.children, 0)])
        i = n.next
        while open_nodes[-1][1] == 0:
            out[open_nodes.pop()[0]] = i
            open_nodes[-1][1] -= 1
    return out


class Visit(NamedTuple):
    """A node of a key, where it is, and the module field it belongs to."""

    path: str  # as the function's body reads it: `x`, `self.encoder.w`, `y['a'][0]`,
    # `args[1]` (of `*args`), `opt_state[0].mu` (a named tuple's item)
    cls: type | None  # the class of the nearest module holding it
    field: str | None  # and the field of that module
    parent: str | None  # the path of the node above (None for an argument)
    node: Node


# A node's `Visit`, less the node: its path, class, field and parent.
_Label = tuple[str, type | None, str | None, str | None]


def visits(key: Key, names: Sequence[str]) -> Iterator[Visit]:
    """Every node of `key` (of values named `names`), parents first, traced leaves
    in the order of the call's."""
    labels: list[_Label] = [(p, None, None, None) for p in reversed(names)]  # to come
    i = 0
    while i < len(key):
        label, node = labels.pop(), node_at(key, i)
        i = node.next
        yield Visit(*label, node)
        below = _labels(node, *label[:3])
        if node.children == -1 or node.kind == ARRAYS.name:  # leaves, not nodes
            leaf = Node("traced", LEAF, (), 0, 1, i)
            yield from (Visit(*at, leaf) for at in below)
        else:
            labels += reversed(below)


def steps(node: Node) -> list:
    """How the value of `node` is read for each node below it, in the key's order:
    a module's dynamic fields by name, a dict's values by key, any other container's
    items (an `ARRAYS`' traced leaves among them) by index."""
    if node.kind == "module":
        return list(module_info(node.head).dynamic_names)
    if node.kind == DICT.name:
        return [value_of(k) for k in node.head[1]]
    return list(range(node.leaves if node.kind == ARRAYS.name else node.children))


def _labels(node: Node, path: str, cls: Any, field: Any) -> list[_Label]:
    """The path, module class, field and parent (`path`) of each node below
    `node`."""
    below = steps(node)
    if node.kind == "module":
        return [(f"{path}.{k}", module_info(node.head).cls, k, path) for k in below]
    names = getattr(node.head[1], "_fields", ()) if node.kind == NAMED.name else ()
    if names and len(names) == len(below):  # by name, as JAX's paths name them
        return [(f"{path}.{k}", cls, field, path) for k in names]
    return [(f"{path}[{k!r}]", cls, field, path) for k in below]


def leaf_visits(key: Key, argnames: Sequence[str]) -> list[Visit]:
    """The visits of the traced leaves, in the order of the call's leaves."""
    return [v for v in visits(key, argnames) if v.node.kind == "traced"]


def first_class(key: Key) -> type | None:
    """The class of the first value of the call, if it is a module."""
    n = node_at(key, 0) if key else None
    return module_info(n.head).cls if n and n.kind == "module" else None


def leaves_of_first(key: Key) -> int:
    """The number of traced leaves of the first value of the call."""
    at = ends(key)  # by the start of every node: the nodes before the first's end
    return sum(node_at(key, i).leaves for i in at if i < at.get(0, 0))
