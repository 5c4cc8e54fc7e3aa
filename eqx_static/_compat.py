"""Every private name of JAX, Equinox and jaxtyping, and every CPython detail, that
`eqx_static` relies on, in one place.

Each is checked on import, so that an unsupported release fails here, with the
supported range, rather than somewhere deep in a call. `tests/test_compat.py`
checks that each still means what the library relies on."""

import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import jax
import jax.extend.core as jex
import jaxtyping


SUPPORTED: Final = "equinox >=0.13.3,<0.14"

try:
    # `eqx.error_if` raises inside a callback; `eqx.filter_jit` turns that into an
    # `EquinoxRuntimeError` with this message, from what the callback left here,
    # and hides JAX's log of the failed callback with this filter.
    import equinox._jit as _eqx_jit  # equinox 0.13
    from equinox._jit import (
        _FilterCallback as FilterCallback,
        _on_error_msg as on_error_message,
    )

    # Equinox's flatten: a module whose instance dictionary holds more or fewer
    # entries than it has fields (a field left unset by `__init__`, the wrapper
    # attributes of `eqx.module_update_wrapper`) carries these attributes in its
    # tree structure, `MISSING` for those absent; unflatten sets all of them.
    from equinox._module._flatten import (  # equinox 0.13.3
        MISSING as EQX_MISSING,
        WRAPPER_FIELD_NAMES as WRAPPER_FIELD_NAMES,
    )

    # Equinox lets a module assign its own fields while it is in this set: that is
    # how `__init__` works, and how `es.edit` makes its copies editable.
    from equinox._module._module import (
        _currently_initialising as currently_initialising,  # equinox 0.13
    )

    # What reading a method off a module gives (`module.method`): a pytree.
    from equinox._module._prebuilt import BoundMethod as BoundMethod  # equinox 0.13

except ImportError as e:  # pragma: no cover
    raise ImportError(
        f"eqx_static supports {SUPPORTED}; equinox {eqx.__version__} is installed, "
        f"which lacks a name it needs ({e}). Install a supported equinox: "
        f'`pip install "{SUPPORTED.replace(" ", "")}"`.'
    ) from None

module_eq: Final[Callable[..., Any]] = eqx.Module.__eq__

# The ids in `currently_initialising`, as a dict the key's walk reads in C: a module
# in it may still change, so its key is not memoised. (Equinox keeps a copied or
# unpickled module there for good: test membership, not size.)
initialising_ids: Final[dict[int, Any]] = currently_initialising._dict  # pyright: ignore[reportAttributeAccessIssue]


def equinox_error_info() -> tuple[str, list] | None:
    """The message and trace-time stack the last failing `eqx.error_if` left."""
    return _eqx_jit.last_error_info


# The marker `eqx.error_if` looks for in the frames of the call that traced it, to
# cut its stack there (a local variable of that name; see `equinox._jit._call`).
EQX_JIT_ID: Final = "__equinox_jit_id__"


# ----------------------------------------------------------------------------------
# JAX. A lowering (`jax.stages.Lowered`) holds the computation `jax.jit` compiles and
# then runs: `jitted.trace(...).lower()` and a later `jitted(...)` with the same
# arguments share it (JAX caches both the trace and the lowering), and its compiled
# executable is kept on it. So the miss path can compile it, or install an
# executable compiled for an identical program, and the call that follows runs that.
# (jax 0.8.1 - 0.10.2: `Lowered._lowering` is a `pxla.MeshComputation`.)

from jax._src import (  # noqa: E402  (grouped with its reason)
    api as _api,
    core as _core,
    traceback_util as _traceback_util,
)


def hide_frames(file: str) -> None:
    """Leave the frames of `file` out of the tracebacks JAX filters, as Equinox
    leaves out its own: an error in user code shows the user's frames."""
    _traceback_util.register_exclusion(file)


# The logger on which JAX reports an exception raised in a host callback (which is
# how `eqx.error_if` fails at run time).
CALLBACK_LOGGER: Final = "jax._src.callback"


# `jax.jit` itself. Under `EQX_ON_ERROR=breakpoint` Equinox replaces the name
# `jax.jit` with a function (its workaround for JAX issue #16732) that inlines a
# nested `jax.jit` and has no `.trace`; the miss path needs `.trace`, and stages a
# nested call through the replacement, as `eqx.filter_jit` does.
jax_jit: Final = _api.jit


def jit_is_replaced() -> bool:
    """Whether someone (Equinox's breakpoint mode) replaced `jax.jit`."""
    return jax.jit is not jax_jit


def lowering_of(lowered: Any) -> Any:
    """The computation inside a `jax.stages.Lowered`, or None if it is not one
    whose executable this library knows how to read and set."""
    lowering = getattr(lowered, "_lowering", None)
    if lowering is None or not all(hasattr(lowering, a) for a in _LOWERING_ATTRIBUTES):
        return None
    return lowering


_LOWERING_ATTRIBUTES: Final = (
    "_executable",
    "compile_args",
    "stablehlo",
    "_donated_invars",
    "_compiler_options_kvs",
    "_device_list",
    "_platforms",
)


def program_options(lowering: Any) -> tuple:
    """What a lowering compiles with besides its module and compile arguments."""
    return (
        ("donated", tuple(lowering._donated_invars)),
        ("compiler_options", tuple(lowering._compiler_options_kvs)),
        ("devices", lowering._device_list),
        ("platforms", tuple(lowering._platforms)),
    )


def executable_of(lowering: Any) -> Any:
    """The executable compiled for a lowering (None before `compile()`)."""
    return lowering._executable


def compiled_of(executable: Any) -> Any:
    """The XLA executable inside JAX's executable (two lowerings whose modules JAX
    found the same in its own caches share one, in two wrappers)."""
    return getattr(executable, "xla_executable", executable)


def set_executable(lowering: Any, executable: Any) -> None:
    """Make the call that follows a lowering run `executable`, compiling nothing."""
    lowering._executable = executable


def trace_state_clean() -> bool:
    """Whether this thread is outside any JAX transformation or trace."""
    return _core.trace_state_clean()


def cache_size(jitted: Any) -> int:
    """The number of compiled signatures in a `jax.jit` function's C++ cache."""
    return jitted._cache_size()


def open_jaxpr(j: Any) -> Any:
    return j.jaxpr if isinstance(j, jex.ClosedJaxpr) else j


def nested_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs in an equation's parameters (a `cond`'s branches, a loop's body)."""
    for value in params.values():
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, jex.Jaxpr | jex.ClosedJaxpr):
                yield v


JaxRuntimeError: Final = jax.errors.JaxRuntimeError


# ----------------------------------------------------------------------------------
# jaxtyping (0.3.3 - 0.3.x).

from jaxtyping._array_types import _NamedDim  # noqa: E402  (grouped with its reason)


def is_named_dim(dim: Any) -> bool:
    """Whether a dimension of a jaxtyping annotation is a plain named one (`"n"`),
    as opposed to a fixed size, `"..."`, `"*n"` or a symbolic expression."""
    return type(dim) is _NamedDim


def jaxtyped_class(cls: type) -> bool:
    """Whether `cls` was decorated with `@jaxtyped(typechecker=...)`: jaxtyping
    marks nothing on the class, but its `__init__` is then jaxtyping's wrapper."""
    init = getattr(cls, "__init__", None)
    module = getattr(init, "__globals__", {}).get("__name__")
    return module == jaxtyping.jaxtyped.__module__


# ----------------------------------------------------------------------------------
# CPython. A dataclass's `__eq__` compares its fields as tuples with `==`; the key
# may compare them by type and value instead, but only if `__eq__` is that one and
# not the user's. `dataclasses` marks nothing on the function it writes, so it is
# recognised by its code: the same bytecode, names and constants as the `__eq__`
# this interpreter writes for a dataclass with the same fields.


_generated_eq: Final[weakref.WeakKeyDictionary[type, bool]] = (
    weakref.WeakKeyDictionary()
)


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
    return _code_parts(code) == _code_parts(ref)


def _code_parts(code: Any) -> tuple:
    return (code.co_code, code.co_names, code.co_consts, code.co_varnames)


__all__ = [
    "EQX_JIT_ID",
    "EQX_MISSING",
    "on_error_message",
    "SUPPORTED",
    "WRAPPER_FIELD_NAMES",
    "CALLBACK_LOGGER",
    "BoundMethod",
    "FilterCallback",
    "JaxRuntimeError",
    "cache_size",
    "compiled_of",
    "currently_initialising",
    "equinox_error_info",
    "executable_of",
    "generated_dataclass_eq",
    "hide_frames",
    "initialising_ids",
    "is_named_dim",
    "jax_jit",
    "jaxtyped_class",
    "jit_is_replaced",
    "lowering_of",
    "module_eq",
    "nested_jaxprs",
    "open_jaxpr",
    "program_options",
    "set_executable",
    "trace_state_clean",
]
