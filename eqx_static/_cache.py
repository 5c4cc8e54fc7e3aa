"""The cache of one function: its entries (one per compile key), the programs they
run (one per XLA compile), and the statistics, all kept together.

Every `es.jit` wrapper of the same function with the same options shares one
`Cache` (as every `jax.jit` of one function shares JAX's), so wrapping a function
again, or a pytree callable of the same structure, reuses the compiled entries
and the statistics."""

import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ._compat import compiled_of
from ._key import forget_all
from ._program import Fingerprint, Program, same_program


class CacheInfo(NamedTuple):
    """Statistics of an [`eqx_static.jit`][] cache, as `functools.lru_cache` reports
    them. A miss is a call that traced the function; `currsize` counts the compiled
    entries (a compile key with one shape of inputs each). XLA compiles are counted
    apart, by the wrapper's `compiles()`: several keys may share one program.

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
    """The XLA compiles of an [`eqx_static.jit`][] function: how many since the
    cache was cleared, how many distinct programs its entries run now (keys whose
    programs are the same share one), and the seconds spent compiling.

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


class Entry:
    """One compile key (without avals): its own `jax.jit`, whose C++ dispatch checks
    the avals and shardings of a call, and the program each signature runs."""

    __slots__ = (
        "busy",
        "call",
        "jitted",
        "key",
        "lock",
        "make",
        "programs",
        "size",
    )

    def __init__(self, key: Any, make: Callable[["Entry"], Any]):
        self.key = key
        self.make = make  # entry -> a new `jax.jit` of its traced function
        # Its trace is JAX's, shared by calls under transformations and outside.
        # Outside, it runs what the miss path compiled or installed.
        self.jitted: Any = make(self)
        self.call: Any = self.jitted  # what a hit calls: `jitted`, or it wrapped
        self.programs: dict[tuple, Program] = {}  # signature -> program
        self.size = 0  # signatures in `jitted`'s own cache, as the miss path made
        self.lock = threading.RLock()  # held by a top-level miss of this entry
        self.busy = False  # a top-level miss is running: hits wait for it


class Compile(NamedTuple):
    """One XLA compile, for `max_compiles` and the storm warning."""

    changed: tuple[
        str, ...
    ]  # fields or arguments that differed from the compile before
    seconds: float
    structure: bytes | None  # the program with its constants masked


class Cache:
    """Entries, programs and statistics shared by the wrappers of one function."""

    def __init__(self, maxsize: int | None):
        self.maxsize = maxsize
        self.entries: dict[Any, Entry] = OrderedDict() if maxsize else {}
        self.local = threading.local()  # `.hits`: this thread's count, a 1-list
        self._hit_counts: list[list[int]] = []  # every thread's
        self.misses = 0
        self.lock = threading.RLock()
        self.programs: dict[bytes, list[Program]] = {}  # by digest of the module
        self.users: dict[int, int] = {}  # program number -> signatures running it
        self.history: list[Compile] = []  # every XLA compile since `cache_clear`
        self.last: tuple | None = None  # the key and signature of the last compile
        self.warned = False

    # -- statistics ------------------------------------------------------------

    def count_hit(self) -> None:
        """Count a hit. Each thread counts in its own list, so that a hit takes no
        lock and no increment is lost (the hot path inlines the common case)."""
        try:
            self.local.hits[0] += 1
        except AttributeError:
            counts = self.local.hits = [1]
            with self.lock:
                self._hit_counts.append(counts)

    def count_miss(self) -> None:
        with self.lock:
            self.misses += 1

    @property
    def hits(self) -> int:
        return sum(c[0] for c in list(self._hit_counts))

    @property
    def compiles(self) -> int:
        return len(self.history)

    def info(self) -> CacheInfo:
        with self.lock:
            currsize = sum(len(e.programs) for e in self.entries.values())
            return CacheInfo(self.hits, self.misses, self.maxsize, currsize)

    def compile_info(self) -> CompileInfo:
        with self.lock:
            programs = len(self.users)
            seconds = sum(c.seconds for c in self.history)
            return CompileInfo(self.compiles, programs, seconds)

    def clear(self) -> None:
        forget_all()  # the per-instance memo too: it may hold static values
        with self.lock:
            self.entries.clear()
            self.programs.clear()
            self.users.clear()
            for counts in self._hit_counts:
                counts[0] = 0
            self.misses = 0
            self.history.clear()
            self.last = None
            self.warned = False

    # -- entries ---------------------------------------------------------------

    def entry(self, key: Any, make: Callable[[Entry], Any]) -> Entry:
        """The entry for `key`, made (with `make`) if there is none."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = Entry(key, make)
            elif self.maxsize is not None:
                self.entries.move_to_end(key)  # pyright: ignore[reportAttributeAccessIssue]
            return entry

    def touch(self, key: Any) -> None:
        """Mark `key` as the most recently used (with `maxsize` only)."""
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)  # pyright: ignore[reportAttributeAccessIssue]

    def known(self) -> list[tuple[Any, tuple]]:
        """The key and signature of every compiled entry, for explanations."""
        with self.lock:
            return [(e.key, s) for e in self.entries.values() for s in e.programs]

    def make_room(self, entry: Entry) -> None:
        """Before `entry` compiles for a new signature: if it alone holds `maxsize`
        signatures, start it again empty (a new `jax.jit`, so JAX frees them too)."""
        if self.maxsize is not None and len(entry.programs) >= self.maxsize:
            with self.lock:
                self._release(entry)
                entry.programs.clear()
                entry.jitted = entry.call = entry.make(entry)
                entry.size = 0

    def add(self, entry: Entry, sig: tuple, program: Program) -> None:
        """Record that `entry` runs `program` for `sig`; then evict the least
        recently used other entries while more than `maxsize` signatures are held."""
        with self.lock:
            old = entry.programs.get(sig)
            if old is not None:
                self._release_one(old)
            entry.programs[sig] = program
            self.users[program.number] = self.users.get(program.number, 0) + 1
            if self.entries.get(entry.key) is not entry:  # evicted meanwhile
                self.entries[entry.key] = entry
            if self.maxsize is None:
                return
            self.entries.move_to_end(entry.key)  # pyright: ignore[reportAttributeAccessIssue]
            size = sum(len(e.programs) for e in self.entries.values())
            while size > self.maxsize and len(self.entries) > 1:
                _, old_entry = self.entries.popitem(last=False)  # pyright: ignore[reportCallIssue]
                size -= len(old_entry.programs)
                self._release(old_entry)

    def _release(self, entry: Entry) -> None:
        for program in entry.programs.values():
            self._release_one(program)

    def _release_one(self, program: Program) -> None:
        """One signature less runs `program`; a program no key runs any more is
        forgotten: it counts as not compiled."""
        n = self.users.get(program.number, 0) - 1
        if n > 0:
            self.users[program.number] = n
            return
        self.users.pop(program.number, None)
        fp = program.fingerprint
        if fp is not None:
            same_digest = self.programs.get(fp.digest, [])
            same_digest[:] = [p for p in same_digest if p is not program]
            if not same_digest:
                self.programs.pop(fp.digest, None)

    # -- programs --------------------------------------------------------------

    def find(self, fp: Fingerprint | None) -> Program | None:
        """A program already compiled that is provably the same as `fp`."""
        if fp is None:
            return None
        for program in self.programs.get(fp.digest, ()):
            if program.fingerprint is not None and same_program(
                program.fingerprint, fp
            ):
                return program
        return None

    def running(self, executable: Any) -> Program | None:
        """The program whose XLA executable this executable holds (by identity)."""
        if executable is None:
            return None
        compiled = compiled_of(executable)
        for programs in self.programs.values():
            for program in programs:
                if compiled_of(program.executable) is compiled:
                    return program
        return None

    def new_program(
        self,
        fp: Fingerprint | None,
        executable: Any,
        compiled: Compile,
    ) -> Program:
        """Record an XLA compile and the program it made."""
        self.history.append(compiled)
        program = Program(self.compiles, fp, executable)
        if fp is not None and executable is not None:
            self.programs.setdefault(fp.digest, []).append(program)
        return program


# The caches, as `eqx.filter_jit` keeps its own: a plain function's for as long as
# the function lives (so wrapping it again, after the first wrapper is gone, finds
# it); any other callable's (a module, `eqx.filter_grad(f)`), by its structure and
# static parts, for as long as the process lives.
_by_function: Final[weakref.WeakKeyDictionary[Callable, dict[Any, Cache]]] = (
    weakref.WeakKeyDictionary()
)
_by_structure: Final[dict[Any, Cache]] = {}
_caches_lock: Final = threading.Lock()


def shared_cache(fn: Callable, identity: Any, maxsize: int | None) -> Cache:
    """The cache of `fn` with these options (`identity`: `fn`'s key and the
    options), made once."""
    with _caches_lock:
        if type(fn) is types.FunctionType:
            caches = _by_function.setdefault(fn, {})
        else:
            caches = _by_structure
        try:
            cache = caches.get(identity)
        except TypeError:  # an unhashable function: its own cache
            return Cache(maxsize)
        if cache is None:
            cache = caches[identity] = Cache(maxsize)
        return cache
