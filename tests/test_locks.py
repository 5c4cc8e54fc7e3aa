"""No lock is held while a program runs, nothing is kept per thread, and a
function's cache dies with the function. Every wait here is bounded: a thread
still alive after its join timeout is a deadlock, reported as a failure."""

import gc
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
from helpers import XlaCompiles


SCALAR = jax.ShapeDtypeStruct((), jnp.float32)
BONUS = {"a": 1.0, "b": 10.0}


def _ping(call: Callable, barrier: threading.Barrier | None):
    """Key `key`'s callback calls `call` (the function itself) with the other key,
    once both threads are inside their callbacks (`barrier`)."""

    def ping(x, key):
        other = "b" if key == "a" else "a"

        def host(y):
            inner = 0.0
            if y > 0:
                if barrier is not None:
                    try:
                        barrier.wait(timeout=10)
                    except threading.BrokenBarrierError:
                        pass
                inner = float(call(np.asarray(y - 1, np.float32), other))
            return np.asarray(inner + BONUS[key], np.float32)

        return jax.pure_callback(host, SCALAR, x)

    return ping


def test_callbacks_calling_the_function_with_the_other_key_finish():
    """Two threads, started together, call keys `a` and `b`; each key's first run
    calls back into Python, which calls the same function with the other key.
    (An entry locked through its first run would deadlock: each thread waits for
    the other's key.) Both finish, with the eager results."""
    barrier = threading.Barrier(2)
    f = es.jit(_ping(lambda *a: f(*a), barrier))
    eager = _ping(lambda *a: eager(*a), None)
    x = np.asarray(1.0, np.float32)  # as the callbacks pass it: the same keys
    want = {key: float(eager(x, key)) for key in "ab"}
    assert want == {"a": 11.0, "b": 11.0}
    got: dict[str, float] = {}
    start = threading.Barrier(2)
    compiles = XlaCompiles()

    def run(key: str) -> None:
        start.wait(timeout=10)
        got[key] = float(f(x, key))

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert got == want
    info = f.cache_info()
    assert info.hits + info.misses == 4 and info.currsize <= info.misses
    # Each trace makes its own `host` closure: never shared. The calls made inside
    # a callback run under JAX's default device there: a signature of their own.
    assert f.compile_info().compiles == compiles.of("ping") == 4


def _reachable(root: Any) -> int:
    """How many objects `root` reaches, not counting modules, classes and what
    they hold (a function's globals)."""
    skip = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) in skip or isinstance(o, types.ModuleType | type):
            continue
        seen.add(id(o))
        stack.extend(gc.get_referents(o))
    return len(seen)


def test_short_lived_threads_leave_nothing_behind():
    """50 threads, one after the other, each calling once: every call is booked
    (50 hits after the first call's miss), and what the function reaches does
    not grow with the number of threads that called it."""

    @es.jit
    def f(x):
        return x + 1

    x = jnp.ones(3)
    want = np.asarray(x) + 1
    results: list[Any] = []

    def call() -> None:
        results.append(f(x))

    def threads(n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=call, daemon=True)
            t.start()
            t.join(timeout=60)
            assert not t.is_alive()

    np.testing.assert_array_equal(f(x), want)
    threads(5)  # whatever a first thread sets up once
    gc.collect()
    before = _reachable(f)
    threads(50)
    gc.collect()
    assert _reachable(f) - before < 10  # not one per thread
    assert len(results) == 55
    for r in results:
        np.testing.assert_array_equal(r, want)
    assert f.cache_info() == es.CacheInfo(55, 1, None, 1)


def test_a_function_s_cache_dies_with_it():
    """A local function, wrapped and called once: once the function and the
    wrapper are gone, nothing keeps the function alive."""

    def local(x):
        return x * 2

    f = es.jit(local)
    np.testing.assert_array_equal(f(jnp.ones(2)), np.full(2, 2.0, np.float32))
    ref = weakref.ref(local)
    del f, local
    gc.collect()
    assert ref() is None
