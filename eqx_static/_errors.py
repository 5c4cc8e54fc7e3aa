"""Errors a compiled call raises: a traced field used where Python needs a value
(at trace time), and `eqx.error_if` failing (at run time), as `eqx.filter_jit`
reports it."""

import functools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

import equinox as eqx
import jax
from jax.core import Tracer

from ._compat import (
    CALLBACK_LOGGER,
    equinox_error_info,
    FilterCallback,
    hide_frames,
    JaxRuntimeError,
    on_error_message,
)
from ._explain import leaf_origins


hide_frames(__file__)


class TracedFieldError(jax.errors.ConcretizationTypeError):
    """A traced (dynamic) field was used where Python needs a concrete value.

    The message names the field and its class, and suggests declaring the field
    static if it selects program structure. The error is also an instance of the
    JAX error it replaces (`jax.errors.TracerBoolConversionError`, ...), and its
    traceback ends at the offending line.

    !!! example

        ```python
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class Model(es.Module):
            scale: float

            @es.jit
            def __call__(self, x):
                return x if self.scale > 0 else -x   # Python `if` on a traced value

        with pytest.raises(es.TracedFieldError, match="'scale'"):
            Model(scale=1.0)(jnp.ones(2))
        ```
    """

    def __init__(self, message: str):  # pyright: ignore[reportMissingSuperCall]
        TypeError.__init__(self, message)


@functools.cache
def _traced_field_error_type(jax_error: type) -> type:
    if issubclass(jax_error, TracedFieldError):
        return jax_error
    return type("TracedFieldError", (TracedFieldError, jax_error), {})


# The traced function's parameter: JAX names a traced leaf `_es_leaves[i]`.
LEAVES_NAME: Final = "_es_leaves"
_LEAF_INDEX: Final = re.compile(LEAVES_NAME + r"\[(\d+)\]")


def traced_field_error(
    name: str, e: Exception, key: Any, argnames: Sequence[str], n_fn: int
) -> Exception:
    """`TracedFieldError` naming the field behind the traced leaf JAX named in `e`
    (`e` itself if it named none). `n_fn` leaves of the function come first."""
    indices = [int(i) - n_fn for i in _LEAF_INDEX.findall(str(e))]
    origins = leaf_origins(key, argnames)
    fields = [origins[i] for i in indices if 0 <= i < len(origins)]
    fields = [o for o in fields if o.field is not None]
    if not fields:
        return e
    o = fields[0]
    cls = o.cls.__qualname__ if o.cls else "?"
    return _traced_field_error_type(type(e))(
        f"{name} used the traced field {o.field!r} of `{cls}` "
        f"(at {o.path}) where Python needs a concrete value (`if`, `bool()`, "
        "`int()`, a shape, ...). Dynamic fields are traced, so their values are "
        f"unknown while compiling. If {o.field!r} selects program structure, "
        f"declare it static: `{o.field}: ... = eqx.field(static=True)` (each "
        "new value then compiles once). Otherwise keep it dynamic and use "
        "`jnp.where` or `jax.lax.cond`.\n\nJAX said: " + str(e)
    )


# ----------------------------------------------------------------------------------
# Run-time errors. `eqx.error_if` raises inside a host callback; JAX reports that
# as a long `JaxRuntimeError` and logs the callback's traceback. `eqx.filter_jit`
# waits for the result, hides that log, and raises `eqx.EquinoxRuntimeError` with
# the message and the stack inside the compiled function instead: so does this.

_callback_logger: Final = logging.getLogger(CALLBACK_LOGGER)


class _Marker(threading.local):
    """The marker of the call being traced in this thread (see `_miss.miss`),
    None outside a miss: Equinox's message shows the stack inside the compiled
    function up to the marker of the call that traced it, and for any other call
    (a hit, or a key that reuses a program) the whole recorded stack, as
    `eqx.filter_jit`, which marks each call anew, does."""

    def __init__(self):
        self.current: bytes | None = None


marker: Final = _Marker()


def reporting_errors(jitted: Callable) -> Callable:
    """`jitted`, called as `eqx.filter_jit` calls a program that may hold an
    `eqx.error_if`: synchronously, its failure raised as `EquinoxRuntimeError`."""

    def call(*leaves: Any) -> Any:
        __tracebackhide__ = True
        quiet = FilterCallback()
        _callback_logger.addFilter(quiet)
        try:
            out = jitted(*leaves)
            _wait_for(out)
        except (JaxRuntimeError, ValueError) as e:
            info = equinox_error_info()
            if info is None or "_EquinoxRuntimeError: " not in str(e):
                raise
            raise eqx.EquinoxRuntimeError(_message(info, marker.current)) from None
        finally:
            _callback_logger.removeFilter(quiet)
        return out

    return call


def _wait_for(out: Any) -> None:
    arrays = out[0] if type(out) is tuple else [out]
    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, Tracer):
            a.block_until_ready()  # one execution: its outputs are ready together
            return


def _message(info: tuple[str, list], eqx_id: bytes | None) -> str:
    """Equinox's message: the error, and the stack inside the compiled function
    (the frames recorded when it was traced, up to this function's marker)."""
    msg, stack = info
    pieces: list[str] = []
    for frame in stack:
        if type(frame) is str:
            pieces.append(frame)
        elif frame == eqx_id:
            break
    return on_error_message.format(msg=msg, stack="".join(reversed(pieces)))
