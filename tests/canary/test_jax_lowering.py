"""What a lowering says about the Python that runs on the host, and its compile
arguments: the allow-list of `_sharing` knows every argument JAX passes, and reads
each host callback's function out of the lowering itself."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from eqx_static import _jax, _sharing
from jax.experimental import io_callback


SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


def _host(y):
    return np.asarray(y, np.float32)


def _lowering(f):
    return _jax.lowering_of(jax.jit(f).trace(jnp.float32(1.0)).lower())


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
    ):
        (host,) = _jax.compile_arguments(_lowering(make))["host_callbacks"]
        found = _jax.flat_callback_in(host)
        assert found is not None, "JAX changed: a host callback's function is hidden"
        assert found[0] is _host
        assert found[1] == jax.tree.structure(((1.0,), {}))


def test_equinox_error_if_stages_one_callback_per_message():
    """Two programs with an `eqx.error_if` over equal messages hold the identical
    callback (Equinox stages it from its own jitted helper): that is why their
    programs can share. Other messages are another callback."""

    def callbacks(message):
        lowering = _lowering(lambda x: eqx.error_if(x * 2, x > 0, message))
        hosts = _jax.compile_arguments(lowering)["host_callbacks"]
        return [_jax.flat_callback_in(h)[0] for h in hosts]  # pyright: ignore[reportOptionalSubscript]

    one, two = callbacks("positive"), callbacks("positive")
    assert one, "Equinox changed: error_if stages no host callback"
    assert all(a is b for a, b in zip(one, two, strict=True)), (
        "Equinox changed: error_if programs over equal messages no longer share"
    )
    assert not any(a is b for a, b in zip(one, callbacks("negative")))


def test_other_host_python_is_not_taken_for_a_known_callback():
    printing = _lowering(lambda x: jax.debug.print("{}", x) or x)
    debugging = _lowering(lambda x: jax.debug.callback(_host, x) or x)
    for lowering in (printing, debugging):
        hosts = _jax.compile_arguments(lowering)["host_callbacks"]
        assert hosts and all(_jax.flat_callback_in(h) is None for h in hosts)


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
