"""Threads and faults: many threads, mixed configurations, eviction, bodies that
raise while tracing (`ValueError`, and `KeyboardInterrupt` mid-trace), calls that
land while another thread traces or compiles; and then the invariants:

- every result equals the eager result;
- every call is booked exactly once, as a hit or a miss (a call whose trace raised
  is a miss: it traced);
- each program compiles once;
- nothing deadlocks (daemon threads, joined with a timeout);
- the cache keeps no module instance alive, with and without `cache_clear()`.

The schedule is fixed by `random.Random(0)`. The environment variable
`EQX_STATIC_FAULT_SCALE` (default 1) multiplies the number of calls per thread; to
run ten times longer locally:

    EQX_STATIC_FAULT_SCALE=10 .venv/bin/python -m pytest tests/test_threads.py -q"""

import concurrent.futures
import gc
import os
import random
import sys
import threading
import time
import weakref

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import shared


SCALE = int(os.environ.get("EQX_STATIC_FAULT_SCALE", "1"))
THREADS = 16
CALLS_PER_THREAD = 12 * SCALE
TIMEOUT = 60.0 * SCALE  # seconds for all threads together; far above a normal run


class Worker(es.Module):
    w: jax.Array
    offset: jax.Array
    mode: int = eqx.field(static=True)  # picks the program: 0, 1 or 2
    fault: str = eqx.field(static=True, default="")  # "", "value" or "interrupt"


class Faults:
    """The function under test, with a thread-safe trace counter."""

    def __init__(self):
        self.lock = threading.Lock()
        self.traces = 0

    def __call__(self, m: Worker, x: jax.Array) -> jax.Array:
        """Only ever traced (it is called through `es.jit`)."""
        with self.lock:
            self.traces += 1
        time.sleep(0.001)  # widen the window in which threads overlap
        return self.eager(m, x)

    @staticmethod
    def eager(m: Worker, x: jax.Array) -> jax.Array:
        if m.fault == "value":
            raise ValueError("fault injected while tracing")
        if m.fault == "interrupt":
            raise KeyboardInterrupt
        y = m.w * x + m.offset
        if m.mode == 0:
            return jnp.sin(y)
        if m.mode == 1:
            return y**2
        return jnp.cumsum(y)


def _schedule(rng: random.Random) -> list[tuple]:
    """One thread's calls: (wrapper name, mode, size, fault, seed)."""
    calls = []
    for _ in range(CALLS_PER_THREAD):
        r = rng.random()
        fault = "value" if r < 0.1 else "interrupt" if r < 0.15 else ""
        calls.append(
            (
                rng.choice(["default", "maxsize2"]),
                rng.choice([0, 1, 2]),
                rng.choice([3, 5]),
                fault,
                rng.randrange(1000),
            )
        )
    return calls


def _run_threads(targets, timeout: float) -> list[threading.Thread]:
    """Start daemon threads (a hung one cannot keep the process alive), join them
    against one deadline, and return those still alive."""
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def _storm(clear: bool) -> dict:
    fn = Faults()
    wrappers = {"default": es.jit(fn), "maxsize2": es.jit(fn, maxsize=2)}
    booked = {name: [0] for name in wrappers}  # calls made, failed ones included
    failed = {name: [0] for name in wrappers}  # of which raised
    booked_lock = threading.Lock()
    programs: dict[str, set] = {name: set() for name in wrappers}
    problems: list[str] = []
    refs: list[weakref.ref] = []
    rng = random.Random(0)
    schedules = [_schedule(random.Random(rng.randrange(2**32))) for _ in range(THREADS)]

    def worker(schedule):
        for name, mode, size, fault, seed in schedule:
            key = jax.random.PRNGKey(seed)
            m = Worker(
                jax.random.normal(key, (size,)), jnp.asarray(seed / 1000.0), mode, fault
            )
            refs.append(weakref.ref(m))
            x = jnp.linspace(0.0, 1.0, size)
            with booked_lock:
                booked[name][0] += 1
            try:
                out = wrappers[name](m, x)
            except (ValueError, KeyboardInterrupt, Exception) as e:  # noqa: B014
                with booked_lock:
                    failed[name][0] += 1
                wanted = {"value": ValueError, "interrupt": KeyboardInterrupt}.get(
                    fault
                )
                if wanted is None or not isinstance(e, wanted):
                    problems.append(f"fault {fault!r} raised {type(e).__name__}: {e}")
                continue
            if fault:
                problems.append(f"fault {fault!r} did not raise")
                continue
            programs[name].add((mode, size))
            expected = fn.eager(m, x)
            if not np.allclose(np.asarray(out), np.asarray(expected), rtol=1e-6):
                problems.append(f"wrong result for mode={mode} size={size}")

    alive = _run_threads([lambda s=s: worker(s) for s in schedules], TIMEOUT)
    infos = {name: w.cache_info() for name, w in wrappers.items()}
    compiles = {name: w.compile_info().compiles for name, w in wrappers.items()}
    if clear:
        for w in wrappers.values():
            w.cache_clear()
    gc.collect()
    live = sum(r() is not None for r in refs)
    return dict(
        alive=alive,
        problems=problems,
        infos=infos,
        compiles=compiles,
        programs=programs,
        booked={k: v[0] for k, v in booked.items()},
        failed={k: v[0] for k, v in failed.items()},
        traces=fn.traces,
        live=live,
        instances=len(refs),
    )


@pytest.fixture(scope="module")
def storms() -> dict[bool, dict]:
    """One storm per setting of `clear`, shared by the checks below."""
    return {clear: _storm(clear) for clear in (False, True)}


@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_no_deadlock_and_results_equal_eager(storms, clear):
    s = storms[clear]
    assert not s["alive"], f"{len(s['alive'])} threads still running after {TIMEOUT} s"
    assert s["problems"] == []


@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_every_call_booked_once(storms, clear):
    s = storms[clear]
    for name, info in s["infos"].items():
        calls, failed = s["booked"][name], s["failed"][name]
        assert info.hits + info.misses == calls, (
            f"{name}: {info}, {calls} calls of which {failed} raised"
        )
    assert s["infos"]["maxsize2"].currsize <= 2


@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_a_miss_is_a_trace(storms, clear):
    s = storms[clear]
    misses = sum(info.misses for info in s["infos"].values())
    assert misses == s["traces"], f"{s['infos']}, {s['failed']} raised"


@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_cache_keeps_no_instance_alive(storms, clear):
    s = storms[clear]
    assert s["instances"] == THREADS * CALLS_PER_THREAD
    assert s["live"] == 0, f"{s['live']} of {s['instances']} instances still alive"


@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_each_program_compiles_once(storms, clear):
    """Without eviction, the XLA compiles are the distinct programs: one per mode
    and size that was called without a fault (a trace that raised compiles
    nothing)."""
    s = storms[clear]
    assert s["compiles"]["default"] == len(s["programs"]["default"])


# --- methods calling each other from two threads ------------------------------------


class PingPong(es.Module):
    w: jax.Array
    flip: bool = eqx.field(static=True)
    unread: int = eqx.field(static=True)

    @es.jit
    def ping(self, x, depth):
        time.sleep(0.05)  # both threads are inside a trace before either calls on
        y = -x if self.flip else x
        return self.pong(self.w * y, depth) if depth > 0 else y

    @es.jit
    def pong(self, x, depth):
        time.sleep(0.05)
        return self.ping(x + 1.0, depth - 1)


def test_methods_calling_each_other_from_two_threads():
    m = PingPong(jnp.arange(3.0), flip=True, unread=0)
    x = jnp.ones(3)
    start = threading.Barrier(2)
    results: dict[str, jax.Array] = {}

    def call(name):
        start.wait()
        results[name] = getattr(m, name)(x, 2)

    alive = _run_threads([lambda: call("ping"), lambda: call("pong")], 8.0)
    assert not alive, "deadlock: threads still running after 8 s"
    np.testing.assert_allclose(
        np.asarray(results["ping"]), _ping_eager(m, x, 2), rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(results["pong"]), _ping_eager(m, x + 1.0, 1), rtol=1e-6
    )


def _ping_eager(m: PingPong, x, depth):
    y = -x if m.flip else x
    return np.asarray(_ping_eager(m, m.w * y + 1.0, depth - 1) if depth > 0 else y)


# --- threads calling one wrapper ---------------------------------------------------


def test_threads_with_mixed_keys_get_correct_results():
    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.w + self.k

    def job(i: int) -> bool:
        k, n, w = i % 4, 2 + i % 3, float(i)
        out = M(w, k)(jnp.arange(n, dtype=jnp.float32))
        return out.shape == (n,) and bool((out == np.arange(n) * w + k).all())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(job, range(96)))
    assert M.__call__.cache_info().currsize == 12


def test_threads_compiling_the_same_new_key_at_once():
    """Eight threads meet at a barrier and call with one new key together."""

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.w + self.k

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a loaded machine would
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for k in range(24):
                barrier = threading.Barrier(8)

                def job(i: int, k: int = k, barrier=barrier) -> float:
                    m, x = M(float(i), k), jnp.ones(())
                    barrier.wait()
                    return float(m(x))

                assert list(pool.map(job, range(8))) == [i + k for i in range(8)]
    finally:
        sys.setswitchinterval(interval)
    assert M.__call__.cache_info().currsize == 24


@pytest.mark.sharing
def test_a_call_that_fails_at_run_time_keeps_its_program_for_the_next_key():
    """A key whose program compiled but failed at run time holds it; another key
    with the same program reuses it and returns its own result."""

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        def body(self, x):
            return self.w * eqx.error_if(x, x < 0, "negative input")

        f = es.jit(body)

    with pytest.raises(eqx.EquinoxRuntimeError, match="negative input"):
        M(w=jnp.ones(3), tag="a").f(-jnp.ones(3))
    m, x = M(w=jnp.full(3, 2.0, jnp.float32), tag="b"), jnp.ones(3)
    assert np.array_equal(m.f(x), M.body(m, x))
    assert M.f.cache_info() == es.CacheInfo(0, 2, None, 2)
    assert M.f.compile_info().compiles == 1


def _in_threads(jobs, timeout=30.0):
    """Run each job on its own thread; re-raise the first error."""
    errors: list[BaseException] = []

    def run(job):
        try:
            job()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def test_a_call_during_another_threads_compile_gets_its_own_trace():
    """A call with another value of a field the program uses, made while another
    thread compiles, traces and compiles its own program."""

    class M(es.Module):
        w: jax.Array
        b: bool = eqx.field(static=True)

        def body(self, x):
            return self.w * (x + 100.0 if self.b else x)

        f = es.jit(body)

    m_a, m_b, x = M(w=jnp.ones(3), b=False), M(w=jnp.ones(3), b=True), jnp.ones(3)
    line_up = threading.Barrier(2, timeout=10)
    b_done = threading.Event()
    a_thread: list[threading.Thread] = []
    out = {}

    def hold_a_in_compile(event, duration, **kwargs):
        # A's compile waits (bounded) for B: B's call lands while A compiles.
        if event == _COMPILE_EVENT and threading.current_thread() in a_thread:
            a_thread.clear()
            line_up.wait()
            b_done.wait(timeout=0.5)

    def a():
        a_thread.append(threading.current_thread())
        out["a"] = m_a.f(x)

    def b():
        line_up.wait()
        out["b"] = m_b.f(x)
        b_done.set()

    jax.monitoring.register_event_duration_secs_listener(hold_a_in_compile)
    try:
        _in_threads([a, b])
    finally:
        jax.monitoring.unregister_event_duration_listener(hold_a_in_compile)
    assert np.array_equal(out["a"], M.body(m_a, x))
    assert np.array_equal(out["b"], M.body(m_b, x))
    assert M.f.cache_info() == es.CacheInfo(0, 2, None, 2)
    assert M.f.compile_info().compiles == 2


@pytest.mark.parametrize("same_key", [False, True])
def test_a_call_right_after_another_threads_trace_of_a_slow_compile(same_key):
    """A call starting right after another thread's trace, while that thread
    compiles, is correct; for the same key it waits and reuses that compile."""
    traced = threading.Event()

    class M(es.Module):
        w: jax.Array
        b: bool = eqx.field(static=True)

        @es.jit
        def f(self, x):
            y = x + 100.0 if self.b else x
            for _ in range(150):  # slow to compile, quick to trace
                y = jnp.sin(y) * 0.0 + y
            traced.set()
            return self.w * y

    m_a, x = M(w=jnp.ones(3), b=False), jnp.ones(3)
    m_b = M(w=jnp.ones(3), b=not same_key)
    line_up = threading.Barrier(2, timeout=10)
    out = {}

    def a():
        line_up.wait()
        out["a"] = m_a.f(x)

    def b():
        line_up.wait()
        assert traced.wait(timeout=10)
        out["b"] = m_b.f(x)

    _in_threads([a, b])
    assert np.array_equal(out["a"], jnp.ones(3))
    assert np.array_equal(out["b"], jnp.ones(3) if same_key else jnp.full(3, 101.0))
    misses = 1 if same_key else 2
    assert M.f.cache_info() == es.CacheInfo(2 - misses, misses, None, misses)
    assert M.f.compile_info().compiles == misses


def test_threads_with_random_configs_get_eager_results():
    """Eight threads calling with random static configs all get the eager result,
    and each distinct program compiles once."""

    def body(self, x):
        y = self.w * x
        if self.a:
            y = y + 100.0 * self.b
        return (y, x.shape[0]) if x.shape[0] > 2 else y

    class M(es.Module):
        w: jax.Array
        a: bool = eqx.field(static=True)
        b: int = eqx.field(static=True)
        f = es.jit(body)

    configs = [(a, b, n) for a in (False, True) for b in range(3) for n in (2, 3)]
    line_up = threading.Barrier(8, timeout=10)
    wrong: list = []
    seen: set = set()
    keys: set = set()

    def worker(seed):
        rng = np.random.default_rng(seed)
        line_up.wait()
        for i in rng.integers(len(configs), size=24):
            a, b, n = configs[i]
            seen.add((a, b * a, n))  # `b` is used only when `a`
            keys.add((a, b, n))
            x = jnp.arange(n, dtype=jnp.float32) + 1
            out = M(w=jnp.ones(n), a=a, b=b).f(x)
            y = out[0] if isinstance(out, tuple) else out
            expected = np.arange(n) + 1.0 + (100.0 * b if a else 0.0)
            if not np.array_equal(y, expected):
                wrong.append((a, b, n, y))

    _in_threads([lambda s=s: worker(s) for s in range(8)])
    assert wrong == []
    assert M.f.compile_info().compiles == shared(len(seen), len(keys))


def _hammer_lru(keys: int, maxsize: int, calls: int) -> es.CacheInfo:
    """Four threads call `maxsize`-bounded `es.jit` with `keys` static values in a
    random order while a fifth iterates the cache through `cache_info()`."""

    class M(es.Module):
        w: jax.Array
        k: int = eqx.field(static=True)

        @es.jit(maxsize=maxsize)
        def f(self, x):
            return self.w * x + self.k

    mods = [M(w=jnp.ones(()), k=k) for k in range(keys)]
    for m in mods[:maxsize]:
        m.f(jnp.ones(()))  # the cache starts full
    x = jnp.ones(())
    line_up = threading.Barrier(5, timeout=10)
    callers_done = threading.Semaphore(0)

    def caller(seed):
        rng = np.random.default_rng(seed)
        line_up.wait()
        try:
            for k in rng.integers(keys, size=calls):
                assert float(mods[k].f(x)) == 1 + k
        finally:
            callers_done.release()

    def inspector():
        line_up.wait()
        done = 0
        while done < 4:
            assert M.f.cache_info().currsize <= maxsize
            done += callers_done.acquire(blocking=False)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a loaded machine would
    try:
        _in_threads([inspector, *(lambda s=s: caller(s) for s in range(4))])
    finally:
        sys.setswitchinterval(interval)
    info = M.f.cache_info()
    assert info.currsize == maxsize
    return info


def test_lru_hits_reorder_the_cache_safely_while_it_is_read():
    """maxsize: hits on other threads never break a concurrent cache_info()."""
    info = _hammer_lru(keys=4, maxsize=4, calls=100)
    assert info == es.CacheInfo(400, 4, 4, 4)


def test_lru_evictions_under_concurrent_calls_give_correct_results():
    """maxsize: concurrent hits, evictions and cache_info() raise nothing and stay correct."""
    info = _hammer_lru(keys=5, maxsize=4, calls=50)
    assert info.hits + info.misses == 4 * 50 + 4
