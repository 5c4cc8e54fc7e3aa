"""Guards: the code a hit runs instead of building a key. A guard is written from a
key, node by node (the key is the description; nothing here looks at a type to
decide how to walk it): it checks a new call's values against exactly what the key
holds (classes, field sets, static values by type and value, which leaves are
arrays, structure) and, if they pass, calls the key's dispatcher with the call's
arrays; else it returns `MISS`, and the call takes the general path.

A guard's source is kept: registered with `linecache` (so tracebacks and
`inspect.getsource` show it) for as long as the guard lives, and logged at DEBUG on
the logger `"eqx_static.guards"` when made, with the check that failed when a call
fell through every guard of its class."""

import itertools
import linecache
import logging
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final

from . import _key
from ._fields import (
    array_types,
    FALSE,
    field_token,
    FieldInfo,
    instance_dict,
    Sentinel,
    SIMPLE,
    TRUE,
    Typed,
    value_of,
)
from ._jax import GENERATED
from ._key import ARRAYS, DICT, Key, key_and_leaves, LEAF, NAMED, Node, SEQ


logger: Final = logging.getLogger("eqx_static.guards")

MISS: Final = Sentinel("the guard does not hold")
_WIDE: Final = 24  # a module with more fields is read with `operator.itemgetter`
_STR: Final = frozenset([str])  # the key types of a dict checked key by key


def same_token(v: Any, tok: Any) -> bool:
    try:
        return field_token(v, shown=False) == tok
    except Exception:  # a hash or an `__eq__` that raises: not the same
        return False


def subtree(v: Any) -> tuple[tuple, list]:
    """The tokens and leaves of one value, for a part a guard checks whole; no
    tokens if it cannot be keyed, so that the general path says why."""
    try:
        return key_and_leaves((v,))
    except Exception:  # unhashable, cyclic, keys that do not sort
        return (), []


def _walk(key: Key, roots: Sequence, visit: Callable[..., Sequence | None]) -> None:
    """Call `visit(label, node, start, end)` on each node of `key` (`end`: the index
    after the whole node), parents first: on the values' nodes, labelled by
    `roots`, then on the nodes below each, labelled by what `visit` returned for it
    (None: skip them)."""
    at, labels, i = _key.ends(key), list(reversed(roots)), 0
    while i < len(key):
        n = _key.node_at(key, i)
        below = visit(labels.pop(), n, i, at[i])
        labels += reversed(below or ())
        i = at[i] if below is None else n.next


class _Writer:
    """Writes a guard's checks in preorder, one node of the key after another: of
    the values named `roots`, each with the value the key was made from (read for
    the objects a check may compare by identity)."""

    def __init__(self, key: Key, roots: Sequence[tuple[str, Any]]):
        self.key = key
        self.lines: list[str] = []
        self.leaves: list[str] = []
        self.ns: dict[str, Any] = {
            "AT": array_types,
            "DICT": instance_dict,
            "SAME": same_token,
            "SUB": subtree,
            "is_": operator.is_,
            "STR": _STR,
            "MISS": MISS,
        }
        self.count = itertools.count(1)
        _walk(key, roots, self.node)

    def name(self) -> str:
        """A new name in the guard's code, for a local variable or a constant."""
        return f"_{next(self.count)}"

    def const(self, value: Any) -> str:
        name = self.name()
        self.ns[name] = value
        return name

    def fail_if(self, condition: str) -> None:
        self.lines.append(f"if {condition}: return MISS")

    def arrays(self, expr: str) -> None:
        """Check that `expr` holds arrays only: the call's next traced leaves."""
        self.fail_if(f"not AT.issuperset(map(type, {expr}))")
        self.leaves.append(f"*{expr}")

    def fetch(self, targets: str, reads: str) -> None:
        """`targets = reads`, where a `KeyError` (a field absent) is a miss."""
        self.lines += [f"try: {targets} = {reads}", "except KeyError: return MISS"]

    def node(self, label: tuple, n: Node, i: int, end: int) -> list | None:
        """Check the node `n` at `key[i:end]`, labelled `(expr, value)`: the value's
        expression in the guard, and the value the key was made from; the children
        to check next, or None: none."""
        (expr, value), key, tok = label, self.key, n.head
        if n.kind == "traced":
            self.fail_if(f"type({expr}) not in AT")
            self.leaves.append(expr)
        elif n.kind == "static" or n.kind == "None":
            self.fail_if(f"not {self.static(expr, tok, value)}")
        elif n.kind == "module" and type(tok) is FieldInfo:
            return self.module(expr, value, n)
        elif n.kind == SEQ.name and _frozen(key, i, end):
            whole = self.const(key[i:end])  # the same tuple: the same key
            self.fail_if(
                f"{expr} is not {self.const(value)} and SUB({expr})[0] != {whole}"
            )
        elif n.kind in (ARRAYS.name, SEQ.name, NAMED.name):
            t = self.const(tok[1])
            self.fail_if(f"type({expr}) is not {t} or len({expr}) != {tok[2]}")
            if n.kind == ARRAYS.name:
                return self.arrays(expr)
            return self.items(expr, value, _key.steps(n))  # item by item
        elif n.kind == DICT.name and all(type(k) is str for k in tok[1]):
            return self.str_dict(expr, value, _key.steps(n), range(n.next, end))
        else:  # other dicts, other pytrees, odd modules: compared whole
            sub, whole = self.name(), self.const(key[i:end])
            self.lines.append(f"{sub} = SUB({expr})")
            self.fail_if(f"{sub}[0] != {whole}")
            self.leaves.append(f"*{sub}[1]")
        return None

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

    def str_dict(self, expr: str, value: Any, keys: list, below: range) -> list | None:
        """A dict of string keys (its children at `key[below]`), key by key: its key
        types before its keys (a key of another type may hash or compare as it
        likes), its values in the sorted order of the key."""
        self.fail_if(
            f"type({expr}) is not dict or not STR.issuperset(map(type, {expr})) "
            f"or {expr}.keys() != {self.const(frozenset(keys))}"
        )
        if len(keys) > 1 and all(self.key[j] is LEAF for j in below):
            items, get = self.name(), self.const(operator.itemgetter(*keys))
            self.lines.append(f"{items} = {get}({expr})")
            return self.arrays(items)
        return self.items(expr, value, keys)

    def items(self, expr: str, value: Any, steps: Sequence) -> list[tuple[str, Any]]:
        """The item `expr[k]` of each of `steps`, a node each, to check next."""
        out = [(self.name(), value[k]) for k in steps]
        self.lines += [f"{e} = {expr}[{k!r}]" for (e, _), k in zip(out, steps)]
        return out

    def module(self, expr: str, value: Any, n: Node) -> list[tuple[str, Any]] | None:
        info: FieldInfo = n.head
        d = self.name()
        self.fail_if(f"type({expr}) is not {self.const(info.cls)}")
        self.lines.append(f"{d} = DICT({expr})")
        self.fail_if(f"len({d}) != {len(info.names)}")
        vd = instance_dict(value)
        if len(info.names) > _WIDE:
            ss, ds = self.name(), self.name()
            gs, gd = self.const(info.get_static), self.const(info.get_dynamic)
            self.fetch(f"{ss}, {ds}", f"{gs}({d}), {gd}({d})")
            check = f"not all(map(SAME, {ss}, {self.const(tuple(n.statics))}))"
            if all(map(_fixed, n.statics)):  # the same objects: the same tokens
                same = self.const(info.get_static(vd))
                check = f"not all(map(is_, {ss}, {same})) and {check}"
            self.fail_if(check)
            if n.children == -1:
                return self.arrays(ds)
            dynamic = [self.name() for _ in info.dynamic_names]
            self.lines += [f"{e} = {ds}[{k}]" for k, e in enumerate(dynamic)]
        else:
            names = (*info.static_names, *info.dynamic_names)
            fetched = [self.name() for _ in names]
            statics, dynamic = fetched[: len(n.statics)], fetched[len(n.statics) :]
            if fetched:
                reads = ", ".join(f"{d}[{k!r}]" for k in names)
                self.fetch(f"{', '.join(fetched)},", f"{reads},")
            checks = list(map(self.static, statics, n.statics, info.get_static(vd)))
            if n.children == -1:
                checks += [f"type({f}) in AT" for f in dynamic]
                self.leaves += dynamic
            if checks:
                self.fail_if(f"not ({' and '.join(checks)})")
        # Below it, its dynamic fields; or none: the leaves, checked above.
        return [] if n.children == -1 else list(zip(dynamic, info.get_dynamic(vd)))


def _frozen(key: Key, i: int, j: int) -> bool:
    """Whether `key[i:j]` holds only tuples and static values that cannot change: a
    subtree that is the same as long as the tuple object is."""
    return all(  # no traced leaf, module, or value that can change
        tok[0] is SEQ and tok[1] is tuple if type(tok) is tuple else _fixed(tok)
        for tok in key[i:j]
    )


def _fixed(tok: Any) -> bool:
    """Whether a static token is the same for as long as its value is the same
    object."""
    t = type(tok)
    return t in SIMPLE or tok is TRUE or tok is FALSE or (t is Typed and tok.fixed)


# ----------------------------------------------------------------------------------
# Choosing one: the guards of a class, found by the static values at the top of a
# call, so that a hit costs the same with one key of the class or 1,000.

OTHERS: Final = Sentinel("the guards of calls whose lookup value Python cannot hash")


def chooser(key: Key, params: list[str], name: str) -> tuple[Callable, Callable, dict]:
    """For the guards of one class, made from `key` (one of theirs): a function that
    gives a call's lookup value (what `key` has as static at the top of each value:
    the value itself, a module's static fields, a tuple of statics), one that looks
    the call's guards up by it, in a dict `TABLE` of tuples of guards, and tries them
    in turn: those under `OTHERS` for a value that cannot be looked up (no hash, an
    `__eq__` that raises), which the first function then gives; and `TABLE`. The
    lookup only chooses which guards to try; each still checks everything."""
    parts: list[str] = []
    ns: dict[str, Any] = {"DICT": instance_dict, "MISS": MISS, "OTHERS": OTHERS}

    def part(p: str, n: Node, i: int, end: int) -> None:  # a value's node, alone
        if n.kind == "static" or (n.kind == SEQ.name and _frozen(key, i, end)):
            parts.append(p)  # (types aside: a guard checks them)
        elif n.kind == "module" and type(n.head) is FieldInfo and n.statics:
            # One name: its value, not a tuple of it.
            ns[f"S{len(parts)}"] = operator.itemgetter(*n.head.static_names)
            parts.append(f"S{len(parts)}(DICT({p}))")

    _walk(key, params, part)
    at = parts[0] if len(parts) == 1 else f"({', '.join(parts)},)" if parts else "()"
    ns["TABLE"] = table = {}
    lines = f"""try: held = TABLE.get({at}, ())
except Exception: held = TABLE.get(OTHERS, ())
for g in held:
    out = g({", ".join(params)})
    if out is not MISS: return out
return MISS""".splitlines()
    choose = _compiled("choose", params, lines, ns, name)
    found = [f"try: TABLE.get(v := {at})", "except Exception: return OTHERS"]
    return _compiled("at", params, [*found, "return v"], ns, name), choose, table


# ----------------------------------------------------------------------------------
# Making one.

_numbers: Final = itertools.count(1)


def guard(
    key: Key,
    values: tuple,
    params: Sequence[str],
    name: str,
    dispatch: Callable[[list[str]], list[str]] | None = None,
    ns: dict[str, Any] | None = None,
) -> Callable:
    """The guard of `key` on values named `params` (those of the call it was made
    from: `values`): its checks, then the lines `dispatch(leaves)` writes (that call
    the key's dispatcher with the leaves' expressions), with the names in `ns`.
    Without `dispatch`, the checks alone: a function that returns the call's traced
    leaves, or `MISS`."""
    w = _Writer(key, list(zip(params, values)))
    w.ns.update(ns or {})
    if dispatch is None:
        lines = [*w.lines, f"return [{', '.join(w.leaves)}]"]
        return _compiled("check", params, lines, w.ns, name)
    made = _compiled("guard", params, [*w.lines, *dispatch(w.leaves)], w.ns, name)
    made.es_dispatch_at = len(w.lines) + 2  # pyright: ignore
    return made


def _compiled(
    kind: str, params: Sequence[str], lines: list[str], ns: dict[str, Any], name: str
) -> Callable:
    body = "\n    ".join(lines)
    source = f"def {kind}({', '.join(params)}):\n    {body}\n"
    filename = f"{GENERATED}/{kind} {next(_numbers)}: {name}"
    exec(compile(source, filename, "exec"), ns)
    fn = ns[kind]
    # Kept while the guard lives, for tracebacks and `inspect.getsource`.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    weakref.finalize(fn, linecache.cache.pop, filename, None)
    if kind == "guard" and logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: a new guard, %s:\n%s", name, filename, source)
    return fn


def first_failure(guard: Callable, values: tuple) -> str | None:
    """The check of `guard` that turns `values` away: its line, as the guard's
    source numbers it, and the line itself; None if it passes. (For the DEBUG log
    only: the guard's checks are run again, as a function in which each check
    returns its line number and nothing is dispatched.)"""
    filename = guard.__code__.co_filename
    lines = linecache.getlines(filename)
    dispatch_at = guard.es_dispatch_at  # pyright: ignore[reportFunctionMemberAccess]
    checks = [  # each check ends its line with `return MISS`
        line.removesuffix("MISS\n") + f"{n}\n" if line.endswith(" MISS\n") else line
        for n, line in enumerate(lines[1 : dispatch_at - 1], 2)
    ]
    source = "".join([lines[0], *checks, "    return None\n"])
    ns = dict(guard.__globals__)
    exec(compile(source, filename, "exec"), ns)
    n = ns["guard"](*values)
    return None if n is None else f"{filename}:{n}: {lines[n - 1].strip()}"
