"""The compile key, and the guard that checks a call against one.

A key is one flat tuple: the call's layout, then the tokens of its arguments in
preorder. Leaves for which `eqx.is_array` holds are traced (listed apart, in the
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

Flat, the key hashes and compares without recursion, however deep the nesting."""

import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple

from ._fields import (
    array_types,
    cycle_in,
    FALSE,
    field_info,
    field_token,
    FieldInfo,
    instance_dict,
    IS_ARRAY,
    is_array_type,
    IS_DICT,
    IS_LIST,
    IS_MODULE,
    IS_NAMED,
    IS_NONE,
    kind_of,
    kinds,
    one_level,
    Sentinel,
    SIMPLE,
    token,
    TRUE,
    Typed,
    UNSET,
    value_of,
)
from ._jax import EQX_MISSING, WRAPPER_FIELD_NAMES


LEAF, ALL = Sentinel("·"), Sentinel("all traced")
ODD, ARRAYS, SEQ, NAMED, DICT, TREE = map(
    Sentinel, ("module", "arrays", "sequence", "named tuple", "dict", "pytree")
)

Key = tuple  # ((number of positional arguments, keyword names), *tokens)


class CyclicValue(ValueError):  # noqa: N818  (reworded by the caller, never shown)
    """A value contains itself, at `path`."""

    def __init__(self, path: str):
        super().__init__(f"a value contains itself, at {path}")
        self.path = path


_CHECK_CYCLES_AFTER: Final = 100_000  # tokens; then at twice as many, and so on


def walk(values: Iterable[Any], tokens: list, leaves: list) -> None:
    """Append the tokens and traced leaves of `values`, in preorder."""
    stack = list(values)
    stack.reverse()
    limit = len(tokens) + _CHECK_CYCLES_AFTER
    while stack:
        v = stack.pop()
        t = type(v)
        k = kinds.get(t)
        if k is None:
            k = kind_of(t, v)
        if k == IS_ARRAY:
            tokens.append(LEAF)
            leaves.append(v)
        elif k == IS_MODULE:
            _module(v, field_info(t), tokens, leaves, stack)
        elif k == IS_LIST:
            if all_arrays(v):
                tokens.append((ARRAYS, t, len(v)))
                leaves += v
            else:
                tokens.append((SEQ, t, len(v)))
                stack += reversed(v)
        elif k == IS_NONE:
            tokens.append(None)
        elif k == IS_DICT:
            try:
                keys = sorted(v)  # as JAX flattens a dict
            except TypeError:  # keys that do not sort: as JAX's flatten says
                _other(v, tokens, stack)
                continue
            tokens.append((DICT, tuple(map(token, keys)), len(keys)))
            stack += [v[key] for key in reversed(keys)]
        elif k == IS_NAMED:
            tokens.append((NAMED, t, len(v)))
            stack += reversed(v)
        else:
            _other(v, tokens, stack)
        if len(tokens) > limit:  # so a finite walk checks at most twice its length
            _raise_if_cyclic(values)
            limit = 2 * len(tokens)


def all_arrays(values: Any) -> bool:
    """Whether every value is an array (in C, once their types have been seen)."""
    return array_types.issuperset(map(type, values)) or all(
        is_array_type(type(x)) for x in values
    )


def _raise_if_cyclic(values: Iterable[Any]) -> None:
    path = cycle_in(list(values))
    if path is not None:
        raise CyclicValue(path)


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
    # absent), `UNSET` for an absent field.
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


def key_and_leaves(args: tuple, kwargs: dict[str, Any]) -> tuple[Key, list]:
    """The key of a call and its traced leaves (`UnhashableError`, `CyclicValue`)."""
    names = tuple(sorted(kwargs)) if kwargs else ()
    tokens: list[Any] = [(len(args), names)]
    leaves: list[Any] = []
    walk((*args, *[kwargs[k] for k in names]), tokens, leaves)
    return tuple(tokens), leaves


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
    if tok is None or tok is UNSET:
        return Node("None" if tok is None else "unset", tok, (), 0, 0, i + 1)
    if type(tok) is FieldInfo or (type(tok) is tuple and tok[0] is ODD):
        info = module_info(tok)
        j = i + 1 + len(info.static_names)
        statics, n = key[i + 1 : j], len(info.dynamic_names)
        if type(tok) is FieldInfo and key[j] is ALL:  # then no node follows
            return Node("module", tok, statics, -1, n, j + 1)
        return Node("module", tok, statics, n, 0, j)
    if type(tok) is tuple:
        kind = tok[0]
        if kind is ARRAYS:
            return Node(kind.name, tok, (), 0, tok[2], i + 1)
        n = tok[1].num_leaves if kind is TREE else tok[2]
        return Node(kind.name, tok, (), n, 0, i + 1)
    return Node("static", tok, (), 0, 0, i + 1)


def module_info(head: Any) -> FieldInfo:
    return head if type(head) is FieldInfo else head[1]


def end_of(key: Key, i: int) -> int:
    """The index after the whole node that starts at `key[i]`."""
    pending = 1
    while pending:
        n = node_at(key, i)
        pending += max(n.children, 0) - 1
        i = n.next
    return i


class Visit(NamedTuple):
    """A node of a key, where it is, and the module field it belongs to."""

    path: str  # printable: `x`, `self.encoder.w`, `y['a'][0]`
    node: Node
    cls: type | None  # the class of the nearest module holding it
    field: str | None  # and the field of that module
    parent: str | None  # the path of the node above (None for an argument)


def argname(argnames: Sequence[str], i: int) -> str:
    return argnames[i] if i < len(argnames) else f"args[{i}]"


def visits(key: Key, argnames: Sequence[str]) -> Iterator[Visit]:
    """Every node of `key`, parents first, traced leaves in the order of the call's."""
    n, names = key[0]
    labels = [argname(argnames, i) for i in range(n)] + list(names)
    slots = [(p, None, None, None) for p in reversed(labels)]  # the nodes to come
    i = 1
    while i < len(key):
        path, cls, field, parent = slots.pop()
        node = node_at(key, i)
        i = node.next
        yield Visit(path, node, cls, field, parent)
        below = _labels(path, node, cls, field)
        if node.children == -1 or node.kind == ARRAYS.name:  # leaves, not nodes
            leaf = Node("traced", LEAF, (), 0, 1, i)
            yield from (Visit(p, leaf, c, f, path) for p, c, f in below)
        else:
            slots += [(p, c, f, path) for p, c, f in reversed(below)]


def _labels(path: str, node: Node, cls: Any, field: Any) -> list[tuple]:
    if node.kind == "module":
        info = module_info(node.head)
        return [(f"{path}.{k}", info.cls, k) for k in info.dynamic_names]
    if node.kind == DICT.name:
        return [(f"{path}[{value_of(k)!r}]", cls, field) for k in node.head[1]]
    count = node.leaves if node.kind == ARRAYS.name else node.children
    return [(f"{path}[{j}]", cls, field) for j in range(count)]


def leaf_visits(key: Key, argnames: Sequence[str]) -> list[Visit]:
    """The visits of the traced leaves, in the order of the call's leaves."""
    return [v for v in visits(key, argnames) if v.node.kind == "traced"]


# ----------------------------------------------------------------------------------
# Guards: code made once per key and argument layout that checks a new call against
# the key (classes, field sets, static tokens, leaf kinds, structure) and returns the
# call's traced leaves, or None. The hit path builds and hashes no key.

_MAX_GUARD_LINES: Final = 20_000
_MAX_GUARD_DEPTH: Final = 100  # deeper, the general path checks the call
_WIDE: Final = 24  # a module with more fields is read with `operator.itemgetter`
_STR: Final = frozenset([str])  # the key types of a dict checked key by key


def same_token(v: Any, tok: Any) -> bool:
    try:
        return field_token(v) == tok
    except Exception:  # a hash or an `__eq__` that raises: not the same
        return False


def same_tokens(values: tuple, toks: tuple) -> bool:
    return all(map(same_token, values, toks))


def subtree(v: Any) -> tuple[tuple, list]:
    """The tokens and leaves of one value, for a part a guard checks whole; no
    tokens if it cannot be keyed, so that the general path says why."""
    tokens: list[Any] = []
    leaves: list[Any] = []
    try:
        walk((v,), tokens, leaves)
    except Exception:  # unhashable, cyclic, keys that do not sort
        return (), []
    return tuple(tokens), leaves


class _Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.leaves: list[str] = []
        self.ns: dict[str, Any] = {
            "AT": array_types, "DICT": instance_dict, "SAME": same_token,
            "SAMES": same_tokens, "SUB": subtree, "is_": operator.is_,
            "STR": _STR,
        }  # fmt: skip
        self.count = 0

    def name(self) -> str:
        """A new name in the guard's code, for a local variable or a constant."""
        self.count += 1
        return f"_{self.count}"

    def const(self, value: Any) -> str:
        name = self.name()
        self.ns[name] = value
        return name

    def fail_if(self, condition: str) -> None:
        self.lines.append(f"if {condition}: return None")

    def node(self, expr: str, value: Any, key: Key, i: int, depth: int = 0) -> int:
        if len(self.lines) > _MAX_GUARD_LINES or depth > _MAX_GUARD_DEPTH:
            raise OverflowError
        n = node_at(key, i)
        tok = n.head
        if n.kind == "traced":
            self.fail_if(f"type({expr}) not in AT")
            self.leaves.append(expr)
        elif n.kind == "None":
            self.fail_if(f"{expr} is not None")
        elif n.kind == "static":
            self.fail_if(f"not {self.static(expr, tok, value)}")
        elif n.kind == "module" and type(tok) is FieldInfo:
            return self.module(expr, value, n, key, depth)
        elif n.kind == ARRAYS.name:
            t = self.const(tok[1])
            self.fail_if(
                f"type({expr}) is not {t} or len({expr}) != {tok[2]} "
                f"or not AT.issuperset(map(type, {expr}))"
            )
            self.leaves.append(f"*{expr}")
        elif n.kind == SEQ.name or n.kind == NAMED.name:  # item by item
            j = end_of(key, i)
            if tok[1] is tuple and _frozen(key, i, j):  # the same tuple: the same key
                whole = self.const(key[i:j])
                self.fail_if(
                    f"{expr} is not {self.const(value)} and SUB({expr})[0] != {whole}"
                )
                return j
            t = self.const(tok[1])
            self.fail_if(f"type({expr}) is not {t} or len({expr}) != {tok[2]}")
            return self.items(expr, enumerate(value), key, n.next, depth)
        elif n.kind == DICT.name and all(type(k) is str for k in tok[1]):
            return self.str_dict(expr, value, n, key, depth)
        else:  # other dicts, other pytrees, odd modules: compared whole
            j = end_of(key, i)
            sub, whole = self.name(), self.const(key[i:j])
            self.lines.append(f"{sub} = SUB({expr})")
            self.fail_if(f"{sub}[0] != {whole}")
            self.leaves.append(f"*{sub}[1]")
            return j
        return n.next

    def static(self, expr: str, tok: Any, value: Any) -> str:
        t = type(tok)
        if tok is TRUE or tok is FALSE or tok is None:
            return f"({expr} is {value_of(tok)})"
        if t is int or t is str or t is bytes:  # a literal if short, else a constant
            short = len(tok) < 64 if t is not int else -(10**18) < tok < 10**18
            value = repr(tok) if short else self.const(tok)
            return f"(type({expr}) is {t.__name__} and {expr} == {value})"
        if t is type:
            return f"({expr} is {self.const(tok)})"
        same = f"SAME({expr}, {self.const(tok)})"
        if t is Typed and tok.fixed:  # the same object, which cannot change
            return f"({expr} is {self.const(value)} or {same})"
        return same

    def str_dict(self, expr: str, value: Any, n: Node, key: Key, depth: int) -> int:
        """A dict of string keys, key by key: its key types before its keys (a
        key of another type may hash or compare as it likes), its values in the
        sorted order of the key."""
        keys: tuple[str, ...] = n.head[1]
        self.fail_if(
            f"type({expr}) is not dict or not STR.issuperset(map(type, {expr})) "
            f"or {expr}.keys() != {self.const(frozenset(keys))}"
        )
        i = n.next
        if len(keys) > 1 and all(key[j] is LEAF for j in range(i, i + len(keys))):
            items = self.name()
            self.lines.append(
                f"{items} = {self.const(operator.itemgetter(*keys))}({expr})"
            )
            self.fail_if(f"not AT.issuperset(map(type, {items}))")
            self.leaves.append(f"*{items}")
            return i + len(keys)
        return self.items(expr, [(k, value[k]) for k in keys], key, i, depth)

    def items(self, expr: str, pairs: Iterable, key: Key, i: int, depth: int) -> int:
        """The item `expr[k]` of each `(k, value)`, checked as the next node."""
        for k, item in pairs:
            local = self.name()
            self.lines.append(f"{local} = {expr}[{k!r}]")
            i = self.node(local, item, key, i, depth + 1)
        return i

    def module(self, expr: str, value: Any, n: Node, key: Key, depth: int) -> int:
        info: FieldInfo = n.head
        d = self.name()
        self.fail_if(f"type({expr}) is not {self.const(info.cls)}")
        self.lines.append(f"{d} = DICT({expr})")
        self.fail_if(f"len({d}) != {len(info.names)}")
        vd = instance_dict(value)
        if len(info.names) > _WIDE:
            ss, ds = self.name(), self.name()
            gs, gd = self.const(info.get_static), self.const(info.get_dynamic)
            self.lines += ["try:", f"    {ss}, {ds} = {gs}({d}), {gd}({d})", "except KeyError: return None"]  # fmt: skip
            check = f"not SAMES({ss}, {self.const(tuple(n.statics))})"
            if all(map(_fixed, n.statics)):  # the same objects: the same tokens
                check = f"not all(map(is_, {ss}, {self.const(info.get_static(vd))})) and {check}"
            self.fail_if(check)
            dynamic = [f"{ds}[{k}]" for k in range(len(info.dynamic_names))]
            if n.children == -1:
                self.fail_if(f"not AT.issuperset(map(type, {ds}))")
                self.leaves.append(f"*{ds}")
                return n.next
        else:
            statics = [self.name() for _ in info.static_names]
            dynamic = [self.name() for _ in info.dynamic_names]
            fetched = [*statics, *dynamic]
            if fetched:
                reads = ", ".join(
                    f"{d}[{k!r}]" for k in (*info.static_names, *info.dynamic_names)
                )
                self.lines += ["try:", f"    {', '.join(fetched)}, = {reads},", "except KeyError: return None"]  # fmt: skip
            checks = [
                self.static(s, tok, vd[k])
                for s, tok, k in zip(statics, n.statics, info.static_names)
            ]
            if n.children == -1:
                checks += [f"type({f}) in AT" for f in dynamic]
                self.leaves += dynamic
            if checks:
                self.fail_if(f"not ({' and '.join(checks)})")
            if n.children == -1:
                return n.next
        i = n.next
        for expr_k, k in zip(dynamic, info.dynamic_names):
            if not expr_k.isidentifier():
                local = self.name()
                self.lines.append(f"{local} = {expr_k}")
                expr_k = local
            i = self.node(expr_k, vd[k], key, i, depth + 1)
        return i


def _frozen(key: Key, i: int, j: int) -> bool:
    """Whether `key[i:j]` holds only tuples and static values that cannot change: a
    subtree that is the same as long as the tuple object is."""
    for tok in key[i:j]:
        if type(tok) is tuple:
            if tok[0] is not SEQ or tok[1] is not tuple:
                return False
        elif not _fixed(tok):
            return False  # a traced leaf, a module, or a value that can change
    return True


def _fixed(tok: Any) -> bool:
    """Whether a static token is the same for as long as its value is the same object."""
    return (
        type(tok) in SIMPLE
        or tok is TRUE
        or tok is FALSE
        or (type(tok) is Typed and tok.fixed)
    )


def make_guard(key: Key, args: tuple) -> Callable[..., list | None] | None:
    """The guard of `key` for calls with these positional arguments and no keyword
    arguments; None if the key is too large to check faster than it is built."""
    (n, names) = key[0]
    if names or n != len(args):
        return None
    w = _Writer()
    params = [w.name() for _ in args]
    i = 1
    try:
        for p, a in zip(params, args):
            i = w.node(p, a, key, i)
    except OverflowError:
        return None
    body = "\n    ".join([*w.lines, f"return [{', '.join(w.leaves)}]"])
    source = f"def guard({', '.join(params)}):\n    {body}\n"
    exec(compile(source, "<es.jit guard>", "exec"), w.ns)
    return w.ns["guard"]


def first_class(key: Key) -> type | None:
    """The class of the first positional argument, if it is a module."""
    if not key[0][0]:
        return None
    n = node_at(key, 1)
    return module_info(n.head).cls if n.kind == "module" else None


def leaves_of_first(key: Key) -> int:
    """The number of traced leaves of the first positional argument."""
    if not key[0][0]:
        return 0
    i, end, count = 1, end_of(key, 1), 0
    while i < end:
        n = node_at(key, i)
        count += n.leaves
        i = n.next
    return count
