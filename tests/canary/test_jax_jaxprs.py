"""Jaxprs as the explanations read them: closed or open (one class since JAX 0.11),
the bodies nested in an equation's parameters, the names of the operations that
only call a nested program, and the frames that traced an equation."""

import inspect

import jax
import jax.numpy as jnp
from eqx_static import _jax, _report


def test_nested_jaxprs_finds_the_bodies_of_control_flow():
    def f(x):
        y = jax.lax.cond(x > 0, jnp.sin, jnp.cos, x)
        return jax.lax.scan(lambda c, _: (c + 1, None), y, None, length=2)[0]

    jaxpr = jax.make_jaxpr(f)(1.0)
    nested = [
        j for e in _jax.open_jaxpr(jaxpr).eqns for j in _jax.nested_jaxprs(e.params)
    ]
    assert len(nested) == 3  # two branches and a body


def test_the_operations_that_call_a_nested_program_are_known():
    """`jit`, `remat2` (checkpoint), `custom_jvp_call`, and `closed_call`, which
    JAX 0.11 renamed `eval_jaxpr`: each is listed, so that the explanation walks
    into them rather than naming the call."""
    inner = jax.jit(jnp.sin)
    cj = jax.custom_jvp(jnp.cos)
    cj.defjvp(lambda p, t: (jnp.cos(p[0]), t[0]))

    def f(x):
        return jax.checkpoint(lambda y: inner(y) + cj(y))(x)

    jaxprs = [jax.make_jaxpr(f)(1.0), jax.make_jaxpr(jax.grad(f))(1.0)]
    calls = set()
    stack = list(jaxprs)
    while stack:
        for e in _jax.open_jaxpr(stack.pop()).eqns:
            nested = list(_jax.nested_jaxprs(e.params))
            if nested and e.primitive.name not in ("cond", "scan", "while"):
                calls.add(e.primitive.name)
            stack += nested
    assert calls and calls <= _report._CALLS, f"JAX changed: {calls - _report._CALLS}"


def test_the_frames_that_traced_an_equation():
    def f(x):
        return jnp.sin(x)

    (eqn,) = _jax.open_jaxpr(jax.make_jaxpr(f)(1.0)).eqns
    (frame, *_) = _jax.user_frames(eqn.source_info)
    assert frame[0] == __file__ and frame[2].endswith("f")
    assert frame[1] == inspect.getsourcelines(f)[1] + 1
