"""Faults: many threads, mixed configurations, eviction, bodies that
raise while tracing (`ValueError`, and `KeyboardInterrupt` mid-trace), and then the
contract's invariants (DESIGN §2.4, "Lifetime and threads" and "Introspection"):

- every result equals the eager result;
- every call is booked exactly once, as a hit or a miss (a call whose trace raised
  is a miss: it traced), and a miss is a trace;
- nothing deadlocks (daemon threads, joined with a timeout);
- the cache keeps no module instance alive, with and without `cache_clear()`.

The schedule is fixed by `random.Random(0)`. The environment variable
`EQX_STATIC_FAULT_SCALE` (default 1) multiplies the number of calls per thread; to
run ten times longer locally:

    EQX_STATIC_FAULT_SCALE=10 .venv/bin/python -m pytest tests/test_faults.py -q
"""

import gc
import os
import random
import threading
import time
import weakref

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


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


@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_no_deadlock_and_results_equal_eager(storms, clear):
    s = storms[clear]
    assert not s["alive"], f"{len(s['alive'])} threads still running after {TIMEOUT} s"
    assert s["problems"] == []


@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_every_call_booked_once(storms, clear):
    s = storms[clear]
    for name, info in s["infos"].items():
        calls, failed = s["booked"][name], s["failed"][name]
        assert info.hits + info.misses == calls, (
            f"{name}: {info}, {calls} calls of which {failed} raised"
        )
    assert s["infos"]["maxsize2"].currsize <= 2


@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_a_miss_is_a_trace(storms, clear):
    s = storms[clear]
    misses = sum(info.misses for info in s["infos"].values())
    assert misses == s["traces"], f"{s['infos']}, {s['failed']} raised"


@pytest.mark.parametrize("clear", [False, True], ids=["kept", "cleared"])
def test_cache_keeps_no_instance_alive(storms, clear):
    s = storms[clear]
    assert s["instances"] == THREADS * CALLS_PER_THREAD
    assert s["live"] == 0, f"{s['live']} of {s['instances']} instances still alive"


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
