"""JAX's C++ dispatcher with a miss path of ours, and a lowering that carries the
executable the next call runs: what each key's hits and its sharing rest on."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import output, run_python, XlaCompiles


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


def _lowered_twice():
    """A function of a constant and two arguments, its trace and lowering, and its
    own `jax.jit`'s miss on the same arguments, to compare with."""
    c = jnp.arange(16.0)  # 64 bytes: hoisted, where JAX hoists constants
    jitted = jax.jit(lambda x, y: ({"s": x * c + y}, x.sum()))
    args = (jnp.ones(16), jnp.float32(2.0))
    traced = jitted.trace(*args)
    return jitted, traced, traced.lower(), args


# Before jax 0.10 a lowering's constants reach its executable otherwise, and a miss
# runs through JAX's own.
needs_run = pytest.mark.skipif(
    not _jax.RUN_LOWERED, reason="jax < 0.10: a miss runs through JAX's own"
)


def test_a_lowering_can_be_run_as_jax_s_own_miss_runs_it():
    if tuple(map(int, jax.__version__.split(".")[:2])) < (0, 10):
        pytest.skip("jax < 0.10: a miss runs through JAX's own")
    assert _jax.RUN_LOWERED, "JAX changed: _get_fastpath_data or shard_const_args"


def runs_as_jax_s_own_miss(hoisted: bool = False) -> None:
    """`run_lowered` returns what `jit_miss` does (outputs, fastpath data that serve
    the next call in C++) from a trace and lowering in hand, without JAX's second
    pass over the arguments; None before the lowering is compiled. `hoisted`: JAX
    passes the program's constant as an argument of its own."""
    jitted, traced, lowered, args = _lowered_twice()
    assert bool(_jax.lowering_of(lowered).const_args) is hoisted
    assert _jax.run_lowered(traced, lowered, args) is None  # nothing compiled yet
    lowered.compile()
    got, want = _jax.run_lowered(traced, lowered, args), _jax.jit_miss(jitted, *args)
    assert got is not None and got[2] is False and got[1] is not None
    assert jax.tree.structure(got[0]) == jax.tree.structure(want[0])
    for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(want[0])):
        np.testing.assert_array_equal(a, b)
    calls = []

    def miss(*a):
        calls.append(1)
        return got if len(calls) == 1 else _jax.jit_miss(jitted, *a)

    dispatch = _jax.dispatcher("fun", jitted, miss, (), jitted)
    for _ in range(3):
        np.testing.assert_array_equal(dispatch(*args)[0]["s"], got[0][0]["s"])
    assert calls == [1]  # the next calls were served in C++ from its fastpath data


@needs_run
def test_a_compiled_lowering_runs_as_jax_s_own_miss_runs_it():
    runs_as_jax_s_own_miss()


@needs_run
def test_the_same_with_the_constants_hoisted_into_arguments():
    """JAX hoists a program's constants into arguments of their own where
    `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS` is on, read at import (JAX means to make
    it the rule; since jax 0.12.1 only those over `jax_embedded_constants_max_bytes`,
    set to 0 here): a process of its own."""
    code = (
        "import sys; sys.path[:0] = ['tests']\n"
        "from canary.test_jax_dispatch import runs_as_jax_s_own_miss\n"
        "runs_as_jax_s_own_miss(hoisted=True)"
    )
    env = {"JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": "1"}
    done = run_python(code=code, env={**env, "JAX_EMBEDDED_CONSTANTS_MAX_BYTES": "0"})
    assert done.returncode == 0, output(done)


# JAX's own miss checks the outputs or the keys, logs the run, refuses to trace, or
# profiles the program (PGLE): it is called instead.
FLAGS = "debug_nans debug_infs debug_key_reuse distributed_debug no_tracing enable_pgle"


@needs_run
@pytest.mark.parametrize("flag", FLAGS.split())
def test_a_lowering_is_not_run_directly_where_jax_s_miss_does_more(flag):
    _, traced, lowered, args = _lowered_twice()
    lowered.compile()
    assert _jax.run_lowered(traced, lowered, args) is not None
    jax.config.update(f"jax_{flag}", True)
    try:
        assert _jax.run_lowered(traced, lowered, args) is None
    finally:
        jax.config.update(f"jax_{flag}", False)


@needs_run
def test_a_lowering_is_not_run_directly_under_a_trace_or_without_a_name(monkeypatch):
    _, traced, lowered, args = _lowered_twice()
    lowered.compile()
    seen = []
    jax.grad(lambda x: seen.append(_jax.run_lowered(traced, lowered, args)) or x)(1.0)
    assert seen == [None]
    monkeypatch.setattr(
        _jax, "RUN_LOWERED", True
    )  # restored: the next call turns it off
    with pytest.warns(RuntimeWarning) as said:
        assert _jax.run_lowered(object(), lowered, args) is None  # no `_params`
    assert re.fullmatch(
        rf"eqx_static: with jax {re.escape(jax.__version__)}, a miss runs its program "
        r"through JAX's own miss \(AttributeError\(.*\)\): results are unchanged, "
        r"and a miss costs one more pass over its arguments\. Please report this "
        r"with your JAX version\.",
        str(said[0].message),
    )
    assert _jax.run_lowered(traced, lowered, args) is None  # said once, then off


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
