"""Equinox's private names: how `eqx.error_if` reports a failure (as
`eqx.filter_jit` does), the set of modules being made, its flatten's wrapper
attributes, and its `BoundMethod`, whose tree structure ours must equal."""

import logging

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from eqx_static import _jax


def test_equinox_error_machinery():
    marker = b"0123456789abcdef"

    def traced(x):
        __equinox_jit_id__ = marker  # noqa: F841  (the name `_compile` sets too)
        return eqx.error_if(x, x > 0, "positive")

    with pytest.raises(Exception, match="positive"):
        jax.block_until_ready(jax.jit(traced)(jnp.ones(())))
    info = _jax.equinox_error_info()
    assert info is not None
    msg, stack = info
    assert msg == "positive" and marker in stack
    text = _jax.on_error_message.format(msg="M", stack="S")
    assert "M" in text and "S" in text
    record = logging.LogRecord(
        _jax.CALLBACK_LOGGER,
        logging.ERROR,
        __file__,
        1,
        "jax.pure_callback failed",
        None,
        None,
    )
    assert not _jax.FilterCallback().filter(record)


def test_equinox_module_internals():
    class M(eqx.Module):
        w: jax.Array

        def __init__(self):
            assert self in _jax._initialising
            self.w = jnp.ones(2)

        def f(self):
            return self.w

    m = M()
    assert m not in _jax._initialising
    assert type(m.f) is _jax.BoundMethod
    assert "__name__" in _jax.WRAPPER_FIELD_NAMES
    assert _jax.EQX_MISSING is not None


def test_a_bound_method_of_an_es_module_has_equinox_s_tree_structure():
    """`m.f` on an `es.Module` is made without Equinox's metaclass call (which walks
    every leaf), so it must hold what Equinox's own holds: the wrapper attributes
    in 0.13, none on Equinox's main branch."""

    class M(es.Module):
        w: jax.Array

        def f(self):
            """doc of f"""
            return self.w

    m = M(jnp.ones(2))
    ours, theirs = m.f, _jax.BoundMethod(M.f, m)
    assert type(ours) is type(theirs)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    assert ours() is m.w


def test_jaxtyping_dimension_kinds_and_decorated_classes():
    import beartype
    from jaxtyping import Array, Float, jaxtyped

    dims = Float[Array, "n 3 *b"].dims
    assert [_jax.is_named_dim(d) for d in dims] == [True, False, False]

    @jaxtyped(typechecker=beartype.beartype)
    class Checked(eqx.Module):
        w: jax.Array

    class Plain(eqx.Module):
        w: jax.Array

    assert _jax.jaxtyped_class(Checked) and not _jax.jaxtyped_class(Plain)
