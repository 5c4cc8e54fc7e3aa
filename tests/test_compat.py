"""Every private JAX and Equinox detail in `eqx_static/_compat.py` still means what
the library relies on. A new release that changes one fails here, by name, before
it fails somewhere deep in a call."""

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _compat
from helpers import XlaCompiles


def _lowered(f, *args):
    return f.trace(*args).lower()


def test_a_lowering_holds_the_executable_the_next_call_runs():
    """`jitted.trace(x).lower()` and a later `jitted(x)` share one lowering: the
    executable compiled (or set) on it is the one the call runs."""
    x = jnp.ones(3)
    want = np.asarray(x) * 2
    f, g = jax.jit(lambda y: y * 2), jax.jit(lambda y: y * 2)
    lf, lg = _lowered(f, x), _lowered(g, x)
    a, b = _compat.lowering_of(lf), _compat.lowering_of(lg)
    assert a is not None and b is not None
    assert _compat.executable_of(a) is None
    compiles = XlaCompiles()
    lf.compile()
    assert compiles.count == 1
    executable = _compat.executable_of(a)
    assert executable is not None
    _compat.set_executable(b, executable)
    outs = [f(x), g(x)]
    assert compiles.count == 1  # neither call compiled again
    for out in outs:
        np.testing.assert_array_equal(out, want)
    assert _compat.lowering_of(object()) is None


def test_program_options_and_compiled_of():
    x = jnp.ones(3)
    donating = _compat.lowering_of(
        _lowered(jax.jit(lambda y: y + 1, donate_argnums=0), x)
    )
    plain = _compat.lowering_of(_lowered(jax.jit(lambda y: y + 1), x))
    options = dict(_compat.program_options(plain))
    assert set(options) == {"donated", "compiler_options", "devices", "platforms"}
    assert options["donated"] == (False,)
    assert dict(_compat.program_options(donating))["donated"] == (True,)
    executable = _lowered(jax.jit(lambda y: y - 1), x).compile()
    assert _compat.compiled_of(executable._executable) is not None


def test_trace_state_clean_is_false_under_any_transformation():
    seen = []

    def f(x):
        seen.append(_compat.trace_state_clean())
        return x

    assert _compat.trace_state_clean()
    jax.jit(f)(1.0)
    jax.vmap(f)(jnp.ones(2))
    jax.grad(f)(1.0)
    assert seen == [False, False, False]


def test_cache_size_counts_compiled_signatures():
    f = jax.jit(lambda y: y + 1)
    assert _compat.cache_size(f) == 0
    f(jnp.ones(2))
    f(jnp.ones(2))
    assert _compat.cache_size(f) == 1
    f(jnp.ones(3))
    assert _compat.cache_size(f) == 2


def test_nested_jaxprs_finds_the_bodies_of_control_flow():
    def f(x):
        y = jax.lax.cond(x > 0, jnp.sin, jnp.cos, x)
        return jax.lax.scan(lambda c, _: (c + 1, None), y, None, length=2)[0]

    jaxpr = jax.make_jaxpr(f)(1.0)
    nested = [
        j
        for eqn in _compat.open_jaxpr(jaxpr).eqns
        for j in _compat.nested_jaxprs(eqn.params)
    ]
    assert len(nested) == 3  # two branches and a body


def test_equinox_error_machinery():
    """`eqx.error_if` leaves its message and trace-time stack where `_compat`
    reads it, marks frames by `EQX_JIT_ID`, and Equinox's filter hides JAX's log
    of the failed callback."""
    marker = b"0123456789abcdef"

    def traced(x):
        __equinox_jit_id__ = marker  # noqa: F841  (the name `EQX_JIT_ID` holds)
        return eqx.error_if(x, x > 0, "positive")

    assert _compat.EQX_JIT_ID == "__equinox_jit_id__"
    with pytest.raises(Exception, match="positive"):
        jax.block_until_ready(jax.jit(traced)(jnp.ones(2)))
    info = _compat.equinox_error_info()
    assert info is not None
    msg, stack = info
    assert msg == "positive" and marker in stack
    text = _compat.on_error_message.format(msg="M", stack="S")
    assert "M" in text and "S" in text
    record = logging.LogRecord(
        "jax._src.callback",
        logging.ERROR,
        __file__,
        1,
        "jax.pure_callback failed",
        None,
        None,
    )
    assert not _compat.FilterCallback().filter(record)
    assert issubclass(_compat.JaxRuntimeError, Exception)


def test_equinox_module_internals():
    class M(eqx.Module):
        w: jax.Array

        def __init__(self):
            assert self in _compat.currently_initialising
            self.w = jnp.ones(2)

        def f(self):
            return self.w

    m = M()
    assert m not in _compat.currently_initialising
    assert type(m.f) is _compat.BoundMethod
    assert "__name__" in _compat.WRAPPER_FIELD_NAMES
    assert _compat.module_eq is eqx.Module.__eq__


def test_jax_reports_a_failed_callback_on_callback_logger():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    def fails(x):
        raise ValueError("no")

    logger = logging.getLogger(_compat.CALLBACK_LOGGER)
    handler = Keep()
    logger.addHandler(handler)
    try:
        with pytest.raises(Exception, match="no"):
            out = jax.pure_callback(fails, jax.ShapeDtypeStruct((), jnp.float32), 1.0)
            jax.block_until_ready(out)
    finally:
        logger.removeHandler(handler)
    assert records, "JAX no longer logs failed callbacks where Equinox filters them"


def test_hide_frames_registers_a_file_with_jax_traceback_filtering():
    from jax._src import traceback_util

    path = "/nonexistent/eqx_static_compat_probe.py"
    _compat.hide_frames(path)
    assert path in traceback_util._exclude_paths


def test_jaxtyping_dimension_kinds_and_decorated_classes():
    import beartype
    from jaxtyping import Array, Float, jaxtyped

    dims = Float[Array, "n 3 *b"].dims
    assert [_compat.is_named_dim(d) for d in dims] == [True, False, False]

    @jaxtyped(typechecker=beartype.beartype)
    class Checked(eqx.Module):
        w: jax.Array

    class Plain(eqx.Module):
        w: jax.Array

    assert _compat.jaxtyped_class(Checked)
    assert not _compat.jaxtyped_class(Plain)


def test_a_generated_dataclass_eq_is_told_from_a_written_one():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Generated:
        a: int
        b: str = dataclasses.field(compare=False)

    @dataclasses.dataclass(frozen=True)
    class Written:
        a: int

        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    @dataclasses.dataclass(frozen=True, eq=False)
    class NoEq:
        a: int

    assert _compat.generated_dataclass_eq(Generated)
    assert not _compat.generated_dataclass_eq(Written)
    assert not _compat.generated_dataclass_eq(NoEq)
    assert not _compat.generated_dataclass_eq(int)


def test_initialising_ids_mirrors_equinox_set_of_modules_being_made():
    seen = []

    class M(eqx.Module):
        w: jax.Array

        def __init__(self):
            seen.append(id(self) in _compat.initialising_ids)
            self.w = jnp.ones(2)

    m = M()
    assert seen == [True] and id(m) not in _compat.initialising_ids


def test_jax_jit_is_the_original_and_a_replacement_is_seen(monkeypatch):
    assert _compat.jax_jit is jax.jit and not _compat.jit_is_replaced()
    monkeypatch.setattr(jax, "jit", lambda f, **kw: f)
    assert _compat.jit_is_replaced()
