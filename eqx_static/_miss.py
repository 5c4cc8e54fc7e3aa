"""The miss path: a call whose compile key, or whose inputs' shapes, are new.

- Outside any transformation, the call is traced and lowered, and its program is
  compared with the programs this function has compiled (`_program.py`). If one
  is provably the same, its executable is installed and XLA compiles nothing;
  otherwise the program is compiled. Each key keeps its own `jax.jit`, trace and
  outputs; only the executable is shared.
- Under a transformation (`grad`, `vmap`, an outer `jit`), the call is staged into
  the outer trace, as `eqx.filter_jit` stages it; nothing is compiled here.
- Under `jax.disable_jit()`, the function runs eagerly.

JAX traces an entry's function only when the miss path asks it to: at any other
time (a hit whose inputs have new shapes, a call under a transformation) the
traced function refuses before running any user code, and the caller takes the
miss path instead. So every trace and every XLA compile goes through here, and is
counted here: no listener is needed.
"""

import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Final

import jax
from jax.core import Tracer

from ._budget import check_budget, record_compile
from ._cache import Cache, Entry
from ._compat import (
    cache_size,
    executable_of,
    hide_frames,
    jit_is_replaced,
    lowering_of,
    set_executable,
    trace_state_clean,
)
from ._errors import LEAVES_NAME, marker, traced_field_error, TracedFieldError
from ._explain import explain
from ._key import build, build_call, deep
from ._outputs import combine, split
from ._program import fingerprint


hide_frames(__file__)

logger: Final = logging.getLogger("eqx_static")

UNUSABLE_DONATION: Final = "Some donated buffers were not usable"


class Refused(Exception):  # noqa: N818  (not an error: a request to take the miss path)
    """JAX asked to trace an entry's function outside the miss path."""

    def __init__(self, entry: Entry):
        super().__init__("es.jit: traced outside the miss path")
        self.entry = entry


class _Pending(threading.local):
    """Per thread: the entry whose function JAX may trace now, and a count of traces."""

    def __init__(self):
        self.allowed: Entry | None = None
        self.traces = 0


pending: Final = _Pending()


def traced_function(wrapper: Any, entry: Entry) -> Callable:
    """The function `jax.jit` traces for `entry`: it rebuilds the call from the key
    and the traced leaves and runs it, if the miss path asked for it."""
    fn_node, key = wrapper._fn_node, entry.key
    n_fn = len(wrapper._fn_leaves)

    def traced(*_es_leaves: Any) -> Any:
        if pending.allowed is not entry:
            raise Refused(entry)
        pending.traces += 1
        fn = deep(build, fn_node, iter(_es_leaves[:n_fn]))
        args, kwargs = deep(build_call, key, _es_leaves[n_fn:])
        try:
            out = fn(*args, **kwargs)
        except TracedFieldError:
            raise
        except Exception as e:
            if LEAVES_NAME + "[" not in str(e):
                raise
            name = wrapper.name(args)
            error = traced_field_error(name, e, key, wrapper._argnames, n_fn)
            raise error.with_traceback(e.__traceback__) from None
        arrays, static = split(out)
        return arrays[0] if static.mask is None else (arrays, static)

    traced.__name__ = getattr(wrapper.fn, "__name__", "fn")
    traced.__qualname__ = wrapper.qualname
    return traced


class Allowed:
    """Within the block, JAX may trace `entry`'s function; `traced` says whether it
    did (the blocks nest: a trace may call another `es.jit` function)."""

    __slots__ = ("entry", "previous", "traces")

    def __init__(self, entry: Entry):
        self.entry = entry

    def __enter__(self) -> "Allowed":
        self.previous, pending.allowed = pending.allowed, self.entry
        self.traces = pending.traces
        return self

    @property
    def traced(self) -> bool:
        return pending.traces != self.traces

    def __exit__(self, *exc: Any) -> None:
        pending.allowed = self.previous


class _Booked(Allowed):
    """`Allowed`, and the call is booked once at the end of the block, even if it
    raised: a miss if it traced, else a hit."""

    __slots__ = ("cache",)

    def __init__(self, cache: Cache, entry: Entry):
        super().__init__(entry)
        self.cache = cache

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self.traced:
            self.cache.count_miss()
        else:
            self.cache.count_hit()


def miss(wrapper: Any, key: Any, leaves: list, args: tuple, kwargs: dict) -> Any:
    """Call `wrapper` for a key it has no program for (at these inputs' shapes),
    or whose entry another thread is compiling."""
    __tracebackhide__ = True
    # `eqx.error_if` records the frames of its trace, with this marker in this
    # frame (the name is Equinox's); its message, if this call fails, shows the
    # frames up to it. A new marker per call, as `eqx.filter_jit` makes one.
    __equinox_jit_id__ = os.urandom(16)
    previous, marker.current = marker.current, __equinox_jit_id__
    try:
        return _miss(wrapper, key, leaves, args, kwargs)
    finally:
        marker.current = previous


def _miss(wrapper: Any, key: Any, leaves: list, args: tuple, kwargs: dict) -> Any:
    cache = wrapper.cache
    if jax.config.jax_disable_jit:  # pyright: ignore[reportAttributeAccessIssue]
        # eager, as `eqx.filter_jit` is: no entry
        cache.count_miss()  # the function ran
        return wrapper.fn(*args, **kwargs)
    entry = cache.entry(key, wrapper.make_jitted(key, leaves))
    if not trace_state_clean() or any(isinstance(x, Tracer) for x in leaves):
        return _staged(wrapper, entry, leaves, args)
    # One top-level miss of an entry at a time, and no hit while it runs: between
    # its trace and its call, `jax.jit` would compile that trace for anyone.
    with entry.lock, quiet_donation(wrapper):
        entry.busy = True
        try:
            return _top_level(wrapper, entry, leaves, args)
        finally:
            entry.busy = False


def _staged(wrapper: Any, entry: Entry, leaves: list, args: tuple) -> Any:
    """Stage the call into the outer trace, as `eqx.filter_jit` does: JAX traces it
    if it has no trace for these avals, and keeps the trace. Nothing compiles here.
    (If a call outside any transformation later reuses that trace, `jax.jit`
    compiles it without the miss path: `layout_miss` books that compile.)"""
    with _Booked(wrapper.cache, entry) as allow:
        try:
            if jit_is_replaced():  # Equinox's breakpoint mode: through its `jax.jit`
                out = jax.jit(traced_function(wrapper, entry))(*leaves)
            else:
                out = entry.jitted(*leaves)
        finally:
            if allow.traced:
                _log(wrapper, entry, leaves, args, "traced under a transformation")
    return combine(*out) if type(out) is tuple else out


def _top_level(wrapper: Any, entry: Entry, leaves: list, args: tuple) -> Any:
    """Trace and lower the call, compile or reuse its program, then call it. (If
    another thread compiled it meanwhile, just call it.)"""
    cache = wrapper.cache
    if entry.programs:
        try:
            out = _call_booked(wrapper, entry, leaves, args)
        except Refused as r:
            if r.entry is not entry:
                raise
        else:
            return combine(*out) if type(out) is tuple else out
    with _Booked(cache, entry):
        cache.make_room(entry)
        traced = entry.jitted.trace(*leaves)
        lowered = traced.lower()
        _compile_or_reuse(wrapper, entry, leaves, args, traced.jaxpr, lowered)
        out = entry.call(*leaves)
        entry.size = cache_size(entry.jitted)
    return combine(*out) if type(out) is tuple else out


def _call_booked(wrapper: Any, entry: Entry, leaves: list, args: tuple) -> Any:
    """Call `entry` (the entry's lock is held) and book the call: a hit, or a miss
    if `jax.jit` compiled a new layout for it."""
    try:
        out = entry.call(*leaves)
    except Refused:
        raise
    except BaseException:
        wrapper.cache.count_hit()  # it ran a compiled program, which raised
        raise
    if cache_size(entry.jitted) != entry.size:
        _check_layout(wrapper, entry, leaves, args)
    else:
        wrapper.cache.count_hit()
    return out


def _compile_or_reuse(
    wrapper: Any, entry: Entry, leaves: list, args: tuple, jaxpr: Any, lowered: Any
) -> None:
    cache = wrapper.cache
    sig = signature(leaves)
    fp = fingerprint(jaxpr, lowered)
    lowering = lowering_of(lowered)
    with cache.lock:  # one compile at a time, so that a program compiles once
        program = cache.find(fp)
        name = wrapper.name(args)
        if program is not None and lowering is not None:
            if logger.isEnabledFor(logging.INFO):
                reason = _reason(wrapper, entry.key, sig)
                if reason is not None:
                    logger.info(
                        "%s: traced (%d cached): %s; same program as compile %d, "
                        "not compiled again",
                        name,
                        len(cache.known()),
                        reason,
                        program.number,
                    )
            set_executable(lowering, program.executable)
        else:
            reason = _reason(wrapper, entry.key, sig)
            if reason is not None:
                logger.info(
                    "%s: compiling (%d cached): %s", name, len(cache.known()), reason
                )
            check_budget(wrapper, reason)
            start = time.perf_counter()
            if lowering is not None:
                lowered.compile()
            seconds = time.perf_counter() - start
            executable = None if lowering is None else executable_of(lowering)
            program = record_compile(
                wrapper, fp, executable, entry.key, sig, reason, seconds, name
            )
        cache.add(entry, sig, program)
        entry.call = wrapper.call_for(entry)


def layout_miss(wrapper: Any, entry: Entry, leaves: list, args: tuple) -> None:
    """Book a hit after which `entry`'s `jax.jit` holds another number of compiled
    signatures than the miss path left it with. Another thread's miss may have
    added one meanwhile; or `jax.jit` compiled a trace it already had: for a new
    layout of this call's inputs (a new sharding, or committed where it was not),
    or for avals it traced under a transformation. The call's signature tells."""
    with entry.lock:
        _check_layout(wrapper, entry, leaves, args)


def _check_layout(wrapper: Any, entry: Entry, leaves: list, args: tuple) -> None:
    entry.size = cache_size(entry.jitted)
    sig = signature(leaves)
    if sig in entry.programs:
        wrapper.cache.count_hit()
    else:
        _book_layout(wrapper, entry, sig, args, leaves)


def _book_layout(
    wrapper: Any, entry: Entry, sig: tuple, args: tuple, leaves: list
) -> None:
    """Record a signature that `jax.jit` served from a trace it had: with a program
    already compiled (JAX's lowering cache found it), or with one it compiled now,
    which is booked as an XLA compile. (That compile could not be refused, nor
    shared with an identical program, before it happened.) The call traced
    nothing: it is booked as a hit."""
    cache = wrapper.cache
    with _Booked(cache, entry), quiet_donation(wrapper):
        traced = entry.jitted.trace(*leaves)  # cached by JAX: nothing runs again
        lowered = traced.lower()  # cached too: the lowering the call compiled
        lowering = lowering_of(lowered)
        executable = None if lowering is None else executable_of(lowering)
        with cache.lock:
            program = cache.running(executable)
            if program is None:
                fp = fingerprint(traced.jaxpr, lowered)
                reason = _reason(wrapper, entry.key, sig)
                name = wrapper.name(args)
                if reason is not None:
                    logger.info(
                        "%s: compiled by jax.jit from an earlier trace (%d cached): %s",
                        name,
                        len(cache.known()),
                        reason,
                    )
                program = record_compile(
                    wrapper, fp, executable, entry.key, sig, reason, 0.0, name
                )
            cache.add(entry, sig, program)
            entry.call = wrapper.call_for(entry)


def _reason(wrapper: Any, key: Any, sig: tuple) -> str | None:
    """What differs from the closest compiled entry (None for the first call)."""
    known = wrapper.cache.known()
    return explain(known, key, sig, wrapper._argnames) if known else None


def _log(wrapper: Any, entry: Entry, leaves: list, args: tuple, what: str) -> None:
    if logger.isEnabledFor(logging.INFO):
        known = wrapper.cache.known()
        if known:
            reason = explain(known, entry.key, signature(leaves), wrapper._argnames)
            logger.info(
                "%s: %s (%d cached): %s", wrapper.name(args), what, len(known), reason
            )


@contextlib.contextmanager
def quiet_donation(wrapper: Any) -> Iterator[None]:
    """`donate="all"` and `"all-except-first"` hide JAX's warning that some donated
    buffers were not usable, as `eqx.filter_jit` does."""
    if not wrapper.quiet_donation:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", UNUSABLE_DONATION)
        yield


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
