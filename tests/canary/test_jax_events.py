"""`jax.monitoring`'s compile event names the program compiled, before and after
the compile, whenever JAX compiles it: the books of every `es.jit` function are
kept from these events alone."""

import jax
import jax.numpy as jnp
from eqx_static import _jax


def _names(run):
    seen = []

    def on_scalar(event, value, **kwargs):
        if event == _jax.COMPILE_EVENT:
            seen.append(("start", kwargs["fun_name"]))

    def on_duration(event, seconds, **kwargs):
        if event == _jax.COMPILE_EVENT:
            seen.append(("end", kwargs["fun_name"]))

    jax.monitoring.register_scalar_listener(on_scalar)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        run()
    finally:
        jax.monitoring.unregister_scalar_listener(on_scalar)
        jax.monitoring.unregister_event_duration_listener(on_duration)
    return seen


def _named_program(name):
    def program(x):
        return jnp.sin(x) - 7

    program.__name__ = name
    return jax.jit(program)


def test_compile_events_name_the_program_before_and_after():
    f = _named_program("canary.probe")
    seen = _names(lambda: f(jnp.ones(5)))
    name = "jit(canary.probe)"
    assert [e for e in seen if e[1] == name] == [("start", name), ("end", name)]


def test_a_backward_program_and_a_checkpointed_call_keep_the_name():
    """The compiles JAX makes after the call returned (the backward program of an
    eager `grad`, a call staged into an eager `checkpoint`) are named by the
    program too: `jit(name)`, or `jit(...)` around it."""
    f = _named_program("canary.staged")
    seen = _names(lambda: jax.grad(lambda x: f(x).sum())(jnp.ones(3)))
    seen += _names(lambda: jax.checkpoint(lambda x: f(x).sum())(jnp.ones(4)))
    ours = [n for _, n in seen if "canary.staged" in n]
    assert len(ours) == 6  # forward, backward, checkpointed: each started and ended
    assert all(n.startswith("jit(") and n.endswith(")") for n in ours)
