"""The comparison table of `docs/guarantees.md` ("Compared with the alternatives"):
its first three rows hold for `es.jit`, `eqx.filter_jit` and `jax.jit`, and for
the peers it names (flax, jax_dataclasses) where they are installed
(`pip install -e ".[bench]"`)."""

import importlib.util

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest


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


def test_static_1_true_1point0():
    """Under `jax.jit` and `eqx.filter_jit`, static `1`, `True` and `1.0` share an
    entry (the first one's `int32`); `es.jit` keys them by type."""

    class M(eqx.Module):
        n: object = eqx.field(static=True)

    def dtypes(jit):
        f = jit(lambda m: jnp.asarray(m.n))
        return [f(M(v)).dtype for v in (1, True, 1.0)]

    assert dtypes(jax.jit) == [jnp.int32] * 3
    assert dtypes(eqx.filter_jit) == [jnp.int32] * 3
    assert dtypes(es.jit) == [jnp.int32, jnp.bool_, jnp.float32]


def _needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"needs `{module}`"
    )


def _flax_struct():
    from flax import struct

    @struct.dataclass
    class S:
        a: float
        n: object = struct.field(pytree_node=False, default=0)

    return S


def _jax_dataclasses():
    import jax_dataclasses as jdc

    @jdc.pytree_dataclass
    class J:
        a: float
        n: jdc.Static[object] = 0

    return J


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_flax_struct, marks=_needs("flax"), id="flax.struct"),
        pytest.param(_jax_dataclasses, marks=_needs("jax_dataclasses"), id="jdc"),
    ],
)
def test_dataclass_peer_columns(make):
    """A float field is data (one trace for three values); static `1`, `True` and
    `1.0` share an entry, as under `jax.jit`."""
    cls = make()
    traces = [0]

    @jax.jit
    def f(s, x):
        traces[0] += 1
        return s.a * x

    for v in (1.0, 2.0, 3.0):
        f(cls(v), jnp.ones(()))
    assert traces[0] == 1
    g = jax.jit(lambda s: jnp.asarray(s.n))
    assert [g(cls(0.0, v)).dtype for v in (1, True, 1.0)] == [jnp.int32] * 3


@_needs("flax")
def test_nnx_column():
    """A Python float in a plain attribute is static (3 compiles); a `jax.Array` in
    a plain attribute is data (1 compile), without `nnx.Variable`."""
    from flax import nnx

    class M(nnx.Module):
        def __init__(self, a):
            self.a = a

    traces = [0]

    @nnx.jit
    def f(m, x):
        traces[0] += 1
        return m.a * x

    for v in (1.0, 2.0, 3.0):
        f(M(v), jnp.ones(()))
    assert traces[0] == 3
    for v in (1.0, 2.0, 3.0):
        f(M(jnp.asarray(v)), jnp.ones(()))
    assert traces[0] == 4

    @nnx.jit
    def g(m):
        return jnp.asarray(m.a)

    assert [g(M(v)).dtype for v in (1, True, 1.0)] == [jnp.int32] * 3
