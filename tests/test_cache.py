"""The cache knows what it did: every call is booked once (a miss is a call that
traced), and `compile_info()` counts the XLA compiles, exactly, with no listener:
under transformations, `jax.disable_jit()`, errors and JAX's persistent
compilation cache. The counts are checked against a trace counter in the body and
against JAX's own monitoring events."""

import functools
import gc
import textwrap
import weakref
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _compile, _jax
from helpers import path, run_python, seed, XlaCompiles


def _counted():
    traces = [0]

    @es.jit
    def f(x):
        traces[0] += 1
        return jnp.sin(x) * 2

    return f, traces


def test_calls_under_transformations_are_booked_like_any_other():
    f, traces = _counted()
    x, xs = jnp.float32(0.5), jnp.ones((4,), jnp.float32)
    compiles = XlaCompiles()
    f(x)
    jax.vmap(f)(xs)
    jax.grad(f)(x)
    info = f.cache_info()
    assert info.hits + info.misses == 3
    # The transformations reuse the trace; but an eager `vmap` or `grad` compiles
    # its transformed program in the call: a miss.
    assert info.misses == 3 and traces[0] == 1
    # Booked: every compile JAX makes of its programs: the top-level program, the
    # batched one, the forward one of the `grad` and the backward one, which
    # `jax.grad` compiles after the call has returned.
    assert f.compile_info().compiles == compiles.of("f") == 4


def test_a_first_call_under_a_transformation_traces_once_and_compiles_nothing():
    f, traces = _counted()
    xs = jnp.ones((4,), jnp.float32)
    compiles = XlaCompiles()
    jax.block_until_ready(jax.jit(jax.vmap(f))(xs))
    assert f.cache_info().misses == traces[0] == 1
    assert f.compile_info().compiles == 0  # the outer jit compiled
    assert compiles.count == 1


def test_disable_jit_runs_eagerly_and_compiles_nothing():
    f, traces = _counted()
    x = jnp.float32(0.5)
    with jax.disable_jit():
        outs = [f(x) for _ in range(3)]
    assert traces[0] == 3 == f.cache_info().misses  # the body ran each time
    assert f.compile_info().compiles == 0 and f.cache_info().currsize == 0
    np.testing.assert_allclose(outs[0], np.sin(0.5) * 2, rtol=1e-6)
    f(x)
    f(x)
    assert f.compile_info().compiles == 1 and f.cache_info().hits == 1


def test_disable_jit_returns_what_the_function_returns():
    """Eagerly too, an output that is not one array comes back as it was returned."""

    @es.jit
    def f(x):
        return x, {"y": 2 * x, "name": "z"}

    with jax.disable_jit():
        x, out = f(jnp.float32(0.5))
    assert out["name"] == "z" and float(out["y"]) == 2 * float(x) == 1.0


def test_a_trace_that_raises_is_a_miss_and_compiles_nothing():
    @es.jit
    def f(x, fail):
        if fail:
            raise ValueError("failed while tracing")
        return x + 1

    with pytest.raises(ValueError, match="failed while tracing"):
        f(jnp.ones(2), True)
    f(jnp.ones(2), False)
    assert f.cache_info() == es.CacheInfo(0, 2, None, 1)
    assert f.compile_info().compiles == 1


@pytest.mark.slow
def test_nothing_leaks_a_tracer():
    """`jax.checking_leaks()` finds no tracer kept by the library, through custom
    rules, callbacks, nested wrappers and shared programs. (`eqx.error_if` is left
    out: its record of the stack keeps tracers alive under `eqx.filter_jit` too.)"""

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return jax.nn.relu(self.w * x) + self.g(x)

        @es.jit
        def h(self, x):
            y = self.f(x)
            return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct((3,), y.dtype), y)

        @es.jit
        def g(self, x):
            return jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)

    x = jnp.ones(3)
    with jax.checking_leaks():
        for tag in "ab":
            m = M(jnp.ones(3), tag)
            m.f(x)
            m.h(x)
            jax.grad(lambda x, m=m: m.f(x).sum())(x)
            jax.vmap(m.f)(jnp.ones((2, 3)))
    assert M.f.compile_info().programs == M.h.compile_info().programs == 1


_PERSISTENT = textwrap.dedent(
    """
    import sys
    import equinox as eqx, jax, jax.numpy as jnp, eqx_static as es
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    x = jnp.ones(3)
    # The first key of a process probes JAX's dispatcher, which compiles a tiny
    # program of the package's own: done before listening.
    es.jit(lambda v: v)(x)
    # With the cache on, each XLA compile is a miss of it (JAX reports a compile
    # duration on a hit too).
    misses = [0]
    jax.monitoring.register_event_listener(
        lambda e, **k: misses.__setitem__(0, misses[0] + (e.endswith("cache_misses")))
    )

    class M(es.Module):
        n: int = eqx.field(static=True)
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x * self.n

    for n, tag in ((1, "a"), (2, "a"), (1, "b")):
        jax.block_until_ready(M(n, tag).f(x))
    print(misses[0], M.f.compile_info().compiles)
    """
)


@pytest.mark.slow
def test_the_persistent_compilation_cache_serves_a_second_process(tmp_path):
    outs = []
    for _ in range(2):
        done = run_python(str(tmp_path / "cache"), code=_PERSISTENT, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(done.stdout.split())
    # Two programs (`tag` is not in the program): compiled by the first process,
    # read from the cache by the second, which asks for the same two compiles.
    assert outs == [["2", "2"], ["0", "2"]]


# --- cache_info, cache_clear and maxsize ----------------------------------------------


def test_cache_info_is_reachable_from_class_and_instance():
    class M(es.Module):
        w: float

        @es.jit
        def __call__(self, x):
            return self.w * x

        @es.jit
        def predict(self, x):
            return self.w + x

    m, x = M(2.0), jnp.array(1.0)
    assert m(x) == 2.0 and m(x) == 2.0
    assert m.predict(x) == 3.0
    assert M.__call__.cache_info() == es.CacheInfo(1, 1, None, 1)
    assert m.__call__.cache_info() == es.CacheInfo(1, 1, None, 1)
    assert isinstance(M.__call__.cache_info(), es.CacheInfo)
    assert M.predict.cache_info() == es.CacheInfo(0, 1, None, 1)
    assert m.predict.cache_info() == es.CacheInfo(0, 1, None, 1)


def test_cache_info_fields_follow_lru_cache():
    info = es.CacheInfo(hits=1, misses=2, maxsize=3, currsize=4)
    assert tuple(info) == (1, 2, 3, 4)
    assert info._fields == ("hits", "misses", "maxsize", "currsize")


def test_cache_clear_drops_entries_and_statistics():
    s = seed()
    c, x = s.Child(dp=2.0, sp=True, dc=3.0, sc=True), jnp.array(1.0)
    c(x), c(x), c.with_static(sc=False)(x)
    assert s.Child.__call__.cache_info() == es.CacheInfo(1, 2, None, 2)
    s.Child.__call__.cache_clear()
    assert s.Child.__call__.cache_info() == es.CacheInfo(0, 0, None, 0)
    assert c(x) == 6.0  # compiles again
    assert s.traces[0] == 3
    assert c.__call__.cache_info() == es.CacheInfo(0, 1, None, 1)
    c.__call__.cache_clear()  # from the instance too
    assert s.Child.__call__.cache_info() == es.CacheInfo(0, 0, None, 0)


def test_cache_clear_from_a_bound_method():
    class M(es.Module):
        w: float

        @es.jit
        def predict(self, x):
            return self.w * x

    m = M(2.0)
    assert m.predict(jnp.array(2.0)) == 4.0
    m.predict.cache_clear()
    assert M.predict.cache_info() == es.CacheInfo(0, 0, None, 0)


def test_maxsize_evicts_the_least_recently_used_entry():
    traces = [0]

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit(maxsize=2)
        def __call__(self, x):
            traces[0] += 1
            return self.w * x + self.k

    x = jnp.array(1.0)
    a, b, c = M(1.0, 0), M(1.0, 10), M(1.0, 20)
    assert a(x) == 1.0 and b(x) == 11.0 and a(x) == 1.0
    assert traces[0] == 2
    assert c(x) == 21.0  # evicts b, the least recently used
    assert traces[0] == 3
    assert M.__call__.cache_info() == es.CacheInfo(1, 3, 2, 2)
    assert a(x) == 1.0  # a survived: a hit, and now the most recent
    assert traces[0] == 3
    assert b(x) == 11.0  # b was evicted: a miss, which evicts c
    assert traces[0] == 4
    assert a(x) == 1.0
    assert traces[0] == 4
    assert c(x) == 21.0
    assert traces[0] == 5
    assert M.__call__.cache_info() == es.CacheInfo(3, 5, 2, 2)


def test_an_evicted_key_s_guard_goes_with_it():
    """A key evicted by `maxsize` keeps no guard: called again, it is a new key,
    whose first two calls take the general path (its guard is made anew at the
    second), as its first two did before."""

    @es.jit(maxsize=1)
    def f(x, k):
        return x * k

    x = jnp.ones(2)
    for k in (1, 2, 1):  # 2 evicts 1, and 1 evicts 2
        for _ in range(3):
            np.testing.assert_array_equal(f(x, k), x * k)
    assert f.cache_info() == es.CacheInfo(6, 3, 1, 1)
    assert f.f.general == 2 * 3


@pytest.mark.sharing
def test_a_program_two_keys_share_is_held_while_either_runs_it():
    """Keys "a" and "b" share one program; with `maxsize=2`, "c" (another program)
    evicts "a": the program is still held for "b" (two held), and "d", whose
    program it is too, runs it without a compile."""

    @es.jit(maxsize=2)
    def f(x, tag):
        return jnp.sin(x) if tag == "c" else x * 2

    x = jnp.ones(2)
    for tag in ("a", "b", "c"):
        f(x, tag)
    assert f.compile_info()[:2] == (2, 2)
    np.testing.assert_array_equal(f(x, "d"), x * 2)
    assert f.compile_info()[:2] == (2, 2)


def _keys_run(monkeypatch: pytest.MonkeyPatch, direct: bool) -> tuple:
    """Four keys of one program, a fifth of another, each called twice: outputs,
    books, and how many of JAX's own misses ran them (`direct`: from the miss's
    trace and lowering where possible; else always JAX's own miss)."""
    own = [0]

    def jit_miss(*args: Any) -> Any:
        own[0] += 1
        return jitted_miss(*args)

    jitted_miss = _jax.jit_miss
    monkeypatch.setattr(_jax, "jit_miss", jit_miss)
    if not direct:
        monkeypatch.setattr(_jax, "run_lowered", lambda *a: None)

    @es.jit
    def f(x, tag):
        return {"y": jnp.cos(x) if tag == "other" else x * 2, "n": x.sum()}

    x = jnp.arange(3.0)
    outs = [f(x, tag) for tag in ("a", "b", "c", "d", "other") * 2]
    return outs, f.cache_info(), f.compile_info()[:2], own[0]


def test_a_miss_runs_its_executable_from_its_own_trace_and_lowering(monkeypatch):
    """A miss runs the executable it compiled or installed from the trace and
    lowering it holds (JAX's own miss would flatten and abstract every leaf again),
    where nothing else is asked of the run; the outputs and books are those of JAX's
    own miss."""
    if not _jax.DISPATCH:
        pytest.skip("the public path: each key's calls are JAX's own")
    es.jit(lambda x: x)(jnp.ones(1))  # the dispatcher's probe, if not run yet
    with monkeypatch.context() as m:
        outs, info, compiles, own = _keys_run(m, direct=True)
    assert own == (0 if _jax.RUN_LOWERED else 5)  # five misses: JAX's own or none
    with monkeypatch.context() as m:
        outs2, info2, compiles2, own2 = _keys_run(m, direct=False)
    assert own2 == 5 and (info, compiles) == (info2, compiles2)
    assert info.misses == 5 and info.hits == 5 and compiles == (2, 2)
    for got, want in zip(outs, outs2):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


def test_maxsize_counts_shapes_as_entries():
    traces = [0]

    @es.jit(maxsize=1)
    def f(x):
        traces[0] += 1
        return x + 1

    assert f(jnp.ones(2)).shape == (2,)
    assert f(jnp.ones(3)).shape == (3,)
    assert f(jnp.ones(2)).shape == (2,)
    assert traces[0] == 3
    assert f.cache_info() == es.CacheInfo(0, 3, 1, 1)


@pytest.mark.parametrize("maxsize", [1.5, "2"])
def test_maxsize_of_the_wrong_type_raises(maxsize):
    with pytest.raises((ValueError, TypeError), match="maxsize"):
        es.jit(maxsize=maxsize)(lambda x: x)


def test_currsize_never_exceeds_maxsize():
    class Shapes(es.Module):
        k: int = eqx.field(static=True)

        @es.jit(maxsize=2)
        def __call__(self, x):
            return x * self.k

    for k in range(3):
        for n in range(1, 4):  # three shapes per entry
            Shapes(k)(jnp.ones(n))
            assert Shapes.__call__.cache_info().currsize <= 2


# --- booking --------------------------------------------------------------------------


def test_a_failed_trace_is_a_miss_that_holds_no_entry():
    """Every call is booked once: a trace that raised is a miss, and
    compiled nothing, so `currsize` does not count it."""

    class Gate(es.Module):
        dp: float

        @es.jit
        def __call__(self, x):
            return x if self.dp > 0 else -x

    for _ in range(2):
        with pytest.raises(es.TracedFieldError):
            Gate(1.0)(jnp.array(1.0))
    assert Gate.__call__.cache_info() == es.CacheInfo(0, 2, None, 0)


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


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.grad(lambda y: f(y).sum())(x),
        lambda f, x: jax.vmap(f)(x[None]),
        lambda f, x: jax.jvp(f, (x,), (x,)),
    ],
    ids=["grad", "vmap", "jvp"],
)
def test_the_first_call_under_an_eager_transform_is_a_miss(transform):
    @es.jit
    def f(x):
        return jnp.sin(x)

    transform(f, jnp.ones(3))
    assert f.cache_info().misses == 1 and f.cache_info().hits == 0
    transform(f, jnp.ones(3))
    info = f.cache_info()
    assert info.hits + info.misses == 2


# --- what the cache keeps alive -------------------------------------------------------


def test_cache_keeps_no_module_alive():
    class M(es.Module):
        w: float
        a: jax.Array

        @es.jit
        def __call__(self, x):
            return self.w * x + self.a

        @es.jit
        def predict(self, x):
            return self.w * x

    @es.jit
    def f(m, x):
        return m.a * x

    @es.jit
    def g(ms, x):
        return ms[0].a * x

    m, x = M(2.0, jnp.ones(3)), jnp.ones(3)
    for _ in range(3):  # a first call, then calls on the memoised key
        m(x), m.predict(x), f(m, x), g([m], x)
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None


def test_cache_keeps_no_traced_array_alive():
    class M(es.Module):
        a: jax.Array

        @es.jit
        def __call__(self, x):
            return self.a * x

    a, x = jnp.ones(3), jnp.full(3, 2.0)
    m = M(a)
    assert (m(x) == 2).all() and (m(x) == 2).all()
    refs = [weakref.ref(a), weakref.ref(x)]
    del a, x, m
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_module_closed_over_by_an_outer_jit_is_still_usable():
    """Calls inside `jax.jit` leave no tracer behind for the calls after it."""

    class M(es.Module):
        w: float

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(2.0)  # a Python float, stored as an array
    x = jnp.array(1.0)
    assert float(jax.jit(lambda x: m(x) + m(x))(x)) == 4.0
    assert float(m(x)) == 2.0
    assert float(m(x)) == 2.0


class SelfReferring(es.Module):
    w: jax.Array
    fn: Any = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x


def _self_referring() -> SelfReferring:
    box: list = []
    m = SelfReferring(jnp.ones(2), fn=lambda: box[0])
    box.append(m)
    return m


def test_a_module_referring_to_itself_is_freed_by_cache_clear():
    """Its key holds its static `fn`, which holds the module: the cache keeps it
    until `cache_clear()` (or until `maxsize` evicts the key), which frees it."""
    m = _self_referring()
    m(jnp.ones(2))
    m(jnp.ones(2))
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is not None  # the documented exception: a key refers back
    SelfReferring.__call__.cache_clear()
    gc.collect()
    assert ref() is None


class _Callback:
    """A static value that references an array (weakly referenceable)."""

    def __init__(self, arr):
        self.arr = arr

    def __call__(self, x):
        return x


def test_a_static_value_lives_until_cache_clear():
    class M(es.Module):
        w: jax.Array
        fn: object = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.fn(self.w * x)

    fn = _Callback(np.ones(3))
    ref = weakref.ref(fn)
    m = M(jnp.ones(3), fn)
    m(jnp.ones(3))
    module_ref = weakref.ref(m)
    del m, fn
    gc.collect()
    assert module_ref() is None  # the module is not kept
    assert ref() is not None  # the static value is, by the cache entry
    M.__call__.cache_clear()
    gc.collect()
    assert ref() is None


def test_a_partial_in_a_static_field_is_kept_until_cache_clear():
    class M(es.Module):
        w: jax.Array
        fn: object = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.fn(self.w * x)

    fn = functools.partial(_Callback(np.ones(3)))  # references an array
    ref = weakref.ref(fn.func)
    M(jnp.ones(3), fn)(jnp.ones(3))
    del fn
    gc.collect()
    assert ref() is not None
    M.__call__.cache_clear()
    gc.collect()
    assert ref() is None


# --- nothing remembered per instance ------------------------------------------------------------


def test_mutable_container_in_a_field_is_read_on_every_call():
    """A frozen module may hold a list; mutating it in place is seen, as under
    `eqx.filter_jit`: its key is read on every call."""

    class M(es.Module):
        ws: list

        @es.jit
        def __call__(self, x):
            return sum(self.ws) * x

    m, x = M([1.0, 2.0]), jnp.array(1.0)  # stored as a list of 0-d arrays
    assert float(m(x)) == 3.0 and float(m(x)) == 3.0
    m.ws[0] = jnp.float32(10.0)  # same structure and avals: a hit, new value seen
    assert float(m(x)) == 12.0
    m.ws.append(jnp.float32(5.0))  # new structure: a miss
    assert float(m(x)) == 17.0
    assert M.__call__.cache_info().misses == 2
    m.ws[0] = 1.0  # a Python float, put in place by hand: static, as in filter_jit
    assert float(m(x)) == 8.0
    assert M.__call__.cache_info().misses == 3


def test_a_module_holding_an_edited_module_sees_its_later_edits():
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
        assert w.f(x) == w.f(x) == 1.0  # the second call: a hit
        inner.k = 3
        assert w.f(x) == Wrap.f.__wrapped__(w, x) == 3.0
    assert w.f(x) == 3.0


def test_a_method_with_256_array_arguments():
    """A module's method takes any number of array arguments (here 256) on the hit
    path."""

    class M(es.Module):
        w: float

        @es.jit
        def f(self, *xs):
            return self.w * sum(xs)

    m, xs = M(w=1.0), [jnp.ones(())] * 256
    for _ in range(3):  # the second and third calls are hits
        assert m.f(*xs) == 256.0
    assert M.f.cache_info() == es.CacheInfo(2, 1, None, 1)


def test_a_hit_keeps_nothing_of_the_module():
    class M(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(jnp.arange(3.0))
    m(jnp.ones(3))
    m(jnp.ones(3))  # a hit
    leaf = weakref.ref(m.w)
    del m
    gc.collect()
    assert leaf() is None


def test_a_module_changed_in_place_is_read_again():
    """Nothing is remembered per instance: a module changed in place (modules are
    frozen; `object.__setattr__` gets around that) gives the eager result, its new
    array and its new static value alike."""

    class M(es.Module):
        w: jax.Array
        k: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x * self.k

    m = M(jnp.ones(3), 1)
    m(jnp.ones(3))
    m(jnp.ones(3))
    object.__setattr__(m, "w", jnp.zeros(3))
    np.testing.assert_array_equal(m(jnp.ones(3)), np.zeros(3))
    object.__setattr__(m, "w", jnp.ones(3))
    object.__setattr__(m, "k", 3)
    np.testing.assert_array_equal(m(jnp.ones(3)), 3 * np.ones(3))
    assert M.__call__.cache_info() == es.CacheInfo(2, 2, None, 2)


# --- maxsize: bounds without thrashing --------------------------------------------


X = jnp.ones(3)


def test_maxsize_one_serves_identical_calls_after_another_shape_as_hits():
    """With `maxsize=1`, a second shape takes the first one's place; the identical
    calls after it are hits, not a trace and a compile each."""

    @es.jit(maxsize=1, max_compiles=2)
    def f(x):
        return jnp.sin(x)

    compiles = XlaCompiles()
    f(jnp.ones(3))
    f(jnp.ones(5))
    for _ in range(20):
        f(jnp.ones(5))
    assert f.cache_info() == es.CacheInfo(20, 2, 1, 1)
    assert f.compile_info().compiles == compiles.of("f") == 2


def test_a_key_evicted_while_its_first_call_traces_holds_nothing_past_maxsize():
    """Thread A traces key "a" and waits; thread B runs keys "b" and "c" meanwhile
    (`maxsize=1` evicts "a"). When A finishes, the books still hold at most
    `maxsize` signatures, and no more programs than signatures."""
    import threading

    tracing, resume = threading.Event(), threading.Event()

    @es.jit(maxsize=1)
    def f(x, tag):
        if tag == "a":
            tracing.set()
            assert resume.wait(timeout=30)
        return x * (1.0 if tag == "a" else 2.0)

    results = {}
    a = threading.Thread(target=lambda: results.update(a=float(f(X, "a")[0])))
    a.start()
    assert tracing.wait(timeout=30)
    results["b"] = float(f(X, "b")[0])
    results["c"] = float(f(X, "c")[0])
    resume.set()
    a.join(timeout=60)
    assert results == {"a": 1.0, "b": 2.0, "c": 2.0}
    info = f.cache_info()
    assert info.currsize <= 1 and info.hits + info.misses == 3
    assert f.compile_info().programs <= info.currsize
    for tag, want in [("a", 1.0), ("b", 2.0), ("a", 1.0)]:  # each made again
        assert float(f(X, tag)[0]) == want


def _executables_alive_during(monkeypatch: pytest.MonkeyPatch, run: Any) -> list:
    """How many of the executables JAX makes during `run(step)` are alive at each
    `step()`, counted by weak references (an executable holds device memory)."""
    from jax._src.interpreters import pxla

    made: list[weakref.ref] = []
    init = pxla.MeshExecutable.__init__

    def spied(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(pxla.MeshExecutable, "__init__", spied)
    alive: list[int] = []
    run(lambda: alive.append(sum(r() is not None for r in made)))
    assert len(made) >= len(alive)  # each step compiled one
    return alive


# 80 shapes in the fast tier: more than the 64 misses kept to explain a later one,
# so that record wraps around too; 1,000 in the slow tier.
@pytest.mark.parametrize("shapes", [80, pytest.param(1_000, marks=pytest.mark.slow)])
def test_maxsize_bounds_the_executables_alive(monkeypatch, shapes):
    """`maxsize` bounds what is held: with `maxsize=2` and one key called with
    many new shapes, at most 2 executables are alive after every call (what is
    kept to explain a later miss holds none), and each result is the eager one."""
    fn = lambda x: x * 2 + 1  # noqa: E731
    f = es.jit(maxsize=2)(fn)
    xs = [np.ones(n, np.float32) for n in range(1, shapes + 1)]

    def run(step: Any) -> None:
        for x in xs:
            np.testing.assert_array_equal(f(x), fn(x))
            step()

    alive = _executables_alive_during(monkeypatch, run)
    assert max(alive) <= 2
    assert f.cache_info() == es.CacheInfo(0, shapes, 2, 2)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_maxsize_bounds_the_executables_of_keys_evicted(monkeypatch, where):
    """With `maxsize=2` and 20 keys, each its own program, at most 2 executables
    are alive after every call, without waiting for Python's cycle collector: an
    evicted key lets go of its executables at once, on both paths."""
    fn = lambda x, k: x * k  # noqa: E731
    with path(where):
        f = es.jit(maxsize=2, warn_after=None)(fn)

        def run(step: Any) -> None:
            for k in range(1, 21):
                np.testing.assert_array_equal(f(np.ones(3, np.float32), k), fn(1, k))
                step()

        gc.disable()
        try:
            alive = _executables_alive_during(monkeypatch, run)
        finally:
            gc.enable()
    assert max(alive) <= 2


@pytest.mark.slow
def test_ten_thousand_keys_made_and_dropped():
    """Each key has its own C++ dispatcher, dropped with the key when `maxsize`
    evicts it: 10,000 of them made and dropped (JAX issue #38281: a jaxlib that
    crashed when many `jax.jit`s were made and dropped), at whatever version runs
    the suite; the floors' CI job runs it at the floor. One program serves them."""

    @es.jit(maxsize=16)
    def f(x, k):
        return x * 2

    x = jnp.ones(2)
    for k in range(10_000):
        f(x, k)
    gc.collect()
    assert f.cache_info() == es.CacheInfo(0, 10_000, 16, 16)
    assert f.compile_info()[:2] == (1, 1)


def test_a_new_key_enters_the_dispatcher_once(monkeypatch):
    """The general path hands the call over before it calls the key's dispatcher,
    so a new key's miss runs once, not once to ask for the call and again with
    it; a new shape of a known key (through its guard) asks once more."""
    if not _jax.DISPATCH:
        pytest.skip("the public path has no dispatcher of its own")
    misses, cache_miss = [], _compile.cache_miss

    def counted(*args: Any) -> Any:
        misses.append(args[2:])
        return cache_miss(*args)

    monkeypatch.setattr(_compile, "cache_miss", counted)
    f = es.jit(lambda x, n: x * n)  # n, a Python int: static
    for n in (2, 3):
        assert float(f(jnp.ones(()), n)) == n
    assert len(misses) == 2
    f(jnp.ones(()), 2), f(jnp.ones(()), 2)  # a hit, through the guard made
    assert len(misses) == 2
    assert f(jnp.ones(2), 2).shape == (2,)  # a new shape: through the guard
    assert len(misses) == 4
