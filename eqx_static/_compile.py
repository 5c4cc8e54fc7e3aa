"""The miss path: every call that is not a hit, and every trace and compile of an
`es.jit` function.

Each key has its own C++ dispatcher (`Entry.dispatch`, JAX's `PjitFunction`, as a
`jax.jit` has), which serves its hits and calls `_cache_miss` for anything it has
no executable for: new shapes, a new sharding, a new context, a transformation.
A miss outside any transformation traces and lowers the call with a `jax.jit`
made for it, compares the program with those this function compiled
(`Fingerprint`), installs the executable of one that is provably the same, or
compiles, and lets that `jax.jit` run it and hand the dispatcher what it needs to
serve the next call in C++. Nothing else of that `jax.jit` is kept: its trace and
lowering die with it. Under a transformation the call is staged into the outer
trace with the key's own trace (`Entry.staged`), as `eqx.filter_jit` stages it.

Compiles are counted from what JAX reports (`jax.monitoring`), in a window this
path opens around everything it asks of JAX: whatever JAX compiles for the
function while it runs, asked for or not, is booked.
"""

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import re
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from ._compat import (
    cell_bound_once,
    COMPILE_EVENT,
    dispatcher,
    EQUINOX_MESSAGE_ONLY,
    executable_of,
    flat_callback,
    hide_frames,
    is_equinox_error_callback,
    jax_jit,
    jit_is_replaced,
    jit_miss,
    lowering_of,
    nested_jaxprs,
    open_jaxpr,
    pgle_enabled,
    program_options,
    set_executable,
    trace_context,
    user_frame,
    xla_executable,
)
from ._key import (
    ARRAY_TYPES,
    build,
    build_call,
    count_leaves,
    deep,
    form,
    is_module_node,
    Key,
    SIMPLE,
    typed,
)
from ._module import is_module_type
from ._report import (
    budget_error,
    Change,
    Compile,
    Differ,
    explain,
    LEAVES_NAME,
    logger,
    marker,
    phrase,
    reporting_errors,
    Seen,
    storm,
    traced_field_error,
    TracedFieldError,
)


hide_frames(__file__)

_UNUSABLE_DONATION: Final = "Some donated buffers were not usable"


# ----------------------------------------------------------------------------------
# What the cache holds.


class Fingerprint(NamedTuple):
    """What decides whether two lowerings are one program."""

    digest: bytes  # SHA-256 of the module, constants in full, no locations
    arguments: tuple  # compile arguments, compared by `==`
    callbacks: tuple  # host callbacks and objects kept alive, compared by `same`


class Program:
    """One XLA compile made by the miss path, and the executable that every key
    whose program is provably the same runs."""

    __slots__ = ("executable", "fingerprint", "number", "ops", "structure", "users")

    def __init__(
        self,
        number: int,
        fp: Fingerprint | None,
        executable: Any,
        ops: Any,
        structure: bytes | None,
    ):
        self.number = number  # among this function's compiles, from 1
        self.fingerprint = fp  # None: not comparable, never shared
        self.executable = executable
        self.ops = ops  # the per-operation summary `_where` compares
        self.structure = structure  # the module's digest with constants masked
        self.users = 0  # signatures that run it

    @property
    def has_callbacks(self) -> bool:
        return self.fingerprint is None or bool(self.fingerprint.callbacks)


class Entry:
    """One compile key: its dispatcher, and what each signature it ran runs."""

    __slots__ = ("call", "dispatch", "helper", "key", "runs", "used")

    def __init__(self, key: Key):
        self.key = key
        self.dispatch: Any = None  # C++: serves its hits, calls `_cache_miss`
        self.call: Callable = lambda *leaves: self.dispatch(*leaves)  # what a hit calls
        # Its `jax.jit`, called by the miss path only: kept (with JAX's trace and
        # lowering) if it compiled a program or ran under a transformation.
        self.helper: Any = None
        self.runs: dict[tuple, Program | None] = {}  # (signature, context) -> program
        self.used = 0  # for `maxsize`: when it was last called


class CacheInfo(NamedTuple):
    """Statistics of an [`eqx_static.jit`][] cache, as `functools.lru_cache` reports
    them: a hit is a call that ran an executable it had, without tracing or
    compiling; every other call is a miss; `currsize` counts compiled signatures.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        @es.jit
        def double(x):
            return 2 * x

        double(jnp.ones(3))
        double(jnp.ones(3))
        assert double.cache_info() == es.CacheInfo(
            hits=1, misses=1, maxsize=None, currsize=1
        )
        ```
    """

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class CompileInfo(NamedTuple):
    """The XLA compiles of an [`eqx_static.jit`][] function since its cache was
    cleared (every one JAX made while a call of it ran, counted from JAX's own
    events), the programs its keys run now (keys whose programs are the same
    share one), and the seconds spent compiling.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            name: str = eqx.field(static=True)  # the method never reads it

            @es.jit
            def __call__(self, x):
                return 2 * x

        Model("a")(jnp.ones(3))
        Model("b")(jnp.ones(3))                 # traced: the same program
        info = Model.__call__.compile_info()
        assert (info.compiles, info.programs) == (1, 1)
        assert Model.__call__.cache_info().misses == 2
        ```
    """

    compiles: int
    programs: int
    seconds: float


def _read(counter: "itertools.count[int]") -> int:
    """An `itertools.count`'s next value, read without advancing it."""
    return int(repr(counter)[6:-1])


class Cache:
    """The keys, programs and statistics of one function (shared by every wrapper
    of it with the same options). Its lock guards bookkeeping only: it is never
    held while JAX traces, compiles or runs a program."""

    def __init__(self, maxsize: int | None):
        self.maxsize = maxsize
        self.entries: dict[Key, Entry] = {}
        self.calls = itertools.count()  # counted in C: no lock, no lost increment
        self.misses = 0
        self.at_clear = 0  # calls counted before the last `clear`
        self.clock = itertools.count(1)
        self.programs: dict[bytes, list[Program]] = {}  # by module digest
        self.compiling: dict[bytes, threading.Event] = {}  # by module digest
        self.history: list[Compile] = []  # every XLA compile since `clear`
        self.reused: dict[str, int] = {}  # name -> misses that changed it, shared
        self.warned = False
        self.lock = threading.Lock()

    def info(self) -> CacheInfo:
        with self.lock:
            size = sum(len(e.runs) for e in self.entries.values())
            calls = _read(self.calls) - self.at_clear
            return CacheInfo(calls - self.misses, self.misses, self.maxsize, size)

    def compile_info(self) -> CompileInfo:
        with self.lock:
            programs = sum(1 for ps in self.programs.values() for p in ps if p.users)
            seconds = sum(c.seconds for c in self.history)
            return CompileInfo(len(self.history), programs, seconds)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.programs.clear()
            self.at_clear = _read(self.calls)
            self.misses = 0
            self.history.clear()
            self.reused.clear()
            self.warned = False

    def known(self) -> list[Seen]:
        """Every compiled signature: its key, avals, context and program."""
        with self.lock:
            return [
                Seen(e.key, s, c, p)
                for e in self.entries.values()
                for (s, c), p in e.runs.items()
            ]

    def book_miss(self, changes: Sequence[Change] = (), shared: bool = False) -> None:
        with self.lock:
            self.misses += 1
            for c in changes if shared else ():
                self.reused[c.name] = self.reused.get(c.name, 0) + 1

    def find(self, fp: Fingerprint | None) -> Program | None:
        """A program compiled already that is provably the same as `fp`. Waits while
        another thread compiles the same module, then looks again; else marks this
        one as being compiled (`done_compiling` unmarks it)."""
        if fp is None:
            return None
        while True:
            with self.lock:
                for p in self.programs.get(fp.digest, ()):
                    if p.fingerprint is not None and same_program(p.fingerprint, fp):
                        return p
                event = self.compiling.get(fp.digest)
                if event is None:
                    self.compiling[fp.digest] = threading.Event()
                    return None
            event.wait()  # no lock held meanwhile

    def running(self, executable: Any) -> Program | None:
        """The program whose XLA executable this executable holds."""
        xla = xla_executable(executable)
        with self.lock:
            programs = [p for ps in self.programs.values() for p in ps]
        return next((p for p in programs if xla_executable(p.executable) is xla), None)

    def done_compiling(self, fp: Fingerprint | None, program: Program | None) -> None:
        with self.lock:
            if program is not None and program.fingerprint is not None:
                self.programs.setdefault(program.fingerprint.digest, []).append(program)
            event = None if fp is None else self.compiling.pop(fp.digest, None)
        if event is not None:
            event.set()

    def add_run(self, entry: Entry, run: tuple, program: Program | None) -> None:
        """Record that `entry` runs `program` for `run` (signature and context); then
        evict the least recently used other keys while more than `maxsize`
        signatures are held. A program no key runs is forgotten."""
        with self.lock:
            old = entry.runs.get(run)
            if old is not None:
                old.users -= 1
            entry.runs[run] = program
            if program is not None:
                program.users += 1
            self.entries.setdefault(entry.key, entry)  # evicted meanwhile: back
            if self.maxsize is None:
                return
            size = sum(len(e.runs) for e in self.entries.values())
            for other in sorted(self.entries.values(), key=lambda e: e.used):
                if size <= self.maxsize:
                    break
                if other is not entry:
                    del self.entries[other.key]
                    size -= len(other.runs)
                    self._release(other)

    def _release(self, entry: Entry) -> None:
        for program in entry.runs.values():
            if program is not None:
                program.users -= 1
                if not program.users and program.fingerprint is not None:
                    same = self.programs.get(program.fingerprint.digest, [])
                    same[:] = [p for p in same if p is not program]
                    if not same:
                        self.programs.pop(program.fingerprint.digest, None)


# ----------------------------------------------------------------------------------
# The function being compiled.


class Function:
    """What the miss path knows of an `es.jit` function (made by its wrapper)."""

    def __init__(
        self,
        fn: Callable,
        fn_node: Any,
        n_fn: int,
        argnames: tuple[str, ...],
        donate: str,
        max_compiles: int | None,
        warn_after: int | None,
        cache: Cache,
    ):
        self.fn = fn
        # How a traced function gets `fn`: a plain function by a weak reference (its
        # cache dies with it); a pytree callable rebuilt from its traced leaves.
        self.fn_node = None if type(fn) is types.FunctionType else fn_node
        self.fn_ref = weakref.ref(fn) if self.fn_node is None else None
        self.n_fn = n_fn
        self.qualname: str = getattr(fn, "__qualname__", repr(fn))
        self.short: str = getattr(fn, "__name__", "fn")
        self.method = False  # set when the wrapper is a class attribute
        self.argnames = argnames
        self.donate = donate
        self.max_compiles = max_compiles
        self.warn_after = warn_after
        self.cache = cache

    def name(self, key: Key) -> str:
        """`Class.method` for a method called on a module, else the qualname."""
        if self.method and key.args and is_module_node(key.args[0]):
            return f"{key.args[0][0].__qualname__}.{self.short}"
        return self.qualname

    def check_budget(self, changes: Sequence[Change], differ: Differ | None) -> None:
        """Raise `RecompileError` if one more XLA compile exceeds `max_compiles`."""
        limit, history = self.max_compiles, self.cache.history
        if limit is not None and len(history) >= limit:
            raise budget_error(self.qualname, limit, history, changes, differ)

    @property
    def quiet_donation(self) -> bool:
        return self.donate in ("all", "all-except-first")


class _Local(threading.local):
    def __init__(self):
        self.traces = 0  # traces made in this thread
        self.window: _Window | None = None  # compiles are booked to it


_local: Final = _Local()


def new_entry(f: Function, key: Key, leaves: Sequence) -> Entry:
    """A key's entry, with its dispatcher, in the cache at once: a call of the key
    from another thread while this one's first miss runs finds it, and JAX's
    dispatcher makes it wait for that miss instead of tracing again."""
    entry = Entry(key)
    _new_dispatch(f, entry, leaves)
    with f.cache.lock:
        return f.cache.entries.setdefault(key, entry)


def _new_dispatch(f: Function, entry: Entry, leaves: Sequence) -> None:
    eager = _traced(f, entry.key, eager=True)
    miss = functools.partial(_cache_miss, f, entry)
    entry.dispatch = dispatcher(f.short, eager, miss, _donated(f, entry.key, leaves))
    entry.call = _calling(f, entry, reports=False)
    entry.helper = None


def _calling(f: Function, entry: Entry, reports: bool) -> Callable:
    """What a call of `entry` calls: its dispatcher; made to wait for the result and
    report `eqx.error_if`'s failures as Equinox does, if a program may hold one;
    made to hide JAX's unusable-donation warning, if `donate` says so."""
    call = entry.dispatch
    if reports:
        call = reporting_errors(call)
    if f.quiet_donation:
        call = _quietly(call, f)
    return call


def _traced(f: Function, key: Key, eager: bool = False) -> Callable:
    """The function `jax.jit` traces for `key`: it rebuilds the call from the key and
    the traced leaves, and runs it (eagerly, under `jax.disable_jit()`)."""
    fn_node, fn_ref, n_fn, argnames, cache = (
        f.fn_node,
        f.fn_ref,
        f.n_fn,
        f.argnames,
        f.cache,
    )
    name = f.name(key)

    def traced(*_es_leaves: Any) -> Any:
        _local.traces += 1
        if fn_ref is None:
            fn = deep(build, fn_node, iter(_es_leaves[:n_fn]))
        else:
            fn = fn_ref()
            assert fn is not None, "a live wrapper holds its function"
        args, kwargs = deep(build_call, key, _es_leaves[n_fn:])
        if eager:
            cache.book_miss()  # it runs: eager, as `eqx.filter_jit` runs it
            return fn(*args, **kwargs)
        try:
            out = fn(*args, **kwargs)
        except TracedFieldError:
            raise
        except Exception as e:
            if LEAVES_NAME + "[" not in str(e):
                raise
            error = traced_field_error(name, e, key, argnames, n_fn)
            raise error.with_traceback(e.__traceback__) from None
        arrays, static = split(out)
        return arrays[0] if static.mask is None else (arrays, static)

    traced.__name__ = f.short
    traced.__qualname__ = f.qualname
    return traced


def _donated(f: Function, key: Key, leaves: Sequence) -> tuple[int, ...]:
    """The positions of the leaves whose buffers `donate` gives to XLA."""
    if f.donate == "none":
        return ()
    skip = f.n_fn
    if f.donate.endswith("except-first") and key.args:
        skip += count_leaves(key.args[0])
    return tuple(
        i
        for i, x in enumerate(leaves)
        if (i >= skip or i < f.n_fn) and isinstance(x, jax.Array)
    )


# ----------------------------------------------------------------------------------
# Booking what JAX compiles.


class _Window:
    """What this thread is asking of JAX for one function: every compile JAX
    reports meanwhile for a program of its name is booked to it."""

    def __init__(self, f: Function):
        self.f = f
        self.fun_name = f"jit({f.short})"
        self.planned = False  # the compile JAX is about to make was asked for
        self.expect_none = False  # no compile should happen: one was installed
        self.changes: Sequence[Change] = ()
        self.structure: bytes | None = None
        self.differ: Differ | None = None
        self.number = 0  # of the last compile booked
        self.previous: _Window | None = None

    def __enter__(self) -> "_Window":
        self.previous, _local.window = _local.window, self
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.window = self.previous

    def starting(self) -> None:
        if self.expect_none:
            _sharing_broken()
        elif not self.planned:
            self.f.check_budget(self.changes or _AGAIN, None)

    def finished(self, seconds: float) -> None:
        record = Compile(tuple(self.changes), seconds, self.structure, self.differ)
        with self.f.cache.lock:
            self.f.cache.history.append(record)
            self.number = len(self.f.cache.history)
        self.planned = False


def _on_compile_start(event: str, value: float, **kwargs: Any) -> None:
    w = _local.window
    if (
        w is not None
        and event == COMPILE_EVENT
        and kwargs.get("fun_name") == w.fun_name
    ):
        w.starting()


def _on_compile_end(event: str, duration_secs: float, **kwargs: Any) -> None:
    w = _local.window
    if (
        w is not None
        and event == COMPILE_EVENT
        and kwargs.get("fun_name") == w.fun_name
    ):
        w.finished(duration_secs)


jax.monitoring.register_scalar_listener(_on_compile_start)
jax.monitoring.register_event_duration_secs_listener(_on_compile_end)

_sharing: Final = [True]


def _sharing_broken() -> None:
    """JAX compiled a call whose executable the miss path had installed: this JAX
    does not run what a lowering holds. Stop sharing programs, and say so once."""
    if _sharing[0]:
        _sharing[0] = False
        warnings.warn(
            f"eqx_static: jax {jax.__version__} compiled a program whose executable "
            "es.jit had installed, so es.jit stops sharing programs between keys in "
            "this process (each key compiles its own, as under `eqx.filter_jit`). "
            "Please report this with your JAX version.",
            RuntimeWarning,
            stacklevel=2,
        )


# ----------------------------------------------------------------------------------
# The miss path.


def _cache_miss(f: Function, entry: Entry, *leaves: Any) -> tuple:
    """What `entry`'s dispatcher calls for a call it has no executable for: returns
    the outputs, and what the dispatcher keeps to serve the next such call in C++.
    It must not wait for the program to finish: the dispatcher holds other calls
    of this signature until it returns, and the program's callbacks may make them."""
    __tracebackhide__ = True
    # `eqx.error_if` records the frames of its trace up to this marker (the name is
    # Equinox's): a new one per miss, as `eqx.filter_jit` makes one per call.
    __equinox_jit_id__ = os.urandom(16)
    previous, marker.current = marker.current, __equinox_jit_id__
    try:
        with _quiet(f):
            if any(isinstance(x, Tracer) for x in leaves):
                return (_staged(f, entry, leaves), None, False)
            return _top_level(f, entry, leaves)
    finally:
        marker.current = previous


def _top_level(f: Function, entry: Entry, leaves: tuple) -> tuple:
    """Trace and lower the call, reuse or compile its program, and run it. A miss if
    it traced or compiled; else (JAX's dispatcher only saw a new kind of input, a
    NumPy array or a committed one) a hit."""
    cache, sig, ctx = f.cache, _signature(leaves), trace_context()
    pgle = pgle_enabled()  # JAX compiles in the call then, with its profiler
    if pgle and entry.helper is not None:
        return _through_helper(f, entry, leaves)
    _make_room(f, entry)
    helper = entry.helper or _helper(f, entry.key, leaves)
    changes: list[Change] = []
    shared, traces, w = False, _local.traces, _Window(f)
    try:
        with w:
            traced = helper.trace(*leaves)
            lowered = traced.lower()
            lowering = lowering_of(lowered)
            known = cache.known()
            changes, closest = explain(known, entry.key, sig, ctx, f.argnames)
            name = f.name(entry.key)
            fp = (
                None
                if pgle or lowering is None
                else fingerprint(traced.jaxpr, lowering)
            )
            # JAX's own cache may hand back a lowering compiled already: its inputs'
            # shardings compare equal to an earlier call's (`P()`, `P(None)`).
            ran = None if lowering is None else executable_of(lowering)
            program = cache.running(ran) if ran is not None else None
            program = program or (cache.find(fp) if _sharing[0] else None)
            try:
                if program is not None:
                    shared = True
                    set_executable(lowering, program.executable)
                else:  # the key keeps its `jax.jit`: the trace of a program it compiled
                    program = _compile(
                        f, w, traced, lowered, fp, changes, closest, name, len(known)
                    )
                    shared = program is not None and not w.number
                    entry.helper = helper
            finally:
                cache.done_compiling(fp, None if shared else program)
            if shared and _local.traces != traces:
                assert program is not None
                tail = f"same program as compile {program.number}, not compiled again"
                _log(name, "traced", len(known), changes, tail)
            w.expect_none = program is not None
            cache.add_run(entry, (sig, ctx), program)
            if program is None or program.has_callbacks:
                entry.call = _calling(f, entry, reports=True)
            try:
                return _reported(jit_miss, helper, *leaves)
            except BaseException:
                # JAX's dispatcher falls back to Python for a signature whose first
                # run raised: later calls come here, and run through this `jax.jit`.
                entry.helper = helper
                raise
    finally:
        if _local.traces != traces or w.number:
            cache.book_miss(changes, shared)
            _maybe_storm(f, f.name(entry.key))


def _helper(f: Function, key: Key, leaves: Sequence) -> Any:
    """A `jax.jit` of the key's traced function, called by the miss path only."""
    return jax_jit(_traced(f, key), donate_argnums=_donated(f, key, leaves))


def _through_helper(f: Function, entry: Entry, leaves: tuple) -> tuple:
    """Run a call through the `jax.jit` the key kept, as JAX's profile-guided path
    needs: a hit, unless it traced or JAX compiled."""
    traces, w = _local.traces, _Window(f)
    try:
        with w:
            return _reported(jit_miss, entry.helper, *leaves)
    finally:
        if _local.traces != traces or w.number:
            f.cache.book_miss()


def _reported(call: Callable, *args: Any) -> Any:
    """`call(*args)`, an `eqx.error_if` failure it raises reported as Equinox does,
    without waiting for its outputs (a miss must not: see `_cache_miss`)."""
    __tracebackhide__ = True
    return reporting_errors(call, wait=False)(*args)


def _compile(
    f: Function,
    w: "_Window",
    traced: Any,
    lowered: Any,
    fp: Fingerprint | None,
    changes: list[Change],
    closest: Seen | None,
    name: str,
    n: int,
) -> Program | None:
    """Compile a lowering that no compiled program is the same as, once the budget
    allows; or leave it to the call that follows (JAX's profile-guided path). JAX
    may serve it from its own caches, compiling nothing: then it is the program
    whose XLA executable it is."""
    lowering = lowering_of(lowered)
    w.changes = changes
    w.structure = None if lowering is None else _structure(lowering)
    w.differ = _differ(closest, changes, traced.jaxpr, w.structure)
    f.check_budget(changes, w.differ)
    w.planned = True
    if fp is None and (lowering is None or pgle_enabled()):
        _log(name, "compiling", n, changes, w.differ)
        return None  # compiled by the call, booked by the window
    lowered.compile()
    executable = executable_of(lowering)
    if not w.number and (same := f.cache.running(executable)) is not None:
        return same
    _log(name, "compiling", n, changes, w.differ)
    return Program(w.number, fp, executable, ops_of(traced.jaxpr), w.structure)


def _make_room(f: Function, entry: Entry) -> None:
    """Before a key compiles another signature: if it alone holds `maxsize`, start
    it again empty (a new dispatcher, so that JAX frees them too)."""
    cache = f.cache
    if cache.maxsize is not None and len(entry.runs) >= cache.maxsize:
        with cache.lock:
            cache._release(entry)
            entry.runs.clear()
        _new_dispatch(f, entry, ())


def _maybe_storm(f: Function, name: str) -> None:
    cache, n = f.cache, f.warn_after
    if n is None or cache.warned or len(cache.history) < n:
        return
    if storm(name, cache.history, cache.reused, n):
        cache.warned = True


def _staged(f: Function, entry: Entry, leaves: tuple) -> Any:
    """Stage the call into the outer trace with the key's own trace, as
    `eqx.filter_jit` does (through the key's `jax.jit`, which keeps it). What JAX
    compiles meanwhile (an eager `grad` or `vmap` compiles the transformed program at
    once) is booked."""
    cache = f.cache
    with cache.lock:
        if entry.helper is None:
            entry.helper = _helper(f, entry.key, leaves)
    helper = entry.helper
    if jit_is_replaced():  # Equinox's breakpoint mode: through its `jax.jit`
        helper = jax.jit(_traced(f, entry.key))
    traces, w = _local.traces, _Window(f)
    try:
        with w:
            out = reporting_errors(helper)(*leaves)
    finally:
        traced = _local.traces != traces
        if traced or w.number:
            cache.book_miss()
    if traced and logger.isEnabledFor(logging.INFO):
        known = cache.known()
        changes, _ = explain(
            known, entry.key, _signature(leaves), trace_context(), f.argnames
        )
        _log(
            f.name(entry.key),
            "traced under a transformation",
            len(known),
            changes,
            None,
        )
    return out


def _log(name: str, what: str, n: int, changes: Sequence[Change], tail: Any) -> None:
    if n and logger.isEnabledFor(logging.INFO):
        logger.info(
            "%s: %s (%d cached): %s%s",
            name,
            what,
            n,
            phrase(changes),
            f"; {tail}" if tail else "",
        )


_AGAIN: Final = [
    Change(
        "JAX compiled it again (a profile-guided or new-layout compile)",
        "call",
        "structure",
    )
]


@contextlib.contextmanager
def _quiet(f: Function) -> Iterator[None]:
    """`donate="all"` and `"all-except-first"` hide JAX's warning that some donated
    buffers were not usable, as `eqx.filter_jit` does."""
    if not f.quiet_donation:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _UNUSABLE_DONATION)
        yield


def _quietly(call: Callable, f: Function) -> Callable:
    def quiet(*leaves: Any) -> Any:
        __tracebackhide__ = True
        with _quiet(f):
            return call(*leaves)

    return quiet


def _signature(leaves: Sequence) -> tuple:
    """Each leaf's shape, dtype, weak type and (if placed explicitly) sharding."""
    return tuple(map(_aval, leaves))


def _aval(x: Any) -> tuple:
    a = jax.typeof(x)
    committed = not isinstance(x, Tracer) and getattr(x, "committed", False)
    return (
        a.shape,
        a.dtype,
        getattr(a, "weak_type", False),
        x.sharding if committed else None,
    )


def lower_call(f: Function, key: Key, leaves: list) -> Any:
    """`jax.stages.Lowered` for a call, through a `jax.jit` of its own: it books
    nothing, and is not one of the function's programs."""
    with _quiet(f):
        helper = jax_jit(_traced(f, key), donate_argnums=_donated(f, key, leaves))
        return helper.trace(*leaves).lower()


# ----------------------------------------------------------------------------------
# Outputs: array leaves leave the program; every other leaf rides in the output's
# tree structure, as `eqx.filter_jit` does, so that `jax.jit` keeps it per trace.


class Static:
    """A pytree node without children whose metadata is an output's static part."""

    __slots__ = ("mask", "statics", "treedef")

    def __init__(self, treedef: Any, mask: tuple[bool, ...] | None, statics: tuple):
        self.treedef = treedef
        self.mask = mask  # None: the output is one array
        self.statics = statics


jtu.register_pytree_node(Static, lambda s: ((), s), lambda s, _: s)
_ONE: Final = Static(None, None, ())


def split(out: Any) -> tuple[list, Static]:
    if isinstance(out, ARRAY_TYPES):
        return [out], _ONE
    flat, treedef = jtu.tree_flatten(out)
    mask = tuple([isinstance(x, ARRAY_TYPES) for x in flat])
    arrays = [x for x, m in zip(flat, mask) if m]
    statics = tuple([None if m else x for x, m in zip(flat, mask)])
    return arrays, Static(treedef, mask, statics)


def combine(arrays: list, static: Static) -> Any:
    if static.mask is None:
        return arrays[0]
    it = iter(arrays)
    flat = [next(it) if m else s for m, s in zip(static.mask, static.statics)]
    return static.treedef.unflatten(flat)


# ----------------------------------------------------------------------------------
# Programs: when two lowerings are provably the same, one executable serves both.

# Compile arguments that do not change what the executable computes (debug names,
# the profiler), and the callbacks, compared through their Python functions.
_NOT_PROGRAM: Final = frozenset(
    {"all_args_info", "pgle_profiler", "host_callbacks", "keepalive"}
)


def fingerprint(jaxpr: Any, lowering: Any) -> Fingerprint | None:
    """The fingerprint of a traced call's closed `jaxpr` and its lowering, or None
    if a host callback's Python function cannot be found (never shared then)."""
    args = lowering.compile_args
    callbacks = callbacks_of(jaxpr)
    if len(callbacks) != len(args.get("host_callbacks") or ()):
        return None
    text = _module_text(lowering)
    arguments = tuple(
        (k, _comparable(args[k])) for k in sorted(args) if k not in _NOT_PROGRAM
    )
    kept = tuple(args.get("keepalive") or ())
    return Fingerprint(
        hashlib.sha256(text).digest(),
        arguments + program_options(lowering),
        callbacks + kept,
    )


def _module_text(lowering: Any) -> bytes:
    """The module, every constant printed in full, source locations left out."""
    return lowering.stablehlo().operation.get_asm(
        binary=True, enable_debug_info=False, large_elements_limit=None
    )


def _comparable(v: Any) -> Any:
    """A compile argument as a value `==` compares: an object without `__eq__` by its
    attributes (less what `functools.cached_property` derived from them, which one
    object may have computed and another not), an array by its shape and items."""
    t = type(v)
    if t is list or t is tuple:
        return tuple(map(_comparable, v))
    if t is np.ndarray:
        return (t, v.shape, tuple(map(_comparable, v.flat)))
    if hasattr(v, "__dict__") and t.__eq__ is object.__eq__:
        derived = {
            k
            for k in dir(t)
            if isinstance(getattr(t, k, None), functools.cached_property)
        }
        items = [(k, _comparable(x)) for k, x in vars(v).items() if k not in derived]
        return (t, tuple(sorted(items, key=lambda kv: kv[0])))
    return v


def same_program(a: Fingerprint, b: Fingerprint) -> bool:
    if a.digest != b.digest:
        return False
    try:
        if a.arguments != b.arguments:
            return False
    except Exception:  # a comparison that cannot be made: not the same
        return False
    return len(a.callbacks) == len(b.callbacks) and all(
        map(same, a.callbacks, b.callbacks)
    )


_CONSTANT: Final = re.compile(rb"dense<[^>]*>")


def _structure(lowering: Any) -> bytes:
    """The module's digest with its constants masked: two programs with the same
    structure differ only in baked-in values."""
    return hashlib.sha256(_CONSTANT.sub(b"dense<>", _module_text(lowering))).digest()


def callbacks_of(jaxpr: Any) -> tuple:
    """The `callback` parameters of the callback equations of a closed jaxpr and of
    the jaxprs nested in it (each nested jaxpr once, as it is lowered once)."""
    found: list = []
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in open_jaxpr(j).eqns:
            if "callback" in eqn.params:
                found.append(eqn.params["callback"])
            stack.extend(reversed(list(nested_jaxprs(eqn.params))))
    return tuple(found)


def same(a: Any, b: Any) -> bool:
    """Whether two host callbacks provably behave the same, now and forever: the
    same object; JAX's wrapper of the same function over the same argument
    structure (compared as keys compare statics); or functions (partials, bound
    methods) of the same code and globals over captured values that cannot change:
    immutable by type, recursively, in closure cells that nothing can rebind
    (Equinox's `error_if` callbacks: their messages). When in doubt, not."""
    try:
        return _same(a, b, set())
    except Exception:  # an `__eq__` that raises, say
        return False


def _same(a: Any, b: Any, seen: set) -> bool:
    if a is b or (id(a), id(b)) in seen:  # a cycle: equal so far, so equal
        return True
    if type(a) is not type(b) or len(seen) > 1000:
        return False
    seen.add((id(a), id(b)))
    t = type(a)
    flat = flat_callback(a)
    if flat is not None:
        other = flat_callback(b)
        return (
            other is not None
            and _same(flat[0], other[0], seen)
            and form(flat[1]) == form(other[1])
        )
    if t is types.FunctionType:
        return _same_function(a, b, seen)
    if t is functools.partial:
        return (
            _same(a.func, b.func, seen)
            and _same(a.args, b.args, seen)
            and _same(_items(a.keywords), _items(b.keywords), seen)
        )
    if t is types.MethodType:
        return _same(a.__func__, b.__func__, seen) and _same(
            a.__self__, b.__self__, seen
        )
    if t in _IMMUTABLE:
        return typed(a) == typed(b)
    if t is tuple or t is frozenset or (isinstance(a, tuple) and hasattr(t, "_fields")):
        if t is frozenset:  # no order to pair them by: equal as static values
            return all(type(x) in _IMMUTABLE for x in a) and typed(a) == typed(b)
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b))
    params = getattr(t, "__dataclass_params__", None)
    if is_module_type(t) or (params is not None and params.frozen):
        da, db = _fields_of(a), _fields_of(b)
        return da is not None and db is not None and _same(da, db, seen)
    return False  # mutable, or compared by its own `__eq__`: only itself


def _same_function(a: types.FunctionType, b: types.FunctionType, seen: set) -> bool:
    if a.__code__ is not b.__code__ or a.__globals__ is not b.__globals__:
        return False
    known = is_equinox_error_callback(a)
    for name, x, y in zip(
        a.__code__.co_freevars, a.__closure__ or (), b.__closure__ or ()
    ):
        if known and name in EQUINOX_MESSAGE_ONLY:
            continue
        if not (known or cell_bound_once(a, name)) or not _same(
            _content(x), _content(y), seen
        ):
            return False
    return (
        _same(a.__defaults__, b.__defaults__, seen)
        and _same(_items(a.__kwdefaults__), _items(b.__kwdefaults__), seen)
        and _same(_items(a.__dict__), _items(b.__dict__), seen)
    )


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # empty: bound later, so not provably the same
        return _EMPTY


_EMPTY: Final = object()


def _items(d: dict | None) -> tuple:
    return tuple(sorted(d.items())) if d else ()


def _fields_of(v: Any) -> tuple | None:
    """A frozen dataclass's or module's fields, by name (slots too)."""
    try:
        names = [f.name for f in dataclasses.fields(v)]
        d = getattr(v, "__dict__", None)
        return tuple(
            (k, d[k] if d is not None and k in d else getattr(v, k)) for k in names
        )
    except Exception:  # a field that cannot be read
        return None


_IMMUTABLE: Final = SIMPLE | {float, complex, np.dtype}


# ----------------------------------------------------------------------------------
# Where two programs first differ, in the user's code.


class Op(NamedTuple):
    what: bytes  # a digest of the primitive, its parameters and constant inputs
    name: str  # the primitive's name, for the message
    where: tuple[str, int, str] | None  # file, line, function


def ops_of(jaxpr: Any) -> tuple[Op, ...]:
    """A compact summary of a traced program: one entry per operation, nested
    bodies in place, with where in user code it was traced."""
    out: list[Op] = []
    _summarise(jaxpr, out, 0)
    return tuple(out)


def _summarise(j: Any, out: list[Op], depth: int) -> None:
    closed = j if hasattr(j, "consts") else None
    inner = open_jaxpr(j)
    consts = dict(zip(inner.constvars, closed.consts)) if closed is not None else {}
    # Inputs by where they come from: the n-th input of the program, or the output
    # of the n-th operation; so `dc * x` and `dp * x` are different operations.
    numbers = {v: i for i, v in enumerate([*inner.constvars, *inner.invars])}
    for eqn in inner.eqns:
        params = [
            (k, _stable(v)) for k, v in sorted(eqn.params.items()) if not _is_jaxpr(v)
        ]
        inputs = [_input(v, consts, numbers) for v in eqn.invars]
        if eqn.primitive.name not in _CALLS:  # a call is what it calls
            what = repr((eqn.primitive.name, params, inputs)).encode()
            digest = hashlib.sha1(what).digest()[:8]
            out.append(Op(digest, eqn.primitive.name, user_frame(eqn.source_info)))
        for v in eqn.outvars:
            numbers[v] = len(numbers)
        if depth < 8:
            for sub in nested_jaxprs(eqn.params):
                _summarise(sub, out, depth + 1)


# Operations that only call the program nested in them (its operations are listed).
_CALLS: Final = frozenset(
    {
        "pjit",
        "jit",
        "closed_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "remat",
        "checkpoint",
    }
)


def _input(v: Any, consts: dict, numbers: dict) -> Any:
    if type(v).__name__ == "Literal":
        return repr(v.val)
    if v in consts:
        a = np.asarray(consts[v])
        return (a.shape, str(a.dtype), hashlib.sha1(a.tobytes()).hexdigest())
    return (numbers.get(v), str(v.aval))


def _stable(v: Any) -> Any:
    """A parameter as it is the same from one trace to the next: a function by its
    name, not its address."""
    if callable(v) and not isinstance(v, type):
        return getattr(v, "__qualname__", type(v).__name__)
    return v


def _is_jaxpr(v: Any) -> bool:
    return bool(list(nested_jaxprs({"v": v})))


def _differ(
    closest: Seen | None, changes: list[Change], jaxpr: Any, structure: bytes | None
) -> Differ | None:
    """Where the new program first differs from the program of the closest compiled
    call, in user code. None for the first compile, and when a shape or the context
    changed (the explanation says so itself)."""
    if (
        closest is None
        or not changes
        or any(c.kind in ("array", "context") for c in changes)
    ):
        return None
    old = getattr(closest.program, "ops", None)
    if old is None:
        return None
    constant = structure is not None and structure == closest.program.structure
    for a, b in itertools.zip_longest(old, ops_of(jaxpr)):
        if a is None or b is None or a.what != b.what:
            op = b or a
            if op is None or op.where is None:
                return None
            file, line, function = op.where
            place = f"{os.path.basename(file)}:{line} in {function.rsplit('.', 1)[-1]}"
            if constant or (a is not None and b is not None and a.name == b.name):
                what = op.name
            elif a is None or b is None:
                what = f"{op.name}, {'new' if a is None else 'gone'}"
            else:
                what = f"{b.name} where {a.name} was"
            return Differ(f"{place} ({what})", constant)
    return None
