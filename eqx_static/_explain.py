"""Explaining compile keys in field terms: what differs between two keys, where a
traced leaf came from, and the messages built from that."""

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._key import children_of, hashable, LEAF, LEAVES, MODULE, plan, STATIC, value_of


def find_unhashable(key: tuple) -> str | None:
    """Names the first unhashable static value in `key`, for an error message."""
    args, names, kw = key
    for i, n in enumerate((*args, *kw)):
        where = f"args[{i}]" if i < len(args) else names[i - len(args)]
        found = _find_unhashable(n, where)
        if found:
            return found
    return None


def _find_unhashable(n: Any, path: str) -> str | None:
    stack = [(n, path)]
    while stack:
        n, path = stack.pop()
        if n is LEAF or n is None:
            continue
        if n[0] == MODULE:
            p = plan(n[1])
            for name, s in zip(p.static_names, n[2]):
                if not hashable(s):
                    kind = type(value_of(s)).__name__
                    cls = n[1].__qualname__
                    return f"the static field {name!r} of `{cls}` holding a {kind}"
            stack += [(c, f"{path}.{k}") for k, c in zip(p.dynamic_names, n[3])]
        elif n[0] == STATIC:
            if not hashable(n[2]):
                return f"{path}, a {n[1].__name__}"
        elif n[0] != LEAVES:
            stack += [(c, f"{path}[{i}]") for i, c in enumerate(n[2])]
    return None


class Origin(NamedTuple):
    """Where a traced leaf comes from: a printable path, and the field if any."""

    path: str
    cls: type | None
    field: str | None


def leaf_origins(key: tuple, argnames: Sequence[str]) -> list[Origin]:
    """The origin of each traced leaf of `key`, in order."""
    out: list[Origin] = []
    args, names, kw = key
    tops = [(n, argname(argnames, i)) for i, n in enumerate(args)]
    tops += list(zip(kw, names))
    for n, path in tops:
        stack: list[tuple[Any, str, Any, Any]] = [(n, path, None, None)]
        while stack:
            n, path, cls, field = stack.pop()
            if n is LEAF:
                out.append(Origin(path, cls, field))
            elif n is None or n[0] == STATIC:
                continue
            elif n[0] == MODULE:
                items = zip(plan(n[1]).dynamic_names, n[3])
                stack += reversed([(c, f"{path}.{k}", n[1], k) for k, c in items])
            else:
                kids = enumerate(children_of(n))
                stack += reversed([(c, f"{path}[{i}]", cls, field) for i, c in kids])
    return out


def argname(argnames: Sequence[str], i: int) -> str:
    return argnames[i] if i < len(argnames) else f"args[{i}]"


def diff(old: tuple, new: tuple, argnames: Sequence[str]) -> list[str]:
    """What differs from `old` to `new`, one phrase per difference, in field terms."""
    out: list[str] = []
    (oa, on, ok), (na, nn, nk) = old, new
    if len(oa) != len(na) or on != nn:
        return [
            f"call signature changed: {len(oa)} -> {len(na)} positional, "
            f"keywords {list(on)} -> {list(nn)}"
        ]
    is_self = bool(argnames) and argnames[0] == "self"
    for i, (a, b) in enumerate(zip(oa, na)):
        _diff(a, b, argname(argnames, i), i == 0 and is_self, out)
    for k, a, b in zip(nn, ok, nk):
        _diff(a, b, k, False, out)
    return out


def _diff(a: Any, b: Any, path: str, is_self: bool, out: list) -> None:
    stack = [(a, b, path, is_self)]
    while stack:
        a, b, path, is_self = stack.pop(0)
        if a == b:
            continue
        if _tag(a) != _tag(b):
            what = _what(path, is_self)
            out.append(f"{what} changed kind: {_kind(a)} -> {_kind(b)}")
        elif _tag(a) == MODULE:
            stack[:0] = _diff_module(a, b, path, is_self, out)
        elif _tag(a) == STATIC:
            out.append(f"{_what(path, is_self)} changed {_show(a)} -> {_show(b)}")
        elif len(children_of(a)) != len(children_of(b)) or a[:2] != b[:2]:
            out.append(f"{_what(path, is_self)} structure changed")
        else:
            pairs = zip(children_of(a), children_of(b))
            stack[:0] = [
                (x, y, f"{path}[{i}]", False) for i, (x, y) in enumerate(pairs)
            ]


def _diff_module(a: tuple, b: tuple, path: str, is_self: bool, out: list) -> list:
    if a[1] is not b[1]:
        who = "class" if is_self else f"{_what(path, is_self)} class"
        out.append(f"{who} {a[1].__qualname__} -> {b[1].__qualname__}")
        return []
    p = plan(a[1])
    for name, x, y, tx, ty in zip(p.static_names, a[2], b[2], a[5], b[5]):
        if tx is not ty or x != y:
            out.append(
                f"static field {_field(path, name, is_self)!r} changed "
                f"{value_of(x)!r} -> {value_of(y)!r}"
            )
    if a[4] != b[4]:
        out.append(f"{_what(path, is_self)} extra attributes changed")
    return [
        (x, y, _field(path, name, is_self), False)
        for name, x, y in zip(p.dynamic_names, a[3], b[3])
    ]


def _field(path: str, name: str, is_self: bool) -> str:
    return name if is_self else f"{path}.{name}"


def _what(path: str, is_self: bool) -> str:
    if is_self:
        return "self"
    if "." not in path and "[" not in path:
        return f"argument {path}"
    return f"field {path!r}"


def _tag(n: Any) -> Any:
    return n if n is LEAF or n is None else n[0]


def _kind(n: Any) -> str:
    tag = _tag(n)
    if tag == LEAVES:
        return "sequence"
    return {LEAF: "traced", None: "None", MODULE: "module", STATIC: "static"}.get(
        tag, "sequence" if tag == 1 else "pytree"
    )


def _show(n: tuple) -> str:
    return repr(value_of(n[2]))


def describe_leaf(o: Origin, a: tuple, b: tuple) -> str:
    """A change of one traced leaf's aval or sharding, in field terms."""
    where = (
        f"field {o.path.split('.', 1)[1]!r}"
        if o.field and o.path.startswith("self.")
        else (f"field {o.path!r}" if o.field else f"argument {o.path}")
    )
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
    known: Sequence[tuple[tuple, tuple]],
    key: tuple,
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
    key: tuple, sig: tuple, new_key: tuple, new_sig: tuple, argnames: Sequence[str]
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
