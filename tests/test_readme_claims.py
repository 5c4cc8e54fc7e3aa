"""The README's statements about `jax.jit` and `eqx.filter_jit`, checked against
the installed JAX and Equinox, next to `es.jit` doing better."""

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp


def _traces_for_float_values(jit, base=eqx.Module):
    traces = [0]

    class M(base):
        a: float

    @jit
    def f(m, x):
        traces[0] += 1
        return m.a * x

    for v in (1.0, 2.0, 3.0):
        f(M(v), jnp.ones(()))
    return traces[0]


def test_a_python_float_field_recompiles_under_filter_jit_but_not_here():
    """In an `eqx.Module` a Python float is a static leaf for both wrappers; an
    `es.Module` stores it as an array, so neither recompiles for a new value."""
    assert _traces_for_float_values(eqx.filter_jit) == 3
    assert _traces_for_float_values(es.jit) == 3
    assert _traces_for_float_values(eqx.filter_jit, es.Module) == 1
    assert _traces_for_float_values(es.jit, es.Module) == 1


def test_static_1_true_1point0_share_an_entry_under_jax_and_filter_jit():
    class M(eqx.Module):
        n: object = eqx.field(static=True)

    def dtypes(jit):
        f = jit(lambda m: jnp.asarray(m.n))
        return [f(M(v)).dtype for v in (1, True, 1.0)]

    assert dtypes(jax.jit) == [jnp.int32] * 3
    assert dtypes(eqx.filter_jit) == [jnp.int32] * 3
    assert dtypes(es.jit) == [jnp.int32, jnp.bool_, jnp.float32]
