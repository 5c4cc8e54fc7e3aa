"""Run-time errors as `eqx.filter_jit` gives them: `eqx.error_if` and
`eqx.branched_error_if` inside an `es.jit` function raise Equinox's
`EquinoxRuntimeError`, with Equinox's message and traceback, hide JAX's log of the
failed callback, and honour `EQX_ON_ERROR` (read when Equinox is imported: each
mode runs in a process of its own). Every case is compared with `eqx.filter_jit`."""

import logging
import os
import subprocess
import sys
import textwrap
import traceback

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _positive(x):
    return eqx.error_if(x, x > 0, "positive!")


def _branched(x):
    return eqx.branched_error_if(
        x, x.sum() > 0, (x.sum() > 10).astype(int), ["big", "huge"]
    )


class Checked(es.Module):
    w: jax.Array

    @es.jit
    def f(self, x):
        return _positive(self.w * x)


def _failure(call):
    try:
        call()
    except BaseException as e:  # noqa: BLE001 (compared below)
        return e
    raise AssertionError("did not raise")


def _frames(e: BaseException) -> list[tuple[str, str]]:
    """The frames of the traceback, without those of jaxtyping's import hook (which
    the test suite puts around the library's functions)."""
    frames = traceback.extract_tb(e.__traceback__)
    return [(f.filename, f.name) for f in frames if "jaxtyping" not in f.filename]


@pytest.mark.parametrize("body", [_positive, _branched], ids=["error_if", "branched"])
def test_error_if_raises_what_filter_jit_raises(body, caplog):
    """The same error, raised the same way. (The messages themselves are compared
    in fresh processes below: the stack they show is the one recorded when
    Equinox's own compiled `error_if` was first traced in the process.)"""
    ours, theirs = es.jit(body), eqx.filter_jit(body)
    x = jnp.full(3, 5.0)
    with caplog.at_level(logging.DEBUG, logger="jax._src.callback"):
        for _ in range(2):  # the call that traces, then a hit
            mine = _failure(lambda: ours(x))
            filtered = _failure(lambda: theirs(x))
            assert type(mine) is type(filtered) is eqx.EquinoxRuntimeError
            assert isinstance(mine, RuntimeError)
            assert mine.__cause__ is None and mine.__suppress_context__
            # the caller's frames only, as filter_jit leaves them
            assert {f[0] for f in _frames(mine)} == {__file__}
            assert {f[0] for f in _frames(filtered)} == {__file__}
            assert str(mine).splitlines()[0] == str(filtered).splitlines()[0]
    assert not [r for r in caplog.records if "pure_callback failed" in r.getMessage()]
    assert ("positive!" if body is _positive else "huge") in str(mine)


def test_a_method_raises_with_the_message_and_the_stack_inside():
    m = Checked(jnp.ones(3))
    e = _failure(lambda: m.f(jnp.ones(3)))
    assert type(e) is eqx.EquinoxRuntimeError
    message = str(e)
    assert message.startswith("Above is the stack outside of JIT.")
    assert "equinox.EquinoxRuntimeError: positive!" in message
    assert "return _positive(self.w * x)" in message  # a frame inside the method
    assert _frames(e)[-1][0] == __file__
    np.testing.assert_array_equal(m.f(-jnp.ones(3)), -jnp.ones(3))  # no error: runs


def test_an_error_in_a_nested_es_jit_is_reported_by_the_outer_call():
    outer = es.jit(lambda m, x: m.f(x) + 1)
    e = _failure(lambda: outer(Checked(jnp.ones(3)), jnp.ones(3)))
    assert type(e) is eqx.EquinoxRuntimeError and "positive!" in str(e)


def test_a_program_without_a_callback_is_not_made_synchronous():
    """Only an entry whose programs call back into Python waits for the result."""
    f = es.jit(lambda x: x * 2)
    f(jnp.ones(3))
    (entry,) = f.cache.entries.values()
    assert entry.call is entry.jitted


def test_under_disable_jit_equinox_raises_as_it_does_eagerly():
    with jax.disable_jit():
        mine = _failure(lambda: es.jit(_positive)(jnp.ones(2)))
        filtered = _failure(lambda: eqx.filter_jit(_positive)(jnp.ones(2)))
    assert type(mine) is type(filtered)
    assert str(mine) == str(filtered)


# One wrapper, in a fresh process: each call's outcome, with the full message.
_MODES = textwrap.dedent(
    """
    import logging, sys, traceback
    import equinox as eqx, jax.numpy as jnp, eqx_static as es

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger().addHandler(handler)

    def body(x):
        return eqx.error_if(x, x > 0, "positive!")

    wrap = es.jit if sys.argv[1] == "es" else eqx.filter_jit
    f = wrap(body)
    for call in range(2):  # the call that traces, then a hit
        try:
            out = f(jnp.ones(2))
            print("returned", out.tolist())
        except Exception as e:
            frames = traceback.extract_tb(e.__traceback__)
            print("raised", type(e).__name__, [fr.name for fr in frames])
            print(str(e))
    print("logged", [m for m in logged if "callback" in m])
    """
)


def _run_mode(mode: str, wrapper: str, tmp_path) -> str:
    env = dict(os.environ, EQX_ON_ERROR=mode, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _MODES, wrapper],
        input="c\n" * 20,  # the debugger of the breakpoint mode: continue
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "nan", "breakpoint"])
def test_eqx_on_error_modes_as_under_filter_jit(mode, tmp_path):
    """Outcomes, messages (stack included), tracebacks and logs, call for call."""
    ours = _run_mode(mode, "es", tmp_path)
    theirs = _run_mode(mode, "eqx", tmp_path)
    assert ours == theirs
    expected = {
        "raise": "raised EquinoxRuntimeError",
        "nan": "returned [nan, nan]",
        "breakpoint": "(jdb) returned [nan, nan]",  # the debugger, continued
    }
    assert expected[mode] in ours, ours
    assert "logged []" in ours
    if mode != "nan":
        assert ours.count("equinox.EquinoxRuntimeError: positive!") == 2
