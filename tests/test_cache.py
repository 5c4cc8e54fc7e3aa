"""The cache knows what it did: every call is booked once (a miss is a call that
traced), and `compile_info()` counts the XLA compiles, exactly, with no listener:
under transformations, `jax.disable_jit()`, errors and JAX's persistent
compilation cache. The counts are checked against a trace counter in the body and
against JAX's own monitoring events."""

import subprocess
import sys
import textwrap

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import XlaCompiles


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
    assert info.misses == traces[0] == 1  # the transformations reused the trace
    assert f.compile_info().compiles == 1
    assert compiles.count >= 1  # the grad's own eager ops compile too


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
    assert M.f.compile_info().compiles == M.h.compile_info().compiles == 1


_PERSISTENT = textwrap.dedent(
    """
    import sys
    import equinox as eqx, jax, jax.numpy as jnp, eqx_static as es
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    x = jnp.ones(3)
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
        done = subprocess.run(
            [sys.executable, "-c", _PERSISTENT, str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(done.stdout.split())
    # Two programs (`tag` is not in the program): compiled by the first process,
    # read from the cache by the second, which asks for the same two compiles.
    assert outs == [["2", "2"], ["0", "2"]]
