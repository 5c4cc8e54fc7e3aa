"""Degrade, don't break: where JAX's private names change so that each key's own
dispatcher cannot be built, `es.jit` runs each key on a public `jax.jit`, with
sharing off and one warning, and its results, books, budgets and explanations
stay right. (`tests/canary/` says which name changed.)"""

import logging

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import XlaCompiles


@pytest.fixture
def no_dispatcher(monkeypatch):
    """A JAX whose dispatcher is built with other arguments than `_jax` passes."""

    def changed(*args, **kwargs):
        raise TypeError("pjit() takes 10 positional arguments but 9 were given")

    monkeypatch.setattr(_jax, "DISPATCH", True)  # restored afterwards
    monkeypatch.setattr(_jax, "SHARING", True)
    monkeypatch.setattr(_jax, "dispatcher", changed)


class Model(es.Module):
    w: jax.Array
    square: bool = eqx.field(static=True)
    name: str = eqx.field(static=True)  # never read

    @es.jit(max_compiles=3)
    def __call__(self, x):
        return self.w * (x * x if self.square else x)


def test_results_books_and_explanations_on_public_jax_jit(no_dispatcher, caplog):
    Model.__call__.cache_clear()
    x = jnp.arange(3.0)
    compiles = XlaCompiles()
    with pytest.warns(RuntimeWarning, match="its dispatcher cannot be built here"):
        first = Model(jnp.ones(3), False, "a")(x)
    np.testing.assert_array_equal(first, x)
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        calls = [
            Model(jnp.ones(3), False, "a"),  # a hit
            Model(2 * jnp.ones(3), False, "a"),  # a hit: dynamic
            Model(jnp.ones(3), True, "a"),  # compiles
            Model(jnp.ones(3), False, "b"),  # compiles: sharing is off
        ]
        for m in calls:
            np.testing.assert_array_equal(m(x), Model.__call__.fn(m, x))
    assert Model.__call__.cache_info() == es.CacheInfo(2, 3, None, 3)
    assert Model.__call__.compile_info().compiles == compiles.of("__call__") == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert "static field 'square' changed False -> True" in lines[0]
    assert "static field 'name' changed 'a' -> 'b'" in lines[1]
    with pytest.raises(es.RecompileError, match="compile 4 exceeds `max_compiles=3`"):
        Model(jnp.ones(3), True, "b")(x)


def test_transformations_on_public_jax_jit(no_dispatcher):
    @es.jit
    def f(x):
        return jnp.sin(x).sum()

    x = jnp.arange(3.0)
    with pytest.warns(RuntimeWarning):
        g = jax.grad(f)(x)
    np.testing.assert_allclose(g, jnp.cos(x))
    np.testing.assert_allclose(jax.vmap(f)(jnp.stack([x, x])), 2 * [jnp.sin(x).sum()])
    assert float(f(x)) == pytest.approx(float(jnp.sin(x).sum()))
