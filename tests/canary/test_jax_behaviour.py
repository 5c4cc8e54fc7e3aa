"""What JAX does that `eqx_static` relies on and that no name shows: a probe call of
the per-key dispatcher, a compile stopped by a monitoring listener that raises,
the trace that runs a call under `jax.grad`, JAX's words for the errors that
`es.TracedFieldError` rewords, and XLA's printing of every constant. Each test
says what is lost when it fails."""

import traceback

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from eqx_static import _jax
from helpers import XlaCompiles
from jax._src import core


def test_the_dispatcher_does_on_a_probe_call_what_the_keys_need():
    """What `_jax` checks at import (else each key runs on a public `jax.jit`); the
    one program it compiles is named for what it is, where JAX reports compiles."""
    seen = XlaCompiles()
    assert _jax.probe() is None, "JAX changed: the per-key dispatcher behaves otherwise"
    assert seen.names == ["jit(eqx_static_dispatcher_probe)"]


def test_no_private_name_of_equinox_or_jaxtyping_is_missing():
    assert _jax._lost == [], f"Equinox or jaxtyping changed: {_jax._lost} are gone"


def test_a_listener_that_raises_stops_the_compile():
    """`max_compiles` refuses a compile from the compile event: the exception leaves
    the call, and nothing compiles."""
    compiled = []

    class RefusedError(Exception):
        pass

    def refuse(event, value, **kwargs):
        if event == _jax.COMPILE_EVENT and "canary_refused" in kwargs["fun_name"]:
            raise RefusedError

    def count(event, seconds, **kwargs):
        if event == _jax.COMPILE_EVENT and "canary_refused" in kwargs["fun_name"]:
            compiled.append(1)

    def canary_refused(x):
        return x + 1

    x = jnp.ones(3)
    jax.monitoring.register_scalar_listener(refuse)
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        with pytest.raises(RefusedError):
            jax.jit(canary_refused)(x)
    finally:
        jax.monitoring.unregister_scalar_listener(refuse)
        jax.monitoring.unregister_event_duration_listener(count)
    assert compiled == [], "JAX changed: a listener can no longer refuse a compile"


def test_reverse_mode_runs_a_call_under_a_linearize_trace():
    """`_jax.reverse_mode` (without it, a loop bounded by a traced number is named
    by JAX's own error in the backward pass, not at the call)."""
    seen = []

    def f(x):
        seen.append(type(core.trace_ctx.trace).__name__)
        return jnp.sum(x)

    jax.grad(f)(jnp.ones(2))
    assert seen == ["LinearizeTrace"], f"JAX changed: grad traces under {seen}"


def _jax_error(run):
    with pytest.raises(Exception) as info:
        run()
    return str(info.value)


def test_jax_s_words_for_a_traced_value_used_as_a_concrete_one():
    """`es.TracedFieldError` finds the leaf JAX names (`argument _es_leaves[i]`),
    and tries again only for an error about a tracer: JAX's errors must say so."""

    def named(_es_leaves):  # the name of `es.jit`'s traced function's argument
        return jnp.zeros(_es_leaves)

    said = _jax_error(lambda: jax.jit(named)(jnp.int32(3)))
    assert "argument _es_leaves" in said, f"JAX changed its message: {said}"
    n = jnp.int32(2)
    for run in (
        lambda: jax.jit(lambda k, n: jr.split(k, n))(jr.key(0), n),
        lambda: jax.jit(lambda x, n: jnp.tile(x, n))(jnp.ones(2), n),
        lambda: jax.jit(lambda x, n: x[:n])(jnp.ones(3), n),
    ):
        said = _jax_error(run)
        assert "Tracer" in said, f"JAX changed: no tracer in {said!r}"


def test_jax_s_words_for_a_loop_with_a_traced_bound_under_grad():
    looped = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, c: 2 * c, x))
    said = _jax_error(lambda: jax.grad(looped)(1.0, jnp.int32(3)))
    assert "Reverse-mode differentiation does not work" in said, said


def test_equinox_s_error_if_text_and_its_record():
    """`eqx.error_if` at run time: the error text holds `_EquinoxRuntimeError: `
    and Equinox records the message and stack (`equinox_error_info`)."""

    @jax.jit
    def checked(x):
        return eqx.error_if(x, x > 0, "canary message")

    said = _jax_error(lambda: checked(jnp.ones(())).block_until_ready())
    assert "_EquinoxRuntimeError: " in said or "canary message" in said, said
    info = _jax.equinox_error_info()
    assert info is not None and info[0] == "canary message"
    assert "{msg}" in _jax.on_error_message and "{stack}" in _jax.on_error_message


def test_xla_prints_every_constant_of_a_compiled_program():
    """The sharing check compares executables by their text: without it, the check
    cannot be made (`compiled_texts` is None) and sharing is refused under it."""
    a = np.random.RandomState(0).randn(64).astype(np.float32)
    lowered = jax.jit(lambda x: x * a).trace(jnp.ones(64)).lower()
    lowered.compile()
    texts = _jax.compiled_texts(_jax.executable_of(_jax.lowering_of(lowered)))
    assert texts is not None, "JAX changed: XLA's print options are gone"
    assert "{...}" not in texts[0] and f"{a[40]:.4g}"[:4] in texts[0]


def test_a_boundary_filters_the_files_left_out_of_tracebacks(tmp_path, monkeypatch):
    """An error raised in the user's function shows no frame of `eqx_static`: JAX's
    `api_boundary` drops the frames of files registered with `register_exclusion`
    (if lost, the package's frames show in such tracebacks, as Equinox's do)."""
    library = tmp_path / "library.py"  # a library's file, registered as ours are
    library.write_text("def call(fn):\n    return fn()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from library import call  # pyright: ignore[reportMissingImports]

    _jax.hide_frames(str(library))

    def users():
        raise ValueError("the user's")

    with pytest.raises(ValueError) as info:
        _jax.api_boundary(call)(users)
    files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert str(library) not in files and files[-1] == __file__
