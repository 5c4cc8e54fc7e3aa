"""The miss path, and the books.

Each key has its own C++ dispatcher (JAX's `PjitFunction`, as a `jax.jit` has): it
serves the key's hits and calls `cache_miss` for anything else (new avals, a new
context, a transformation). A miss at the top level runs in three steps: trace and
lower the call with the key's own `jax.jit`; decide: reuse the executable of a
program provably the same (`_sharing`), or compile; install that executable and
run, which hands the dispatcher what it keeps to serve the next such call in C++.
Under a transformation the call is staged, as `eqx.filter_jit` stages it.

Compiles are booked from JAX's own `jax.monitoring` events, which name each
compile by its program; each function's programs have a name of their own, so a
compile JAX makes when no call of it is running (in an eager `jax.checkpoint`,
the backward program of an eager `jax.grad`) is booked too. No lock is held while
JAX traces, compiles or runs."""

import collections
import contextlib
import dataclasses
import functools
import inspect
import itertools
import logging
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple, Protocol

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.core import Tracer

from . import _diverge, _jax, _report, _sharing
from ._fields import ARRAY_TYPES, is_array_type, Sentinel
from ._key import first_class, Key, Layout, leaf_visits, leaves_of_first
from ._report import Change, Compile, Seen


_jax.hide_frames(__file__)


class CacheInfo(NamedTuple):
    """Statistics of an [`eqx_static.jit`][] cache, as `functools.lru_cache` reports
    them: a hit is a call that ran an executable it had, without tracing or
    compiling; every other call is a miss, except a call refused before it is keyed
    (an unhashable or cyclic argument), which is neither; `currsize` counts compiled
    signatures.

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
    cleared (every one JAX made for it), the programs its keys run now (keys whose
    programs are the same share one), and the seconds spent compiling.

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


@dataclasses.dataclass(eq=False, slots=True)  # compared, and held, by identity
class Program:
    """One XLA compile: the executable of every key whose program is the same."""

    key: Key
    fingerprint: _sharing.Fingerprint | None
    executable: Any
    outline: "Outline"
    number: int
    users: int = 0
    later: Callable[[], Any] | None = None  # computes `fingerprint`, not yet known


# No module's digest: marks the program compiling alone (`Function.find`).
_ALONE: Final = b""


class Outline(NamedTuple):
    """What explaining a later miss reads of a program, which keeps no executable
    alive (an executable holds device memory, which `maxsize` bounds)."""

    ops: tuple | None  # `_report.ops_of`; None: not recorded (see `explaining`)
    structure: bytes | None  # `_sharing.structure`; None: no module


class Entry:
    """One key: its dispatcher, its guard, and the program it runs for each
    signature (avals and JAX's context) it ran."""

    __slots__ = ("call", "dispatch", "helper", "key", "reversible", "runs", "used")

    def __init__(self, key: Key):
        self.key, self.used = key, 0  # `used`: when last called, for `maxsize`
        self.call: Callable = _unset  # what a hit calls: the dispatcher, maybe wrapped
        self.dispatch: Any = None
        self.helper: Any = None  # its `jax.jit`, for the miss path only
        self.runs: dict[tuple, Program] = {}
        self.reversible: tuple = ()  # signatures checked under reverse mode (few)


class Guards(Protocol):
    """A wrapper's guards (`_jit`), which the function empties as it drops entries."""

    def drop(self, entry: Entry) -> None: ...
    def clear(self) -> None: ...


def _unset(*leaves: Any) -> Any:
    raise AssertionError("an entry is called before it is made")


class Function:
    """One `es.jit` function: what its miss path knows, its keys, programs and
    books. Shared by every wrapper of the same function with the same options; the
    lock guards bookkeeping only. It keeps no function: a trace calls the one in
    the call's hand."""

    def __init__(
        self, fn: Callable, fn_key: Key | None, n_fn: int, layout: Layout, opts: tuple
    ):
        """`opts`: `es.jit`'s `donate`, `maxsize`, `max_compiles`, `warn_after`."""
        self.layout, self.argnames = layout, layout.names
        self.fn_key, self.n_fn = fn_key, n_fn
        self.donate, self.maxsize, self.max_compiles, self.warn_after = opts
        self.quiet = self.donate in ("all", "all-except-first")
        self.qualname: str = qualname(fn)
        self.short: str = getattr(fn, "__name__", None) or self.qualname
        self.method = layout.names[:1] == ("self",)
        self.where = _where(fn)
        # A plain function made again and again (a lambda in a loop): its code, and
        # the user's line that wraps it, once it has been wrapped before.
        self.code = fn.__code__ if inspect.isfunction(fn) else None
        self.wrapped_at = _jax.user_line() if self.code in _rewraps else ""
        self.lock = threading.Lock()
        self.entries: dict[Key, Entry] = {}
        self.guard_sets = weakref.WeakSet[Guards]()  # each wrapper's guards
        # Counted in C at the end of every call; read by taking a number from it,
        # which `at_clear` takes off again with the calls before `clear`.
        self.calls = itertools.count()
        self.clock = itertools.count(1)  # for `Entry.used`
        self.misses = self.at_clear = self.size = self.general = 0  # size: signatures
        self.held: dict[int, Program] = {}  # every program a signature runs, by id
        self.compiling: dict[bytes, threading.Event] = {}  # by module digest
        self.history: list[Compile] = []  # every XLA compile since `clear`
        self.recent: collections.deque[Seen] = collections.deque(maxlen=64)
        self.shared: collections.deque[_report.Why] = collections.deque(maxlen=64)
        self.warned = False
        self.program_name = _claim_name(self, fn)

    def info(self) -> CacheInfo:
        with self.lock:
            calls = next(self.calls) - self.at_clear
            self.at_clear += 1  # the number just taken was no call
            return CacheInfo(calls - self.misses, self.misses, self.maxsize, self.size)

    def compile_info(self) -> CompileInfo:
        with self.lock:
            seconds = sum(c.seconds for c in self.history)
            return CompileInfo(len(self.history), len(self.held), seconds)

    def clear(self) -> None:
        with self.lock:
            runs = [e.runs for e in self.entries.values()]
            kept = (self.entries, self.held, self.shared, self.history, self.recent)
            for d in (*runs, *kept, *self.guard_sets):
                d.clear()
            self.at_clear, self.misses, self.size = next(self.calls) + 1, 0, 0
            self.general, self.warned = 0, False

    def name(self, key: Key) -> str:
        """`Class.method` for a method called on a module, else the qualname."""
        cls = first_class(key) if self.method else None
        return self.qualname if cls is None else f"{cls.__qualname__}.{self.short}"

    # The books.

    def book_miss(self, shared: "_report.Why | None" = None) -> None:
        """Count a miss; `shared`: why it missed, if it shared a program."""
        with self.lock:
            self.misses += 1
            if shared is not None:
                self.shared.append(shared)

    def storm(self, key: Key) -> None:
        """Warn once, after a miss, if one thing changed at each of the last
        `warn_after` compiles."""
        n = self.warn_after
        if n and not self.warned and len(self.history) >= n:
            # Copies: another thread's miss may append to either while this reads.
            history, shared = list(self.history), tuple(self.shared)
            self.warned = _report.storm(self.name(key), history, shared, n)

    def explaining(self) -> bool:
        """Whether the compile about to start records its program's operations
        (`ops_of`: a digest of each, each constant's bytes hashed), from which where
        two programs differ is found. Only if something will read that: the INFO
        line, a budget, or the storm watch from compile `warn_after // 2` on until
        it has warned (it reads where the last compile differs from its closest:
        nowhere, if the closest was compiled before). The structure (constants
        masked), which the storm compares over its whole window, is recorded at
        every compile."""
        n, budget = self.warn_after, self.max_compiles is not None
        storm = n is not None and not self.warned and len(self.history) + 1 >= n // 2
        return budget or storm or _report.logger.isEnabledFor(logging.INFO)

    def check_budget(self, changes: Sequence[Change], differ: Any) -> None:
        """Raise `RecompileError` if one more XLA compile exceeds `max_compiles`."""
        limit, history = self.max_compiles, self.history
        if limit is not None and len(history) >= limit:
            raise _report.budget_error(self.qualname, limit, history, changes, differ)

    def find(self, miss: "_Miss", later: Callable) -> "Program | None":
        """A program provably the same as the one `later` fingerprints (its
        fingerprint set on `miss`); else `miss` marks its module as compiling until
        it `unmark`s, and a `find` of the same module waits for it. The only program
        (none held or compiling) compiles without its fingerprint, marked alone: a
        later `find` fingerprints it, once it is held."""
        with self.lock:
            if not self.held and not self.compiling:
                return self._mark(miss, _ALONE)
        while (event := self.compiling.get(_ALONE)) is not None:
            event.wait()
        with self.lock:  # each one's function read here: another thread clears it
            unknown = [(p, p.later) for p in self.held.values() if p.later is not None]
        for p, compute in unknown:
            p.fingerprint, p.later = compute(), None  # pyright: ignore
        miss.fp = fp = later()
        while fp is not None:
            with self.lock:
                for p in self.held.values():
                    if p.fingerprint and _sharing.same_program(p.fingerprint, fp):
                        return p
                event = self.compiling.get(fp.digest)
                if event is None:
                    return self._mark(miss, fp.digest)
            event.wait()
        return None

    def _mark(self, miss: "_Miss", digest: bytes) -> None:
        miss.mark, self.compiling[digest] = digest, threading.Event()

    def unmark(self, miss: "_Miss") -> None:
        """Let the misses waiting for `miss`'s module find it."""
        if miss.mark is not None:
            with self.lock:  # (not there if interrupted as `_mark` set it)
                event, miss.mark = self.compiling.pop(miss.mark, None), None
            if event is not None:
                event.set()

    def running(self, lowering: Any) -> Program | None:
        """The program whose executable a lowering holds, if it was compiled."""
        if lowering is None or (executable := _jax.executable_of(lowering)) is None:
            return None
        xla = _jax.xla_executable(executable)
        with self.lock:
            held = list(self.held.values())
        return next((p for p in held if _jax.xla_executable(p.executable) is xla), None)

    def add_run(self, entry: Entry, sig: tuple[Any, Any], program: Program) -> None:
        """`entry` runs `program` for `sig`; past `maxsize`, evict other keys."""
        with self.lock:
            if self.entries.setdefault(entry.key, entry) is not entry:
                return  # evicted meanwhile, and made again: that entry holds it
            if (old := entry.runs.get(sig)) is not None:
                self._release(old)
            self.size += 1
            entry.runs[sig] = program
            program.users += 1
            self.held[id(program)] = program
            self.recent.append(Seen(entry.key, *sig, program.outline))
            while self.maxsize is not None and self.size > self.maxsize:
                others = [e for e in self.entries.values() if e is not entry]
                if not others:
                    break
                self._evict(min(others, key=lambda e: e.used))

    def drop_run(self, entry: Entry, sig: tuple) -> None:
        """Forget that `entry` runs a program for `sig` (its compile was refused)."""
        with self.lock:
            if (program := entry.runs.pop(sig, None)) is not None:
                self._release(program)

    def make_room(self, miss: "_Miss") -> None:
        """Empty a key that alone holds `maxsize` signatures, for a signature it does
        not hold: JAX's caches too, through the dispatcher (which, emptied during the
        call, drops what the call hands it: the next such call comes back here
        once). A public `jax.jit` cannot drop a signature: the call is made on a
        new one (`_empty`), and the old one goes with JAX's caches of it.
        The miss's signature is read last: a call that needs no room reads no avals."""
        entry = miss.entry
        full = self.maxsize is not None and len(entry.runs) >= self.maxsize
        if full and miss.sig not in entry.runs:
            with self.lock:
                self._empty(entry)

    def _evict(self, entry: Entry) -> None:
        del self.entries[entry.key]
        for guards in self.guard_sets:  # the entry's own guard is gone too
            guards.drop(entry)
        self._empty(entry)
        self.recent = collections.deque(
            (s for s in self.recent if s.key is not entry.key), maxlen=64
        )

    def _empty(self, entry: Entry) -> None:
        """Let go of the programs `entry` runs, and of the executables its dispatcher
        holds: a C++ dispatcher empties its cache; a public `jax.jit`
        (`Entry.helper`) goes at once with JAX's caches of it (the entry and it refer
        to each other: left to them, it would wait for the cycle collector), and the
        next call makes one anew."""
        for p in entry.runs.values():
            self._release(p)
        entry.runs.clear()
        if _jax.DISPATCH and not isinstance(entry.dispatch, _Public):
            _jax.clear(entry.dispatch)
        entry.helper = None

    def _release(self, p: Program) -> None:
        """A signature lets go of the program it ran."""
        self.size -= 1
        p.users -= 1
        if not p.users:
            self.held.pop(id(p), None)
            p.later = None  # its lowering, and so its executable, let go


def _where(fn: Any) -> str:
    """Where the user's function is, found as JAX finds it: through partials and
    `functools.wraps`; empty for a callable object."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    try:
        code = getattr(inspect.unwrap(fn), "__code__", None)
    except ValueError:  # a chain of `__wrapped__` without end
        code = None
    return f"{code.co_filename}:{code.co_firstlineno}" if code else ""


def qualname(fn: Callable) -> str:
    """How messages name a function: its qualified name; a partial by the function
    it wraps; any other callable (a module, an instance) by its class's `__call__`."""
    if isinstance(fn, functools.partial):
        return f"partial({qualname(fn.func)})"
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else f"{type(fn).__qualname__}.__call__"


# Each function's programs are named `jit(<name>)` in JAX's compile events (maybe
# transformed: `jit(transpose(jvp(<name>)))`), by a name this package gives it: the
# function's qualified name, with its module if it has no dot (no plain `jax.jit`
# names a program with a dot: it takes `__name__`), no parenthesis, unique among
# the live functions.
_by_name: Final = weakref.WeakValueDictionary[str, Function]()
_names_lock: Final = threading.Lock()
_UNNAMEABLE: Final = re.compile(r"[^\w.<>]+")


def _claim_name(f: Function, fn: Callable) -> str:
    base = _UNNAMEABLE.sub("_", f.qualname.replace("(", ".").replace(")", ""))
    if "." not in base:
        base = f"{getattr(fn, '__module__', None) or 'es'}.{base}"
    with _names_lock:
        names = (f"{base}#{n}" if n > 1 else base for n in itertools.count(1))
        name = next(name for name in names if name not in _by_name)
        _by_name[name] = f
    return name


# ----------------------------------------------------------------------------------
# The call in hand.


class Call(NamedTuple):
    """The call in hand, as the hit path hands it to a miss: a trace of its key
    traces these objects (never values kept in the key), and an eager run runs them."""

    entry: Entry
    fn: Callable
    values: tuple  # the call's arguments, as its function's `Layout` lays them out
    leaves: Sequence  # what the dispatcher is called with: the traced leaves


# What a dispatcher returns for a miss reached without the call in hand (a new
# signature, a transformation, `jax.disable_jit`): the hit path calls again with it.
# It is returned, not raised: JAX's dispatcher sends every later call of a
# signature whose miss raised to Python; with "rebuild" set, it keeps nothing and
# asks again (`tests/canary/test_jax_behaviour.py`).
NEED_CALL: Final = Sentinel("the call in hand is needed")


class _Local(threading.local):
    traces = 0  # traces made in this thread
    miss: "_Miss | None" = None  # the innermost miss running in this thread
    call: Call | None = None  # the call whose miss runs in this thread


_local: Final = _Local()


def call_in_hand(call: Call, run: Callable | None = None) -> Any:
    """Call `call`'s entry again (or `run`), with the call in hand for its miss."""
    previous, _local.call = _local.call, call
    try:
        return (run or call.entry.call)(*call.leaves)
    finally:
        _local.call = previous


def _in_hand(entry: Entry) -> Call | None:
    """The call in hand for a miss of `entry`, if the hit path handed it over."""
    call = _local.call
    return call if call is not None and call.entry is entry else None


def _with_leaves(call: Call, leaves: Sequence) -> tuple[Callable, tuple]:
    """The call's own function and values, with `leaves` (tracers) in place of its
    arrays, which are those of the call (`call.leaves`): flattened and rebuilt by
    JAX, as `eqx.filter_jit` does."""
    arrays, tracers = iter(call.leaves), iter(leaves)

    def swap(x: Any) -> Any:
        if not is_array_type(type(x)):
            return x
        if next(arrays, None) is not x:
            raise ValueError(_MSG_CHANGED)
        return next(tracers)

    tree = (call.fn, call.values)
    try:
        flat, treedef = jtu.tree_flatten(tree)
    except (RecursionError, SystemError):  # deeper than JAX's flatten takes
        out = _rebuilt(tree, swap)
    else:
        out = treedef.unflatten([swap(x) for x in flat])
    if next(arrays, None) is not None:
        raise ValueError(_MSG_CHANGED)
    return out


_MSG_CHANGED: Final = (
    "eqx_static: the arrays of a call changed between keying it and tracing it, so "
    "`es.jit` cannot say which array each traced value stands for. Either another "
    "thread changed an argument in place during the call (change a copy, as "
    "`es.edit` and `eqx.tree_at` do), or a pytree's flatten makes new arrays each "
    "time it is called (return the arrays the pytree holds)."
)


def _rebuilt(tree: Any, swap: Callable[[Any], Any]) -> Any:
    """`tree` with `swap(leaf)` for each leaf, in JAX's order, one node at a time
    (JAX's own flatten recurses, up to Python's recursion limit; a call's tree is
    keyed at any depth)."""

    def one_level(node: Any) -> tuple[list, Any]:
        return jtu.tree_flatten(node, is_leaf=lambda child: child is not node)

    stack = [(*one_level(tree), [])]
    while True:
        children, treedef, done = stack[-1]
        if len(done) < len(children):
            child = children[len(done)]
            below = one_level(child)
            if below[0] and jtu.treedef_is_leaf(below[1]) and below[0][0] is child:
                done.append(swap(child))
            else:
                stack.append((*below, []))
            continue
        stack.pop()
        node = treedef.unflatten(done)
        if not stack:
            return node
        stack[-1][2].append(node)


# ----------------------------------------------------------------------------------
# A key's dispatcher and entry.


def new_entry(f: Function, key: Key, leaves: Sequence) -> Entry:
    """A key's entry, in the cache at once: a call from another thread during its
    first miss finds it, and JAX's dispatcher makes it wait instead of tracing."""
    entry = Entry(key)
    if _jax.dispatching():
        try:
            miss = functools.partial(cache_miss, f, entry)
            eager = _traced(f, entry)  # run by the dispatcher only eagerly
            deoptimized = functools.partial(_deoptimized, f, entry)
            donated = _donated(f, key, leaves)
            entry.dispatch = _jax.dispatcher(
                f.program_name, eager, miss, donated, deoptimized
            )
        except Exception as e:  # a JAX whose dispatcher is built otherwise
            _jax.no_dispatcher(f"{type(e).__name__}: {e}")
    entry.call = _calling(f, entry, False) if _jax.DISPATCH else _Public(f, entry)
    with f.lock:
        return f.entries.setdefault(key, entry)


class Rerun(Exception):  # noqa: N818  (caught by the hit path, never shown)
    """JAX's `jax_debug_nans`/`jax_debug_infs` check found an invalid value in the
    outputs of a hit, and runs the call eagerly to name the operation: that needs
    the call in hand, so the hit path calls `rerun` with it."""


def _deoptimized(f: Function, entry: Entry, *leaves: Any) -> Any:
    """The call run eagerly, op by op, as `jax.jit` runs its function when its
    check finds an invalid value in a program's outputs (JAX's checks then raise,
    naming the operation)."""
    call = _in_hand(entry)
    if call is None:
        raise Rerun
    return f.layout.call(call.fn, call.values)


def rerun(f: Function, call: Call, error: Rerun) -> Any:
    """`jax.jit`'s rerun after its check (which has said so) found an invalid value:
    the eager run's error, or one saying that the eager run found none. (The eager
    run needs no call in hand: only a miss of `call.entry` reads it.)"""
    __tracebackhide__ = True
    try:
        f.layout.call(call.fn, call.values)
    except (FloatingPointError, ZeroDivisionError) as e:
        raise e from None
    _jax.no_invalid_value_when_deoptimized(error.__context__)


def _calling(f: Function, entry: Entry, reports: bool) -> Callable:
    """What a hit calls: the dispatcher, reporting `eqx.error_if` failures as
    Equinox does if a program may hold one, quiet with `donate="all"`."""
    call = _report.reporting_errors(entry.dispatch) if reports else entry.dispatch
    return _quiet(f)(call) if f.quiet else call


def _traced(f: Function, entry: Entry, name: str = "") -> Callable:
    """What `jax.jit` traces for `entry`'s key (and runs under `jax.disable_jit()`):
    the call in hand, with the traced leaves in place of its arrays."""

    def traced(*_es_leaves: Any) -> Any:
        call = _in_hand(entry)
        if call is None:  # only a dispatcher runs it so, eagerly: it asks again
            return NEED_CALL
        eager = _jax.jit_disabled()  # it runs, as under `eqx.filter_jit`
        if eager:
            f.book_miss()
            fn, values = call.fn, call.values
        elif _es_leaves and not any(isinstance(x, Tracer) for x in _es_leaves):
            # no trace: `jax.jit`'s rerun, after its check for invalid values
            return _deoptimized(f, entry)
        else:
            _local.traces += 1
            fn, values = _with_leaves(call, _es_leaves)
        try:
            return split(f.layout.call(fn, values))
        except Exception as e:
            if isinstance(e, _report.RecompileError):
                raise
            # Which numbers had to be concrete, if JAX's error is about a tracer, a
            # loop bound under `grad`, or a nested call's fields: those are leaves
            # of this call too, named here with the rest, if these are concrete.
            nested = isinstance(e, _report.TracedFieldError)
            tracer = isinstance(e, jax.errors.ConcretizationTypeError) or any(
                s in str(e) for s in ("Tracer", _report.REVERSE)
            )
            found = _needs_concrete(f, call, False) if tracer and not eager else ()
            if nested and not found:
                raise
            error = _field_error(f, entry.key, e, found)
            if error is None:
                raise
            raise error.with_traceback(e.__traceback__) from None

    traced.__name__ = name or f.program_name
    traced.__qualname__ = f.qualname
    return traced


def _field_error(
    f: Function, key: Key, e: Exception, found: Sequence[int]
) -> "_report.TracedFieldError | None":
    """`_report.traced_field_error` for a trace of `key` that raised `e`."""
    visits = leaf_visits(key, f.argnames)
    return _report.traced_field_error(f.name(key), e, visits, f.n_fn, f.where, found)


def _donated(f: Function, key: Key, leaves: Sequence) -> tuple[int, ...]:
    """The positions of the array leaves whose buffers `donate` gives to XLA."""
    if f.donate == "none":
        return ()
    first = leaves_of_first(key) if f.donate.endswith("first") else 0
    kept = range(f.n_fn, f.n_fn + first)
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


def _helper(f: Function, entry: Entry, leaves: Sequence, name: str = "") -> Any:
    """A `jax.jit` of the key's traced function, for the miss path (or, named as
    the function is, for `lower_call`)."""
    donated = _donated(f, entry.key, leaves)
    return _jax.jax_jit(_traced(f, entry, name=name), donate_argnums=donated)


# ----------------------------------------------------------------------------------
# A traced value where Python needs a concrete one: which of the call's numbers (0-d
# arrays, such as an `int` field stored as an array) must be Python values? Found by
# tracing the call in hand again with numbers in their place: all of them first,
# then each put back while the trace still succeeds. Only when a trace failed, and
# so that a port meets every such field in one error.
_MAX_DIAGNOSED: Final = 64


def _numbers(call: Call) -> list[int]:
    """The leaves of the call that hold one concrete number (not a PRNG key)."""
    return [
        i
        for i, x in enumerate(call.leaves)
        if not isinstance(x, Tracer)
        and getattr(x, "ndim", None) == 0
        and (jnp.issubdtype(x.dtype, jnp.number) or x.dtype == bool)
    ]


def _needs_concrete(f: Function, call: Call, reverse: bool) -> list[int]:
    """The numbers of the call that must be Python values for its trace (if
    `reverse`: its reverse-mode derivative) to succeed; none if that is not enough.
    Floats are put back first: a float made a constant may only hide the failure
    (a `grad` left with nothing to differentiate), where an int was the cause."""
    numbers = _numbers(call)
    numbers.sort(key=lambda i: not jnp.issubdtype(call.leaves[i].dtype, jnp.inexact))
    if not 0 < len(numbers) <= _MAX_DIAGNOSED:
        return []
    concrete = set(numbers)
    if _replay(f, call, concrete, reverse) is not None:
        return []
    for i in numbers:
        if _replay(f, call, concrete - {i}, reverse) is None:
            concrete.discard(i)
    return sorted(concrete)


def _replay(
    f: Function, call: Call, concrete: set[int], reverse: bool
) -> Exception | None:
    """Trace the call in hand abstractly with the leaves in `concrete` as Python
    numbers (if `reverse`, its reverse-mode derivative too); the error, if any."""

    def replayed(*xs: Any) -> Any:
        free = iter(xs)
        leaves = [
            x.item() if i in concrete else next(free) for i, x in enumerate(call.leaves)
        ]
        return f.layout.call(*_with_leaves(call, leaves))

    # `replayed`, then its reverse-mode derivative in its inexact inputs
    def backward(*xs: Any) -> Any:
        out, pullback = eqx.filter_vjp(replayed, *xs)
        zeros = jtu.tree_map(
            lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else None, out
        )
        return pullback(zeros)

    avals = [jax.typeof(x) for i, x in enumerate(call.leaves) if i not in concrete]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    try:
        jax.eval_shape(backward if reverse else replayed, *shapes)
    except Exception as e:
        return e
    return None


def _check_reverse_mode(miss: "_Miss", helper: Any) -> None:
    """Under reverse-mode differentiation, a program whose loop bound is a traced
    number (`lax.fori_loop(0, self.n, ...)`) fails in the backward pass, outside
    this package: find that now, and name the fields. The call is traced again
    only if its program can fail so: a trace is the user's code run once more.
    Checked at each call until a signature passes (its program, the same each
    time, then passes again)."""
    f, entry, call = miss.f, miss.entry, _in_hand(miss.entry)
    if call is None or miss.sig in entry.reversible:
        return
    wrt = [isinstance(x, Tracer) for x in miss.leaves]  # the rest is constant
    loops = _numbers(call) and _transposes_a_loop(helper.trace(*miss.leaves).jaxpr, wrt)
    e = _replay(f, call, set(), reverse=True) if loops else None
    if e is None or "Reverse-mode differentiation does not work" not in str(e):
        entry.reversible += (miss.sig,)
        return
    error = _field_error(f, entry.key, e, _needs_concrete(f, call, True))
    if error is not None:
        raise error from None


# Operations whose nested programs take their inputs one for one (after a `cond`'s
# index), and those differentiated by a rule of their own.
_CALLS: Final = frozenset(
    "pjit jit closed_call core_call remat2 checkpoint cond".split()
)
_OWN_RULE: Final = frozenset("custom_jvp_call custom_vjp_call".split())


def _transposes_a_loop(jaxpr: Any, wrt: Sequence[bool]) -> bool:
    """Whether the reverse mode of `jaxpr` in the inputs flagged in `wrt` may meet a
    `while` loop that a derivative flows into: JAX transposes none. Followed into
    calls and `cond`s; any input of another nested program (a `scan`'s) counts."""
    inner = _jax.open_jaxpr(jaxpr)
    varied = {v for v, d in zip(inner.invars, wrt) if d}
    for eqn in inner.eqns:
        ins = [not isinstance(v, jex.Literal) and v in varied for v in eqn.invars]
        name = eqn.primitive.name
        if not any(ins):
            continue
        varied.update(eqn.outvars)
        if name == "while":  # a derivative of its condition's inputs is dropped
            flows = list(zip(ins, eqn.invars))[eqn.params["cond_nconsts"] :]
            if any(d and jnp.issubdtype(v.aval.dtype, jnp.inexact) for d, v in flows):
                return True
        elif name not in _OWN_RULE:
            for sub in _jax.nested_jaxprs(eqn.params):
                n = len(_jax.open_jaxpr(sub).invars)
                if _transposes_a_loop(sub, ins[-n:] if name in _CALLS else [True] * n):
                    return True
    return False


# ----------------------------------------------------------------------------------
# The miss path.


def cache_miss(f: Function, entry: Entry, *leaves: Any) -> tuple:
    """The outputs, and what the dispatcher keeps to serve the next such call (for
    a `_Public` key, nothing). It must not wait for the program to run: the
    dispatcher holds other calls of this signature until it returns, and the
    program's callbacks may make them."""
    __tracebackhide__ = True
    if _in_hand(entry) is None:
        return (NEED_CALL, None, True)
    # `eqx.error_if` records the frames of its trace up to this marker (the name is
    # Equinox's): a new one per miss, as `eqx.filter_jit` makes one per call.
    __equinox_jit_id__ = os.urandom(16)
    with _report.marked(__equinox_jit_id__), _quiet(f):
        if _transformed(leaves):
            return (_staged(f, entry, leaves), None, False)
        if isinstance(entry.dispatch, _Public):
            return (_public(f, entry, leaves), None, False)
        return _top_level(f, entry, leaves)


def _transformed(leaves: Sequence) -> bool:
    """Whether a call is bound into a trace: `grad`, `vmap`, an outer `jit`."""
    return _jax.under_transformation() or any(isinstance(x, Tracer) for x in leaves)


class _Miss:
    """One miss in this thread, step by step; a compile of the function's program
    meanwhile is booked with its explanation (`why`), and budgeted. As it ends, it
    is booked if it traced, compiled or was refused a compile (with why it missed,
    if it shared a program), and the storm is watched for."""

    def __init__(self, f: Function, entry: Entry, leaves: tuple, unplanned: Change):
        self.f, self.entry, self.leaves, self.unplanned = f, entry, leaves, unplanned
        self.traces = _local.traces
        # `planned`: the compile about to start was asked for; `due`: a compile was
        # asked for (planned when JAX starts it); `installed`: an executable was
        # installed (no compile is due); `checks`: its program may hold
        # `eqx.error_if` (wait for it).
        self.planned = self.due = self.installed = self.checks = False
        self.why = _report.Why.said(())  # these three: the compile's record
        self.outline = Outline(None, None)  # its program
        self.differ: Any = None
        self.known = self.number = 0  # signatures held when it started; its compile
        self.lowered: Any = None
        self.jit_trace: Any = None  # its `jax.stages.Traced`, lowered as `lowered`
        self.fp: _sharing.Fingerprint | None = None  # its program's, if computed
        self.shared: Program | None = None  # a compiled program it runs
        self.mark: bytes | None = None  # the module it marked as compiling
        self.public: Any = None  # the public `jax.jit` a top-level call runs on
        self.previous: _Miss | None = None

    @functools.cached_property
    def sig(self) -> tuple:
        """What a key runs a program for: its leaves' avals, and JAX's context."""
        return tuple(map(_aval, self.leaves)), _jax.trace_context()

    @property
    def traced(self) -> bool:
        return _local.traces != self.traces

    def __enter__(self) -> "_Miss":
        self.previous, _local.miss = _local.miss, self
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        _local.miss = self.previous
        self.f.unmark(self)  # on every path: an interrupted miss leaves no mark
        if self.traced or self.number or isinstance(error, _report.RecompileError):
            self.f.book_miss(self.why if self.shared else None)
            self.f.storm(self.entry.key)


def _top_level(f: Function, entry: Entry, leaves: tuple) -> tuple:
    """Trace and lower, decide, install and run. A miss if it traced or compiled;
    else a hit (the dispatcher had not seen this kind of input: a NumPy array)."""
    with _Miss(f, entry, leaves, _PGLE) as miss:
        if _jax.pgle_enabled() and entry.helper is not None:
            # JAX compiles with its profile; what it runs is not read here
            return _run(entry.helper, leaves, wait=True)
        helper = _lowered(miss, None, entry.helper is not None and not entry.runs)
        return _install_and_run(miss, _decide(miss), helper)


def _lowered(miss: _Miss, helper: Any, staged: bool) -> Any:
    """Trace and lower the call with `helper` (else the key's `jax.jit`), and say why
    it missed, against the signatures known before room is made; `staged`: it is
    the first call outside a transformation, after calls under one."""
    f, entry = miss.f, miss.entry
    miss.known, known = f.size, list(f.recent)
    f.make_room(miss)
    helper = helper or entry.helper or _helper(f, entry, miss.leaves)
    miss.jit_trace = helper.trace(*miss.leaves)
    miss.lowered = miss.jit_trace.lower()
    asked = (known, entry.key, miss.sig, f.argnames, f.n_fn)
    miss.why = _report.Why(*asked, otherwise=[_UNTRANSFORMED] if staged else [])
    return helper


def _decide(miss: _Miss) -> Program:
    """A compiled program provably the same, or a new compile. An unshareable
    program (no fingerprint, now or later) is compiled by the call that follows
    (JAX's own miss), still inside the miss that books it. The budget and the log
    see a compile as it starts (`_plan`): JAX's own cache of executables may serve
    this lowering (a sharding that lowers to the same program), and then nothing
    compiles."""
    f, key = miss.f, miss.entry.key
    lowering = _jax.lowering_of(miss.lowered)
    callbacks, miss.checks = _sharing.host_callbacks(lowering, miss.jit_trace.jaxpr)
    # Never shared under profile-guided compiles, nor on a public `jax.jit`, whose
    # own miss compiles.
    shareable = not _jax.pgle_enabled() and miss.public is None
    later = _sharing.fingerprint(lowering, callbacks) if shareable else None
    # JAX's lowering cache may give a lowering compiled already (a new sharding
    # that compares equal to one this key ran: `P()`, `P(None)`).
    program = f.running(lowering)
    if program is None and later is not None:
        program = f.find(miss, later)
    seen = _diverge.Miss(f, key, miss.sig[0][f.n_fn :], miss.why, miss.traced)
    _diverge.check(seen, lowering, miss.fp, program)  # decided alike
    if program is not None:
        miss.shared = program
        if _jax.env_switch("EQX_STATIC_CHECK_SHARING", False) and program.fingerprint:
            _check_sharing(miss, program)
        return program
    _record(miss, miss.lowered.compiler_ir("stablehlo"), miss.jit_trace.jaxpr)
    miss.due, alone = True, miss.mark == _ALONE
    if miss.fp is None and not alone:
        return Program(key, None, None, miss.outline, 0)
    miss.lowered.compile()
    held = None if miss.number else f.running(lowering)
    executable, later = _jax.executable_of(lowering), later if alone else None
    return held or Program(
        key, miss.fp, executable, miss.outline, miss.number, 0, later
    )


def _check_sharing(miss: _Miss, program: Program) -> None:
    """Compile the call's own program too (booked, not budgeted) and compare the
    two executables, as `jax_compilation_cache_check_contents` does for JAX's
    persistent cache; raise, naming both keys, if they differ."""
    miss.planned = True
    miss.lowered.compile()
    own = _jax.executable_of(_jax.lowering_of(miss.lowered))
    if not _sharing.same_compiled(own, program.executable):
        f, key = miss.f, miss.entry.key
        number = program.number
        raise _report.sharing_error(f.name(key), program.key, key, f.argnames, number)


def _record(miss: _Miss, module: Any, jaxpr: Any) -> None:
    """Before a compile: record the new program (its operations only if something
    will read them: `Function.explaining`) and where it differs."""
    ops = tuple(_report.ops_of(jaxpr)) if miss.f.explaining() else None
    miss.outline = Outline(ops, None if module is None else _sharing.structure(module))
    miss.differ = _report.differ_of(miss.why.closest, miss.why.changes, miss.outline)


def _plan(miss: _Miss) -> None:
    """As a compile starts: check the budget, and say why it compiles."""
    f, why = miss.f, miss.why
    f.check_budget(why.changes, miss.differ)
    miss.planned = True
    _report.log(f.name(miss.entry.key), "compiling", miss.known, why, miss.differ)


def _install_and_run(miss: _Miss, program: Program, helper: Any) -> tuple:
    f, entry = miss.f, miss.entry
    if miss.shared is not None and program.executable is not None:
        _jax.set_executable(_jax.lowering_of(miss.lowered), program.executable)
        miss.installed = True
    f.add_run(entry, miss.sig, program)
    f.unmark(miss)  # waiting misses of the same module find it now
    if miss.shared is not None and miss.traced:
        again = f"same program as compile {program.number}, not compiled again"
        _report.log(f.name(entry.key), "traced", miss.known, miss.why, again)
    if miss.checks:  # else JAX's asynchronous dispatch: nothing to raise
        entry.call = _calling(f, entry, reports=True)
    if miss.shared is None or program.fingerprint is None:
        entry.helper = helper  # a key that shares a program keeps no lowering
    try:
        out = _run(helper, miss.leaves, miss.checks, miss)
    except BaseException as e:
        # JAX's dispatcher falls back to Python for a signature whose first run
        # raised: later calls come here, through this `jax.jit`.
        entry.helper = helper
        if isinstance(e, _report.RecompileError):  # refused as it started to compile
            f.drop_run(entry, miss.sig)
        raise
    program.number = program.number or miss.number
    return out


# What changed for a compile no value of the call explains.
_A_TRANSFORMED: Final = ("a transformed program", "transformed")  # name, kind
_UNTRANSFORMED: Final = Change("first call outside a transformation", *_A_TRANSFORMED)
_TRANSFORMED: Final = Change("JAX compiled a transformed program", *_A_TRANSFORMED)
_PGLE: Final = Change(
    "JAX compiled it again (profile-guided)", "JAX's own compile", "jax"
)


def _staged(f: Function, entry: Entry, leaves: tuple) -> Any:
    """Stage the call into the outer trace through the key's `jax.jit`, as
    `eqx.filter_jit` does; what JAX compiles meanwhile (an eager `grad`) is booked."""
    with f.lock:
        entry.helper = helper = entry.helper or _helper(f, entry, leaves)
    if _jax.jit_is_replaced():  # Equinox's breakpoint mode: through its `jax.jit`
        helper = jax.jit(_traced(f, entry))
    if isinstance(entry.dispatch, _Public):
        entry.dispatch.staged = True
    miss = _Miss(f, entry, leaves, _TRANSFORMED)
    try:
        with miss:
            out = _report.reporting_errors(helper)(*leaves)
        if _jax.reverse_mode():
            _check_reverse_mode(miss, helper)
        return out
    finally:
        if miss.traced:
            why = _report.Why(list(f.recent), entry.key, miss.sig, f.argnames, f.n_fn)
            _report.log(f.name(entry.key), "traced under a transformation", f.size, why)


def _run(helper: Any, leaves: tuple, wait: bool, miss: "_Miss | None" = None) -> tuple:
    """Run the call (waited for if `wait`: its program may hold `eqx.error_if`), and
    return what a dispatcher keeps: from `miss`'s trace and lowering if their
    executable is compiled, else by `helper`'s own miss."""
    __tracebackhide__ = True

    def run(*leaves: Any) -> tuple:
        __tracebackhide__ = True
        got = miss and _jax.run_lowered(miss.jit_trace, miss.lowered, leaves)
        return got or _jax.jit_miss(helper, *leaves)

    return _report.reporting_errors(run, wait=lambda: wait)(*leaves)


def _aval(x: Any) -> tuple:
    """A leaf's shape, dtype, weak type and (if placed explicitly) sharding."""
    # An array's or tracer's own aval holds the shape, dtype and weak type that
    # `jax.typeof` reads from it, at a tenth of the cost (a miss reads every leaf).
    a = getattr(x, "aval", None)
    a = jax.typeof(x) if a is None else a
    committed = not isinstance(x, Tracer) and getattr(x, "committed", False)
    sharding = x.sharding if committed else None
    return a.shape, a.dtype, getattr(a, "weak_type", False), sharding


def lower_call(f: Function, call: Call) -> Any:
    """`jax.stages.Lowered` for a call, by a `jax.jit` of its own whose programs are
    named as the function is: an AOT compile is the caller's, not booked."""
    jitted = _helper(f, call.entry, call.leaves, name=f.short)
    with _quiet(f):
        return call_in_hand(call, lambda *leaves: jitted.trace(*leaves).lower())


# ----------------------------------------------------------------------------------
# Without the per-key dispatcher (a JAX whose private names changed): each key runs
# on a public `jax.jit`, a miss around each call books what it traced and compiled,
# and explains a compile as it starts; nothing is shared.


class _Public:
    """What a hit calls where a key has no dispatcher: every call is a miss, which
    runs the key's public `jax.jit` (`Entry.helper`) as JAX's own dispatcher."""

    def __init__(self, f: Function, entry: Entry):
        self.f, self.entry = f, entry
        # `reports`: a program may hold `eqx.error_if` (wait for it); `staged`: it
        # was called under a transformation
        self.reports = self.staged = False
        entry.dispatch = self

    def __call__(self, *leaves: Any) -> Any:
        __tracebackhide__ = True
        return cache_miss(self.f, self.entry, *leaves)[0]


def _public(f: Function, entry: Entry, leaves: tuple) -> Any:
    """A call at the top level on the key's public `jax.jit`, whose own miss traces
    and compiles: booked as a miss if it did, explained as the compile starts
    (`_explain_public`)."""
    public, miss = entry.dispatch, _Miss(f, entry, leaves, _PGLE)
    f.make_room(miss)  # the books, and the key's `jax.jit` let go
    if (helper := entry.helper) is None:
        with f.lock:
            entry.helper = helper = entry.helper or _helper(f, entry, leaves)
    miss.public = helper
    try:
        with miss:
            run = _report.reporting_errors(helper, wait=lambda: public.reports)
            return run(*leaves)
    finally:
        if miss.number:  # compiled
            program = Program(entry.key, None, None, miss.outline, miss.number)
            f.add_run(entry, miss.sig, program)


def _explain_public(miss: _Miss) -> None:
    """As JAX's own miss starts to compile, the steps of the dispatcher's miss path
    (the program always compiled, never shared), from the trace and lowering being
    compiled (JAX's caches give them again, for nothing): then the compile is
    planned as `_decide` asks. Not for a signature compiled before: JAX's own
    compile (profile-guided)."""
    if miss.sig in miss.entry.runs:
        return
    public = miss.entry.dispatch
    _lowered(miss, miss.public, public.staged and not miss.entry.runs)
    _decide(miss)
    public.reports |= miss.checks


# ----------------------------------------------------------------------------------
# The books: every compile JAX reports of a function's programs.


def _compiling(event: str, fun_name: Any) -> tuple[Function, _Miss | None] | None:
    """The function whose program JAX compiles (JAX names it `jit(<name>)`, maybe
    transformed), and its innermost miss in this thread, if any."""
    if event != _jax.COMPILE_EVENT:
        return None
    f = _by_name.get(str(fun_name).rsplit("(", 1)[-1].split(")")[0])
    if f is None:  # not an `es.jit` function's: nothing of this thread to walk
        return None
    m = _local.miss
    while m is not None and m.f is not f:
        m = m.previous
    return f, m


# A compile of a function's program while none of its calls runs in this thread:
# JAX compiling a call staged earlier (an eager `jax.checkpoint`, the backward
# program of an eager `jax.grad`).
_OUT_OF_SIGHT: Final = Change("JAX compiled a call it had staged", *_A_TRANSFORMED)


def _what_changed(f: Function, m: _Miss | None) -> tuple[Change, ...]:
    """What changed for the compile JAX reports now: the miss's explanation, or,
    for a compile it did not ask for after the first, why JAX compiled on its own."""
    if m is None:
        return (_OUT_OF_SIGHT,) if f.history else ()
    changes = tuple(m.why.changes)
    return changes if m.planned or not f.history else changes or (m.unplanned,)


def _on_compile_start(event: str, value: float, **kwargs: Any) -> None:
    if (compiling := _compiling(event, kwargs.get("fun_name"))) is None:
        return
    f, m = compiling
    if m is not None and m.public is not None and not m.due:
        _explain_public(m)
    if m is not None and m.installed:  # this JAX compiled what was installed
        _jax.stop_sharing("it compiled a program whose executable es.jit had installed")
    elif m is not None and m.due and not m.planned:  # the compile `_decide` asked for
        _plan(m)
    elif m is None or not m.planned:  # JAX's own: profile-guided, transformed
        f.check_budget(_what_changed(f, m), None)


def _on_compile_end(event: str, duration_secs: float, **kwargs: Any) -> None:
    if (compiling := _compiling(event, kwargs.get("fun_name"))) is None:
        return
    f, m = compiling
    masked, differ = (None, None) if m is None else (m.outline.structure, m.differ)
    record = Compile(_what_changed(f, m), duration_secs, masked, differ)
    with f.lock:
        f.history.append(record)
        number = len(f.history)
    if m is not None:
        m.number, m.planned = number, False
    _rewrapped(f, m if number == 1 else None)


# The storm of a function wrapped anew in a loop: each wrap is a cache of its own,
# and compiles the same program again; none compiles twice, so no budget of one
# function sees it. Counted while the first compiles of new wraps of one code, for
# one call (its key and signature), follow each other with no other compile of this
# package between (a test suite's fresh wraps each compile more, or for other calls,
# and reset it). The call is kept as its hash: a collision can only tell of a loop
# one wrap early. A compile under a transformation (no structure recorded) is none.
_rewraps: Final[set[Any]] = set()  # the codes of which a wrap compiled
_in_a_row: list[Any] = [None, 0, 0]  # the last code, its call's hash, wraps in a row


def _rewrapped(f: Function, m: _Miss | None) -> None:
    if m is None or m.outline.structure is None or f.code is None:
        _in_a_row[:] = [None, 0, 0]
        return
    _rewraps.add(f.code)
    call = hash((m.entry.key, m.sig))
    same = _in_a_row[0] is f.code and _in_a_row[1] == call
    _in_a_row[:] = [f.code, call, _in_a_row[2] + 1 if same else 1]
    if _in_a_row[2] == f.warn_after:  # a count never equals None
        _report.logger.warning(
            "`%s` was wrapped by `es.jit` %d times (at %s), and each wrap compiled: "
            "each `es.jit(...)` starts a cache of its own. Wrap it once, outside the "
            "loop, and call the wrapped function in the loop.",
            f.qualname,
            f.warn_after,
            f.wrapped_at or "in a loop",
        )


jax.monitoring.register_scalar_listener(_on_compile_start)
jax.monitoring.register_event_duration_secs_listener(_on_compile_end)


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
    if isinstance(out, ARRAY_TYPES):
        return out
    flat, treedef = jtu.tree_flatten(out)
    mask = tuple([isinstance(x, ARRAY_TYPES) for x in flat])
    statics = tuple([None if m else x for x, m in zip(flat, mask)])
    return [x for x, m in zip(flat, mask) if m], Static(treedef, mask, statics)


def combine(arrays: list, static: Static) -> Any:
    it = iter(arrays)
    leaves = [next(it) if m else s for m, s in zip(static.mask, static.statics)]
    return static.treedef.unflatten(leaves)
