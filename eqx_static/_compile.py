"""The miss path, the books, and programs provably the same.

Each key has its own C++ dispatcher (JAX's `PjitFunction`, as a `jax.jit` has): it
serves the key's hits and calls `_cache_miss` for anything else (new avals, a new
context, a transformation). A miss traces and lowers the call with the key's
`jax.jit`, installs the executable of a compiled program provably the same
(`Fingerprint`, `same`) or compiles, and lets that `jax.jit` run it and hand the
dispatcher what it keeps to serve the next such call in C++. A key keeps its
`jax.jit` only if it compiled a program or ran under a transformation.

Compiles are booked from JAX's own events (`jax.monitoring`) in a window around
everything a miss asks of JAX: whatever JAX compiles for the function meanwhile,
asked for or not, is counted and budgeted. No lock is held while JAX traces,
compiles or runs.
"""

import contextlib
import dataclasses
import functools
import hashlib
import itertools
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

from . import _compat as jx, _key, _report as rp
from ._key import Key
from ._module import is_module_type


jx.hide_frames(__file__)


class Fingerprint(NamedTuple):
    """What decides whether two lowerings are one program."""

    digest: bytes  # SHA-256 of the module, constants in full, no source locations
    arguments: tuple  # the compile arguments, compared by `==`
    callbacks: tuple  # host callbacks and objects kept alive, compared by `same`


@dataclasses.dataclass(eq=False)
class Program:
    """One XLA compile: the executable of every key whose program is the same."""

    number: int  # among this function's compiles, from 1
    fingerprint: Fingerprint | None  # None: never shared
    executable: Any
    ops: tuple  # `rp.ops_of`, for `rp.differ_of`
    structure: bytes | None  # the module's digest with its constants masked
    users: int = 0  # signatures that run it

    @property
    def has_callbacks(self) -> bool:
        return self.fingerprint is None or bool(self.fingerprint.callbacks)


class Entry:
    """One compile key: its dispatcher, its `jax.jit`, and what it runs for each
    signature (avals and JAX's context) it ran."""

    __slots__ = ("call", "dispatch", "helper", "key", "runs", "used")
    call: Callable  # what a hit calls: the dispatcher, maybe wrapped
    dispatch: Any  # C++: serves the key's hits, calls `_cache_miss`

    def __init__(self, key: Key):
        self.key, self.used = key, 0  # `used`: when last called, for `maxsize`
        self.helper: Any = None  # its `jax.jit`, called by the miss path only
        self.runs: dict[tuple, Program | None] = {}


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

        double(jnp.ones(3)), double(jnp.ones(3))
        assert double.cache_info() == es.CacheInfo(1, 1, None, 1)
        ```
    """

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class CompileInfo(NamedTuple):
    """The XLA compiles of an [`eqx_static.jit`][] function since its cache was
    cleared (every one JAX made while a call of it ran), the programs its keys run
    now (keys whose programs are the same share one), and the seconds compiling.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            name: str = eqx.field(static=True)  # never read: one program

            @es.jit
            def __call__(self, x):
                return 2 * x

        Model("a")(jnp.ones(3)), Model("b")(jnp.ones(3))
        assert Model.__call__.compile_info()[:2] == (1, 1)
        ```
    """

    compiles: int
    programs: int
    seconds: float


def _read(counter: "itertools.count[int]") -> int:
    return int(repr(counter)[6:-1])  # its next value, without advancing it


class Cache:
    """The keys, programs and books of one function, shared by every wrapper of it
    with the same options. The lock guards bookkeeping only."""

    def __init__(self, maxsize: int | None):
        self.maxsize = maxsize
        self.entries: dict[Key, Entry] = {}
        self.calls = itertools.count()  # counted in C: no lock, no lost increment
        self.clock = itertools.count(1)  # for `Entry.used`
        self.misses = self.at_clear = 0
        self.programs: dict[bytes, list[Program]] = {}  # by module digest
        self.compiling: dict[bytes, threading.Event] = {}  # by module digest
        self.history: list[rp.Compile] = []  # every XLA compile since `clear`
        self.reused: dict[str, int] = {}  # name -> misses that changed it, shared
        self.warned = False
        self.lock = threading.Lock()

    def info(self) -> CacheInfo:
        with self.lock:
            calls = _read(self.calls) - self.at_clear
            size = sum(len(e.runs) for e in self.entries.values())
            return CacheInfo(calls - self.misses, self.misses, self.maxsize, size)

    def compile_info(self) -> CompileInfo:
        with self.lock:
            programs = sum(p.users > 0 for ps in self.programs.values() for p in ps)
            seconds = sum(c.seconds for c in self.history)
            return CompileInfo(len(self.history), programs, seconds)

    def clear(self) -> None:
        with self.lock:
            for d in (self.entries, self.programs, self.history, self.reused):
                d.clear()
            self.at_clear, self.misses, self.warned = _read(self.calls), 0, False

    def known(self) -> list[rp.Seen]:
        with self.lock:
            es = self.entries.values()
            return [rp.Seen(e.key, s, c, p) for e in es for (s, c), p in e.runs.items()]

    def book_miss(self, reused: Sequence[rp.Change] = ()) -> None:
        """Count a miss; `reused`: what changed in it, if it shared a program."""
        with self.lock:
            self.misses += 1
            for c in reused:
                self.reused[c.name] = self.reused.get(c.name, 0) + 1

    def running(self, lowering: Any) -> Program | None:
        """The program whose XLA executable `lowering` holds, if it holds one."""
        if lowering is None or (executable := jx.executable_of(lowering)) is None:
            return None
        xla = jx.xla_executable(executable)
        with self.lock:
            ps = [p for ps in self.programs.values() for p in ps]
        return next((p for p in ps if jx.xla_executable(p.executable) is xla), None)

    def find(self, fp: Fingerprint | None) -> Program | None:
        """A compiled program provably the same as `fp`; else `fp` is marked as
        compiling until `done`, and a `find` of the same module waits for it."""
        while fp is not None:
            with self.lock:
                for p in self.programs.get(fp.digest, ()):
                    if p.fingerprint is not None and same_program(p.fingerprint, fp):
                        return p
                event = self.compiling.get(fp.digest)
                if event is None:
                    self.compiling[fp.digest] = threading.Event()
                    return None
            event.wait()
        return None

    def done(self, marked: Fingerprint | None, new: Program | None) -> None:
        """Register `new`, and release the calls waiting on `marked`."""
        with self.lock:
            if new is not None and new.fingerprint is not None:
                self.programs.setdefault(new.fingerprint.digest, []).append(new)
            event = None if marked is None else self.compiling.pop(marked.digest, None)
        if event is not None:
            event.set()

    def add_run(self, entry: Entry, run: tuple, program: Program | None) -> None:
        """`entry` runs `program` for `run`; past `maxsize`, evict other keys (LRU)."""
        with self.lock:
            if (old := entry.runs.get(run)) is not None:
                old.users -= 1
            entry.runs[run] = program
            if program is not None:
                program.users += 1
            self.entries.setdefault(entry.key, entry)  # evicted meanwhile: back
            size = sum(len(e.runs) for e in self.entries.values())
            for other in sorted(self.entries.values(), key=lambda e: e.used):
                if self.maxsize is None or size <= self.maxsize:
                    break
                if other is not entry:
                    del self.entries[other.key]
                    size -= len(other.runs)
                    self.release(other)

    def release(self, entry: Entry) -> None:
        """`entry` runs nothing any more; a program nobody runs is forgotten."""
        for p in entry.runs.values():
            if p is not None and p.fingerprint is not None:
                p.users -= 1
                same = self.programs.get(p.fingerprint.digest, [])
                same[:] = [q for q in same if q.users > 0]
                if not same:
                    self.programs.pop(p.fingerprint.digest, None)
        entry.runs.clear()


class Function:
    """What the miss path knows of an `es.jit` function (made by its wrapper)."""

    def __init__(self, fn: Callable, fn_node: Any, n_fn: int, argnames: tuple,
                 donate: str, max_compiles: int | None, warn_after: int | None,
                 cache: Cache):  # fmt: skip
        # A plain function is held weakly (its cache dies with it); any other
        # callable is rebuilt from its node and traced leaves.
        self.fn_node = None if type(fn) is types.FunctionType else fn_node
        self.fn_ref = weakref.ref(fn) if self.fn_node is None else None
        self.n_fn, self.argnames, self.donate = n_fn, argnames, donate
        self.qualname: str = getattr(fn, "__qualname__", repr(fn))
        self.short: str = getattr(fn, "__name__", "fn")
        self.method = False  # set when the wrapper is a class attribute
        self.max_compiles, self.warn_after, self.cache = max_compiles, warn_after, cache
        self.quiet = donate in ("all", "all-except-first")

    def name(self, key: Key) -> str:
        """`Class.method` for a method called on a module, else the qualname."""
        if self.method and key.args and _key.is_module_node(key.args[0]):
            return f"{key.args[0][0].__qualname__}.{self.short}"
        return self.qualname

    def check_budget(
        self, changes: Sequence[rp.Change], differ: rp.Differ | None
    ) -> None:
        """Raise `RecompileError` if one more XLA compile exceeds `max_compiles`."""
        limit, history = self.max_compiles, self.cache.history
        if limit is not None and len(history) >= limit:
            raise rp.budget_error(self.qualname, limit, history, changes, differ)


class _Local(threading.local):
    traces = 0  # traces made in this thread
    window: "_Window | None" = None  # where a compile is booked


_local: Final = _Local()


# ----------------------------------------------------------------------------------
# A key's dispatcher.


def new_entry(f: Function, key: Key, leaves: Sequence) -> Entry:
    """A key's entry, in the cache at once: a call from another thread during its
    first miss finds it, and JAX's dispatcher makes it wait instead of tracing."""
    entry = Entry(key)
    _new_dispatch(f, entry, leaves)
    with f.cache.lock:
        return f.cache.entries.setdefault(key, entry)


def _new_dispatch(f: Function, entry: Entry, leaves: Sequence) -> None:
    miss = functools.partial(_cache_miss, f, entry)
    donated = _donated(f, entry.key, leaves)
    entry.dispatch = jx.dispatcher(f.short, _traced(f, entry.key, True), miss, donated)
    entry.call, entry.helper = _calling(f, entry, reports=False), None


def _calling(f: Function, entry: Entry, reports: bool) -> Callable:
    """What a hit calls: the dispatcher, reporting `eqx.error_if` failures as
    Equinox does if a program may hold one, quiet with `donate="all"`."""
    call = rp.reporting_errors(entry.dispatch) if reports else entry.dispatch
    return _quiet(f)(call) if f.quiet else call


def _traced(f: Function, key: Key, eager: bool = False) -> Callable:
    """What `jax.jit` traces for `key` (and runs under `jax.disable_jit()`)."""

    def traced(*_es_leaves: Any) -> Any:
        _local.traces += 1
        n, ref = f.n_fn, f.fn_ref
        fn = ref() if ref else _key.deep(_key.build, f.fn_node, iter(_es_leaves[:n]))
        assert fn is not None, "a live wrapper holds its function"
        args, kwargs = _key.deep(_key.build_call, key, _es_leaves[n:])
        if eager:
            f.cache.book_miss()  # it runs, eagerly, as under `eqx.filter_jit`
        try:
            out = fn(*args, **kwargs)
        except Exception as e:
            error = rp.traced_field_error(f.name(key), e, key, f.argnames, n)
            if error is None:
                raise
            raise error.with_traceback(e.__traceback__) from None
        return split(out)

    traced.__name__, traced.__qualname__ = f.short, f.qualname
    return traced


def _donated(f: Function, key: Key, leaves: Sequence) -> tuple[int, ...]:
    """The positions of the array leaves whose buffers `donate` gives to XLA."""
    if f.donate == "none":
        return ()
    n = _key.count_leaves(key.args[0]) if f.donate.endswith("first") and key.args else 0
    kept = range(f.n_fn, f.n_fn + n)
    return tuple(
        i for i, x in enumerate(leaves) if i not in kept and isinstance(x, jax.Array)
    )


@contextlib.contextmanager
def _quiet(f: Function) -> Iterator[None]:
    """`donate="all"` and `"all-except-first"` hide JAX's warning that some donated
    buffers were not usable, as `eqx.filter_jit` does."""
    with warnings.catch_warnings():
        if f.quiet:
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        yield


# ----------------------------------------------------------------------------------
# The miss path.


def _cache_miss(f: Function, entry: Entry, *leaves: Any) -> tuple:
    """The outputs, and what the dispatcher keeps to serve the next such call. It
    must not wait for the program: the dispatcher holds other calls of this
    signature until it returns, and the program's callbacks may make them."""
    __tracebackhide__ = True
    # `eqx.error_if` records the frames of its trace up to this marker (the name is
    # Equinox's): a new one per miss, as `eqx.filter_jit` makes one per call.
    __equinox_jit_id__ = os.urandom(16)
    previous, rp.marker.current = rp.marker.current, __equinox_jit_id__
    try:
        with _quiet(f):
            if jx.under_transformation() or any(isinstance(x, Tracer) for x in leaves):
                return (_staged(f, entry, leaves), None, False)
            return _top_level(f, entry, leaves)
    finally:
        rp.marker.current = previous


def _top_level(f: Function, entry: Entry, leaves: tuple) -> tuple:
    """Trace and lower, reuse or compile, run. A miss if it traced or compiled; else
    a hit (the dispatcher had seen another kind of input: a NumPy array, say)."""
    cache, run = f.cache, _signature(leaves)
    pgle = jx.pgle_enabled()  # JAX compiles in the call then, with its profile
    w, traces, shared = _Window(f), _local.traces, False
    try:
        with w:
            if pgle and entry.helper is not None:
                return _run(entry.helper, leaves)
            staged = entry.helper is not None and not entry.runs  # used transformed
            known = cache.known()  # what the call is explained against: before
            _make_room(f, entry)  # the room made for it takes a signature away
            helper = entry.helper or _helper(f, entry.key, leaves)
            traced = helper.trace(*leaves)
            lowered = traced.lower()
            lowering = jx.lowering_of(lowered)
            w.changes, closest = rp.explain(known, entry.key, run, f.argnames)
            if staged and not w.changes:
                w.changes = [_UNTRANSFORMED]
            fp = None if pgle else fingerprint(traced.jaxpr, lowering)
            # JAX's lowering cache may give a lowering compiled already (the inputs'
            # shardings compare equal to an earlier call's: `P()`, `P(None)`).
            program, marked = cache.running(lowering), None
            if program is None and _sharing:
                program = cache.find(fp)  # None: `fp` is marked as compiling
                marked = fp if program is None else None
            try:
                if program is not None:
                    shared = True
                    jx.set_executable(lowering, program.executable)
                else:  # the key keeps its `jax.jit`: it compiled a program
                    program = _compile(w, entry, traced, lowered, fp, closest, known)
                    shared, entry.helper = program is not None and not w.number, helper
            finally:
                cache.done(marked, None if shared else program)
            if shared and _local.traces != traces:
                assert program is not None
                again = f"same program as compile {program.number}, not compiled again"
                rp.log(f.name(entry.key), "traced", len(known), w.changes, again)
            w.expect_none = program is not None
            cache.add_run(entry, run, program)
            if program is None or program.has_callbacks:
                entry.call = _calling(f, entry, reports=True)
            try:
                return _run(helper, leaves)
            except BaseException:
                # JAX's dispatcher falls back to Python for a signature whose first
                # run raised: later calls come here, through this `jax.jit`.
                entry.helper = helper
                raise
    finally:
        if _local.traces != traces or w.number:
            cache.book_miss(w.changes if shared else ())
            n = f.warn_after
            if n and not cache.warned and len(cache.history) >= n:
                name = f.name(entry.key)
                cache.warned = rp.storm(name, cache.history, cache.reused, n)


def _compile(w: "_Window", entry: Entry, traced: Any, lowered: Any,
             fp: Fingerprint | None, closest: rp.Seen | None,
             known: list) -> Program | None:  # fmt: skip
    """Compile, once the budget allows (or leave it to the call that follows: JAX's
    profile-guided path). If JAX's own caches serve it, it is the program whose XLA
    executable they gave."""
    lowering = jx.lowering_of(lowered)
    w.structure = None if lowering is None else _structure(lowering)
    w.differ = rp.differ_of(closest, w.changes, traced.jaxpr, w.structure)
    w.f.check_budget(w.changes, w.differ)
    w.planned = True
    if fp is not None:
        lowered.compile()
        if not w.number and (same := w.f.cache.running(lowering)) is not None:
            return same
    rp.log(w.f.name(entry.key), "compiling", len(known), w.changes, w.differ)
    executable = None if fp is None else jx.executable_of(lowering)
    if executable is None:
        return None  # compiled by the call that follows, booked by the window
    ops = tuple(rp.ops_of(traced.jaxpr))
    return Program(w.number, fp, executable, ops, w.structure)


# What changed for a compile no value of the call explains.
_UNTRANSFORMED: Final = rp.Change(
    "first call outside a transformation", "a transformed program", "transformed"
)
_TRANSFORMED: Final = rp.Change(
    "JAX compiled a transformed program", "a transformed program", "transformed"
)
_PGLE: Final = rp.Change(
    "JAX compiled it again (profile-guided)", "JAX's own compile", "jax"
)


def _staged(f: Function, entry: Entry, leaves: tuple) -> Any:
    """Stage the call into the outer trace through the key's `jax.jit`, as
    `eqx.filter_jit` does; what JAX compiles meanwhile (an eager `grad`) is booked."""
    with f.cache.lock:
        entry.helper = helper = entry.helper or _helper(f, entry.key, leaves)
    if jx.jit_is_replaced():  # Equinox's breakpoint mode: through its `jax.jit`
        helper = jax.jit(_traced(f, entry.key))
    w, traces, refused = _Window(f), _local.traces, False
    w.unplanned = _TRANSFORMED
    try:
        with w:
            return rp.reporting_errors(helper)(*leaves)
    except rp.RecompileError:  # a compile refused: a miss, as at the top level
        refused = True
        raise
    finally:
        if _local.traces != traces or w.number or refused:
            f.cache.book_miss()
        if _local.traces != traces:
            known = f.cache.known()
            changes, _ = rp.explain(known, entry.key, _signature(leaves), f.argnames)
            what = "traced under a transformation"
            rp.log(f.name(entry.key), what, len(known), changes)


def _helper(f: Function, key: Key, leaves: Sequence) -> Any:
    """A `jax.jit` of the key's traced function, for the miss path only."""
    return jx.jax_jit(_traced(f, key), donate_argnums=_donated(f, key, leaves))


def _run(helper: Any, leaves: tuple) -> tuple:
    """`helper`'s own miss: it runs the call, and returns what a dispatcher keeps."""
    __tracebackhide__ = True
    run = functools.partial(jx.jit_miss, helper)
    return rp.reporting_errors(run, wait=False)(*leaves)


def _make_room(f: Function, entry: Entry) -> None:
    """Empty a key that alone holds `maxsize` (a new dispatcher: JAX's goes too)."""
    if f.cache.maxsize is not None and len(entry.runs) >= f.cache.maxsize:
        with f.cache.lock:
            f.cache.release(entry)
        _new_dispatch(f, entry, ())


def _signature(leaves: tuple) -> tuple:
    """What a key runs a program for: its leaves' avals, and JAX's context."""
    return tuple(map(_aval, leaves)), jx.trace_context()


def _aval(x: Any) -> tuple:
    """A leaf's shape, dtype, weak type and (if placed explicitly) sharding."""
    a = jax.typeof(x)
    committed = not isinstance(x, Tracer) and getattr(x, "committed", False)
    sharding = x.sharding if committed else None
    return a.shape, a.dtype, getattr(a, "weak_type", False), sharding


def lower_call(f: Function, key: Key, leaves: list) -> Any:
    """`jax.stages.Lowered` for a call, by a `jax.jit` of its own: nothing booked."""
    with _quiet(f):
        return _helper(f, key, leaves).trace(*leaves).lower()


# ----------------------------------------------------------------------------------
# The books: every compile JAX reports while a window is open in this thread.


class _Window:
    """What this thread asks of JAX for one function: every compile JAX reports
    meanwhile of a program of its name is booked to it, and budgeted."""

    def __init__(self, f: Function):
        self.f, self.fun_name = f, f"jit({f.short})"
        self.planned = False  # the compile about to start was asked for
        self.expect_none = False  # an executable was installed: no compile is due
        self.changes: Sequence[rp.Change] = ()  # these three: the compile's record
        self.structure: bytes | None = None
        self.differ: rp.Differ | None = None
        self.number = 0  # of the last compile booked
        # What a compile this window did not ask for is (JAX compiling on its own).
        self.unplanned = _PGLE
        self.previous: _Window | None = None

    def __enter__(self) -> "_Window":
        self.previous, _local.window = _local.window, self
        return self

    def what_changed(self) -> tuple[rp.Change, ...]:
        """What changed for the compile JAX reports now: the miss path's
        explanation, or, for a compile it did not ask for after the first, why JAX
        compiled on its own."""
        if self.planned or self.changes or not self.f.cache.history:
            return tuple(self.changes)
        return (self.unplanned,)

    def __exit__(self, *exc: Any) -> None:
        _local.window = self.previous


def _window(event: str, kwargs: dict[str, Any]) -> "_Window | None":
    """This thread's open window, if JAX reports a compile of its function."""
    w = _local.window
    if w is None or event != jx.COMPILE_EVENT or kwargs.get("fun_name") != w.fun_name:
        return None
    return w


def _on_compile_start(event: str, value: float, **kwargs: Any) -> None:
    if (w := _window(event, kwargs)) is None:
        return
    if w.expect_none:  # this JAX compiled a lowering whose executable was installed
        _stop_sharing()
    elif not w.planned:  # JAX's own: profile-guided, or of a transformed program
        w.f.check_budget(w.what_changed(), None)


def _on_compile_end(event: str, duration_secs: float, **kwargs: Any) -> None:
    if (w := _window(event, kwargs)) is not None:
        record = rp.Compile(w.what_changed(), duration_secs, w.structure, w.differ)
        with w.f.cache.lock:
            w.f.cache.history.append(record)
            w.number = len(w.f.cache.history)
        w.planned = False


jax.monitoring.register_scalar_listener(_on_compile_start)
jax.monitoring.register_event_duration_secs_listener(_on_compile_end)

_sharing = True  # cleared if this JAX compiles what the miss path installed


def _stop_sharing() -> None:
    global _sharing
    if _sharing:
        _sharing = False
        warnings.warn(
            f"eqx_static: jax {jax.__version__} compiled a program whose executable "
            "es.jit had installed, so es.jit stops sharing programs between keys in "
            "this process (each key compiles its own, as under `eqx.filter_jit`). "
            "Please report this with your JAX version.",
            RuntimeWarning,
            stacklevel=2,
        )


# ----------------------------------------------------------------------------------
# Outputs: array leaves leave the program; every other leaf rides in the output's
# tree structure, as `eqx.filter_jit` does, so that `jax.jit` keeps it per trace.


@jtu.register_static
@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Static:
    """A pytree node without children, whose metadata is an output's static part."""

    treedef: Any
    mask: tuple  # which leaves are arrays
    statics: tuple


def split(out: Any) -> Any:
    """One array as itself; else the arrays, and a `Static` of the rest."""
    if isinstance(out, _key.ARRAY_TYPES):
        return out
    flat, treedef = jtu.tree_flatten(out)
    mask = tuple([isinstance(x, _key.ARRAY_TYPES) for x in flat])
    statics = tuple([None if m else x for x, m in zip(flat, mask)])
    return [x for x, m in zip(flat, mask) if m], Static(treedef, mask, statics)


def combine(arrays: list, static: Static) -> Any:
    it = iter(arrays)
    leaves = [next(it) if m else s for m, s in zip(static.mask, static.statics)]
    return static.treedef.unflatten(leaves)


# ----------------------------------------------------------------------------------
# Programs: a lowering's fingerprint, and when two are provably one program.

# Compile arguments that do not change what the executable computes (debug names,
# the profiler), and the callbacks, compared through their Python functions.
_NOT_PROGRAM: Final = frozenset(
    {"all_args_info", "pgle_profiler", "host_callbacks", "keepalive"}
)
_CONSTANT: Final = re.compile(rb"dense<[^>]*>")


def fingerprint(jaxpr: Any, lowering: Any) -> Fingerprint | None:
    """None (never shared) if the lowering or a callback's function is unknown."""
    if lowering is None:
        return None
    args, callbacks = lowering.compile_args, callbacks_of(jaxpr)
    if len(callbacks) != len(args.get("host_callbacks") or ()):
        return None
    arguments = [(k, _comparable(args[k])) for k in sorted(set(args) - _NOT_PROGRAM)]
    arguments += jx.program_options(lowering)
    callbacks += tuple(args.get("keepalive") or ())
    digest = hashlib.sha256(_module_text(lowering)).digest()
    return Fingerprint(digest, tuple(arguments), callbacks)


def _module_text(lowering: Any) -> bytes:
    """The module, every constant printed in full, source locations left out."""
    return lowering.stablehlo().operation.get_asm(
        binary=True, enable_debug_info=False, large_elements_limit=None
    )


def _structure(lowering: Any) -> bytes:
    """The module's digest with its constants masked."""
    return hashlib.sha256(_CONSTANT.sub(b"dense<>", _module_text(lowering))).digest()


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
        d, cached = vars(v), functools.cached_property
        names = [k for k in d if not isinstance(getattr(t, k, None), cached)]
        return (t, tuple((k, _comparable(d[k])) for k in sorted(names)))
    return v


def same_program(a: Fingerprint, b: Fingerprint) -> bool:
    try:
        if a[:2] != b[:2] or len(a.callbacks) != len(b.callbacks):
            return False
    except Exception:  # a comparison that cannot be made: not the same
        return False
    return all(map(same, a.callbacks, b.callbacks))


def callbacks_of(jaxpr: Any) -> tuple:
    """The host callbacks of a jaxpr, nested jaxprs included (each once)."""
    found, stack, seen = [], [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) not in seen:
            seen.add(id(j))
            for eqn in jx.open_jaxpr(j).eqns:
                if "callback" in eqn.params:
                    found.append(eqn.params["callback"])
                stack.extend(reversed(list(jx.nested_jaxprs(eqn.params))))
    return tuple(found)


def same(a: Any, b: Any) -> bool:
    """Whether two host callbacks provably behave the same, now and forever: the
    same object; JAX's wrapper of the same function over argument structures equal
    as keys compare statics; or functions (partials, bound methods) of the same code
    and globals over captured values that cannot change: immutable by type,
    recursively, held in closure cells that nothing can rebind (Equinox's
    `error_if` callbacks: their messages). When in doubt, not."""
    try:
        return _same(a, b, set())
    except Exception:  # an `__eq__` that raises, an empty cell: not provably the same
        return False


_IMMUTABLE: Final = _key.SIMPLE | {float, complex, np.dtype}


def _same(a: Any, b: Any, seen: set) -> bool:
    # Every rule is a conjunction: a `False` or an exception anywhere is `False`.
    if a is b or (id(a), id(b)) in seen:  # a cycle: equal so far, so equal
        return True
    t = type(a)
    if t is not type(b) or len(seen) > 1000:
        return False
    seen.add((id(a), id(b)))
    if (fa := jx.flat_callback(a)) is not None and (fb := jx.flat_callback(b)):
        return _same(fa[0], fb[0], seen) and _key.form(fa[1]) == _key.form(fb[1])
    if t is types.FunctionType:
        return _same_function(a, b, seen)
    if t is functools.partial:
        pa, pb = [(p.func, p.args, _items(p.keywords)) for p in (a, b)]
        return _same(pa, pb, seen)
    if t is types.MethodType:
        return _same((a.__func__, a.__self__), (b.__func__, b.__self__), seen)
    if t in _IMMUTABLE or (t is frozenset and all(type(x) in _IMMUTABLE for x in a)):
        return _key.typed(a) == _key.typed(b)
    if t is tuple or (isinstance(a, tuple) and hasattr(t, "_fields")):
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b))
    params = getattr(t, "__dataclass_params__", None)
    if is_module_type(t) or (params is not None and params.frozen):
        names = [f.name for f in dataclasses.fields(b)]  # slots too
        x, y = (tuple(getattr(v, n) for n in names) for v in (a, b))
        return _same(x, y, seen)
    return False  # mutable, or compared by its own `__eq__`: only itself


def _same_function(a: types.FunctionType, b: types.FunctionType, seen: set) -> bool:
    if a.__code__ is not b.__code__ or a.__globals__ is not b.__globals__:
        return False
    known = jx.is_equinox_error_callback(a)
    cells = zip(a.__code__.co_freevars, a.__closure__ or (), b.__closure__ or ())
    for name, x, y in cells:
        if known and name in jx.EQUINOX_MESSAGE_ONLY:
            continue
        if not (known or jx.cell_bound_once(a, name)):
            return False
        if not _same(x.cell_contents, y.cell_contents, seen):
            return False
    held = [(g.__defaults__, _items(g.__kwdefaults__), _items(vars(g))) for g in (a, b)]
    return _same(held[0], held[1], seen)


def _items(d: dict | None) -> tuple:
    return tuple(sorted(d.items())) if d else ()
