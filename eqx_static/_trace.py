"""Tracing: the function `jax.jit` traces for an entry, the booking of misses, and
the error that names a traced field used where Python needs a value."""

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import jax
from jax._src import traceback_util
from jax.core import Tracer

from ._budget import record_compile
from ._cache import Entry
from ._explain import explain, leaf_origins
from ._key import build, build_call, deep
from ._outputs import split
from ._relevance import Handover, rewatch


traceback_util.register_exclusion(__file__)

logger: Final = logging.getLogger("eqx_static")


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


class _Pending(threading.local):
    """Per thread: traces and compiles seen, read back by the call that caused them."""

    def __init__(self):
        self.events = 0  # traces of es.jit functions, and XLA compiles
        self.records: list[tuple[Entry, Any, bool]] = []  # (entry, reads, ok)
        self.current: Any = None  # the full key of the call being dispatched
        self.handover: Handover | None = None  # for the next trace to take


_pending: Final = _Pending()


def _on_duration_event(event: str, duration_secs: float, **kwargs: Any) -> None:
    # A change of layout (sharding) alone makes `jax.jit` compile again without
    # tracing again: count XLA compiles too, so that such a call is a miss.
    if event == "/jax/core/compile/backend_compile_duration":
        _pending.events += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration_event)


def traced_fn(self: Any, key: tuple, entry: Entry) -> Callable:
    """The function `jax.jit` traces for `entry`: it rebuilds the call from the key
    and the traced leaves, runs it, and books the trace."""
    fn_node, relevance = self._fn_node, self._relevance
    n_fn = len(self._fn_leaves)

    def traced(*_es_leaves: Any) -> Any:
        fn = deep(build, fn_node, iter(_es_leaves[:n_fn]))
        rest = _es_leaves[n_fn:]
        reads, ok = None, False
        call_key = key
        handover, _pending.handover = _pending.handover, None
        if relevance is not None:  # rebuild from this call: unread statics differ
            call_key = _pending.current
            args, kwargs = deep(build_call, call_key, rest)
            reads = relevance.watch(entry, args)
        else:
            args, kwargs = deep(build_call, key, rest)
            if handover is not None:
                rewatch(handover, (*args, *kwargs.values()))
        try:
            out = fn(*args, **kwargs)
            arrays, static = split(out)  # reads the statics of returned modules
            ok = True
        except TracedFieldError:
            raise
        except Exception as e:
            if "_es_leaves[" not in str(e):
                raise
            raise traced_field_error(self, e, call_key, args).with_traceback(
                e.__traceback__
            ) from None
        finally:  # a trace that raised is a miss too
            if reads is not None:
                reads.sealed = True
            _pending.records.append((entry, reads if ok else None, ok))
            _pending.events += 1
        return arrays[0] if static.mask is None else (arrays, static)

    traced.__name__ = getattr(self.fn, "__name__", "fn")
    traced.__qualname__ = self.qualname
    return traced


def after_miss(
    self: Any, entry: Entry, leaves: list, args: tuple, full: tuple, start: float
) -> None:
    """Book a call that traced or compiled: one miss per trace, or one for a
    compile without a trace for a signature not seen before (a new layout of the
    same program). A compile for a signature already traced (say under `vmap`,
    then called directly) adds no entry, so it is no miss."""
    records = _pending.records
    mine = [(reads, ok) for e, reads, ok in records if e is entry]
    records[:] = [r for r in records if r[0] is not entry]
    sig = signature(leaves)
    if not mine and sig not in entry.variants:
        mine = [(None, True)]
    seconds = time.perf_counter() - start
    for reads, ok in mine:
        known = known_keys(self)
        reason = None
        if known:
            reason = explain(known, full, sig, self._argnames)
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "%s: compiling (%d cached): %s",
                    self.name(args),
                    len(known),
                    reason,
                )
        self.cache.book(entry, sig if ok else None)
        if ok:
            record_compile(self, full, sig, reason, seconds, args)
        if self._relevance is not None:
            self._relevance.learn(entry, reads, leaves, full)


def known_keys(self: Any) -> list[tuple[tuple, tuple]]:
    """The full key and signature of every compile held, for explanations."""
    with self.cache.lock:
        return [(e.origin, s) for e in self.cache.entries.values() for s in e.variants]


def traced_field_error(self: Any, e: Exception, key: tuple, args: tuple) -> Exception:
    """`TracedFieldError` naming the field behind the traced leaf JAX named in `e`
    (`e` itself if it named none)."""
    n_fn = len(self._fn_leaves)
    indices = [int(i) - n_fn for i in re.findall(r"_es_leaves\[(\d+)\]", str(e))]
    origins = leaf_origins(key, self._argnames)
    fields = [origins[i] for i in indices if 0 <= i < len(origins)]
    fields = [o for o in fields if o.field is not None]
    if not fields:
        return e
    o = fields[0]
    cls = o.cls.__qualname__ if o.cls else "?"
    return _traced_field_error_type(type(e))(
        f"{self.name(args)} used the traced field {o.field!r} of `{cls}` "
        f"(at {o.path}) where Python needs a concrete value (`if`, `bool()`, "
        "`int()`, a shape, ...). Dynamic fields are traced, so their values are "
        f"unknown while compiling. If {o.field!r} selects program structure, "
        f"declare it static: `{o.field}: ... = eqx.field(static=True)` (each "
        "new value then compiles once). Otherwise keep it dynamic and use "
        "`jnp.where` or `jax.lax.cond`.\n\nJAX said: " + str(e)
    )


def signature(leaves: list) -> tuple:
    """Each leaf's shape, dtype, weak type and (if placed explicitly) sharding."""
    return tuple(map(_aval_key, leaves))


def _aval_key(x: Any) -> tuple:
    a = jax.typeof(x)
    committed = not isinstance(x, Tracer) and getattr(x, "committed", False)
    return (
        a.shape,
        a.dtype,
        getattr(a, "weak_type", False),
        x.sharding if committed else None,
    )
