"""Default arguments are bound from the signature of the callable `es.jit` wraps,
not from the one `functools.wraps` left in `__wrapped__`: a decorator's own
defaults and parameters are the ones the call uses, as in the eager call. Where the
callable has no signature to read, what the caller passed is passed on."""

import functools

import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


X = jnp.array([0.5, -1.0, 2.0])


def _scaled(x, s=2.0):
    return x * s


def _with_own_default(f):
    @functools.wraps(f)
    def wrapper(x, s=3.0):
        return f(x, s)

    return wrapper


def test_a_wraps_decorator_s_own_default_is_used():
    """The wrapper's default is `3.0`, the wrapped function's `2.0`: calling the
    wrapper without `s` uses `3.0`, eagerly and compiled; the default and the
    explicit `3.0` are one entry."""
    eager = _with_own_default(_scaled)
    f = es.jit(eager)
    np.testing.assert_array_equal(eager(X), X * 3.0)
    np.testing.assert_array_equal(f(X), eager(X))
    np.testing.assert_array_equal(f(X, 3.0), eager(X, 3.0))
    np.testing.assert_array_equal(f(X, s=2.0), eager(X, s=2.0))
    assert f.cache_info() == es.CacheInfo(1, 2, None, 2)


def _with_fewer_parameters(f):
    @functools.wraps(f)
    def wrapper(x):
        return f(x, 5.0)

    return wrapper


def test_a_wraps_wrapper_with_fewer_parameters_works():
    """The wrapper takes `x` only, the wrapped function `x, s=2.0`: the call
    binds to the wrapper's parameters and gives the eager result."""
    eager = _with_fewer_parameters(_scaled)
    f = es.jit(eager)
    np.testing.assert_array_equal(f(X), eager(X))
    np.testing.assert_array_equal(f(x=X), X * 5.0)
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)


def test_a_vmapped_function_with_a_default_works():
    """`jax.vmap(f)` keeps `f` in `__wrapped__` but takes `*args, **kwargs`:
    called with `x` alone, `f`'s default applies inside, as eagerly."""
    xs = jnp.stack([X, 2 * X])
    vmapped = jax.vmap(_scaled)
    f = es.jit(vmapped)
    np.testing.assert_array_equal(vmapped(xs), xs * 2.0)
    np.testing.assert_array_equal(f(xs), vmapped(xs))
    np.testing.assert_array_equal(f(xs), vmapped(xs))
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)
