"""Processes that diverge raise instead of hanging.

On several processes (`jax.distributed`) each process decides alone, at a miss,
whether to reuse a program, compile one or refuse (the compile budget). Where the
processes' programs or decisions differ, the collectives inside wait for each other
for ever. So at a miss of a program whose devices belong to several processes, each
process posts a small record (the program's canonical digest, which holds its avals
and shardings; the decision; the call described field by field, avals and shardings
too; the user's line) to JAX's distributed key-value store; a barrier with a timeout
waits for all of them; process 0 reads them, compares each with its own and posts
the verdict, which the others read; the records are deleted once read. A star, so
that the cost does not grow with the number of processes squared, and a key-value
store, not an XLA collective, so that the check itself cannot hang. On a difference
every process raises `DivergenceError` with process 0's message. A process that hit
where another missed is inside XLA, where nothing can be raised: the process that
timed out posts its message, and a watchdog thread on every process ends one that is
still waiting, with the message and its stack on stderr.

Only what every process computes alike enters a record: no process index, device
id, hash seed or address."""

import atexit
import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import jax

from . import _jax, _report
from ._fields import value_of
from ._key import Key, module_info, visits
from ._sharing import digest


_jax.hide_frames(__file__)


class DivergenceError(RuntimeError):
    """The processes of a multi-process job (`jax.distributed`) diverged at a miss
    of an [`eqx_static.jit`][] program that spans them: their programs differ, or
    their decisions do (one compiles, another reuses a program or refuses at its
    `max_compiles`), and each would wait in the program's collectives for the others.
    Raised on every process, with the same message: the function, each field or
    argument that differs with each process's value, and each process's decision
    and compile count. A process that missed where the others did not raises after
    the timeout; a process stuck in a collective meanwhile is ended, with the message
    and its stack on stderr.

    The check runs at each miss of a program whose devices belong to several
    processes, never at a hit; `EQX_STATIC_CHECK_DIVERGENCE=0` turns it off, and
    `EQX_STATIC_DIVERGENCE_TIMEOUT` sets how long a process waits for the others
    (600 seconds; a warning at 60).

    !!! example

        ```python
        import jax
        import jax.numpy as jnp
        import eqx_static as es

        @es.jit
        def step(x, steps):
            for _ in range(steps):
                x = x * 2
            return x

        # One process has no other to diverge from: the check does not run.
        assert jax.process_count() == 1
        step(jnp.ones(3), 2)

        # On two processes, with `x` sharded over the devices of both and `steps`
        # read from each one's environment, every process raises at the miss,
        # before any collective, the same message:
        #   step: the processes diverged at a miss of a program that spans them
        #   (at train.py:12), and would wait in its collectives for ever:
        #     argument steps: process 0: 2 (int), process 1: 3 (int)
        #     program: process 0: 4c1d9e0a57f2b3e6, process 1: 9f03a1c7d2e4b580
        #     decision: processes 0, 1: compile (compiles so far: 0)
        try:
            step(jnp.ones(3), 3)
        except es.DivergenceError as e:  # stop the job, on every process alike
            raise SystemExit(str(e)) from None
        ```
    """


_PREFIX: Final = "eqx_static/diverge"  # in JAX's key-value store
_ABORT: Final = f"{_PREFIX}/abort"  # a timed-out process's message, for the watchdogs
_checks: Final = itertools.count()  # checked misses, in order: alike on every process
_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
_SAME: Final = (
    "Every process must make the same calls in the same order, with the same static "
    "values (none from its environment or `jax.process_index()`), shapes, shardings, "
    "budgets and caches."
)
# The store a watchdog watches, and whether this process posted the abort (it raised).
_state: Final[dict[str, Any]] = {"client": None, "posted": False}
_stop: Final = threading.Event()
atexit.register(_stop.set)  # at exit, before JAX's own exit (registered earlier)


class Miss(NamedTuple):
    """What the check reads of a miss: the function (`_compile.Function`), the
    call's key and avals, why it missed (`_report.Why`), and whether it traced."""

    f: Any
    key: Key
    avals: Sequence
    why: Any
    traced: bool


def check(miss: Miss | None, lowering: Any, fp: Any, program: Any) -> None:
    """At a miss about to reuse `program`, or (None) to compile: raise
    `DivergenceError` if the processes' programs or decisions differ. Nothing for a
    program of this process alone, nor for a miss that traced nothing and reuses (a
    hit). The switches: `EQX_STATIC_CHECK_DIVERGENCE=0` turns it off;
    `EQX_STATIC_DIVERGENCE_TIMEOUT`, the seconds a process waits for the others."""
    on = _jax.env_switch("EQX_STATIC_CHECK_DIVERGENCE", True)
    limit = _jax.env_seconds("EQX_STATIC_DIVERGENCE_TIMEOUT", 600.0)  # read, so checked
    reused = program is not None
    if not on or miss is None or lowering is None or reused and not miss.traced:
        return
    if not _jax.spans_processes(lowering) or (client := _jax.kv_store()) is None:
        return
    try:  # a refusal is the budget's own rule
        decision = "reuse" if reused else miss.f.check_budget((), None) or "compile"
    except _report.RecompileError:
        decision = "refuse"
    # The canonical module: its avals and shardings, by their types and attributes.
    module = fp.digest if fp is not None else digest(lowering.stablehlo()) or b""
    record = {
        "f": miss.f.name(miss.key),
        "at": _jax.user_line(),
        "compiles": len(miss.f.history),
        "program": hashlib.sha256(module).hexdigest()[:16],
        "decision": decision,
        "key": _described(miss.key, miss.f.argnames, miss.avals),
    }
    if message := _exchange(client, record, miss.why, limit):
        raise DivergenceError(message)


def _described(key: Key, argnames: Sequence[str], avals: Sequence) -> list:
    """The call, node by node, as `[label, value]` in the messages' terms."""
    out, leaves, method = [], iter(avals), argnames[:1] == ("self",)
    for v in visits(key, argnames):
        name, node = v.path.removeprefix("self.") if method else v.path, v.node
        label = f"argument {name}" if v.parent is None else f"field {name!r}"
        if node.kind == "module":
            info = module_info(node.head)
            out.append([label, info.cls.__qualname__])
            for field, tok in zip(info.static_names, node.statics):
                inner = field if name == "self" else f"{name}.{field}"
                out.append([f"static field {inner!r}", _value(tok)])
        elif node.kind == "traced":  # shape, dtype, weak type, sharding
            shape, dtype, weak, sharding = next(leaves, ((), "?", False, None))
            spec = getattr(sharding, "spec", "")  # a partition spec, if any
            out.append([label, f"{dtype}{list(shape)}{' weak' * weak} {spec}".rstrip()])
        elif node.kind == "static":
            out.append([label, _value(node.head)])
    return out


def _value(tok: Any) -> str:
    """A static value as every process writes it: no address, no set order."""
    v = value_of(tok)
    text = _report.show(sorted(v, key=repr) if isinstance(v, frozenset | set) else v)
    return f"{_ADDRESS.sub('', text)[:80]} ({type(v).__qualname__})"


def _exchange(client: Any, record: dict, why: Any, limit: float) -> str:
    """Post the record; past a barrier, process 0 compares them all and posts the
    verdict (a message, or "" if they agree), which every process returns."""
    me, seq, ms = jax.process_index(), next(_checks), int(limit * 1000)
    at, verdict = f"{_PREFIX}/{seq}", f"{_PREFIX}/verdict/{seq}"
    if _state["client"] is not client:  # one watchdog per job
        _state["client"], interval = client, max(1.0, jax.process_count() / 100)  # n/s
        threading.Thread(target=_watchdog, args=(client, interval), daemon=True).start()
    slow = "%s: waiting for every process to come to this miss (at %s), at most %g s"
    said = (slow, record["f"], record["at"], limit)
    warning = threading.Timer(min(60, limit / 2), _report.logger.warning, said)
    warning.start()
    try:
        client.key_value_set(f"{at}/{me:06d}", json.dumps(record))  # sorted so
        try:
            client.wait_at_barrier(at, ms)
        except _jax.JaxRuntimeError:
            return _timed_out(client, at, record, why, limit)
        if me != 0:  # process 0 posts the verdict as it passes the barrier
            return client.blocking_key_value_get(verdict, ms)[1:]
        records = [json.loads(v) for _, v in sorted(client.key_value_dir_get(f"{at}/"))]
        client.key_value_set(verdict, "=" + (message := _compared(records)))  # never ""
        client.key_value_delete(f"{at}/")  # as the last verdict: all read it by now
        client.key_value_delete(f"{_PREFIX}/verdict/{seq - 1}")
        return message
    finally:
        warning.cancel()


def _compared(records: list[dict]) -> str:
    """The message if the records' programs or decisions differ, else ""."""
    first, keys = records[0], [dict(r["key"]) for r in records]
    if all(r[k] == first[k] for r in records for k in ("f", "program", "decision")):
        return ""
    for r, k in zip(records, keys):  # each miss's call, program and decision
        k.update(call=f"{r['f']} at {r['at']}", program=r["program"])
        k["decision"] = f"{r['decision']} (compiles so far: {r['compiles']})"
    labels = dict.fromkeys(label for k in keys for label in k)
    differ = [k for k in labels if len({d.get(k) for d in keys}) > 1]
    lines = [
        f"{k}: {_by_process([d.get(k, 'absent') for d in keys])}"
        for k in [*differ[:8], "program", "decision"]
    ]
    return (
        f"{first['f']}: the processes diverged at a miss of a program that spans them "
        f"(at {first['at']}), and would wait in its collectives for ever:\n  "
        + "\n  ".join(dict.fromkeys(lines))
        + f"\n{_SAME}"
    )


def _by_process(values: Sequence[str]) -> str:
    """`process 0: a, processes 1-3: b`: the processes grouped by value."""
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(v, []).append(i)
    return ", ".join(f"{_who(ids)}: {v}" for v, ids in groups.items())


def _who(ids: Sequence[int]) -> str:
    more = f", ... ({len(ids)} in all)" if len(ids) > 8 else ""
    return f"process{'es' * (len(ids) > 1)} {', '.join(map(str, ids[:8]))}{more}"


def _timed_out(client: Any, at: str, record: dict, why: Any, limit: float) -> str:
    """The message of a process that waited in vain, posted for the watchdogs."""
    came = set()  # those who posted
    with contextlib.suppress(_jax.JaxRuntimeError):
        came = {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(f"{at}/")}
    absent = [i for i in range(jax.process_count()) if i not in came]
    what = _report.phrase(why.changes) if why.changes else "its first call"
    message = (
        f"{record['f']}: this call missed (at {record['at']}: {what}) and would "
        f"{record['decision']}, but {_who(absent)} did not come to this miss within "
        f"{limit:g} s: it hit the call, or runs other code. {_SAME}"
    )
    _state["posted"] = True
    with contextlib.suppress(_jax.JaxRuntimeError):  # or another process did
        client.key_value_set(_ABORT, message)
    return message


def _watchdog(client: Any, interval: float) -> None:
    """End this process once another timed out (and so raised)."""
    while not _stop.wait(interval) and _jax.kv_store() is client:
        with contextlib.suppress(_jax.JaxRuntimeError):  # none posted
            message = client.key_value_try_get(_ABORT)
            return None if _state["posted"] else _end(message)


def _end(message: str) -> None:
    """End this process, stuck (where nothing can be raised) after another raised."""
    main = sys._current_frames().get(threading.main_thread().ident or 0)
    sys.stderr.write(
        f"eqx_static: process {jax.process_index()} is ended, for another raised "
        f"es.DivergenceError:\n{message}\nIt was waiting here:\n"
    )
    traceback.print_stack(main, file=sys.stderr)
    sys.stderr.flush()
    try:
        jax.distributed.shutdown()  # through JAX's shutdown barrier, as the others
    finally:
        os._exit(1)
