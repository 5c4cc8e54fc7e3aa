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


def test_program_options():
    x = jnp.ones(3)
    donating = _compat.lowering_of(
        _lowered(jax.jit(lambda y: y + 1, donate_argnums=0), x)
    )
    plain = _compat.lowering_of(_lowered(jax.jit(lambda y: y + 1), x))
    options = dict(_compat.program_options(plain))
    assert set(options) == {"donated", "compiler_options", "devices", "platforms"}
    assert options["donated"] == (False,)
    assert dict(_compat.program_options(donating))["donated"] == (True,)


def test_a_dispatcher_serves_hits_in_cpp_and_calls_back_on_a_miss():
    """JAX's own C++ dispatcher, whose misses go to a function of ours: here, a
    `jax.jit`'s own miss."""
    calls, eager = [], []

    def fun(x):
        eager.append(1)
        return x * 2

    helper = jax.jit(fun)

    def miss(*args):
        calls.append(args[0].shape)
        return _compat.jit_miss(helper, *args)

    dispatch = _compat.dispatcher("fun", fun, miss, ())
    x = jnp.ones(3)
    np.testing.assert_array_equal(dispatch(x), x * 2)
    np.testing.assert_array_equal(dispatch(x), x * 2)  # in C++: no miss
    np.testing.assert_array_equal(dispatch(jnp.ones(4)), jnp.ones(4) * 2)
    assert calls == [(3,), (4,)]
    with jax.disable_jit():
        dispatch(x)
    assert eager == [1, 1, 1]  # two traces, one eager call
    out = jax.vmap(dispatch)(jnp.ones((2, 3)))
    np.testing.assert_array_equal(out, 2 * jnp.ones((2, 3)))
    assert len(calls) == 3  # tracers: a miss


def test_compile_events_name_the_program_before_and_after():
    seen = []

    def on_scalar(event, value, **kwargs):
        if event == _compat.COMPILE_EVENT:
            seen.append(("start", kwargs["fun_name"]))

    def on_duration(event, seconds, **kwargs):
        if event == _compat.COMPILE_EVENT:
            seen.append(("end", kwargs["fun_name"]))

    jax.monitoring.register_scalar_listener(on_scalar)
    jax.monitoring.register_event_duration_secs_listener(on_duration)

    def probe_program(x):
        return x - 7

    try:
        jax.jit(probe_program)(jnp.ones(5))
    finally:
        jax.monitoring.unregister_scalar_listener(on_scalar)
        jax.monitoring.unregister_event_duration_listener(on_duration)
    name = "jit(probe_program)"
    assert [e for e in seen if e[1] == name] == [("start", name), ("end", name)]


def test_trace_context_and_pgle():
    before = _compat.trace_context()
    with jax.enable_x64(True):
        assert _compat.trace_context() != before
    assert _compat.trace_context() == before
    assert not _compat.pgle_enabled()
    jax.config.update("jax_enable_pgle", True)
    try:
        assert _compat.pgle_enabled()
    finally:
        jax.config.update("jax_enable_pgle", False)


def test_callbacks_and_source_locations_in_a_jaxpr():
    import inspect

    def cb(y):
        return y

    def f(x):
        y = jnp.sin(x)
        return jax.pure_callback(cb, jax.ShapeDtypeStruct((), jnp.float32), y)

    jaxpr = jax.make_jaxpr(f)(1.0)
    eqns = _compat.open_jaxpr(jaxpr).eqns
    (callback,) = [e.params["callback"] for e in eqns if "callback" in e.params]
    func, tree = _compat.flat_callback(callback)
    assert func is cb and tree == jax.tree.structure(((1.0,), {}))
    assert _compat.flat_callback(cb) is None
    file, line, function = _compat.user_frame(eqns[0].source_info)
    assert file == __file__ and function.endswith("f")
    assert line == inspect.getsourcelines(f)[1] + 1


def test_equinox_error_callbacks_are_recognised():
    found = []

    def f(x):
        return eqx.error_if(x, x > 0, "positive")

    stack = [jax.make_jaxpr(f)(1.0)]
    while stack:
        for e in _compat.open_jaxpr(stack.pop()).eqns:
            if "callback" in e.params:
                found.append(_compat.flat_callback(e.params["callback"])[0])
            stack += list(_compat.nested_jaxprs(e.params))
    assert found and all(_compat.is_equinox_error_callback(c) for c in found)
    assert not _compat.is_equinox_error_callback(lambda y: y)
    assert not _compat.is_equinox_error_callback(np.sin)


def _factory(k):
    def bound_once(y):
        return y * k

    return bound_once


def _counter():
    n = 0

    def counts(y):
        nonlocal n
        n += 1
        return y

    return counts


def _setter(k):
    def scaled(y):
        return y * k

    def set_k(v):
        nonlocal k
        k = v

    return scaled, set_k


def _looped():
    fs = []
    for i in range(2):
        j = i
        fs.append(lambda y: y + j)  # noqa: B023  (the point: rebound in a loop)
    return fs[0]


def _assigned_late():
    def late(y):
        return y + m

    m = 1
    m = 2
    return late


def test_a_closure_cell_is_bound_once_only_if_nothing_can_rebind_it():
    assert _compat.cell_bound_once(_factory(2), "k")
    assert not _compat.cell_bound_once(_counter(), "n")  # `nonlocal`, assigned
    assert not _compat.cell_bound_once(_setter(2)[0], "k")  # a sibling assigns it
    assert not _compat.cell_bound_once(_looped(), "j")  # assigned in a loop
    assert not _compat.cell_bound_once(_assigned_late(), "m")  # assigned twice
    made: dict = {}
    exec("def outer(k):\n    return lambda y: y * k\nf = outer(2)", made)
    assert not _compat.cell_bound_once(made["f"], "k")  # no module to find it in


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
    reads it, finds the frames marked `__equinox_jit_id__`, and Equinox's filter hides JAX's log
    of the failed callback."""
    marker = b"0123456789abcdef"

    def traced(x):
        __equinox_jit_id__ = marker  # noqa: F841  (the name `_compile` sets too)
        return eqx.error_if(x, x > 0, "positive")

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
