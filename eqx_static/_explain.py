"""Explaining compile keys in field terms: what differs between two keys, where a
traced leaf came from, and the messages built from that. Everything here reads a
key through one walk (`_key.walk`)."""

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._key import ArraysNode, Key, LEAF, ModuleNode, plan, StaticNode, walk
from ._typed import is_hashable, value_of


class Origin(NamedTuple):
    """Where a traced leaf comes from: a printable path, and the field if any."""

    path: str
    cls: type | None
    field: str | None


def leaf_origins(key: Key, argnames: Sequence[str]) -> list[Origin]:
    """The origin of each traced leaf of `key`, in order."""
    return [
        Origin(v.path, v.cls, v.field) for v in walk(key, argnames) if v.node is LEAF
    ]


def find_unhashable(key: Key) -> str | None:
    """The first unhashable static value of `key` (an argument's leaf: a module's
    static values key by `==`), named for an error message."""
    for v in walk(key, ()):
        if type(v.node) is StaticNode and not is_hashable(value_of(v.node.value)):
            return f"{v.path}, a {v.node.type.__name__}"
    return None


# ----------------------------------------------------------------------------------
# What differs between two keys.


def diff(old: Key, new: Key, argnames: Sequence[str]) -> list[str]:
    """What differs from `old` to `new`, one phrase per difference, in field terms:
    a node whose kind, class or structure differs is reported, and nothing below
    it; a module's static fields are reported one by one."""
    if len(old.args) != len(new.args) or old.names != new.names:
        return [
            f"call signature changed: {len(old.args)} -> {len(new.args)} positional, "
            f"keywords {list(old.names)} -> {list(new.names)}"
        ]
    method = bool(argnames) and argnames[0] == "self"
    before = {v.path: v.node for v in walk(old, argnames)}
    out: list[str] = []
    stopped: set[str] = set()  # nothing below these paths is compared
    for v in walk(new, argnames):
        if v.parent in stopped:
            stopped.add(v.path)
            continue
        a, b = before[v.path], v.node
        if a == b or _compare(a, b, Where(v.path, method), out):
            stopped.add(v.path)
    return out


class Where(NamedTuple):
    """How to name a path: relative to `self` in a method."""

    path: str
    method: bool

    @property
    def is_self(self) -> bool:
        return self.method and self.path == "self"

    @property
    def field(self) -> str:
        if self.method and self.path.startswith("self."):
            return self.path.removeprefix("self.")
        return self.path

    def static(self, name: str) -> str:
        return name if self.is_self else f"{self.field}.{name}"

    @property
    def what(self) -> str:
        if self.is_self:
            return "self"
        if "." not in self.path and "[" not in self.path:
            return f"argument {self.path}"
        return f"field {self.field!r}"


def _compare(a: Any, b: Any, where: Where, out: list[str]) -> bool:
    """Append what differs between the nodes `a` and `b` themselves (not their
    children); return whether their children are not to be compared."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        out.append(f"{where.what} changed kind: {ka} -> {kb}")
        return True
    if type(a) is ModuleNode:
        if a.cls is not b.cls:
            who = "class" if where.is_self else f"{where.what} class"
            out.append(f"{who} {a.cls.__qualname__} -> {b.cls.__qualname__}")
            return True
        _compare_statics(a, b, where, out)
        if a.wrapper != b.wrapper:
            out.append(f"{where.what} extra attributes changed")
        return False
    if type(a) is StaticNode:
        out.append(f"{where.what} changed {_show(a.value)} -> {_show(b.value)}")
        return True
    if a is LEAF or a is None:
        return True
    if a[:2] != b[:2] or _length(a) != _length(b):  # type, keys or treedef; length
        out.append(f"{where.what} structure changed")
        return True
    return False


def _length(n: Any) -> int:
    return n.n if type(n) is ArraysNode else len(n.children)


def _compare_statics(a: ModuleNode, b: ModuleNode, where: Where, out: list) -> None:
    names = plan(a.cls).static_names
    for name, x, y, tx, ty in zip(
        names, a.statics, b.statics, a.static_types, b.static_types
    ):
        if tx is not ty or x != y:
            out.append(
                f"static field {where.static(name)!r} changed {_show(x)} -> {_show(y)}"
            )


def _kind(n: Any) -> str:
    if n is LEAF:
        return "traced"
    if n is None:
        return "None"
    name: str = n[0].name
    return "sequence" if name == "arrays" else name


def _show(s: Any) -> str:
    return repr(value_of(s))


# ----------------------------------------------------------------------------------
# Changes of a traced leaf's aval or sharding.


def describe_leaf(o: Origin, a: tuple, b: tuple) -> str:
    """A change of one traced leaf's aval or sharding, in field terms."""
    if o.field and o.path.startswith("self."):
        where = f"field {o.path.removeprefix('self.')!r}"
    else:
        where = f"field {o.path!r}" if o.field else f"argument {o.path}"
    for name, i in (("shape", 0), ("dtype", 1), ("weak type", 2)):
        if a[i] != b[i]:
            return f"{where} {name} {a[i]} -> {b[i]}"
    if a[3] != b[3]:
        return f"{where} sharding {_show_sharding(a[3])} -> {_show_sharding(b[3])}"
    return f"{where} changed"


def _show_sharding(s: Any) -> str:
    if s is None:
        return "uncommitted"
    spec = getattr(s, "spec", None)
    return repr(spec) if spec is not None else type(s).__name__


def explain(
    known: Sequence[tuple[Key, tuple]],
    key: Key,
    sig: tuple,
    argnames: Sequence[str],
) -> str:
    """What differs between the call `(key, sig)` and the closest of `known`."""
    try:
        candidates = [
            (_differences(k, s, key, sig, argnames), k != key) for k, s in known[-64:]
        ]
    except Exception as e:  # an explanation must never break a call
        return f"could not explain: {e!r}"
    best, _ = min(candidates, key=lambda c: (len(c[0]), c[1]))
    return "; ".join(best) if best else "same key; JAX dropped its own cache"


def _differences(
    key: Key, sig: tuple, new_key: Key, new_sig: tuple, argnames: Sequence[str]
) -> list[str]:
    phrases = diff(key, new_key, argnames)
    if phrases or sig == new_sig:
        return phrases
    origins = leaf_origins(new_key, argnames)
    return [describe_leaf(o, a, b) for o, a, b in zip(origins, sig, new_sig) if a != b]


def named_in(reason: str) -> list[str]:
    """The fields or arguments named in an explanation."""
    out = []
    for phrase in reason.split("; "):
        if "'" in phrase:
            out.append(phrase.split("'")[1])
        elif phrase.startswith("argument "):
            out.append(phrase.split()[1])
    return out
