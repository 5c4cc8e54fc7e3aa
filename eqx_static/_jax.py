"""Every private name of JAX, Equinox and jaxtyping that `eqx_static` uses, each
checked once, here, at import. Where a JAX name is missing or changed, the feature
that needs it is off and `es.jit` keeps working on public `jax.jit` (one warning):
`DISPATCH` (each key's own C++ dispatcher, with JAX's own miss path under ours)
and `SHARING` (installing one key's executable for another). `tests/canary/`
checks each name, so that a release that changes one reads as "JAX changed"."""

import contextlib
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NoReturn, TypeVar

import equinox as eqx
import jax
import jax.extend.core as jex
import jaxtyping
import numpy as np


SUPPORTED: Final = "equinox >=0.13.3,<0.14"
_lost: list[str] = []  # the private names this process runs without


def _private(module: str, name: str, fallback: Any = None) -> Any:
    """A private name of Equinox or jaxtyping, or `fallback` where it is gone."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):  # pragma: no cover
        _lost.append(f"{module}.{name}")
        return fallback


def _jax_module(name: str) -> Any:
    """A private module of JAX's (`jax._src.<name>`), or None where it is gone."""
    with contextlib.suppress(ImportError):
        return importlib.import_module(f"jax._src.{name}")


# `eqx.filter_jit` turns a failed `eqx.error_if` callback into an
# `EquinoxRuntimeError` with this message, from what the callback left
# (`equinox_error_info`), and hides JAX's log of the failure with this filter.
# Without them: the same message; the log shown; JAX's own error raised.
on_error_message: Final[str] = _private(
    "equinox._jit", "_on_error_msg", "{msg}\n\nThe stack inside the program:\n{stack}"
)
FilterCallback: Final = _private("equinox._jit", "_FilterCallback", logging.Filter)


def equinox_error_info() -> tuple[str, list] | None:
    """The message and trace-time stack the last failing `eqx.error_if` left."""
    return getattr(sys.modules.get("equinox._jit"), "last_error_info", None)


# Equinox's flatten: a module whose instance dictionary holds more or fewer entries
# than it has fields carries these in its structure, `MISSING` where absent;
# unflatten sets them all. Without them, such a module is keyed as JAX flattens it.
EQX_MISSING: Final = _private("equinox._module._flatten", "MISSING")
WRAPPER_FIELD_NAMES: Final[tuple[str, ...] | None] = _private(
    "equinox._module._flatten", "WRAPPER_FIELD_NAMES"
)
# A module may assign its fields while it is in this set (`__init__`, and the copies
# `es.edit` makes). Without it, an `es.edit` copy of a module refuses assignments.
_initialising: Final = _private("equinox._module._module", "_currently_initialising")
# What `module.method` is. Without it, an `es.Module` makes it as Equinox does.
BoundMethod: Final = _private("equinox._module._prebuilt", "BoundMethod")


class _Probe(eqx.Module):
    def method(self) -> None:
        """A method, to see what Equinox's `BoundMethod` holds."""


# The wrapper attributes Equinox's `BoundMethod` keeps in its instance dictionary
# (and so in its tree structure): all of them in 0.13, none on its main branch.
BOUND_METHOD_FIELDS: Final = tuple(
    k for k in WRAPPER_FIELD_NAMES or () if k in _Probe().method.__dict__
)


# Here and below, `getattr(gone, name, no_op)(...)` is a call that does nothing where
# the private name is gone.
def allow_assignments(module: Any) -> None:
    """Let `module` assign its fields, as Equinox lets one in its `__init__`."""
    getattr(_initialising, "add", lambda m: None)(module)


def forbid_assignments(module: Any) -> None:
    getattr(_initialising, "remove", lambda m: None)(module)


# ----------------------------------------------------------------------------------
# JAX's public names this package leans on.

# The `jax.monitoring` event around every XLA compile: a scalar when it starts, a
# duration when it ends, each with `fun_name="jit(<the program's name>)"`.
COMPILE_EVENT: Final = "/jax/core/compile/backend_compile_duration"
# The logger on which JAX reports an exception raised in a host callback.
CALLBACK_LOGGER: Final = "jax._src.callback"
JaxRuntimeError: Final = jax.errors.JaxRuntimeError

# `jax.jit` itself. Under `EQX_ON_ERROR=breakpoint` Equinox replaces the name
# `jax.jit` with a function (for JAX issue #16732) that has no `.trace`.
jax_jit: Callable[..., Any] = getattr(_jax_module("api"), "jit", jax.jit)


def jit_is_replaced() -> bool:
    return jax.jit is not jax_jit


_options: Any = jax.config  # read by its options' names


def jit_disabled() -> bool:
    """Whether `jax.disable_jit()` is on: `jax.jit` then calls its function."""
    return bool(_options.jax_disable_jit)


def pgle_enabled() -> bool:
    """Whether JAX profiles programs and compiles them again with the profile."""
    return bool(_options.jax_enable_pgle) and _options.jax_pgle_profiling_runs > 0


# ----------------------------------------------------------------------------------
# JAX's private names, each with what happens without it.

# Without JAX's trace state (`trace_ctx` and `EvalTrace` both), no call is under a
# transformation (tracer arguments are still seen; closures over them are not) nor
# in reverse mode (a traced loop bound is then named by JAX's own error).
_core, _config, _lib = map(_jax_module, ("core", "config", "lib"))
_trace_ctx = getattr(_core, "trace_ctx", None) if hasattr(_core, "EvalTrace") else None


def under_transformation() -> bool:
    """Whether a call here is bound into a trace (`grad`, `vmap`, an outer `jit`),
    concrete arguments or not: it may close over that trace's values."""
    return _trace_ctx is not None and type(_trace_ctx.trace) is not _core.EvalTrace


def reverse_mode() -> bool:
    """Whether a call here is being linearized for reverse mode (`jax.grad`)."""
    return type(getattr(_trace_ctx, "trace", None)).__name__ == "LinearizeTrace"


_traceback_util = _jax_module("traceback_util")


def hide_frames(file: str) -> None:
    """Leave `file`'s frames out of the tracebacks JAX filters, as Equinox does."""
    getattr(_traceback_util, "register_exclusion", lambda f: None)(file)


# The generated code (a wrapper's signature, the guards) is compiled as files of
# this directory: hidden as the package's own files are, so that a traceback or
# Equinox's runtime-error stack shows the user's frames as under `eqx.filter_jit`
# (with `JAX_TRACEBACK_FILTERING=off` they show, with their source).
GENERATED: Final = "<es.jit>"
hide_frames(GENERATED)


_F = TypeVar("_F", bound=Callable)


def api_boundary(f: _F) -> _F:
    """`f`, below which an error raised in the user's function shows JAX's filtered
    traceback: the frames of the files left out (ours, JAX's) dropped."""
    return getattr(_traceback_util, "api_boundary", lambda g: g)(f)


def _trace_context() -> Any:  # pragma: no cover (where JAX's is gone)
    return (_options.jax_enable_x64, _options.jax_default_device)


trace_context: Callable[[], Any] = getattr(_config, "trace_context", _trace_context)


def _warn(what: str) -> None:
    """Warn, at the caller's caller, of what this JAX lacks and what follows."""
    warnings.warn(
        f"eqx_static: with jax {jax.__version__}, {what}. Please report this with "
        "your JAX version.",
        RuntimeWarning,
        stacklevel=3,
    )


# What follows where the per-key dispatchers or sharing are off.
_OWN: Final = (
    " (each key compiles its own program, as under `eqx.filter_jit`; results are "
    "unchanged)"
)


# The package's environment variables, each read through one of these two.


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable: `1` on, `0` off; unset or empty, `default`."""
    value = os.environ.get(name, "").strip()
    if value in ("", "0", "1"):
        return value == "1" if value else default
    on = "on" if default else "off"
    raise _bad_env(name, "a switch", "`1` (on) or `0` (off)", on)


def env_seconds(name: str, default: float) -> float:
    """A number of seconds greater than 0 from the environment; unset, `default`."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    if re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)\s*", value) and float(value) > 0:
        return float(value)
    accepted = "a number greater than 0 (`1200`, `2.5`)"
    raise _bad_env(name, "a number of seconds", accepted, f"{default:g}")


def _bad_env(name: str, what: str, accepted: str, default: str) -> Exception:
    value = os.environ[name]
    return ValueError(
        f"The environment variable {name}={value!r} is not {what} eqx_static reads: "
        f"set it to {accepted}, or unset it (then it is {default})."
    )


# `EQX_STATIC_PUBLIC_JIT=1`: every key on a public `jax.jit`, as where the private
# names are missing (what CI runs the suite under, to keep that path first-class).
PUBLIC: Final = env_switch("EQX_STATIC_PUBLIC_JIT", False)
# Each key's own dispatcher, and sharing; each turned off, saying so once, where this
# JAX lacks a name it needs or behaves otherwise (and, silently, under `PUBLIC`).
DISPATCH = SHARING = not PUBLIC


def no_dispatcher(why: object) -> None:
    """Turn the per-key dispatchers off for this process, saying so once."""
    global DISPATCH, SHARING
    if DISPATCH:
        DISPATCH = SHARING = False
        _warn(f"its dispatcher cannot be built here ({why}){_OWN}")


def stop_sharing(why: str) -> None:
    global SHARING
    if SHARING:
        SHARING = False
        stop = "es.jit stops sharing programs between keys in this process"
        _warn(f"{why}, so {stop}{_OWN}")


# The C++ dispatcher of a `jax.jit` (`PjitFunction`), built as `pjit._cpp_pjit`
# builds one, with a miss path of ours. A hit is JAX's C++; a miss calls
# `cache_miss(*args)`, which returns what JAX's own miss returns (`jit_miss`).
_CPP_KEYS: Final = (
    "donate_argnums donate_argnames device backend in_shardings_treedef "
    "in_shardings_leaves out_shardings_treedef out_shardings_leaves in_layouts_treedef "
    "in_layouts_leaves out_layouts_treedef out_layouts_leaves compiler_options_kvs"
).split()

try:
    from jax._src import pjit as _pjit, tree_util as _tree_util
    from jax._src.interpreters import pxla as _pxla

    # JAX's extension: `lib._jax` in jax >= 0.10, `lib.xla_client._xla` in 0.8, 0.9.
    _extension: Any = getattr(_lib, "_jax", None) or _lib.xla_client._xla
    _make_pjit: Callable[..., Any] = _extension.pjit
    _CacheKeys, _cpp_cache = _pxla.JitGlobalCppCacheKeys, _pjit._get_cpp_global_cache
    _registry, _shard_arg = _tree_util.dispatch_registry, _pxla.cc_shard_arg
    _info = jax_jit(abs)._jit_info  # pyright: ignore[reportAttributeAccessIssue]
    _needed = (*_CPP_KEYS, "static_argnums", "static_argnames")
    _missing = [k for k in _needed if not hasattr(_info, k)]
    if _missing or not hasattr(jax_jit(abs), "_cache_miss"):
        raise AttributeError(f"`jax.jit(f)` lacks {_missing or ['_cache_miss']}")
except (ImportError, AttributeError) as e:  # pragma: no cover
    no_dispatcher(e)


def dispatcher(
    name: str, fun: Callable, cache_miss: Callable, donate: tuple, rerun: Callable
) -> Any:
    """A C++ dispatcher whose misses call `cache_miss(*args)`, which calls
    `fun(*args)` under `jax.disable_jit()`, and `rerun(*args)` when JAX's
    `jax_debug_nans`/`jax_debug_infs` check finds an invalid value in the outputs
    of a hit (JAX's hook reads it as `_fun`, as on a `jax.jit`)."""
    ji = jax_jit(fun, donate_argnums=donate)._jit_info  # pyright: ignore
    key = _CacheKeys(**{k: getattr(ji, k) for k in _CPP_KEYS})
    cache = _cpp_cache(key.contains_explicit_attributes)  # pyright: ignore
    statics = (ji.static_argnums, ji.static_argnames)
    d = _make_pjit(name, fun, cache_miss, *statics, key, _registry, _shard_arg, cache)
    d._fun = rerun
    return d


def no_invalid_value_when_deoptimized(error: BaseException | None) -> NoReturn:
    """What `jax.jit` raises where its eager run found no invalid value that its
    `jax_debug_nans`/`jax_debug_infs` check found in a program's outputs."""
    raise_it = getattr(_jax_module("api_util"), "_raise_no_nan_in_deoptimized", None)
    if raise_it is not None and error is not None:
        raise_it(error)
    raise FloatingPointError(f"{error}: the eager run found no invalid value") from None


def jit_miss(jitted: Any, *args: Any) -> tuple:
    """A `jax.jit`'s own miss (trace, lower, compile or use the executable set on
    the lowering, run): `(outputs, fastpath_data, rebuild)`, what a dispatcher
    keeps to serve the next such call in C++."""
    return jitted._cache_miss(*args)


# The flags under which JAX's own miss does more than run a lowering's executable:
# it checks the outputs or the keys, logs the run, or refuses to trace.
_CHECKED: Final = "debug_nans debug_infs debug_key_reuse distributed_debug no_tracing"
# What `run_lowered` hands the fastpath data from, as JAX's own miss does (jax >=
# 0.10; before, a lowering's constants were passed otherwise: JAX's miss runs it).
_FASTPATH: Final = (
    "executable out_tree args_flat out_flat effects consts_for_constvars "
    "pgle_profiler const_args"
).split()
try:
    _fastpath: Any = _pjit._get_fastpath_data  # pyright: ignore
    _shards = hasattr(_pxla.MeshExecutable, "shard_const_args")  # pyright: ignore
    RUN_LOWERED = list(inspect.signature(_fastpath).parameters) == _FASTPATH and _shards
except (NameError, AttributeError, TypeError, ValueError):  # pragma: no cover
    RUN_LOWERED = False  # and off once `run_lowered` finds a name gone (said once)


def run_lowered(traced: Any, lowered: Any, args: tuple) -> tuple | None:
    """What `jit_miss` returns for `args`, run from the trace and lowering in hand
    (`jax.stages.Traced`, `Lowered`) whose executable is compiled: JAX's own miss
    would infer, resolve and lower them again (cache hits, at the cost of a pass
    over every leaf). None where that miss does more than run the executable (a
    check, a profile, a program of hijax types, a trace in progress), on a JAX
    before 0.10, or where this JAX lacks a name read here (said once): then call
    `jit_miss`. Every name is read before the program runs."""
    global RUN_LOWERED
    if not RUN_LOWERED:
        return None
    try:
        params, computation = traced._params, lowered._lowering
        compiled, jaxpr = computation._executable, params["jaxpr"]
        flags = [getattr(_config, f).value for f in _CHECKED.split()]
        plain = not jaxpr.is_high and _core.trace_state_clean()
        if compiled is None or any(flags) or pgle_enabled() or not plain:
            return None
        shard, run = compiled.shard_const_args, compiled.unsafe_call
        tree, consts = traced.out_tree, traced._consts
        constants = computation.const_args
        effects = (jaxpr.effects, jaxpr.consts)  # of the program, for the fastpath
    except (AttributeError, KeyError, TypeError) as e:
        RUN_LOWERED = False
        _warn(
            f"a miss runs its program through JAX's own miss ({e!r}): results are "
            "unchanged, and a miss costs one more pass over its arguments"
        )
        return None
    const_args = shard(constants)
    args_flat = [*consts, *args]
    out_flat = run(*const_args, *args_flat)
    data = _fastpath(compiled, tree, args_flat, out_flat, *effects, None, const_args)
    return jax.tree.unflatten(tree, out_flat), data, False


def clear(dispatch: Any) -> None:
    """Drop every executable a dispatcher holds."""
    dispatch._clear_cache()


def probe() -> str | None:
    """What JAX's dispatcher does not do that the per-key dispatchers need, seen on
    a probe call (None: it does all): it serves a hit in C++; it calls its miss for
    anything else and returns what that returns first; after a miss that returned
    no fastpath data with "rebuild" set it keeps nothing and asks again; the
    outputs and fastpath data of `jit_miss` serve the next call."""
    misses: list[int] = []

    # A new function each time (JAX's C++ caches are by function), named for what
    # it is in compile logs and `jax.monitoring`: `jit(eqx_static_dispatcher_probe)`.
    def eqx_static_dispatcher_probe(x: Any) -> Any:
        return x * 2

    def miss(*args: Any) -> tuple:
        misses.append(1)
        return ("again", None, True) if len(misses) == 1 else jit_miss(helper, *args)

    pgle = getattr(_config, "enable_pgle", contextlib.nullcontext)
    try:  # with JAX's defaults, whatever the caller's (see `dispatching`)
        with jax.disable_jit(False), pgle(False), jax.transfer_guard("allow"):
            helper = jax_jit(fn := eqx_static_dispatcher_probe)
            d = dispatcher("eqx_static.probe", fn, miss, (), fn)
            x = jax.device_put(np.arange(3, dtype=np.float32))
            out = [d(x) for _ in range(3)]
    except Exception as e:
        return f"a probe call raised {type(e).__name__}: {e}"
    if type(out[0]) is not str or out[0] != "again":
        return "a miss's outputs are not what the call returns"
    if len(misses) != 2:
        return f"3 calls of one signature made {len(misses)} misses, not 2"
    if not all(np.array_equal(o, 2 * np.arange(3)) for o in out[1:]):
        return "the outputs of a miss are not the call's"
    return None


# A lowering (`Lowered._lowering`, a `pxla.MeshComputation`) holds what `jax.jit`
# compiles and runs: `jitted.trace(...).lower()` and a later call of `jitted` with
# the same arguments share it (JAX caches both), and its executable is kept on it.
# So the miss path can compile it, or install the executable of a program it has
# proved the same, and the call that follows runs that.
_LOWERING: Final = (
    "_executable compile_args stablehlo _donated_invars _compiler_options_kvs "
    "_device_list _platforms"
).split()


def lowering_of(lowered: Any) -> Any:
    """The computation in a `jax.stages.Lowered` (None if not one we know)."""
    lowering = getattr(lowered, "_lowering", None)
    return lowering if all(hasattr(lowering, a) for a in _LOWERING) else None


def compile_arguments(lowering: Any) -> dict[str, Any]:
    """What a lowering is compiled with besides its module."""
    return {
        **lowering.compile_args,
        "donated_invars": tuple(lowering._donated_invars),
        "compiler_options_kvs": tuple(lowering._compiler_options_kvs),
        "device_list": lowering._device_list,
        "platforms": tuple(lowering._platforms),
    }


def executable_of(lowering: Any) -> Any:
    """The executable compiled for a lowering (None before `compile()`)."""
    return lowering._executable


def set_executable(lowering: Any, executable: Any) -> None:
    """Make the call that follows a lowering run `executable`, compiling nothing."""
    lowering._executable = executable


# The printers the sharing check reads a program with: MLIR's, then XLA's. Without
# them, sharing is off.
_ir: Any = getattr(_jax_module("lib.mlir"), "ir", None)


def string_value(attribute: Any) -> str:
    """The string an MLIR string attribute holds (a function's symbol name)."""
    return _ir.StringAttr(attribute).value


def large_constants(op: Any, limit: int) -> list:
    """The dense constants that `op` and the operations inside it hold, in a
    fixed order, which the printer elides at `limit` (not a splat, more
    elements); None for one this cannot read (a resource, whose data is not in
    the module). Walked here, not by MLIR's `walk`: an error in its callback
    aborts. Reading a constant of complex numbers aborts: the caller checks the
    module's element types first."""
    found: list = []
    todo = [op]
    while todo:
        inner = todo.pop()
        attributes = inner.attributes
        for i in range(len(attributes)):
            a = attributes[i].attr
            if isinstance(a, _ir.DenseResourceElementsAttr):
                found.append(None)
            elif isinstance(a, _ir.DenseElementsAttr) and not a.is_splat:
                found.extend([a] if len(a) > limit else [])
        for region in inner.regions:
            for block in region.blocks:
                todo.extend(o.operation for o in block.operations)
    return found


def xla_executable(executable: Any) -> Any:
    """The XLA executable inside JAX's: JAX's own caches may wrap one in two."""
    return getattr(executable, "xla_executable", executable)


try:  # `hlo` in jax >= 0.9; in older ones, the extension itself
    _hlo: Any = getattr(_lib, "hlo", None) or _lib.xla_client._xla
    # XLA's canonical printing (names numbered in order, no metadata), every
    # constant in full (by default, a constant of over 10 elements is `{...}`).
    _hlo_options: Any = _hlo.HloPrintOptions.canonical()
    _hlo_options.print_large_constants = True
except (ImportError, AttributeError):  # pragma: no cover
    _hlo_options = None
if _ir is None or _hlo_options is None:  # pragma: no cover
    stop_sharing("its MLIR or HLO printer cannot be imported")

_MODULE_NAME: Final = re.compile(r"^HloModule [^,\s]+", re.M)  # the function's name


def compiled_texts(executable: Any) -> list[str] | None:
    """The optimized HLO of an executable, one text per module: names numbered in
    order, no metadata, every constant in full. None where this JAX cannot print
    it so."""
    if _hlo_options is None:  # pragma: no cover
        return None
    modules = xla_executable(executable).hlo_modules()
    return [_MODULE_NAME.sub("HloModule", m.to_string(_hlo_options)) for m in modules]


_probed = not DISPATCH


def dispatching() -> bool:
    """Whether each key gets a dispatcher of its own: JAX's is probed at the first
    key, not at import (a probe call starts JAX's backend, after which
    `jax.distributed.initialize` refuses to run)."""
    global _probed
    if not _probed:
        # The probe runs on a fresh thread with JAX's defaults: the first key may
        # come inside a trace (`jax.jit`, `vmap`, `grad`), under `jax.disable_jit`,
        # with profile-guided compiles on or transfers guarded, none of which says
        # anything of the dispatcher (JAX's trace state and these contexts are per
        # thread). Two threads may both probe: the same answer.
        with ThreadPoolExecutor(1, "eqx_static dispatcher probe") as thread:
            why = thread.submit(probe).result()  # `probe` raises nothing
        if why:  # pragma: no cover
            no_dispatcher(why)
        _probed = True
    return DISPATCH


if _lost:  # pragma: no cover
    warnings.warn(
        f"eqx_static: this equinox {eqx.__version__} or jaxtyping lacks "
        f"{', '.join(_lost)}: results are unchanged, and what each one served is "
        f"done another way or not at all (see eqx_static/_jax.py). {SUPPORTED} is "
        "what eqx_static is tested with.",
        RuntimeWarning,
        stacklevel=2,
    )


# JAX's distributed runtime (`jax.distributed`): its key-value store, where the
# processes of a job compare their decisions at a miss (`_diverge`), and the
# processes a program's devices belong to. Without them the check is off, with one
# warning where `jax.process_count() > 1`.
_STORE: Final = (
    "key_value_set key_value_try_get key_value_dir_get key_value_delete "
    "blocking_key_value_get wait_at_barrier"
).split()
_runtime: Any = getattr(_jax_module("distributed"), "global_state", None)
_store_lost: list[str] = []  # said once


def kv_store() -> Any:
    """The client of JAX's distributed key-value store; None if `jax.distributed`
    is not running, or this JAX's lacks a name the divergence check uses."""
    client = getattr(_runtime, "client", None)
    missing = [n for n in _STORE if not hasattr(client, n)]
    if client is not None and not missing:
        return client
    if not _store_lost and (_runtime is None or client is not None):
        _store_lost.append("said")
        missing = missing if _runtime is not None else ["global_state"]
        _warn(
            f"JAX's distributed key-value store lacks {missing}, "
            "so processes that diverge at a miss are not checked (a divergence waits "
            "in a collective)"
        )
    return None


def spans_processes(lowering: Any) -> bool:
    """Whether a lowering's devices belong to more than one process."""
    devices = lowering._device_list
    indices = getattr(devices, "process_indices", None)  # else, device by device
    return len(indices or {d.process_index for d in devices}) > 1


# Jaxprs: where the explanations and the sharing rules look inside a program.
try:
    from jax._src import callback as _callback, source_info_util as _source_info
    from jax._src.interpreters import mlir as _mlir, partial_eval as _pe

    _FlatCallback: Any = _callback._FlatCallback
    _CALLBACKS: tuple = (_callback.pure_callback_p, _callback.io_callback_p)
    _dce: Any = _pe.dce_jaxpr_consts  # what JAX's `jit` drops before lowering
    _uncached: Any = _mlir._uncacheable_primitives  # lowered again at each equation
    _user_frames: Any = _source_info.user_frames
except (ImportError, AttributeError):  # pragma: no cover
    _FlatCallback = _dce = _uncached = _user_frames = None
    _CALLBACKS = ()
    stop_sharing("its callbacks cannot be read")


def open_jaxpr(j: Any) -> Any:
    """The jaxpr of a closed jaxpr, or the jaxpr itself (one class in JAX 0.11+)."""
    inner = getattr(j, "jaxpr", j)
    return inner if isinstance(inner, jex.Jaxpr) else j


def nested_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs in an equation's parameters (a `cond`'s branches, a loop's body)."""
    for value in params.values():
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, jex.Jaxpr | jex.ClosedJaxpr):
                yield v


def callbacks_in(jaxpr: Any) -> list[tuple[Callable, Any]] | None:
    """The Python function and `in_tree` of each `pure_callback` and `io_callback`
    a traced program's lowering holds, nested jaxprs included, in order. As JAX
    lowers it: after the dead-code elimination `jit` makes (an unused
    `pure_callback` is dropped), and each equation once per lowering cache key (an
    inner `jax.jit` called twice is one function). Read from the equations, which
    hold them on every platform (a TPU's lowering holds only opaque objects). None
    if one holds a callback of another kind (`jax.debug.callback`,
    `inspect_array_sharding`)."""
    if _dce is None:  # pragma: no cover
        return None
    inner, found, lowered = open_jaxpr(jaxpr), [], set()
    stack = _dce(inner, [True] * len(inner.outvars))[0].eqns[::-1]
    while stack:  # each equation, then those of the jaxprs it holds, in order
        eqn = stack.pop()
        if (key := _lowered_once(eqn)) is not None and key in lowered:
            continue
        lowered.add(key)
        host = eqn.params.get("callback")
        if host is not None:
            if eqn.primitive not in _CALLBACKS or type(host) is not _FlatCallback:
                return None
            found.append((host.callback_func, host.in_tree))
        for nested in reversed(list(nested_jaxprs(eqn.params))):
            stack += open_jaxpr(nested).eqns[::-1]
    return found


_JIT_FUNCTION: Final = "name jaxpr in_shardings out_shardings in_layouts out_layouts"


def _lowered_once(eqn: Any) -> Any:
    """What JAX's lowering emits once per module, for equations equal in it (None:
    each equation anew): an equation (`mlir.LoweringCacheKey`), or an inner `jit`'s
    function (`pjit._pjit_lowering`; shardings compared with `==`, which JAX's
    semantic comparison may find equal more often: then a count differs)."""
    if eqn.primitive.name in ("jit", "pjit"):
        return tuple(eqn.params.get(k) for k in _JIT_FUNCTION.split())
    if eqn.primitive in _uncached:
        return None
    avals = tuple(v.aval for v in eqn.invars)
    params = tuple(sorted(eqn.params.items()))
    return eqn.primitive, eqn.ctx, avals, frozenset(eqn.effects), params


# `eqx.error_if` stages host callbacks defined beside it (in `equinox._errors`):
# `raises`, and on a TPU, whose runtime may not raise, `tpu_msg`.
ERROR_CHECKS: Final = eqx.error_if.__module__


_NOT_USER: Final = tuple(
    os.path.dirname(str(f)) + os.sep for f in (eqx.__file__, __file__)
)


# Modules whose frames are not the user's, where a line of the user's is named.
_OURS: Final = ("eqx_static.", "jax.", "jaxlib.", "equinox.", "jaxtyping.", "beartype.")


def user_line() -> str:
    """The user's line that called into this package (through JAX, Equinox and the
    type checks): file name (no directory) and line."""
    frame = sys._getframe(1)  # the code `es.jit` writes has no module: it is ours
    while frame.f_back and frame.f_globals.get("__name__", _OURS[0]).startswith(_OURS):
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def user_frames(source_info: Any) -> list[tuple[str, int, str]]:
    """File, line and function of the frames that traced an equation, innermost
    first, outside JAX, Equinox and this package."""
    if _user_frames is None:  # pragma: no cover
        return []
    return [
        (f.file_name, f.start_line, f.function_name)
        for f in _user_frames(source_info.traceback)
        if not f.file_name.startswith(_NOT_USER)
    ]


# ----------------------------------------------------------------------------------
# jaxtyping (0.3.3 - 0.3.x). Without `_NamedDim`, a mismatch of one dimension across
# fields is reported as jaxtyping reports it, not named.

_NamedDim: Final = _private("jaxtyping._array_types", "_NamedDim")


def is_named_dim(dim: Any) -> bool:
    """Whether a dimension of a jaxtyping annotation is a plain named one (`"n"`)."""
    return type(dim) is _NamedDim  # never None's type


def jaxtyped_class(cls: type) -> bool:
    """Whether `cls` is `@jaxtyped`: nothing marks the class, but its `__init__` is
    then jaxtyping's wrapper."""
    module = getattr(cls.__init__, "__globals__", {}).get("__name__")
    return module == jaxtyping.jaxtyped.__module__
