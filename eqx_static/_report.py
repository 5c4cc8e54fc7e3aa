"""What `es.jit` tells the user: why a call compiled (the INFO line), the compile
budget (`RecompileError`), the storm warning, and the errors a compiled call raises
(a traced field used as a Python value; `eqx.error_if` at run time, as
`eqx.filter_jit` reports it). All of it reads structured records: a key's nodes
(`_key.walk`) and the `Change`s found between two keys."""

import functools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import equinox as eqx
import jax
from jax.core import Tracer

from ._compat import (
    CALLBACK_LOGGER,
    equinox_error_info,
    FilterCallback,
    hide_frames,
    JaxRuntimeError,
    on_error_message,
)
from ._key import ARRAYS, is_hashable, is_module_node, Key, LEAF, STATIC, value_of, walk
from ._module import field_info


hide_frames(__file__)

logger: Final = logging.getLogger("eqx_static")


# ----------------------------------------------------------------------------------
# What changed between two calls.


class Change(NamedTuple):
    """One difference between two calls, in field terms."""

    phrase: str  # "static field 'sp' changed False -> True"
    name: str  # what it is about: "sp", "encoder.act", "x", "y[1]"
    kind: str  # "static field", "leaf", "argument", "array", "structure", "context"


class Origin(NamedTuple):
    """Where a traced leaf comes from."""

    path: str
    cls: type | None
    field: str | None


def leaf_origins(key: Key, argnames: Sequence[str]) -> list[Origin]:
    """The origin of each traced leaf of `key`, in order."""
    return [
        Origin(v.path, v.cls, v.field) for v in walk(key, argnames) if v.node is LEAF
    ]


def unhashable_message(name: str, key: Key) -> str:
    """The error for a call with an unhashable static leaf: where it is, and the
    hashable value to pass instead."""
    for v in walk(key, ()):
        n = v.node
        if type(n) is tuple and n[0] is STATIC and not is_hashable(value_of(n[2])):
            t = n[1]
            fix = _HASHABLE.get(
                t, "a hashable value, or an array if it is data (traced)"
            )
            return (
                f"`{name}` got {v.path}, a {t.__name__}, which is not hashable. A "
                "non-array argument is static: it keys the compilation cache, as under "
                f"`eqx.filter_jit`, so it must be hashable. Pass {fix} instead."
            )
    return f"`{name}` got an unhashable static value."


_HASHABLE: Final = {
    list: "a tuple",
    set: "a frozenset",
    dict: "a tuple of its items",
}


class _Where(NamedTuple):
    path: str
    method: bool  # paths are named relative to `self`

    @property
    def name(self) -> str:
        if self.method and self.path.startswith("self."):
            return self.path.removeprefix("self.")
        return self.path

    @property
    def is_self(self) -> bool:
        return self.method and self.path == "self"

    @property
    def is_argument(self) -> bool:
        return "." not in self.path and "[" not in self.path

    def what(self) -> str:
        if self.is_self:
            return "self"
        return f"argument {self.path}" if self.is_argument else f"field {self.name!r}"


def diff(old: Key, new: Key, argnames: Sequence[str]) -> list[Change]:
    """What differs from `old` to `new`: a node whose kind, class or structure
    differs is reported and nothing below it; a module's static fields one by one."""
    if len(old.args) != len(new.args) or old.names != new.names:
        phrase = (
            f"call signature changed: {len(old.args)} -> {len(new.args)} positional, "
            f"keywords {list(old.names)} -> {list(new.names)}"
        )
        return [Change(phrase, "call", "structure")]
    method = bool(argnames) and argnames[0] == "self"
    before = {v.path: v.node for v in walk(old, argnames)}
    out: list[Change] = []
    stopped: set[str] = set()
    for v in walk(new, argnames):
        if v.parent in stopped:
            stopped.add(v.path)
            continue
        a, b = before[v.path], v.node
        if a == b or _compare(a, b, _Where(v.path, method), out):
            stopped.add(v.path)
    return out


def _compare(a: Any, b: Any, where: _Where, out: list[Change]) -> bool:
    """Append what differs between the nodes `a` and `b` themselves; return whether
    their children are not to be compared."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        out.append(
            Change(
                f"{where.what()} changed kind: {ka} -> {kb}", where.name, "structure"
            )
        )
        return True
    if ka == "module":
        if a[0] is not b[0]:
            who = "class" if where.is_self else f"{where.what()} class"
            phrase = f"{who} {a[0].__qualname__} -> {b[0].__qualname__}"
            out.append(Change(phrase, where.name, "structure"))
            return True
        names = field_info(a[0]).static_names
        for name, x, y, tx, ty in zip(names, a[1], b[1], a[2], b[2]):
            if tx is not ty or x != y:
                field = name if where.is_self else f"{where.name}.{name}"
                phrase = f"static field {field!r} changed {_show(x)} -> {_show(y)}"
                out.append(Change(phrase, field, "static field"))
        if a[4] != b[4]:
            out.append(
                Change(
                    f"{where.what()} extra attributes changed", where.name, "structure"
                )
            )
        return False
    if ka == "static":
        kind = "argument" if where.is_argument else "leaf"
        phrase = f"{where.what()} changed {_show(a[2])} -> {_show(b[2])}"
        out.append(Change(phrase, where.name, kind))
        return True
    if a is LEAF or a is None:
        return True
    if a[0] is ARRAYS or a[:-1] != b[:-1] or len(a[-1]) != len(b[-1]):
        out.append(Change(f"{where.what()} structure changed", where.name, "structure"))
        return True
    return False


def _kind(n: Any) -> str:
    if n is LEAF:
        return "traced"
    if n is None:
        return "None"
    if is_module_node(n):
        return "module"
    return "sequence" if n[0] is ARRAYS else n[0].name


def _show(s: Any) -> str:
    return repr(value_of(s))


def _describe_leaf(o: Origin, a: tuple, b: tuple) -> Change:
    """A change of one traced leaf's shape, dtype, weak type or sharding."""
    if o.field and o.path.startswith("self."):
        name = o.path.removeprefix("self.")
        where = f"field {name!r}"
    else:
        name = o.path
        where = f"field {o.path!r}" if o.field else f"argument {o.path}"
    for what, i in (("shape", 0), ("dtype", 1), ("weak type", 2)):
        if a[i] != b[i]:
            return Change(f"{where} {what} {a[i]} -> {b[i]}", name, "array")
    phrase = f"{where} sharding {_show_sharding(a[3])} -> {_show_sharding(b[3])}"
    return Change(phrase, name, "array")


def _show_sharding(s: Any) -> str:
    if s is None:
        return "uncommitted"
    spec = getattr(s, "spec", None)
    return repr(spec) if spec is not None else type(s).__name__


class Seen(NamedTuple):
    """A compiled signature of a key: what a new call is explained against."""

    key: Key
    sig: tuple  # each traced leaf's shape, dtype, weak type and sharding
    context: Any  # JAX's configuration
    program: Any  # what it runs


def explain(
    known: Sequence[Seen], key: Key, sig: tuple, context: Any, argnames: Sequence[str]
) -> tuple[list[Change], Seen | None]:
    """What differs between the call `(key, sig, context)` and the closest of
    `known` (the fewest differences; the most recent of equals), and that one."""
    best: tuple[list[Change], Seen | None] = ([], None)
    for seen in reversed(known[-64:]):
        changes = diff(seen.key, key, argnames)
        if seen.sig != sig and not any(c.kind == "structure" for c in changes):
            origins = leaf_origins(key, argnames)  # the leaves line up
            pairs = zip(origins, seen.sig, sig)
            changes += [_describe_leaf(o, a, b) for o, a, b in pairs if a != b]
        if not changes and seen.context != context:
            changes = [Change("JAX's configuration changed", "context", "context")]
        if best[1] is None or len(changes) < len(best[0]):
            best = (changes, seen)
    return best


class Differ(NamedTuple):
    """Where a new program first differs from the closest compiled one."""

    place: str  # `model.py:42 in __call__ (tanh where max was)`
    constant: bool  # only in a constant: the same structure

    def __str__(self) -> str:
        if self.constant:
            return f"the programs differ only in a constant, at {self.place}"
        return f"the programs first differ at {self.place}"


def phrase(changes: Sequence[Change], differ: Differ | None = None) -> str:
    """What changed, and where the programs differ, as one explanation."""
    text = "; ".join(c.phrase for c in changes) or "same key and avals"
    return f"{text}; {differ}" if differ else text


# ----------------------------------------------------------------------------------
# Compile budgets: `max_compiles`, and the storm warning.


class RecompileError(RuntimeError):
    """An [`eqx_static.jit`][] function would compile more often than its
    `max_compiles` allows. The message says what changed, for this compile and
    every earlier one. It is raised before XLA compiles.

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
        with pytest.raises(es.RecompileError, match="static field 'n' changed 2 -> 3"):
            Model(n=3)(jnp.ones(2))
        ```
    """


class Compile(NamedTuple):
    """One XLA compile of an `es.jit` function, as the budget and storm read it."""

    changes: tuple[Change, ...]  # from the closest cached call (empty: the first)
    seconds: float
    structure: bytes | None  # the program with its constants masked
    differ: Differ | None  # where it first differs from the closest compiled one


def budget_error(
    qualname: str,
    limit: int,
    history: Sequence[Compile],
    changes: Sequence[Change],
    differ: Differ | None,
) -> RecompileError:
    lines = "".join(
        f"\n  compile {i + 1}: {', '.join(dict.fromkeys(c.name for c in h.changes)) or 'first call'}"
        for i, h in enumerate(history)
    )
    fix = _fix(changes[0], differ is None or differ.constant) if changes else ""
    return RecompileError(
        f"{qualname}: compile {len(history) + 1} exceeds `max_compiles={limit}`: "
        f"{phrase(changes, differ)}.\nEarlier compiles (what changed from the one "
        f"before):{lines}\n{fix} (If these compiles are expected, raise "
        "`max_compiles`.)"
    )


def storm(
    name: str, history: Sequence[Compile], reused: dict[str, int], n: int
) -> bool:
    """After `n` compiles in which one field or argument changed every time, log
    one WARNING naming it, the time spent and what to do; return whether it did.
    Of several that changed every time, the one that changed least often without a
    new program is named (a field that also changed alone, sharing a program, is
    not what makes the programs differ)."""
    recent = history[-n:]
    per_compile = [{c.name: c for c in h.changes} for h in recent[1:]]
    if not per_compile:
        return False
    common = set(per_compile[0]).intersection(*per_compile[1:])
    if not common:
        return False
    culprit = min(common, key=lambda k: (reused.get(k, 0), k))
    change = per_compile[-1][culprit]
    structures = [h.structure for h in recent]
    constant = None not in structures and len(set(structures)) == 1
    differ = recent[-1].differ
    at = f" (at {differ.place})" if differ else ""
    if change.kind == "array":
        verdict = ""
    elif constant:
        verdict = f"The programs differ only in their constants{at}: {culprit!r} is only used as a value. "
    else:
        verdict = f"The programs differ in their structure, not only in constants{at}. "
    logger.warning(
        "%s has compiled %d times, and %r changed every time (%.2f s spent "
        "compiling). %s%s",
        name,
        len(history),
        culprit,
        sum(h.seconds for h in history),
        verdict,
        _fix(change, constant),
    )
    return True


def _fix(change: Change, constant: bool) -> str:
    """What to do about a value that keeps changing, for its kind: trace it if the
    programs differ only in its constants; else it picks program structure."""
    name = repr(change.name)
    if change.kind == "array":
        return (
            f"{name} is an array whose shape, dtype or sharding keeps changing, and "
            "each new one is a new program: pad or bucket shapes to a few sizes."
        )
    if change.kind in ("structure", "context"):
        return f"Keep {name} the same from call to call (its structure, or JAX's configuration)."
    if not constant:
        return (
            f"{name} picks program structure (an `if`, a loop length, a shape), so "
            "it must stay static: reduce the number of distinct values."
        )
    return {
        "static field": f"Make {name} dynamic: drop `static=True`, and a number is "
        "stored as an array and traced, with no compile per value.",
        "leaf": f"{name} is a Python value in a dynamic field (as `eqx.tree_at` or a plain "
        "`eqx.Module` leaves one): store an array there instead (`jnp.asarray(v)`, or "
        "`with_dynamic`), and it is traced, with no compile per value.",
        "argument": f"{name} is a Python value passed as an argument: pass "
        "`jnp.asarray(v)` instead, and it is traced, with no compile per value.",
    }[change.kind]


# ----------------------------------------------------------------------------------
# A traced field used where Python needs a value (trace time).


class TracedFieldError(jax.errors.ConcretizationTypeError):
    """A traced (dynamic) field, or a traced argument, was used where Python needs a
    concrete value.

    The message names the field and its class (or the argument), and the fix for
    what it is: declare a field static if it selects program structure, pass a
    Python value for an argument, or branch with `jnp.where`/`jax.lax.cond`. The
    error is also an instance of the JAX error it replaces
    (`jax.errors.TracerBoolConversionError`, ...), and its traceback ends at the
    offending line.

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

    def __init__(self, message: str):  # pyright: ignore[reportMissingSuperCall]
        TypeError.__init__(self, message)


@functools.cache
def _traced_field_error_type(jax_error: type) -> type:
    if issubclass(jax_error, TracedFieldError):
        return jax_error
    return type("TracedFieldError", (TracedFieldError, jax_error), {})


# The traced function's parameter: JAX names a traced leaf `_es_leaves[i]`.
LEAVES_NAME: Final = "_es_leaves"
_LEAF_INDEX: Final = re.compile(LEAVES_NAME + r"\[(\d+)\]")


def traced_field_error(
    name: str, e: Exception, key: Key, argnames: Sequence[str], n_fn: int
) -> Exception:
    """`TracedFieldError` naming the field or argument behind the traced leaf JAX
    named in `e`, with the fix for what it is (`e` itself if it named none). `n_fn`
    leaves of the function come first."""
    indices = [int(i) - n_fn for i in _LEAF_INDEX.findall(str(e))]
    origins = leaf_origins(key, argnames)
    found = [origins[i] for i in indices if 0 <= i < len(origins)]
    if not found:
        return e
    o = found[0]
    need = "where Python needs a concrete value (`if`, `bool()`, `int()`, a shape, ...)"
    if o.field is None or o.cls is None:
        what = (
            f"{name} used the traced argument {o.path} {need}. An array argument is "
            "traced, its value unknown while compiling: pass a Python value instead "
            "(static: one compile per value), or keep the array and use `jnp.where` "
            "or `jax.lax.cond`."
        )
    else:
        ann = field_info(o.cls).annotations.get(o.field)
        kind = (
            "a number stored as an array"
            if ann in (int, float, complex)
            else "an array"
        )
        what = (
            f"{name} used the traced field {o.field!r} of `{o.cls.__qualname__}` (at "
            f"{o.path}) {need}. It is a dynamic field holding {kind}, traced, its "
            f"value unknown while compiling. If {o.field!r} selects program "
            f"structure, declare it static: `{o.field}: ... = eqx.field(static=True)` "
            "(each new value then compiles once). Otherwise keep it dynamic and use "
            "`jnp.where` or `jax.lax.cond`."
        )
    return _traced_field_error_type(type(e))(f"{what}\n\nJAX said: {e}")


# ----------------------------------------------------------------------------------
# `eqx.error_if` failing at run time. It raises inside a host callback; JAX reports
# that as a long `JaxRuntimeError` and logs the callback's traceback. As
# `eqx.filter_jit` does, wait for the result, hide that log, and raise
# `eqx.EquinoxRuntimeError` with the message and the stack inside the program.

_callback_logger: Final = logging.getLogger(CALLBACK_LOGGER)


class _Marker(threading.local):
    """The marker of the call being traced in this thread, None outside a miss:
    Equinox's message shows the stack inside the compiled function up to the
    marker of the call that traced it, and for any other call the whole recorded
    stack, as `eqx.filter_jit`, which marks each call anew, does."""

    def __init__(self):
        self.current: bytes | None = None


marker: Final = _Marker()


def reporting_errors(call: Callable, wait: bool = True) -> Callable:
    """`call`, run as `eqx.filter_jit` runs a program that may hold an
    `eqx.error_if`: synchronously (if `wait`), its failure raised as
    `EquinoxRuntimeError`."""

    def reporting(*leaves: Any) -> Any:
        __tracebackhide__ = True
        quiet = FilterCallback()
        _callback_logger.addFilter(quiet)
        try:
            out = call(*leaves)
            if wait:
                _wait_for(out)
        except (JaxRuntimeError, ValueError) as e:
            info = equinox_error_info()
            if info is None or "_EquinoxRuntimeError: " not in str(e):
                raise
            raise eqx.EquinoxRuntimeError(_message(info, marker.current)) from None
        finally:
            _callback_logger.removeFilter(quiet)
        return out

    return reporting


def _wait_for(out: Any) -> None:
    arrays = out[0] if type(out) is tuple else [out]
    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, Tracer):
            a.block_until_ready()  # one execution: its outputs are ready together
            return


def _message(info: tuple[str, list], eqx_id: bytes | None) -> str:
    msg, stack = info
    pieces: list[str] = []
    for frame in stack:
        if type(frame) is str:
            pieces.append(frame)
        elif frame == eqx_id:
            break
    return on_error_message.format(msg=msg, stack="".join(reversed(pieces)))
