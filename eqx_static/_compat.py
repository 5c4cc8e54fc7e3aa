"""Every private name of JAX, Equinox and jaxtyping, and every CPython detail, that
`eqx_static` relies on, in one place. `tests/test_compat.py` checks that each still
means what the library relies on, so that a release that changes one fails there,
by name, before it fails somewhere deep in a call."""

import dataclasses
import dis
import operator
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import jax
import jax.extend.core as jex
import jaxtyping


SUPPORTED: Final = "equinox >=0.13.3,<0.14"

try:  # equinox 0.13.3
    import equinox._errors as _eqx_errors
    import equinox._jit as _eqx_jit
    from equinox._module import _flatten, _module, _prebuilt

    # `eqx.error_if` raises inside a callback; `eqx.filter_jit` turns that into an
    # `EquinoxRuntimeError` with this message, from what the callback left (read by
    # `equinox_error_info`), and hides JAX's log of the failed callback with this.
    on_error_message: Final[str] = _eqx_jit._on_error_msg
    FilterCallback = _eqx_jit._FilterCallback
    # Equinox's flatten: a module whose instance dictionary holds more or fewer
    # entries than it has fields carries these attributes in its tree structure,
    # `MISSING` for those absent; unflatten sets all of them.
    EQX_MISSING: Final = _flatten.MISSING
    WRAPPER_FIELD_NAMES: Final = _flatten.WRAPPER_FIELD_NAMES
    # Equinox lets a module assign its own fields while it is in this set: that is
    # how `__init__` works, and how `es.edit` makes its copies editable.
    currently_initialising: Final = _module._currently_initialising
    BoundMethod = _prebuilt.BoundMethod  # what `module.method` is: a pytree
except (ImportError, AttributeError) as e:  # pragma: no cover
    raise ImportError(
        f"eqx_static supports {SUPPORTED}; equinox {eqx.__version__} is installed, "
        f"which lacks a name it needs ({e}). Install a supported equinox: "
        f'`pip install "{SUPPORTED.replace(" ", "")}"`.'
    ) from None

# Captured by `eqx.error_if`'s callbacks for the error message only.
EQUINOX_MESSAGE_ONLY: Final = frozenset({"stack"})
# The ids in `currently_initialising`, as a dict read in C. (Equinox keeps a copied
# or unpickled module there for good: test membership, not size.)
initialising_ids: Final[dict[int, Any]] = currently_initialising._dict  # pyright: ignore[reportAttributeAccessIssue]
module_eq: Final[Callable[..., Any]] = eqx.Module.__eq__


def equinox_error_info() -> tuple[str, list] | None:
    """The message and trace-time stack the last failing `eqx.error_if` left."""
    return _eqx_jit.last_error_info


def is_equinox_error_callback(fn: Any) -> bool:
    """Whether `fn` is one of the functions `eqx.error_if` calls back into."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == _eqx_errors.__file__


# ----------------------------------------------------------------------------------
# JAX.

from jax._src import (  # noqa: E402  (grouped with its reason)
    api as _api,
    callback as _callback,
    config as _config,
    core as _core,
    pjit as _pjit,
    source_info_util as _source_info,
    traceback_util as _traceback_util,
    tree_util as _tree_util,
)
from jax._src.interpreters import pxla as _pxla  # noqa: E402


try:  # jax 0.10
    from jax._src.lib import _jax

    _pjit_function: Callable[..., Any] = _jax.pjit
except ImportError:  # jax 0.9
    from jax._src.lib import xla_client as _xc

    _pjit_function = _xc._xla.pjit  # pyright: ignore[reportAttributeAccessIssue]

# The logger on which JAX reports an exception raised in a host callback.
CALLBACK_LOGGER: Final = "jax._src.callback"
# The `jax.monitoring` event around every XLA compile: a scalar is recorded when it
# starts, a duration when it ends, each with `fun_name="jit(<function name>)"`.
COMPILE_EVENT: Final = "/jax/core/compile/backend_compile_duration"
JaxRuntimeError: Final = jax.errors.JaxRuntimeError
# `jax.jit` itself. Under `EQX_ON_ERROR=breakpoint` Equinox replaces the name
# `jax.jit` with a function (for JAX issue #16732) that has no `.trace`.
jax_jit: Final = _api.jit


def under_transformation() -> bool:
    """Whether a call here is bound into a trace (`grad`, `vmap`, an outer `jit`),
    concrete arguments or not: its function may close over that trace's values."""
    return not isinstance(_core.trace_ctx.trace, _core.EvalTrace)


def jit_is_replaced() -> bool:
    return jax.jit is not jax_jit


def hide_frames(file: str) -> None:
    """Leave `file`'s frames out of the tracebacks JAX filters, as Equinox does."""
    _traceback_util.register_exclusion(file)


# A lowering (`Lowered._lowering`, a `pxla.MeshComputation`) holds what `jax.jit`
# compiles and runs: `jitted.trace(...).lower()` and a later `jitted(...)` with the
# same arguments share it (JAX caches both), and its executable is kept on it. So the
# miss path can compile it, or install the executable of an identical program, and
# the call that follows runs that.
_LOWERING_ATTRIBUTES: Final = (
    "_executable compile_args stablehlo _donated_invars _compiler_options_kvs "
    "_device_list _platforms"
).split()


def lowering_of(lowered: Any) -> Any:
    """The computation in a `jax.stages.Lowered` (None if not one we can handle)."""
    lowering = getattr(lowered, "_lowering", None)
    if lowering is None or not all(hasattr(lowering, a) for a in _LOWERING_ATTRIBUTES):
        return None
    return lowering


def program_options(lowering: Any) -> tuple:
    """What a lowering compiles with besides its module and compile arguments."""
    return (
        ("donated", tuple(lowering._donated_invars)),
        ("compiler_options", tuple(lowering._compiler_options_kvs)),
        ("devices", tuple(lowering._device_list)),
        ("platforms", tuple(lowering._platforms)),
    )


def executable_of(lowering: Any) -> Any:
    """The executable compiled for a lowering (None before `compile()`)."""
    return lowering._executable


def set_executable(lowering: Any, executable: Any) -> None:
    """Make the call that follows a lowering run `executable`, compiling nothing."""
    lowering._executable = executable


def xla_executable(executable: Any) -> Any:
    """The XLA executable inside JAX's: JAX's own caches may wrap one in two."""
    return getattr(executable, "xla_executable", executable)


_CPP_CACHE_KEYS: Final = (
    "donate_argnums donate_argnames device backend in_shardings_treedef "
    "in_shardings_leaves out_shardings_treedef out_shardings_leaves "
    "in_layouts_treedef in_layouts_leaves out_layouts_treedef out_layouts_leaves "
    "compiler_options_kvs"
).split()


def dispatcher(name: str, fun: Callable, cache_miss: Callable, donate: tuple) -> Any:
    """JAX's C++ `PjitFunction` dispatcher, built as `pjit._cpp_pjit` builds one: a
    miss calls `cache_miss(*args)`, which returns what `jit_miss` does; under
    `jax.disable_jit()` it calls `fun(*args)`."""
    ji = jax_jit(fun, donate_argnums=donate)._jit_info  # pyright: ignore[reportAttributeAccessIssue]
    key = _pxla.JitGlobalCppCacheKeys(**{k: getattr(ji, k) for k in _CPP_CACHE_KEYS})
    cpp_cache = _pjit._get_cpp_global_cache(key.contains_explicit_attributes)  # pyright: ignore[reportArgumentType]
    return _pjit_function(
        name, fun, cache_miss, ji.static_argnums, ji.static_argnames, key,
        _tree_util.dispatch_registry, _pxla.cc_shard_arg, cpp_cache,
    )  # fmt: skip


def jit_miss(jitted: Any, *args: Any) -> tuple:
    """A `jax.jit`'s own cache miss (trace, lower, compile or read the executable set
    on the lowering, run): `(outputs, fastpath_data, rebuild)` for a dispatcher."""
    return jitted._cache_miss(*args)


def trace_context() -> Any:
    """What JAX keys its caches by besides the arguments (x64, default device, ...)."""
    return _config.trace_context()


def pgle_enabled() -> bool:
    """Whether JAX profiles programs and compiles them again with the profile."""
    return bool(jax.config.jax_enable_pgle) and jax.config.jax_pgle_profiling_runs > 0  # pyright: ignore[reportAttributeAccessIssue]


def open_jaxpr(j: Any) -> Any:
    return j.jaxpr if isinstance(j, jex.ClosedJaxpr) else j


def nested_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs in an equation's parameters (a `cond`'s branches, a loop's body)."""
    for value in params.values():
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, jex.Jaxpr | jex.ClosedJaxpr):
                yield v


def flat_callback(cb: Any) -> tuple[Callable, Any] | None:
    """The function and `in_tree` of a callback equation's `callback`, or None."""
    if type(cb) is _callback._FlatCallback:
        return cb.callback_func, cb.in_tree
    return None


_NOT_USER: Final = tuple(
    os.path.dirname(str(f)) + os.sep for f in (eqx.__file__, __file__)
)


def user_frame(source_info: Any) -> tuple[str, int, str] | None:
    """File, line and function of the innermost frame that traced an equation
    outside JAX, Equinox and this package."""
    for frame in _source_info.user_frames(source_info.traceback):
        if not frame.file_name.startswith(_NOT_USER):
            return frame.file_name, frame.start_line, frame.function_name
    return None


# ----------------------------------------------------------------------------------
# jaxtyping (0.3.3 - 0.3.x).

from jaxtyping._array_types import _NamedDim  # noqa: E402  (grouped with its reason)


def is_named_dim(dim: Any) -> bool:
    """Whether a dimension of a jaxtyping annotation is a plain named one (`"n"`)."""
    return type(dim) is _NamedDim


def jaxtyped_class(cls: type) -> bool:
    """Whether `cls` is `@jaxtyped`: nothing marks the class, but its `__init__` is
    then jaxtyping's wrapper."""
    init = getattr(cls, "__init__", None)
    module = getattr(init, "__globals__", {}).get("__name__")
    return module == jaxtyping.jaxtyped.__module__


# ----------------------------------------------------------------------------------
# CPython. A dataclass's `__eq__` compares its fields as tuples with `==`; the key
# may compare them by type and value instead, but only if `__eq__` is that one and
# not the user's. `dataclasses` marks nothing on the function it writes, so it is
# recognised by its code: the same bytecode, names and constants as the `__eq__`
# this interpreter writes for a dataclass with the same fields.

_generated_eq: Final = weakref.WeakKeyDictionary[type, bool]()


def generated_dataclass_eq(t: type) -> bool:
    """Whether `t.__eq__` is the one `dataclasses` wrote for `t` (cached)."""
    try:
        return _generated_eq[t]
    except KeyError:
        found = _generated_eq[t] = _is_generated_eq(t)
        return found
    except TypeError:  # not weakly referenceable
        return _is_generated_eq(t)


def _is_generated_eq(t: type) -> bool:
    params = getattr(t, "__dataclass_params__", None)
    eq = vars(t).get("__eq__") if params is not None and params.eq else None
    code = getattr(eq, "__code__", None)
    if code is None:
        return False
    fields = [
        (f.name, object, dataclasses.field(compare=f.compare))
        for f in dataclasses.fields(t)
    ]
    ref = dataclasses.make_dataclass("_Probe", fields, eq=True).__eq__.__code__
    parts = operator.attrgetter("co_code", "co_names", "co_consts", "co_varnames")
    return parts(code) == parts(ref)


# A closure cell can be rebound by the frame that made it (an assignment run again,
# in a loop or a later statement) and by any function nested in that frame's code
# that declares the name `nonlocal` and assigns it. Both are in the bytecode: a
# cell is provably bound once if the code that owns it stores it at most once,
# outside any loop, and no code nested in it stores it. The owner is found among
# the code objects reachable from the function's module (functions and classes,
# at any depth); a function made elsewhere (by `exec`, say) is not provable.

_BACKWARD: Final = frozenset({"JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"})
_parents: Final[dict[str, dict[types.CodeType, types.CodeType]]] = {}


def cell_bound_once(fn: types.FunctionType, name: str) -> bool:
    """Whether the closure cell `name` of `fn` provably keeps its value forever."""
    owner: types.CodeType | None = fn.__code__
    module = fn.__module__ or ""
    while owner is not None and name not in owner.co_cellvars:
        parents = _parents.get(module)
        if parents is None or owner not in parents:  # a module grows: look again
            parents = _parents[module] = _code_tree(module)
        owner = parents.get(owner)
    if owner is None:
        return False
    stores = _stores(owner, name)
    jumps = [i for i in dis.get_instructions(owner) if i.opname in _BACKWARD]
    if len(stores) > 1 or any(j.argval <= s < j.offset for j in jumps for s in stores):
        return False  # stored twice, or in a loop
    return not any(_stores(c, name) for _, c in _nested(owner) if name in c.co_freevars)


def _stores(code: types.CodeType, name: str) -> list[int]:
    return [
        i.offset
        for i in dis.get_instructions(code)
        if i.opname in ("STORE_DEREF", "DELETE_DEREF") and i.argval == name
    ]


def _nested(code: types.CodeType) -> Iterator[tuple[types.CodeType, types.CodeType]]:
    """`(parent, child)` for each code object nested in `code`, at any depth."""
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield code, c
            yield from _nested(c)


def _code_tree(name: str) -> dict[types.CodeType, types.CodeType]:
    """The parent of each code object reachable from module `name`."""
    module = sys.modules.get(name)
    stack = list(vars(module).values()) if module is not None else []
    parents: dict[types.CodeType, types.CodeType] = {}
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, type):
            if v.__module__ == name:
                stack += vars(v).values()
            continue
        if isinstance(v, types.FunctionType) and v.__module__ == name:
            parents.update((c, p) for p, c in _nested(v.__code__))
        for attr in ("__wrapped__", "__func__", "fn", "fget", "fset"):
            inner = getattr(v, attr, None)
            if inner is not None:
                stack.append(inner)
    return parents
