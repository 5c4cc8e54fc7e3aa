"""The compile cache of one function: its entries, statistics and compile history.

Every `es.jit` wrapper of the same function with the same options shares one
`Cache` (as every `jax.jit` of one function shares JAX's), so wrapping a function
again, or a pytree callable of the same structure, reuses the compiled entries
and the statistics."""

import threading
import weakref
from collections import OrderedDict
from typing import Any, Final, NamedTuple


class CacheInfo(NamedTuple):
    """Statistics of an [`eqx_static.jit`][] cache, as `functools.lru_cache` reports
    them. A miss is a trace and a compile; `currsize` counts compiled entries.

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


class Entry:
    """One compile key without avals: a `jax.jit` whose own dispatch checks the
    avals, and the signatures (avals and shardings) it has compiled for."""

    __slots__ = (
        "epoch",
        "jitted",
        "key",
        "make",
        "origin",
        "paths",
        "retired",
        "reused",
        "variants",
    )

    def __init__(self, origin: tuple, key: Any, paths: tuple[str, ...] | None):
        self.jitted: Any = None
        self.make: Any = None  # makes a new `jitted`, empty
        self.origin = origin  # the full key of the call that created it
        self.key = key  # where it is in the cache (None: not yet keyed)
        self.paths = paths  # the static paths of `self` that `key` holds
        self.variants: dict[tuple, None] = {}  # signatures booked as misses
        self.reused = False  # served a call whose unread static values differ
        self.retired = False  # a trace read a field outside `paths`: not to be used
        self.epoch = 0  # bumped on retiring: a call that used it then runs again


class Compile(NamedTuple):
    """One miss, for `max_compiles` and the storm warning."""

    changed: tuple[str, ...]  # fields or arguments that differed from the closest
    seconds: float


class Cache:
    """Entries and statistics shared by the wrappers of one function."""

    def __init__(self, maxsize: int | None):
        self.maxsize = maxsize
        self.entries: dict[Any, Entry] = OrderedDict() if maxsize else {}
        self.local = threading.local()  # `.hits`: this thread's count, a 1-list
        self._hit_counts: list[list[int]] = []  # every thread's
        self.misses = 0
        self.lock = threading.RLock()
        self.learned: dict[type, list[tuple[str, ...]]] = {}  # depends_on="auto"
        self.checked: set[type] = set()  # classes whose `depends_on` paths exist
        self.late: list[tuple[Entry, str]] = []  # reads after tracing, to learn
        self.compiles: list[Compile] = []
        self.last: tuple | None = None  # the key and signature of the last compile
        self.warned = False

    def count_hit(self) -> None:
        """Count a hit. Each thread counts in its own list, so that a hit takes no
        lock and no increment is lost (the hot path inlines the common case)."""
        try:
            self.local.hits[0] += 1
        except AttributeError:
            counts = self.local.hits = [1]
            with self.lock:
                self._hit_counts.append(counts)

    @property
    def hits(self) -> int:
        return sum(c[0] for c in list(self._hit_counts))

    def info(self) -> CacheInfo:
        with self.lock:
            currsize = sum(len(e.variants) for e in self.entries.values())
            return CacheInfo(self.hits, self.misses, self.maxsize, currsize)

    def clear(self) -> None:
        from ._key import forget_all

        forget_all()  # the per-instance memo too: it may hold static values
        with self.lock:
            self.entries.clear()
            for counts in self._hit_counts:
                counts[0] = 0
            self.misses = 0
            self.compiles.clear()
            self.last = None
            self.late.clear()
            self.warned = False

    def insert(self, key: Any, entry: Entry) -> Entry:
        """Add `entry` under `key` (or return the one there), evicting the least
        recently used entries beyond `maxsize`."""
        with self.lock:
            there = self.entries.get(key)
            if there is not None:
                return there
            self.entries[key] = entry
            return entry

    def touch(self, key: Any) -> None:
        if self.maxsize is not None:
            with self.lock:
                if key in self.entries:
                    self.entries.move_to_end(key)  # pyright: ignore[reportAttributeAccessIssue]

    def book(self, entry: Entry, sig: tuple | None) -> None:
        """Count a miss: a compile of `entry` for the signature `sig` (None: a trace
        that raised, which compiled nothing); then evict the least recently used
        entries while more than `maxsize` signatures are held."""
        with self.lock:
            self.misses += 1
            if sig is None:
                return
            entry.variants[sig] = None
            if self.maxsize is None:
                return
            self.touch(entry.key)
            size = sum(len(e.variants) for e in self.entries.values())
            while size > self.maxsize and len(self.entries) > 1:
                _, old = self.entries.popitem(last=False)  # pyright: ignore[reportCallIssue]
                size -= len(old.variants)
            if size > self.maxsize:  # one entry holds too many signatures: drop them
                entry.variants.clear()
                entry.jitted = entry.make()

    def rekey(self, entry: Entry, key: Any) -> None:
        """Move `entry` (or put a private one) under `key`."""
        with self.lock:
            if entry.key is not None and self.entries.get(entry.key) is entry:
                del self.entries[entry.key]
            entry.key = key
            self.entries[key] = entry


_caches: Final[weakref.WeakValueDictionary[Any, Cache]] = weakref.WeakValueDictionary()
_caches_lock: Final = threading.Lock()


def shared_cache(identity: Any, maxsize: int | None) -> Cache:
    """The cache of the function `identity` (with these options), made once."""
    with _caches_lock:
        try:
            cache = _caches.get(identity)
        except TypeError:  # an unhashable function: its own cache
            return Cache(maxsize)
        if cache is None:
            cache = _caches[identity] = Cache(maxsize)
        return cache
