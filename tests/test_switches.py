"""JAX's debugging switches behave under `es.jit` as under `jax.jit`, on a hit and on
a miss: the same exception (type and message), the same printed lines, the same
records on JAX's loggers. CI runs this file on both paths (`EQX_STATIC_PUBLIC_JIT=1`).
"""

import logging
import re
from collections.abc import Callable
from typing import Any

import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax


def _log_twice() -> Callable:
    def log_twice(x):
        return jnp.log(x) * 2  # NaN below 0, -inf at 0

    return log_twice


# Each switch, and the input of a call that it acts on (of a shape given later).
SWITCHES: dict[str, tuple[Callable[[], Any], Callable[[int], Any]]] = {
    "jax_debug_nans": (lambda: jax.debug_nans(True), lambda n: -jnp.ones(n)),
    "jax_debug_infs": (lambda: jax.debug_infs(True), lambda n: jnp.zeros(n)),
    "transfer_guard": (
        lambda: jax.transfer_guard("disallow"),
        lambda n: np.ones(n, np.float32),  # a transfer to the device
    ),
    "log_compiles": (lambda: jax.log_compiles(True), lambda n: jnp.ones(n)),
    "explain_cache_misses": (
        lambda: jax.explain_cache_misses(True),
        lambda n: jnp.ones(n),
    ),
}


def _record(r: logging.LogRecord) -> tuple:
    """A record of JAX's, as both wrappers' must agree, without the program's name
    (es.jit names each function's programs its own way) and timings."""
    if isinstance(r.args, tuple) and r.args:  # "Compiling %s with ...", and others
        return r.name, r.levelno, r.msg
    # "TRACING CACHE MISS at <call site>: for <function> ...": JAX names the
    # function it traces, which under es.jit is the package's, and where.
    text = str(r.msg).split(" at ")[0]
    return (
        r.name,
        r.levelno,
        re.sub(r"jit\(\S*\)|tracing \S+|transforming \S+|[\d.]+ sec", "...", text),
    )


def _outcome(f: Callable, x: Any, switch: Callable, capsys, caplog) -> tuple:
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.WARNING), switch():
        try:
            f(x)
            error = None
        except Exception as e:
            error = type(e), str(e)
    records = [_record(r) for r in caplog.records if r.name.startswith("jax")]
    return error, capsys.readouterr().out, records


@pytest.mark.parametrize("when", ["hit", "miss"])
@pytest.mark.parametrize("name", list(SWITCHES))
def test_a_debugging_switch_behaves_as_under_jax_jit(name, when, capsys, caplog):
    switch, make = SWITCHES[name]
    outcomes, fn = [], _log_twice()  # a new function: a cache of its own
    for wrap in (jax.jit, es.jit):
        f = wrap(fn)
        f(jnp.ones(2))  # compiled for the shape of a hit
        outcomes.append(
            _outcome(f, make(2 if when == "hit" else 3), switch, capsys, caplog)
        )
        if wrap is es.jit:
            hits = f.cache_info().hits  # pyright: ignore[reportFunctionMemberAccess]
            assert hits == (1 if when == "hit" else 0)
    assert outcomes[1] == outcomes[0]
    # What the switch did: at a hit, the logs have nothing to say.
    quiet_at_a_hit = name in ("log_compiles", "explain_cache_misses")
    assert (outcomes[0] == (None, "", [])) == (when == "hit" and quiet_at_a_hit)


def test_a_nan_at_a_hit_names_the_operation():
    """The rerun `jax.jit` makes after its check found a NaN (the function run
    eagerly, op by op) names the operation, on a hit of a method too."""

    class M(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x):
            return jnp.sqrt(self.w * x)

    m = M(jnp.ones(2))
    m(jnp.ones(2))
    with jax.debug_nans(True):
        with pytest.raises(
            FloatingPointError, match=r"invalid value \(nan\) encountered in sqrt"
        ):
            m(-jnp.ones(2))
    assert M.__call__.cache_info().hits == 1


def test_a_nan_only_the_program_makes_says_so_as_jax_jit_does():
    """A NaN the eager run does not make (a literal NaN in the output): the error
    `jax.jit` raises then, on a hit."""

    def nan(x):
        return x * jnp.nan

    messages = []
    for wrap in (jax.jit, es.jit):
        f = wrap(nan)
        f(jnp.ones(2))
        with jax.debug_nans(True), pytest.raises(FloatingPointError) as info:
            f(jnp.ones(2))
        messages.append(str(info.value))
    assert messages[1] == messages[0]


def _traced_with_a_nan(wrap: Callable) -> Callable:
    """`wrap` of a function whose program was traced, and run, with a NaN that it
    no longer reads (a Python value changed since)."""
    scale = [float("nan")]
    f = wrap(lambda x: x * scale[0])
    f(jnp.ones(2))
    scale[0] = 1.0
    return f


def test_a_nan_the_eager_run_does_not_make_is_told_as_jax_jit_tells_it(capsys, caplog):
    """A program traced with a NaN that the function, run again eagerly, no longer
    reads (a Python value changed since): at a hit, the error, printed lines and
    records that `jax.jit`'s say that the de-optimized run found no invalid value."""
    outcomes, switch = [], lambda: jax.debug_nans(True)
    for wrap in (jax.jit, es.jit):
        f = _traced_with_a_nan(wrap)
        outcomes.append(_outcome(f, jnp.ones(2), switch, capsys, caplog))
    assert outcomes[1] == outcomes[0]
    assert "did not produce invalid values" in outcomes[0][0][1]


@pytest.mark.skipif(not _jax.DISPATCH, reason="a public jax.jit reruns in JAX's code")
def test_without_jax_s_own_message_the_eager_run_finding_none_is_said(monkeypatch):
    """Where JAX has no function that raises its message (another version), the
    error is still a `FloatingPointError` saying that the eager run found no
    invalid value where the program made one."""
    from jax._src import api_util

    monkeypatch.delattr(api_util, "_raise_no_nan_in_deoptimized")
    f = _traced_with_a_nan(es.jit)
    f(jnp.ones(2))  # its guard made: the call below is a hit through it, where
    # the package reruns (the general path hands JAX the call, and JAX reruns)
    with jax.debug_nans(True), pytest.raises(FloatingPointError) as info:
        f(jnp.ones(2))
    assert str(info.value).endswith(": the eager run found no invalid value")
    assert "nan" in str(info.value)
