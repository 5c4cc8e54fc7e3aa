"""`es.jit` under transformations: `jax.grad` and `eqx.filter_grad` reach the
module's dynamic fields, `jax.vmap` and `eqx.filter_vmap` over stacked modules, an
outer `jax.jit` or `eqx.filter_jit`, and decorated methods calling each other."""

from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from helpers import seed


# --- transforms ---------------------------------------------------------------------


def test_jax_grad_reaches_python_float_fields():
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    grads = jax.grad(lambda m: m(x))(c)
    assert type(grads) is s.Child
    assert grads.sp is True and grads.sc is True
    assert float(grads.dp) == 3.0 * 1.5  # d(dp * dc * x)/d dp
    assert float(grads.dc) == 2.0 * 1.5
    traces = s.traces[0]
    grads = jax.grad(lambda m: m(x))(c.with_dynamic(dp=5.0, dc=7.0))
    assert float(grads.dp) == 7.0 * 1.5 and float(grads.dc) == 5.0 * 1.5
    assert s.traces[0] == traces  # new values of a traced field: no new trace


def test_jax_grad_with_respect_to_the_argument():
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    dx = jax.grad(lambda x: c(x) ** 2)(jnp.array(1.5))
    assert float(dx) == pytest.approx(2 * 9.0 * 6.0)


def test_filter_grad_reaches_array_fields():
    s = seed()
    c = s.Child(dp=jnp.array(2.0), sp=True, dc=jnp.array(3.0), sc=True)
    grads = eqx.filter_grad(lambda m, x: m(x))(c, jnp.array(1.5))
    assert float(grads.dp) == 4.5 and float(grads.dc) == 3.0


def test_filter_grad_differentiates_stored_numbers_as_eager_does():
    """A Python float in a dynamic field of an `es.Module` is stored as an array, so
    `eqx.filter_grad` differentiates it, eagerly and under `es.jit` alike."""
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=jnp.array(3.0), sc=True)
    compiled = eqx.filter_grad(lambda m, x: m(x))(c, jnp.array(1.5))
    eager = eqx.filter_grad(s.Child.__call__.__wrapped__)(c, jnp.array(1.5))
    assert float(compiled.dp) == float(eager.dp) == 4.5
    assert float(compiled.dc) == float(eager.dc) == 3.0


def test_value_and_grad_inside_jax_jit():
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)

    @jax.jit
    def loss(m, x):
        return jax.value_and_grad(lambda m: m(x) ** 2)(m)

    value, grads = loss(c, jnp.array(1.0))
    assert float(value) == 36.0
    assert float(grads.dp) == 2 * 6.0 * 3.0 and float(grads.dc) == 2 * 6.0 * 2.0


def _stack(modules: list) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *modules)


@pytest.mark.parametrize("vmap", [jax.vmap, eqx.filter_vmap])
def test_vmap_over_stacked_modules(vmap):
    s = seed()
    cs = [s.Child(dp=float(i), sp=True, dc=float(i + 1), sc=True) for i in range(4)]
    xs = jnp.arange(4.0) + 0.5
    out = vmap(lambda m, x: m(x))(_stack(cs), xs)
    expected = [float(c(x)) for c, x in zip(cs, xs)]
    assert out.shape == (4,)
    assert out.tolist() == expected == [i * (i + 1) * (i + 0.5) for i in range(4)]


def test_vmap_over_the_argument_only():
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=False)
    xs = jnp.arange(5.0)
    assert (jax.vmap(c)(xs) == 2.0 * xs).all()
    assert (eqx.filter_vmap(c.__call__)(xs) == 2.0 * xs).all()


def test_outer_jax_jit():
    s = seed()
    outer_traces = [0]

    @jax.jit
    def outer(m, x):
        outer_traces[0] += 1
        return m(x) + 1

    x = jnp.array(1.5)
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    assert float(outer(c, x)) == 10.0
    traces = s.traces[0]
    assert float(outer(c.with_dynamic(dp=3.0, dc=4.0), x)) == 19.0
    assert outer_traces[0] == 1 and s.traces[0] == traces
    assert float(outer(c.with_static(sc=False), x)) == 4.0
    assert outer_traces[0] == 2
    assert float(c(x)) == 9.0  # the decorated method alone still agrees


def test_outer_filter_jit():
    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    out = eqx.filter_jit(lambda m, x: m(x) * 2)(c, jnp.array(1.5))
    assert float(out) == 18.0


def test_decorated_method_calls_another():
    traces = {"outer": 0, "inner": 0}

    class M(es.Module):
        w: float
        square: bool = eqx.field(static=True)

        @es.jit
        def inner(self, x):
            traces["inner"] += 1
            return self.w * (x * x if self.square else x)

        @es.jit
        def __call__(self, x):
            traces["outer"] += 1
            return self.inner(x) + self.w

    x = jnp.array(3.0)
    assert M(2.0, False)(x) == 8.0
    assert M(5.0, False)(x) == 20.0
    assert M(2.0, True)(x) == 20.0
    assert M(2.0, True).inner(x) == 18.0
    assert traces["outer"] == 2
    assert M.__call__.cache_info().misses == 2
    assert M.inner.cache_info().misses >= 2


def test_decorated_function_takes_a_decorated_module():
    s = seed()

    @es.jit
    def twice(m, x):
        return m(m(x))

    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    assert float(twice(c, jnp.array(1.0))) == 36.0
    assert float(twice(c.with_dynamic(dp=1.0), jnp.array(1.0))) == 9.0
    assert twice.cache_info() == es.CacheInfo(1, 1, None, 1)


def _scaled(fn, y):
    return fn(y) * 2


@pytest.mark.filterwarnings("error")  # the self-check that turns sharing off: not here
def test_a_function_closing_over_an_outer_grad_s_value():
    """Called inside `jax.grad` with concrete arguments only, the function closes over
    the gradient's tracer (optimistix's `minimise` of a closure, under `grad`): the
    call is bound into the outer trace, as `eqx.filter_jit` binds it, with the same
    gradients. (It once ran an installed executable, and JAX compiled that again.)"""
    ours, theirs = es.jit(_scaled), eqx.filter_jit(_scaled)
    assert ours(lambda y: y + 1.0, 1.0) == theirs(lambda y: y + 1.0, 1.0) == 4.0
    got = [
        jax.grad(lambda o: ours(lambda y: y + o, 1.0))(0.5),
        jax.grad(lambda x: x * ours(lambda y: y + 3.0, 1.0))(1.0),
    ]
    assert (
        got
        == [
            jax.grad(lambda o: theirs(lambda y: y + o, 1.0))(0.5),
            jax.grad(lambda x: x * theirs(lambda y: y + 3.0, 1.0))(1.0),
        ]
        == [2.0, 8.0]
    )
