"""What a lowering says about the Python that runs on the host, and its compile
arguments: the allow-list of `_sharing` knows every argument JAX passes, and reads
each host callback's function out of the traced jaxpr, counted against the
lowering's host callbacks."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _fields, _jax, _sharing
from jax.experimental import io_callback


SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


def _host(y):
    return np.asarray(y, np.float32)


def _lowering(f):
    return _jax.lowering_of(jax.jit(f).trace(jnp.float32(1.0)).lower())


def _callbacks(f):
    """What `_sharing` reads of the host callbacks of `jax.jit(f)`."""
    traced = jax.jit(f).trace(jnp.float32(1.0))
    return _sharing.host_callbacks(_jax.lowering_of(traced.lower()), traced.jaxpr)[0]


def test_every_compile_argument_is_on_the_allow_list():
    """A compile argument JAX adds in a release makes every program unshareable
    (safe, but every key then compiles): it must be looked at, and listed."""
    for f in (lambda x: x * 2, lambda x: jax.pure_callback(_host, SCALAR, x)):
        unknown = set(_jax.compile_arguments(_lowering(f))) - set(_sharing._ARGUMENTS)
        assert not unknown, f"JAX changed: compile arguments {unknown} are not known"


def test_a_host_callback_names_the_function_it_runs():
    for make in (
        lambda x: jax.pure_callback(_host, SCALAR, x),
        lambda x: io_callback(_host, SCALAR, x),
        lambda x: jax.lax.cond(x > 0, make_callback, jnp.sin, x),
    ):
        found = _callbacks(make)
        assert found is not None, "JAX changed: a host callback's function is hidden"
        ((function, tree),) = found
        assert function is _host
        assert tree == _fields.token(jax.tree.structure(((1.0,), {})))


def make_callback(x):
    return jax.pure_callback(_host, SCALAR, x)


def test_an_unused_callback_is_dropped_from_the_jaxpr_read_as_from_the_lowering():
    """JAX's `jit` drops an unused `pure_callback` before lowering: the jaxpr is read
    after the same elimination, so that its callbacks are the lowering's."""
    assert _callbacks(lambda x: (jax.pure_callback(_host, SCALAR, x), x * 2)[1]) == ()


def test_equinox_error_if_stages_one_callback_per_message():
    """Two programs with an `eqx.error_if` over equal messages hold the identical
    callback (Equinox stages it from its own jitted helper): that is why their
    programs can share. Other messages are another callback. Each is recognised as
    Equinox's error check."""

    def callbacks(message):
        found = _callbacks(lambda x: eqx.error_if(x * 2, x > 0, message))
        assert found is not None
        return [function for function, _ in found]

    one, two = callbacks("positive"), callbacks("positive")
    assert one, "Equinox changed: error_if stages no host callback"
    assert all(a is b for a, b in zip(one, two, strict=True)), (
        "Equinox changed: error_if programs over equal messages no longer share"
    )
    assert not any(a is b for a, b in zip(one, callbacks("negative")))
    modules = {function.__module__ for function in one}
    assert modules == {_jax.ERROR_CHECKS}, "Equinox moved its error check"


def test_other_host_python_is_not_taken_for_a_known_callback():
    """`jax.debug.print` stages no callback equation, `jax.debug.callback` one of
    another kind: neither program's host callbacks are all accounted for, also
    beside a `pure_callback` that JAX drops (the same count of callbacks)."""
    for f in (
        lambda x: jax.debug.print("{}", x) or x,
        lambda x: jax.debug.callback(_host, x) or x,
        lambda x: jax.debug.print("{}", jax.pure_callback(_host, SCALAR, x)) or x,
        lambda x: (
            (jax.pure_callback(_host, SCALAR, x), jax.debug.print("{}", x))[1] or x
        ),
    ):
        assert _jax.compile_arguments(_lowering(f))["host_callbacks"]
        assert _callbacks(f) is None


def test_a_module_names_its_functions_and_their_visibility():
    """Every top-level operation JAX emits has a symbol name (a module with one
    that has none is never shared): a program with a private function, and an
    `eqx.error_if` program, digest to something."""
    inner = jax.jit(jnp.sin)
    for fn in (lambda x: inner(x) * 2, lambda x: eqx.error_if(x, x > 9, "big")):
        lowering = _lowering(fn)
        module = lowering.stablehlo()
        assert all(
            "sym_name" in op.operation.attributes for op in module.body.operations
        )
        names = {
            _jax.string_value(op.operation.attributes["sym_name"])
            for op in module.body.operations
        }
        assert "main" in names
        module = lowering.stablehlo()
        assert _sharing.digest(module) is not None
        assert _sharing.digest(module) == _sharing.digest(module)


def _python_in(host):
    """The function a CPU host callback (a Python closure) runs: the one
    `_FlatCallback` its closures hold; None where there is none to read."""
    stack, seen = [host], set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            value = cell.cell_contents
            if type(value) is _jax._FlatCallback:
                return value.callback_func
            if callable(value):
                stack.append(value)
    return None


def test_the_callbacks_read_from_the_jaxpr_are_the_lowering_s_in_order():
    """Where the lowering's host callbacks are Python closures (the CPU), the
    functions read from the jaxpr are theirs, one by one: through `cond` branches,
    a loop's condition and body, an inner `jax.jit` called twice (one function),
    `scan`, and `eqx.error_if`."""
    hosts = [functools.partial(_plus, k) for k in range(8)]

    def call(k, x):
        return jax.pure_callback(hosts[k], SCALAR, x)

    inner = jax.jit(lambda x: call(3, x) * call(4, x))

    def program(x):
        a = jax.lax.cond(x > 0, lambda y: call(0, y), lambda y: call(1, y), x)
        b = jax.lax.while_loop(
            lambda c: call(2, c) < 5, lambda c: c + call(5, c) + 1, a
        )
        c = inner(b) + inner(b * 2)
        d = jax.lax.scan(lambda c, _: (call(6, c), None), c, None, length=2)[0]
        return eqx.error_if(d + call(7, x), d > 100, "big")

    traced = jax.jit(program).trace(jnp.float32(1.0))
    lowering = _jax.lowering_of(traced.lower())
    held = [_python_in(h) for h in _jax.compile_arguments(lowering)["host_callbacks"]]
    if jax.default_backend() != "cpu" or None in held:
        pytest.skip("the lowering's host callbacks are opaque here")
    found = _sharing.host_callbacks(lowering, traced.jaxpr)[0]
    assert found is not None, (
        "JAX changed: the jaxpr's callbacks are not the lowering's"
    )
    assert [f for f, _ in found] == held
    assert len(held) == 10 and held[:2] == [hosts[1], hosts[0]]


def _plus(k, y):
    return np.asarray(y + k, np.float32)


def test_without_a_lowering_to_count_against_no_callback_is_accounted_for():
    """A lowering this JAX does not let us read (None): its host callbacks cannot
    be counted, so none is accounted for, and the program is waited for."""
    traced = jax.jit(lambda x: jax.pure_callback(_host, SCALAR, x)).trace(SCALAR)
    assert _sharing.host_callbacks(None, traced.jaxpr) == (None, True)
