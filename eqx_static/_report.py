"""What `es.jit` tells the user: why a call compiled (the INFO line) and where the
programs differ, the compile budget (`RecompileError`), the storm warning, and the
errors a compiled call raises (a traced value used as a Python one; `eqx.error_if`
at run time, as `eqx.filter_jit` reports it). All of it reads structured records:
a key's nodes (`_key.key_and_leaves`), the `Change`s between two keys, and each
program's per-operation summary (`ops_of`)."""

import collections
import contextlib
import functools
import hashlib
import itertools
import linecache
import logging
import operator
import os
import re
import reprlib
import site
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import equinox as eqx
import jax
import jax.extend.core as jex
import numpy as np
from jax.core import Tracer

from . import _jax
from ._fields import field_info, hashable_instead, value_of
from ._key import Key, module_info, Node, Visit, visits


_jax.hide_frames(__file__)

logger: Final = logging.getLogger("eqx_static")


# ----------------------------------------------------------------------------------
# What changed between two calls.


class Change(NamedTuple):
    """One difference between two calls, in field terms."""

    phrase: str  # "static field 'sp' changed False -> True"
    name: str  # what it is about: "sp", "encoder.act", "x", "y[1]"
    kind: str  # "static field", "leaf", "argument", "array", "structure", "context",
    # or a change no value names: "jax" (JAX's own), "transformed"
    detail: str = ""  # the change itself, without where: "changed 8 -> 16"
    path: str = ""  # where, in full: "self.layers[0].weight", "opt_state[0].mu.w"
    new: Any = None  # what it changed to (a token, an aval), for counting values
    old: Any = None  # and from


def unhashable_message(name: str, where: str, value: object) -> str:
    """The error for an unhashable static leaf of a call, with the fix for it."""
    return (
        f"`{name}` got {where}, a {type(value).__name__}, which is not hashable. A "
        "non-array argument is static: it keys the compilation cache, as under "
        "`eqx.filter_jit`, so it must be hashable. "
        f"{hashable_instead(value, where.split('.')[-1].split('[')[0], 'Pass')}"
    )


def diff(old: Key, new: Key, argnames: Sequence[str]) -> list[Change]:
    """What differs from `old` to `new`: a node that changed kind, class or
    structure and nothing below it; a module's static fields one by one."""
    method = argnames[:1] == ("self",)
    before = {v.path: v.node for v in visits(old, argnames)}
    out: list[Change] = []
    stopped: set[str] = set()  # below a change of structure: already said
    for v in visits(new, argnames):
        a = before.get(v.path)
        if a is None or v.parent in stopped or _compare(a, v.node, v, method, out):
            stopped.add(v.path)
    return out


# A value's `repr`, cut short: 6 levels deep (a tuple nested 900 deep), 40 items.
_REPR: Final = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 6, 160, 200
_REPR.maxtuple = _REPR.maxlist = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 40


def show(tok: Any) -> str:
    """A static value as a message names it: a function by its name, else `repr`,
    cut short."""
    v = value_of(tok)
    name = getattr(v, "__qualname__", None)
    if isinstance(name, str) and not isinstance(v, type):
        return name
    if type(v) is int and v.bit_length() > 4096:  # past what `repr` prints
        return f"<an int of {v.bit_length():,} bits>"
    return _REPR.repr(v)


def _compare(a: Node, b: Node, v: Visit, method: bool, out: list[Change]) -> bool:
    """Append what differs between two nodes themselves; return whether to skip
    their children."""
    if a[:5] == b[:5]:
        return False
    path = v.path
    is_self = method and path == "self"
    name = path.removeprefix("self.") if method else path
    # A value in no module's field is in an argument: named as the body reads it
    # (`x`, `args[1]` of `*args`, `cfg['lr']`), never as a field.
    argument = v.cls is None
    what = "self" if is_self else f"argument {path}" if argument else f"field {name!r}"
    # An `arrays` node holds a sequence of arrays; to the user, a sequence.
    ka, kb = ("sequence" if n.kind == "arrays" else n.kind for n in (a, b))
    if ka == kb == "module" and module_info(a.head) is module_info(b.head):
        for field, x, y in zip(module_info(a.head).static_names, a.statics, b.statics):
            if x != y:
                full = f"{path}.{field}"
                field = field if is_self else f"{name}.{field}"
                detail = f"changed {show(x)} -> {show(y)}"
                phrase = f"static field {field!r} {detail}"
                out.append(Change(phrase, field, "static field", detail, full, y, x))
        if a.head != b.head:
            detail = "extra attributes changed"
            out.append(Change(f"{what} {detail}", name, "structure", detail, path))
        return False
    if ka == kb == "static":
        detail = f"changed {show(a.head)} -> {show(b.head)}"
        plain = v.cls is not None and not field_info(v.cls).stores_arrays
        kind = "argument" if argument else "plain leaf" if plain else "leaf"
        out.append(Change(f"{what} {detail}", name, kind, detail, path, b.head, a.head))
        return True
    if ka != kb:
        detail = f"changed kind: {ka} -> {kb}"
    elif ka == "module":
        old, new = (module_info(n.head).cls.__qualname__ for n in (a, b))
        detail = f"class {old} -> {new}"
    else:  # the same kind, and its head or its size differs
        detail = "structure changed"
    phrase = detail if is_self and ka == kb else f"{what} {detail}"
    out.append(Change(phrase, name, "structure", detail, path))
    return True


class Seen(NamedTuple):
    """A compiled signature of a key: what a new call is explained against."""

    key: Key
    sig: tuple  # each traced leaf's shape, dtype, weak type and sharding
    context: Any  # JAX's configuration
    program: Any  # what it runs


class Why:
    """What differs between a call and the closest call known when it missed,
    worked out when first asked: a miss whose program is reused says and budgets
    nothing unless asked, and costs no comparison. `asked`: the known calls
    (`Seen`), the call's key, its avals and JAX's context, its argument names, and
    how many leaves (the first) are the function's own; `otherwise` is what to say
    if nothing differs."""

    def __init__(self, *asked: Any, otherwise: Sequence[Change] = ()) -> None:
        self._asked, self._otherwise = asked, otherwise

    @classmethod
    def said(cls, changes: Sequence[Change]) -> "Why":
        """An answer known already."""
        return cls(otherwise=changes)

    @functools.cached_property
    def closest(self) -> Seen | None:
        """The known call with the fewest tokens and avals that differ, the most
        recent of equals: one comparison of flat tuples each."""
        if not self._asked:
            return None
        known, key, (sig, _), *_ = self._asked
        return min(reversed(known), key=lambda s: _distance(s, key, sig), default=None)

    @functools.cached_property
    def changes(self) -> list[Change]:
        """What differs from the closest call (else `otherwise`)."""
        if (closest := self.closest) is None:
            return list(self._otherwise)
        _, key, (sig, context), argnames, n_fn = self._asked
        changes = diff(closest.key, key, argnames)
        if closest.sig != sig and not any(c.kind == "structure" for c in changes):
            leaves = [v for v in visits(key, argnames) if v.node.kind == "traced"]
            pairs = zip(leaves, closest.sig[n_fn:], sig[n_fn:])  # they line up
            changes += [_leaf_change(o, a, b) for o, a, b in pairs if a != b]
        if not changes and closest.context != context:
            changes = [Change("JAX's configuration changed", "context", "context")]
        return merge_copies(changes) or list(self._otherwise)


def _distance(seen: Seen, key: Key, sig: tuple) -> int:
    """How many tokens and avals differ, position by position."""
    pairs = ((seen.key, key), (seen.sig, sig))
    return sum(abs(len(a) - len(b)) + sum(map(operator.ne, a, b)) for a, b in pairs)


def merge_copies(changes: Sequence[Change]) -> list[Change]:
    """One change reached through several paths (a model, and its copies in an
    optimiser's state: `opt_state[0].mu.<the model's path>`) named once, at its
    shortest path, "and the same under opt_state[0].mu and opt_state[0].nu": the
    same change, at paths that end alike, named by where they part."""
    groups: dict[int, list[Change]] = {}  # by the index of the first change
    for i, c in enumerate(changes):  # with the first it copies, else on its own
        at = next((j for j, g in groups.items() if c.detail and _copies(g[0], c)), i)
        groups.setdefault(at, []).append(c)
    out = []
    for group in groups.values():
        first = min(group, key=lambda c: len(c.path))
        tail = len(re.sub(r"^\w*", "", first.path))  # past the root
        if heads := [c.path[: len(c.path) - tail] for c in group if c is not first]:
            also = f"(and the same under {' and '.join(heads)})"
            first = first._replace(phrase=f"{first.phrase} {also}")
        out.append(first)
    return out


def _copies(a: Change, b: Change) -> bool:
    """The same change at paths whose ends, past the shorter one's root, agree."""
    if a.kind != b.kind or a.detail != b.detail:
        return False
    short, long = sorted((a.path, b.path), key=len)
    tail = re.sub(r"^\w*", "", short)  # past the root
    return bool(tail) and long.endswith(tail) and long != short


def _leaf_change(o: Visit, a: tuple, b: tuple) -> Change:
    """A change of one traced leaf's shape, dtype, weak type or sharding."""
    name = o.path.removeprefix("self.")  # only a field's path starts so
    where = f"field {name!r}" if o.field else f"argument {o.path}"
    i = next((i for i in range(3) if a[i] != b[i]), 3)
    x, y = (a[i], b[i]) if i < 3 else map(_sharding, (a[3], b[3]))
    detail = f"{('shape', 'dtype', 'weak type', 'sharding')[i]} {x} -> {y}"
    return Change(f"{where} {detail}", name, "array", detail, o.path, b, a)


def _sharding(s: Any) -> str:
    """A placement as a change names it: the device, or the partition spec."""
    if s is None:
        return "uncommitted"
    if (spec := getattr(s, "spec", None)) is not None:
        return repr(spec)
    devices = s.device_set
    return repr(next(iter(devices))) if len(devices) == 1 else type(s).__name__


def phrase(changes: Sequence[Change], tail: object = None) -> str:
    text = "; ".join(c.phrase for c in changes) or "same key and avals"
    return f"{text}; {tail}" if tail else text


def log(name: str, what: str, n: int, why: Why, tail: object = None) -> None:
    """The INFO line of a miss after the first (worked out only if it is shown)."""
    if n and logger.isEnabledFor(logging.INFO):
        logger.info("%s: %s (%d cached): %s", name, what, n, phrase(why.changes, tail))


# ----------------------------------------------------------------------------------
# Where two programs first differ, in the user's code: each program keeps one
# small record per operation (a digest, its name, where it was traced).


Frame = tuple[str, int, str]  # file, line, function
Where = tuple[Frame, Frame | None]  # the user's frame, and a library's inside it


class Op(NamedTuple):
    what: bytes  # a digest of the primitive, its parameters and inputs
    name: str  # the primitive's name
    where: Where | None


class Differ(NamedTuple):
    """Where a new program first differs from the closest compiled one."""

    place: str  # `train.py:41 in loss, inside diffrax _integrate.py:1157 (mul)`
    constant: bool  # only in a constant: the same structure
    line: Frame | None  # the user's line

    def __str__(self) -> str:
        how = "differ only in a constant," if self.constant else "first differ"
        return f"the programs {how} at {self.place}"


# Operations that only call the program nested in them (whose operations are listed).
_CALLS: Final = frozenset(
    "pjit jit closed_call eval_jaxpr custom_jvp_call custom_vjp_call remat remat2 "
    "checkpoint".split()
)


def ops_of(jaxpr: Any, depth: int = 0, outer: Frame | None = None) -> Iterator[Op]:
    """A traced program, one record per operation, nested bodies in place. An
    operation a library traced away from the user's call (a loop body diffrax
    traces itself) is placed at the user's line of the operation holding it."""
    inner = _jax.open_jaxpr(jaxpr)
    # Inputs by where they come from: the n-th input of the program or output of an
    # operation; so `dc * x` and `dp * x` are different operations. A constant is a
    # value, hashed once, except one closed over from an outer trace (jax 0.12),
    # which is an input.
    numbers: dict = {v: i for i, v in enumerate([*inner.constvars, *inner.invars])}
    for v, c in zip(inner.constvars, getattr(jaxpr, "consts", ())):
        if not isinstance(c, Tracer):
            numbers[v] = hashlib.sha1(np.asarray(c).tobytes()).hexdigest()
    for eqn in inner.eqns:
        name, where = eqn.primitive.name, _user_frame(eqn.source_info, outer)
        if name not in _CALLS:
            params = [(k, _stable(v)) for k, v in sorted(eqn.params.items())]
            inputs = [_input(v, numbers) for v in eqn.invars]
            what = hashlib.sha1(repr((name, params, inputs)).encode()).digest()[:8]
            yield Op(what, name, where)
        numbers.update((v, len(numbers)) for v in eqn.outvars)
        user = where[0] if where and not where[0][0].startswith(_LIBRARIES) else outer
        for sub in _jax.nested_jaxprs(eqn.params) if depth < 8 else ():
            yield from ops_of(sub, depth + 1, user)


def _input(v: Any, numbers: dict) -> Any:
    """An operation's input: a literal by its value, any other by its number (or
    its constant's digest) and aval."""
    return repr(v.val) if isinstance(v, jex.Literal) else (numbers.get(v), str(v.aval))


# Installed packages: a frame in one is a library's, not the user's own code.
_LIBRARIES: Final = tuple(
    {os.path.join(p, "") for p in (*site.getsitepackages(), site.getusersitepackages())}
)


def _user_frame(source_info: Any, outer: Frame | None = None) -> Where | None:
    """The innermost frame of the user's own code that traced an equation (else
    `outer`, that of the operation holding it), and the innermost library frame
    inside it (diffrax's, optimistix's), if any."""
    frames = _jax.user_frames(source_info)
    if not frames:
        return None if outer is None else (outer, None)
    user = next((f for f in frames if not f[0].startswith(_LIBRARIES)), None)
    user = user or outer or frames[-1]
    return user, (frames[0] if frames[0] is not user else None)


def _stable(v: Any) -> Any:
    """A parameter as it is from one trace to the next: a function by its name; a
    nested program by a placeholder (its operations are recorded in their turn)."""
    if list(_jax.nested_jaxprs({"": v})):
        return "nested"
    if callable(v) and not isinstance(v, type):
        return getattr(v, "__qualname__", type(v).__name__)
    return v


def differ_of(seen: Seen | None, changes: Sequence[Change], new: Any) -> Differ | None:
    """Where a new program (its `_compile.Outline`) first differs from the closest
    call's (`seen`); None for the first compile, when avals or the context changed
    (the explanation says so), and when either's operations were not recorded."""
    old = None if seen is None else seen.program
    moved = not changes or {c.kind for c in changes} & {"array", "context"}
    if old is None or moved or None in (old.ops, new.ops):
        return None
    constant = new.structure is not None and new.structure == old.structure
    for a, b in itertools.zip_longest(old.ops, new.ops):  # None past the shorter's end
        if a is None or b is None or a.what != b.what:
            break
    else:
        return None
    op = b or a
    if op is None or op.where is None:
        return None
    if a is None or b is None:
        what = op.name if constant else f"{op.name}, {'new' if a is None else 'gone'}"
    elif constant or a.name == b.name:
        what = op.name
    else:
        what = f"{b.name} where {a.name} was"
    # `train.py:41 in loss`, then `, inside diffrax _integrate.py:1157`
    (file, line, function), inner = op.where
    place = f"{os.path.basename(file)}:{line} in {function.rsplit('.', 1)[-1]}"
    if inner is not None:
        root = next((r for r in _LIBRARIES if inner[0].startswith(r)), "")
        package = inner[0][len(root) :].split(os.sep, 1)[0]
        place += f", inside {package} {os.path.basename(inner[0])}:{inner[1]}"
    return Differ(f"{place} ({what})", constant, op.where[0])


# ----------------------------------------------------------------------------------
# Compile budgets: `max_compiles`, and the storm warning.


class RecompileError(RuntimeError):
    """An [`eqx_static.jit`][] function would compile more often than its
    `max_compiles` allows. Raised before XLA compiles, saying what changed for this
    compile (and where the programs differ) and for every earlier one.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class Model(es.Module):
            n: int = eqx.field(static=True)

            @es.jit(max_compiles=1)
            def __call__(self, x):
                return x * self.n

        Model(n=2)(jnp.ones(2))
        with pytest.raises(es.RecompileError, match="'n' changed 2 -> 3"):
            Model(n=3)(jnp.ones(2))
        ```
    """


class Compile(NamedTuple):
    """One XLA compile, as the budget and the storm warning read it."""

    changes: tuple[Change, ...]  # from the closest cached call (empty: the first)
    seconds: float
    structure: bytes | None  # the program with its constants masked
    differ: Differ | None


def sharing_error(
    name: str, old: Key, new: Key, argnames: Sequence[str], number: int
) -> RuntimeError:
    """What `EQX_STATIC_CHECK_SHARING` raises: a key's program, taken for compile
    `number`'s (of key `old`), compiles to other code."""
    return RuntimeError(
        f"{name}: EQX_STATIC_CHECK_SHARING: this call's program ("
        f"{phrase(diff(old, new, argnames))}, from the key of compile {number}) "
        f"compiles to other code than compile {number}, whose executable it would "
        f"have run. Please report this with your JAX version ({jax.__version__})."
    )


def budget_error(
    qualname: str,
    limit: int,
    history: Sequence[Compile],
    changes: Sequence[Change],
    differ: Differ | None,
) -> RecompileError:
    named = [", ".join(dict.fromkeys(c.name for c in h.changes)) for h in history]
    lines = "".join(
        f"\n  compile {i}: {n or 'first call'}" for i, n in enumerate(named, 1)
    )
    fix = _fix(changes[0], differ is None or differ.constant) if changes else ""
    return RecompileError(
        f"{qualname}: compile {len(history) + 1} exceeds `max_compiles={limit}`: "
        f"{phrase(changes, differ)}.\nEarlier compiles (what changed from the one "
        f"before):{lines}\n{fix} (If these compiles are expected, raise "
        "`max_compiles`.)"
    )


def storm(name: str, history: Sequence[Compile], shared: Sequence[Why], n: int) -> bool:
    """Warn once something changed at each of the last `n` compiles; of several,
    name the one whose name is on the line where the last programs differ, or else
    the one least often changed in a miss that shared a program (`shared`: the
    latest such misses' reasons). Say only what is
    true: "every time" if it changed at every compile, and, if it took few values,
    that the compiles come from their combinations with other changes."""
    recent = history[-n:]
    per_compile = [{c.name: c for c in h.changes} for h in recent[1:]]
    common = set(per_compile[0]).intersection(*per_compile) if per_compile else ()
    if not common:
        return False
    differ = recent[-1].differ
    line = differ.line[:2] if differ is not None and differ.line else ("", 0)
    read = set(re.findall(r"\w+", linecache.getline(*line)))  # where programs differ
    reused = collections.Counter(c.name for why in shared for c in why.changes)
    culprit = min(common, key=lambda k: (k.split(".")[-1] not in read, reused[k], k))
    change = per_compile[-1][culprit]
    changed = [c for h in history for c in h.changes if c.name == culprit]
    when = f"at each of the last {len(per_compile)} compiles"
    when = "every time" if len(changed) == len(history) - 1 else when
    structures = [h.structure for h in recent]
    constant = None not in structures and len(set(structures)) == 1
    at = f" (at {differ.place})" if differ else ""
    verdict = f"The programs differ in their structure, not only in constants{at}. "
    if constant:
        verdict = f"The programs differ only in their constants{at}: {culprit!r} is "
        verdict += "only used as a value. "
    values = {c.new for c in changed} | {changed[0].old}
    few = change.new is not None and None not in values and len(values) <= len(changed)
    fix = _combinations(culprit, values, history) if few else _fix(change, constant)
    logger.warning(
        f"{name} has compiled {len(history)} times, and {culprit!r} changed {when} "
        f"({sum(h.seconds for h in history):.2f} s spent compiling). "
        f"{'' if change.kind == 'array' else verdict}{fix}"
    )
    return True


def _combinations(culprit: str, values: set, history: Sequence[Compile]) -> str:
    """What to say of a field that took few values but changed at many compiles."""
    names = [c.name for h in history for c in h.changes if c.name != culprit]
    others = collections.Counter(names)
    top = [f"{k!r} at {n}" for k, n in others.most_common(3)]
    said = ", ".join(top) + (f", and {len(others) - 3} more" if len(others) > 3 else "")
    took = f"{culprit!r} took only {len(values)} values"
    if said:
        return (
            f"{took}: the compiles come from their combinations with other changes "
            f"({said}), each a program of its own."
        )
    return (
        f"{took}, each compiled more than once: are its entries evicted (`maxsize`), "
        "or the function wrapped anew?"
    )


# The fix for a value that keeps changing, by its kind; "picks structure" stands
# for the kinds of a value the program reads as more than a value. `{name}`: the
# value's name, `{field}`: its last part.
_FIXES: Final = {
    "array": "{name} is an array whose shape, dtype or sharding keeps changing, and "
    "each new one is a new program: pad or bucket shapes to a few sizes.",
    "jax": "JAX's profile-guided optimisation (`jax_enable_pgle`) compiles each "
    "program again once it has profiled it.",
    "transformed": "An eager `jax.grad`, `jax.vmap` or `jax.checkpoint` compiles "
    "each transformed program: put the transformation under a `jax.jit`.",
    "structure": "Keep the structure of {name} the same from call to call.",
    "context": "Keep JAX's configuration (`jax.config`, and context managers such as "
    "`jax.default_device`) the same from call to call.",
    "picks structure": "{name} picks program structure (an `if`, a loop length, a "
    "shape), so it must stay static: reduce the number of distinct values.",
    "static field": "Make {name} dynamic: drop `static=True`, and a number is "
    "stored as an array and traced, with no compile per value.",
    "leaf": "{name} is a Python value in a dynamic field (as `eqx.tree_at` leaves "
    "one): store an array there instead (`jnp.asarray(v)`, or `with_dynamic`), and "
    "it is traced, with no compile per value.",
    "plain leaf": "{name} is a Python value in a field of a plain `eqx.Module`, "
    "where `with_dynamic` keeps it as it is: store an array there instead "
    "(`eqx.tree_at(lambda m: m.{field}, m, jnp.asarray(v))`), or pass it as an "
    "argument of the call, and it is traced, with no compile per value.",
    "argument": "{name} is a Python value passed as an argument: pass "
    "`jnp.asarray(v)` instead, and it is traced, with no compile per value.",
}
_VALUES: Final = ("static field", "leaf", "plain leaf", "argument")


def _fix(change: Change, constant: bool) -> str:
    """What to do about a value that keeps changing (`constant`: only as a value)."""
    kind = "picks structure" if change.kind in _VALUES and not constant else change.kind
    field = change.name.rsplit(".", 1)[-1]
    return _FIXES[kind].format(name=repr(change.name), field=field)


# ----------------------------------------------------------------------------------
# A traced value used where Python needs a concrete one (at trace time).


class TracedFieldError(jax.errors.ConcretizationTypeError):
    """A traced (dynamic) field, or a traced argument, was used where Python needs a
    concrete value. The message names it (a field with its class and path; every
    such field of the call, in one error) and the fix; the
    error is also the JAX error it replaces (`jax.errors.TracerBoolConversionError`,
    ...), and its traceback ends at the offending line.

    !!! example

        ```python
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class Model(es.Module):
            scale: float

            @es.jit
            def __call__(self, x):
                return x if self.scale > 0 else -x   # Python `if` on a traced value

        with pytest.raises(es.TracedFieldError, match="'scale'"):
            Model(scale=1.0)(jnp.ones(2))
        ```
    """

    def __init__(  # pyright: ignore[reportMissingSuperCall]
        self, message: str, said: str = ""
    ):
        TypeError.__init__(self, message)
        self.said = said  # JAX's message in our terms, for a call around this one


@functools.cache
def _traced_field_error_type(jax_error: type) -> type:
    return type("TracedFieldError", (TracedFieldError, jax_error), {})


# JAX names a traced value by the argument it came from: a leaf of the traced
# function (`_es_leaves[2]`), or, in a trace nested in it (`eqx.filter_eval_shape`
# inside diffrax), an argument of that one, which ends in the same field
# (`_dynamic[0].hidden_size`).
_ARGUMENT: Final = re.compile(r"argument ([\w.\[\]'\"]*[\w\]])")
_LEAF_INDEX: Final = re.compile(r"_es_leaves\[(\d+)\]")
# JAX names the function it traced by its code's place: ours, whatever the folder.
_OURS: Final = re.compile(
    rf"(?<!\S)\S+ at {re.escape(os.path.dirname(__file__))}\S+:\d+"
)
_NEED: Final = (
    "where Python needs a concrete value (`if`, `int()`, a shape, a length, an index, "
    "a loop bound, ...)"
)
# JAX's error in the backward pass of a loop whose bound is traced.
REVERSE: Final = "Reverse-mode differentiation does not work"


def traced_field_error(
    name: str,
    e: Exception,
    origins: Sequence[Visit],
    n_fn: int,
    where: str,
    found: Sequence[int] = (),
) -> TracedFieldError | None:
    """`TracedFieldError` for the fields and arguments that had to be concrete: the
    leaves in `found` (found by tracing again with numbers in their place) and the
    one `e` names; None if none. `n_fn` leaves of the function come first. JAX's
    message follows, with our names for the leaves and `where` for the traced
    function; if `e` is already one (a nested call's), as `e` quoted it."""
    leaves = dict(enumerate(origins, n_fn))  # by their index among the call's
    nested = isinstance(e, TracedFieldError)  # its leaves are not this call's
    named = None if nested else _origin(str(e), leaves)
    seen = [leaves[i] for i in found if i in leaves]
    culprits = list({o.path: o for o in [*seen, named] if o is not None}.values())
    if not culprits:
        return None
    fields = [o for o in culprits if o.cls is not None]
    arguments = [o for o in culprits if o.cls is None]
    parts = [_fields_message(name, fields)] if fields else []
    if arguments:
        paths = ", ".join(o.path for o in arguments)
        parts.append(
            f"{name} used the traced argument{'s' if len(arguments) > 1 else ''} "
            f"{paths} {_NEED}. An array argument is traced, its value unknown while "
            "compiling: pass a Python value instead (static: one compile per value), "
            "or keep the array and use `jnp.where` or `jax.lax.cond`."
        )
    said = e.said if isinstance(e, TracedFieldError) else str(e)
    paths = {i: o.path for i, o in leaves.items()}
    own = "the function's own leaf"
    said = _LEAF_INDEX.sub(lambda m: paths.get(int(m[1]), own), said)
    said = _OURS.sub(name + (f" at {where}" if where else ""), said)
    kind = type(e) if nested else _traced_field_error_type(type(e))
    return kind("\n".join(parts) + f"\n\nJAX said: {said}", said)


def _fields_message(name: str, fields: Sequence[Visit]) -> str:
    """What to do about dynamic fields used as concrete values: each named, with
    its class and path, and the one line that makes each static."""
    described, fixes, numbers = [], [], True
    for o in fields:
        assert o.field is not None and o.cls is not None, "a field's visit names it"
        a = field_info(o.cls).annotations.get(o.field)
        numbers = numbers and a in (int, float, complex)
        described.append(f"{o.field!r} of `{o.cls.__qualname__}` (at {o.path})")
        ann = a.__name__ if a in (bool, int, float, complex) else "..."
        fixes.append(f"`{o.field}: {ann} = eqx.field(static=True)`")
    it = "it" if len(fields) == 1 else "them"
    if len(fields) == 1:
        used = f"the traced field {described[0]} {_NEED}. It is a dynamic field"
        held = "a number stored as an array" if numbers else "an array"
        rest = f"its value unknown while compiling. If {fields[0].field!r} selects"
    else:
        listed = ", ".join(described)
        used = f"{len(fields)} traced fields {_NEED}: {listed}. They are dynamic fields"
        held = "numbers stored as arrays" if numbers else "arrays"
        rest = "their values unknown while compiling. If they select"
    return (
        f"{name} used {used} holding {held}, traced, {rest} program structure, "
        f"declare {it} static: {' and '.join(fixes)} (each new value then compiles "
        f"once). Otherwise keep {it} dynamic and use `jnp.where` or `jax.lax.cond`."
    )


def _origin(message: str, leaves: dict[int, Visit]) -> Visit | None:
    for path in _ARGUMENT.findall(message):
        if (m := _LEAF_INDEX.fullmatch(path)) is not None:
            if int(m[1]) in leaves:
                return leaves[int(m[1])]
        else:  # a nested trace's argument: the one field of ours of that name
            field = path.rsplit(".", 1)[-1]
            found = {(o.cls, o.field): o for o in leaves.values() if o.field == field}
            if len(found) == 1:
                return next(iter(found.values()))
    return None


# ----------------------------------------------------------------------------------
# `eqx.error_if` failing at run time raises inside a host callback; JAX reports
# that as a long `JaxRuntimeError` and logs the callback's traceback. As
# `eqx.filter_jit` does, wait for the result, hide that log, and raise
# `eqx.EquinoxRuntimeError` with the message and the stack inside the program.

_callback_logger: Final = logging.getLogger(_jax.CALLBACK_LOGGER)


# `current`: the marker of the miss running in this thread (none before the first):
# Equinox's message shows the stack up to it, and the whole stack outside a miss (a
# hit), as under `eqx.filter_jit`, which marks each call anew.
_marker: Final = threading.local()


@contextlib.contextmanager
def marked(jit_id: bytes) -> Iterator[None]:
    """Within, an `eqx.error_if` failure shows the stack up to `jit_id` (the value of
    a local `__equinox_jit_id__` of the caller, where Equinox looks for it)."""
    previous, _marker.current = getattr(_marker, "current", None), jit_id
    try:
        yield
    finally:
        _marker.current = previous


def reporting_errors(
    call: Callable, wait: Callable[[], bool] = lambda: True
) -> Callable:
    """`call` as `eqx.filter_jit` runs a program that may hold an `eqx.error_if`:
    (if `wait()`, asked after the call) synchronously, a failure raised as
    `EquinoxRuntimeError`."""

    def reporting(*leaves: Any) -> Any:
        __tracebackhide__ = True
        quiet = _jax.FilterCallback()
        _callback_logger.addFilter(quiet)
        try:
            out = call(*leaves)
            for a in jax.tree.leaves(out) if wait() else ():
                if isinstance(a, jax.Array) and not isinstance(a, Tracer):
                    a.block_until_ready()  # one execution: its outputs come together
                    break
        except (_jax.JaxRuntimeError, ValueError) as e:
            info = _jax.equinox_error_info()
            if info is None or "_EquinoxRuntimeError: " not in str(e):
                raise
            marker = getattr(_marker, "current", None)
            mine = itertools.takewhile(lambda f: f != marker, info[1])
            stack = "".join(reversed([f for f in mine if type(f) is str]))
            error = _jax.on_error_message.format(msg=info[0], stack=stack)
            raise eqx.EquinoxRuntimeError(error) from None
        finally:
            _callback_logger.removeFilter(quiet)
        return out

    return reporting
