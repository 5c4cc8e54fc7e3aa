"""JAX's C++ dispatcher with a miss path of ours, and a lowering that carries the
executable the next call runs: what each key's hits and its sharing rest on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import XlaCompiles


def test_the_dispatcher_can_be_built():
    if _jax.PUBLIC:
        pytest.skip("EQX_STATIC_PUBLIC_JIT=1 asks for the public path")
    assert _jax.DISPATCH, "JAX changed: the per-key dispatcher cannot be built"


def test_a_dispatcher_serves_hits_in_cpp_and_calls_back_on_a_miss():
    calls, eager = [], []

    def fun(x):
        eager.append(1)
        return x * 2

    helper = jax.jit(fun)

    def miss(*args):
        calls.append(args[0].shape)
        return _jax.jit_miss(helper, *args)

    dispatch = _jax.dispatcher("fun", fun, miss, (), fun)
    x = jnp.ones(3)
    np.testing.assert_array_equal(dispatch(x), x * 2)
    np.testing.assert_array_equal(dispatch(x), x * 2)  # in C++: no miss
    np.testing.assert_array_equal(dispatch(jnp.ones(4)), jnp.ones(4) * 2)
    assert calls == [(3,), (4,)]
    _jax.clear(dispatch)  # emptied: the next call is a miss again
    dispatch(x)
    assert calls == [(3,), (4,), (3,)]
    with jax.disable_jit():
        dispatch(x)
    assert len(eager) == 3  # two traces, one eager call
    jax.vmap(dispatch)(jnp.ones((2, 3)))
    assert len(calls) == 4  # tracers: a miss


def test_jax_s_nan_check_reruns_the_dispatcher_s_eager_function():
    """With `jax_debug_nans` on, a NaN in the outputs of a hit served in C++ makes
    JAX's hook call the function the dispatcher carries (`_fun`, as on a `jax.jit`)
    with the call's arguments; what that raises is what the call raises."""
    reruns = []

    def fun(x):
        return jnp.log(x)

    def rerun(*args):
        reruns.append(args)
        raise ZeroDivisionError("rerun")

    helper = jax.jit(fun)
    dispatch = _jax.dispatcher(
        "fun", fun, lambda *a: _jax.jit_miss(helper, *a), (), rerun
    )
    dispatch(jnp.ones(2))
    with jax.debug_nans(True), pytest.raises(ZeroDivisionError, match="rerun"):
        dispatch(-jnp.ones(2))  # a hit: JAX changed if it raises anything else
    assert len(reruns) == 1 and reruns[0][0].shape == (2,)


def test_a_lowering_holds_the_executable_the_next_call_runs():
    """`jitted.trace(x).lower()` and a later `jitted(x)` share one lowering: the
    executable compiled (or set) on it is the one the call runs."""
    x = jnp.ones(3)
    f, g = jax.jit(lambda y: y * 2), jax.jit(lambda y: y * 2)
    lf, lg = f.trace(x).lower(), g.trace(x).lower()
    a, b = _jax.lowering_of(lf), _jax.lowering_of(lg)
    assert a is not None and b is not None and _jax.executable_of(a) is None
    compiles = XlaCompiles()
    lf.compile()
    executable = _jax.executable_of(a)
    assert compiles.count == 1 and executable is not None
    _jax.set_executable(b, executable)
    outs = [f(x), g(x)]
    assert compiles.count == 1  # neither call compiled again
    for out in outs:
        np.testing.assert_array_equal(out, np.asarray(x) * 2)
    assert _jax.lowering_of(object()) is None
    assert _jax.compiled_texts(executable)[0].startswith("HloModule")


def test_compile_arguments_hold_what_a_program_is_compiled_with():
    x = jnp.ones(3)
    donating = _jax.lowering_of(
        jax.jit(lambda y: y + 1, donate_argnums=0).trace(x).lower()
    )
    plain = _jax.lowering_of(jax.jit(lambda y: y + 1).trace(x).lower())
    assert _jax.compile_arguments(plain)["donated_invars"] == (False,)
    assert _jax.compile_arguments(donating)["donated_invars"] == (True,)
    assert "host_callbacks" in _jax.compile_arguments(plain)


def test_the_top_level_and_a_transformation_are_told_apart():
    assert not _jax.under_transformation()
    seen = []
    jax.grad(lambda x: seen.append(_jax.under_transformation()) or x * 2.0)(1.0)
    jax.jit(lambda x: seen.append(_jax.under_transformation()) or x)(1.0)
    assert seen == [True, True]


def test_trace_context_and_pgle():
    before = _jax.trace_context()
    with jax.enable_x64(True):
        assert _jax.trace_context() != before
    assert _jax.trace_context() == before
    assert not _jax.pgle_enabled()
    jax.config.update("jax_enable_pgle", True)
    try:
        assert _jax.pgle_enabled()
    finally:
        jax.config.update("jax_enable_pgle", False)


def test_jax_jit_is_the_original_and_a_replacement_is_seen(monkeypatch):
    assert _jax.jax_jit is jax.jit and not _jax.jit_is_replaced()
    monkeypatch.setattr(jax, "jit", lambda f, **kw: f)
    assert _jax.jit_is_replaced()


def test_hide_frames_registers_a_file_with_jax_traceback_filtering():
    from jax._src import traceback_util

    path = "/nonexistent/eqx_static_canary_probe.py"
    _jax.hide_frames(path)
    assert path in traceback_util._exclude_paths
