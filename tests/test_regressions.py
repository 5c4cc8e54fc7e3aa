"""Regression tests for the bugs found in review, one rule per test.

Each test compares against plain `es.jit`, the eager function, or exact
`cache_info()` numbers, so that it fails on the old behaviour. Thread tests line
threads up with `threading.Barrier` (or an event set from inside the trace) and
assert on results, never on timings.
"""

import sys
import threading

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


# --- a program shared by keys: each key keeps what its own trace returned ------------


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


def test_a_failing_run_books_its_compile_and_nothing_else():
    """A call that traces and compiles but fails at run time counts as one miss."""

    class M(es.Module):
        w: jax.Array

        @es.jit
        def f(self, x):
            return eqx.error_if(self.w * x, x < 0, "negative")

    m = M(w=jnp.ones(3))
    with pytest.raises(eqx.EquinoxRuntimeError, match="negative"):
        m.f(-jnp.ones(3))
    assert M.f.cache_info() == es.CacheInfo(0, 1, None, 1)
    assert np.array_equal(m.f(jnp.ones(3)), jnp.ones(3))
    assert M.f.cache_info() == es.CacheInfo(1, 1, None, 1)
    with pytest.raises(eqx.EquinoxRuntimeError, match="negative"):
        m.f(-jnp.ones(3))  # a hit that fails at run time: still one call
    assert M.f.cache_info() == es.CacheInfo(2, 1, None, 1)
    M.f.cache_clear()
    m.f(jnp.ones(3))  # one fresh miss; no stale record booked with it
    assert M.f.cache_info() == es.CacheInfo(0, 1, None, 1)
    m.f(jnp.ones(3))
    assert M.f.cache_info() == es.CacheInfo(1, 1, None, 1)


def test_a_positional_call_after_a_keyword_only_call():
    """Keyword and positional forms of one call are one key."""

    class M(es.Module):
        w: jax.Array
        b: bool = eqx.field(static=True)

    def body(m, x):
        return m.w * x if m.b else x

    f = es.jit(body)
    m, x = M(w=jnp.full(3, 2.0), b=True), jnp.ones(3)
    assert np.array_equal(f(m=m, x=x), body(m, x))
    assert np.array_equal(f(m, x), body(m, x))
    off = M(w=jnp.full(3, 2.0), b=False)
    assert np.array_equal(f(off, x), body(off, x))
    assert f.cache_info().misses == 2


def test_returning_self_from_a_program_shared_with_another_value_of_a_field():
    """Keys that differ only in `tag` share one program; each returns its own
    `self`, with its own `tag`."""

    def body(self, x):
        y = self.w * x
        return (y, self) if x.ndim == 2 else y

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)
        f = es.jit(body)

    x1, x2 = jnp.ones(3), jnp.ones((2, 3))
    M(w=jnp.ones(()), tag="a").f(x1)
    M(w=jnp.ones(()), tag="b").f(x1)  # the same program, another `tag`
    M(w=jnp.ones(()), tag="a").f(x2)
    m = M(w=jnp.ones(()), tag="b")
    y, out = m.f(x2)  # the same program as `tag="a"` at this shape
    y0, out0 = body(m, x2)
    assert out.tag == out0.tag == "b"
    assert np.array_equal(y, y0)
    assert M.f.compile_info().compiles == 2


def test_returning_a_submodule_from_a_shared_program():
    class Sub(es.Module):
        k: int = eqx.field(static=True)

    def body(self, x):
        y = self.w * x
        return (y, self.sub) if x.ndim == 2 else y

    class M(es.Module):
        w: jax.Array
        sub: Sub
        name: str = eqx.field(static=True)  # never used
        f = es.jit(body)

    x2 = jnp.ones((2, 3))
    M(w=jnp.ones(()), sub=Sub(k=1), name="a").f(x2)
    y, sub = M(w=jnp.ones(()), sub=Sub(k=2), name="b").f(x2)
    assert sub == Sub(k=2)
    assert M.f.compile_info().compiles == 1


@pytest.mark.parametrize("first_has_enc", [False, True])
def test_an_optional_submodule_whichever_instance_comes_first(first_has_enc):
    class Enc(es.Module):
        act: str = eqx.field(static=True)

    def body(self, x):
        y = self.w * x
        return jnp.tanh(y) if self.enc is not None and self.enc.act == "tanh" else y

    class M(es.Module):
        w: jax.Array
        enc: Enc | None
        f = es.jit(body)

    with_enc = M(w=jnp.full((), 2.0), enc=Enc(act="tanh"))
    without = M(w=jnp.full((), 2.0), enc=None)
    order = [with_enc, without] if first_has_enc else [without, with_enc]
    x = jnp.ones(())
    for m in order * 2:
        assert m.f(x) == body(m, x)


# --- typed static values ------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
def test_numpy_scalar_statics_are_keyed_by_sign():
    """np.float32(0.0) and np.float32(-0.0) as static values compile separately."""

    class N(es.Module):
        v: object = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + 1 / jnp.asarray(self.v)

    z = jnp.zeros((), jnp.float32)
    for v in (np.float32(0.0), np.float32(-0.0)):
        assert N(v=v).f(z) == z + 1 / jnp.asarray(v)
    assert N.f.cache_info() == es.CacheInfo(0, 2, None, 2)


def test_complex_statics_are_keyed_by_sign_and_nan_equals_itself():
    """Complex static values differ by the sign of zero; a nan part still hits."""

    class C(es.Module):
        c: complex = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + 1 / jnp.asarray(self.c).imag

    z = jnp.zeros((), jnp.float32)
    for v in (complex(1, 0.0), complex(1, -0.0)):
        assert C(c=v).f(z) == z + 1 / jnp.asarray(v).imag
    assert C.f.cache_info() == es.CacheInfo(0, 2, None, 2)
    C.f.cache_clear()
    for _ in range(5):
        C(c=complex(float("nan"), 0)).f(z)  # equal-valued modules
    assert C.f.cache_info() == es.CacheInfo(4, 1, None, 1)


def test_frozenset_statics_are_keyed_by_element_types():
    """frozenset({1}), frozenset({True}) and frozenset({1.0}) compile separately."""

    class S(es.Module):
        s: frozenset = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return jnp.asarray(next(iter(self.s)))

    z = jnp.zeros((), jnp.float32)
    for v in (frozenset({1}), frozenset({True}), frozenset({1.0})):
        out = S(s=v).f(z)
        assert out.dtype == jnp.asarray(next(iter(v))).dtype
    assert S.f.cache_info() == es.CacheInfo(0, 3, None, 3)


class Dims(tuple):
    def __new__(cls, *dims):
        return super().__new__(cls, dims)


def test_tuple_subclass_static_reaches_the_trace_unchanged():
    """A static tuple subclass with a *args constructor is the same value inside the trace."""

    class M(es.Module):
        dims: Dims = eqx.field(static=True)

        @es.jit
        def f(self, x):
            assert type(self.dims) is Dims
            return x * len(self.dims)

    m, x = M(dims=Dims(4, 5, 6)), jnp.ones(())
    assert m.f(x) == M.f.__wrapped__(m, x) == 3.0


# --- the per-instance memo ------------------------------------------------------------


def test_results_follow_jax_enable_x64_as_eager_does():
    """A stored number keeps the dtype it was stored with (float32, or float64 if
    stored under x64); the compiled call computes what the eager call computes
    under the current jax_enable_x64."""

    class M(es.Module):
        dp: float

        @es.jit
        def __call__(self, x):
            return self.dp * x

    eager = M.__call__.__wrapped__
    m = M(dp=0.1)
    m(jnp.ones(()))
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        x = jnp.ones((), jnp.float64)
        got, want = m(x), eager(m, x)
        assert got.dtype == want.dtype == jnp.float64 and got.item() == want.item()
        fresh = M(dp=0.1)  # stored under x64: float64
        assert fresh.dp.dtype == jnp.float64
        assert fresh(x).item() == eager(fresh, x).item() == 0.1
    got = m(jnp.ones(()))
    assert got.dtype == eager(m, jnp.ones(())).dtype == jnp.float32


def test_a_module_holding_an_edited_module_is_not_memoised():
    """A module holding a module still being edited sees that module's later edits."""

    class Inner(es.Module):
        k: int = eqx.field(static=True)

    class Wrap(es.Module):
        inner: Inner

        @es.jit
        def f(self, x):
            return x * self.inner.k

    x = jnp.ones(())
    with es.edit(Inner(k=1)) as inner:
        w = Wrap(inner=inner)
        assert w.f(x) == w.f(x) == 1.0  # the second call would memoise `w`
        inner.k = 3
        assert w.f(x) == Wrap.f.__wrapped__(w, x) == 3.0
    assert w.f(x) == 3.0


def test_memoised_method_with_256_array_arguments():
    """A memoised module's method takes any number of array arguments (here 256)."""

    class M(es.Module):
        w: float

        @es.jit
        def f(self, *xs):
            return self.w * sum(xs)

    m, xs = M(w=1.0), [jnp.ones(())] * 256
    for _ in range(3):  # the third call takes the memoised fast path
        assert m.f(*xs) == 256.0
    assert M.f.cache_info() == es.CacheInfo(2, 1, None, 1)


# --- cache statistics -------------------------------------------------------------


def test_lower_books_no_call_and_erases_no_hits():
    """lower() is not a call: it books nothing, and the calls around it keep
    their counts. Nor does its trace let a later call compile behind the miss
    path: each new shape is a miss, and compiles once."""

    @es.jit
    def f(x):
        return 2 * x

    f(jnp.ones(3))
    for n in (4, 5, 6):
        f.lower(jnp.ones(n))
    for _ in range(3):
        f(jnp.ones(3))
    assert f.cache_info() == es.CacheInfo(3, 1, None, 1)
    f(jnp.ones(4))
    assert f.cache_info() == es.CacheInfo(3, 2, None, 2)
    assert f.compile_info().compiles == 2


# --- es.edit ----------------------------------------------------------------------------


def test_edit_in_place_on_a_list_or_dict_field_leaves_the_original_alone():
    """In-place edits of a plain list or dict field inside es.edit change only the copy."""

    class M(es.Module):
        ws: list
        names: dict
        flag: bool = eqx.field(static=True)

    c = M(ws=[jnp.zeros(2), jnp.zeros(2)], names={"a": 1.0}, flag=False)
    with es.edit(c) as c2:
        c2.ws[0] = jnp.ones(2)
        c2.names["a"] = 5.0
    assert c2.ws is not c.ws and c2.names is not c.names
    assert np.array_equal(c.ws[0], jnp.zeros(2)) and c.names == {"a": 1.0}
    assert np.array_equal(c2.ws[0], jnp.ones(2)) and c2.names == {"a": 5.0}


def test_a_failed_edit_leaves_no_usable_module():
    """When es.edit fails validation on exit, the yielded copy cannot be used."""

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        def __check_init__(self):
            if self.k < 0:
                raise ValueError("k must be >= 0")

        @es.jit
        def f(self, x):
            return x * self.w * self.k

    c, x = M(w=1.0, k=1), jnp.ones(())
    with pytest.raises(ValueError, match="k must be >= 0"):
        with es.edit(c) as c2:
            c2.k = -5
    defunct = "copy made by an `es.edit` block that raised"
    with pytest.raises(RuntimeError, match=defunct):
        c2.k  # noqa: B018
    with pytest.raises(RuntimeError, match=defunct):
        c2.f(x)
    with pytest.raises(TypeError, match="unhashable"):
        with es.edit(c) as c3:
            c3.k = [1, 2]  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(RuntimeError, match=defunct):
        c3.k  # noqa: B018
    assert c.k == 1 and c.f(x) == 1.0


# --- threads ----------------------------------------------------------------------------


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

    def worker(seed):
        rng = np.random.default_rng(seed)
        line_up.wait()
        for i in rng.integers(len(configs), size=24):
            a, b, n = configs[i]
            seen.add((a, b * a, n))  # `b` is used only when `a`
            x = jnp.arange(n, dtype=jnp.float32) + 1
            out = M(w=jnp.ones(n), a=a, b=b).f(x)
            y = out[0] if isinstance(out, tuple) else out
            expected = np.arange(n) + 1.0 + (100.0 * b if a else 0.0)
            if not np.array_equal(y, expected):
                wrong.append((a, b, n, y))

    _in_threads([lambda s=s: worker(s) for s in range(8)])
    assert wrong == []
    assert M.f.compile_info().compiles == len(seen)


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
