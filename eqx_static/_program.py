"""Programs: when two compile keys lowered to the same program, one executable
serves both.

A new compile key is traced and lowered anyway; the lowered program is what the
key means to XLA. Two lowerings are the same program only when that is provable:

- the same module text, printed with every constant in full and without source
  locations (which are not part of the program);
- the same compile arguments: input and output avals (weak types included),
  shardings, layouts, devices, kept inputs, effects, donation and compile options;
- the same host callbacks. A callback's Python function is not in the module text,
  so two callbacks are the same only if they are the same object, or the same code
  over captured values that are themselves the same (see `same`).

Anything that cannot be compared is treated as different: it compiles.
"""

import dataclasses
import functools
import hashlib
import re
import types
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ._compat import lowering_of, nested_jaxprs, open_jaxpr, program_options
from ._fields import is_module_type
from ._key import ARRAY_TYPES
from ._typed import typed


class Fingerprint(NamedTuple):
    """What decides whether two lowerings are one program."""

    digest: bytes  # SHA-256 of `text`: the look-up key
    text: bytes  # the module, constants in full, no locations
    arguments: tuple  # compile arguments other than callbacks, compared by `==`
    callbacks: tuple  # host callbacks and objects kept alive, compared by `same`


class Program:
    """One XLA compile: its number among this function's compiles (1-based), what
    it was compiled from, and the executable every lowering that shares it runs."""

    __slots__ = ("executable", "fingerprint", "number")

    def __init__(self, number: int, fp: Fingerprint | None, executable: Any):
        self.number = number
        self.fingerprint = fp  # None: unreadable, so never shared
        self.executable = executable

    @property
    def has_callbacks(self) -> bool:
        """Whether the program calls back into Python while it runs (as
        `eqx.error_if` does), or might (when it could not be read)."""
        return self.fingerprint is None or bool(self.fingerprint.callbacks)


# Compile arguments that do not change what the executable computes (debug names, the
# profiler), and the callbacks, which are compared through their Python functions.
# Every other one is compared; an unknown one with `==`.
_NOT_PROGRAM: Final = frozenset(
    {"all_args_info", "pgle_profiler", "host_callbacks", "keepalive"}
)


def fingerprint(jaxpr: Any, lowered: Any) -> Fingerprint | None:
    """The fingerprint of a traced call's closed `jaxpr` and its `jax.stages.Lowered`,
    or None if it cannot be read (then the program is never shared)."""
    lowering = lowering_of(lowered)
    if lowering is None:
        return None
    args = lowering.compile_args
    callbacks = callbacks_of(jaxpr)
    if len(callbacks) != len(args.get("host_callbacks") or ()):
        return None  # a host callback whose Python function cannot be found
    text = lowering.stablehlo().operation.get_asm(
        binary=True, enable_debug_info=False, large_elements_limit=None
    )
    arguments = tuple(
        (name, _comparable(args[name]))
        for name in sorted(args)
        if name not in _NOT_PROGRAM
    )
    arguments += program_options(lowering)
    kept = tuple(args.get("keepalive") or ())
    return Fingerprint(hashlib.sha256(text).digest(), text, arguments, callbacks + kept)


def _comparable(v: Any) -> Any:
    """A compile argument as a value `==` can compare (a lowering-state object by
    its attributes)."""
    if isinstance(v, list):
        return tuple(map(_comparable, v))
    if hasattr(v, "__dict__") and type(v).__eq__ is object.__eq__:
        return (type(v), tuple(sorted(vars(v).items())))
    return v


def same_program(a: Fingerprint, b: Fingerprint) -> bool:
    """Whether two fingerprints are provably the same program."""
    if a.digest != b.digest or a.text != b.text:
        return False
    try:
        if a.arguments != b.arguments:
            return False
    except Exception:  # a comparison that cannot be made: not the same
        return False
    return same(a.callbacks, b.callbacks)


def structure(text: bytes) -> bytes:
    """A digest of the module with its constants masked: two programs with the
    same structure differ only in baked-in values."""
    return hashlib.sha256(_CONSTANT.sub(b"dense<>", text)).digest()


_CONSTANT: Final = re.compile(rb"dense<[^>]*>")


# ----------------------------------------------------------------------------------
# Host callbacks: the Python functions a program calls while it runs.


def callbacks_of(jaxpr: Any) -> tuple:
    """The `callback` parameters of the callback equations of a closed jaxpr and of
    the jaxprs nested in it (each nested jaxpr once, as it is lowered once)."""
    found: list = []
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in open_jaxpr(j).eqns:
            params = eqn.params
            if "callback" in params:
                found.append(params["callback"])
            stack.extend(reversed(list(nested_jaxprs(params))))
    return tuple(found)


def same(a: Any, b: Any) -> bool:
    """Whether `a` and `b` provably behave the same when called.

    The same object; or functions with the same code and globals whose captured
    values (closure cells, defaults, attributes) are the same; partials and bound
    methods of the same; tuples of the same; frozen dataclasses and modules whose
    fields are the same; other immutable values equal by type and value, as static
    values in the compile key are. What can change after the trace (a list, a dict,
    an array, an object compared by identity) is the same only as itself: a callback
    that appends to a list it captured must not append to another list. When in
    doubt, not the same."""
    try:
        return _same(a, b, set(), 0)
    except Exception:  # an `__eq__` that raises, say: not provably the same
        return False


_MAX_DEPTH: Final = 64


def _same(a: Any, b: Any, seen: set[tuple[int, int]], depth: int) -> bool:
    if a is b:
        return True
    t = type(a)
    if t is not type(b) or depth > _MAX_DEPTH:
        return False
    pair = (id(a), id(b))
    if pair in seen:  # a cycle: equal so far, so equal (as `==` on a cycle)
        return True
    seen.add(pair)
    compare = _COMPARE.get(t) or _compare_for(t)
    return compare(a, b, seen, depth + 1)


def _same_items(a: Any, b: Any, seen: set, depth: int) -> bool:
    return len(a) == len(b) and all(_same(x, y, seen, depth) for x, y in zip(a, b))


def _same_function(a: types.FunctionType, b: types.FunctionType, seen, depth) -> bool:
    return (
        a.__code__ is b.__code__
        and a.__globals__ is b.__globals__
        and _same_items(_cells(a), _cells(b), seen, depth)
        and _same(a.__defaults__, b.__defaults__, seen, depth)
        and _same(_frozen(a.__kwdefaults__), _frozen(b.__kwdefaults__), seen, depth)
        and _same(_frozen(a.__dict__), _frozen(b.__dict__), seen, depth)
    )


def _cells(f: types.FunctionType) -> tuple:
    out = []
    for c in f.__closure__ or ():
        try:
            out.append(c.cell_contents)
        except ValueError:  # an empty cell
            out.append(_EMPTY)
    return tuple(out)


_EMPTY: Final = object()


def _frozen(d: dict | None) -> tuple:
    """A function's own dict (defaults, attributes): it belongs to the function,
    so it is compared by its items, sorted by name."""
    return tuple(sorted(d.items())) if d else ()


def _same_partial(a: functools.partial, b: functools.partial, seen, depth) -> bool:
    return (
        _same(a.func, b.func, seen, depth)
        and _same(a.args, b.args, seen, depth)
        and _same(_frozen(a.keywords), _frozen(b.keywords), seen, depth)
    )


def _same_method(a: types.MethodType, b: types.MethodType, seen, depth) -> bool:
    return _same(a.__func__, b.__func__, seen, depth) and _same(
        a.__self__, b.__self__, seen, depth
    )


def _same_fields(a: Any, b: Any, seen: set, depth: int) -> bool:
    """Frozen dataclasses and modules, field by field (their own `__eq__` compares
    the functions they hold by identity, and their arrays by value)."""
    da, db = getattr(a, "__dict__", None), getattr(b, "__dict__", None)
    if da is not None and db is not None:  # unset fields and wrapper attributes too
        return _same(_frozen(da), _frozen(db), seen, depth)
    names = [f.name for f in dataclasses.fields(a)]
    return _same_items(
        tuple(getattr(a, n, _EMPTY) for n in names),
        tuple(getattr(b, n, _EMPTY) for n in names),
        seen,
        depth,
    )


def _identical(a: Any, b: Any, seen: set, depth: int) -> bool:
    return False  # `a is b` was checked first


def _equal_values(a: Any, b: Any, seen: set, depth: int) -> bool:
    return typed(a) == typed(b)


_Compare = Callable[[Any, Any, set, int], bool]
_COMPARE: Final[dict[type, _Compare]] = {
    types.FunctionType: _same_function,
    functools.partial: _same_partial,
    types.MethodType: _same_method,
    tuple: _same_items,
}


def _compare_for(t: type) -> _Compare:
    """How to compare two values of type `t` (cached per type)."""
    if issubclass(t, ARRAY_TYPES):
        compare = _identical  # mutable (NumPy) or traced: only itself
    elif is_module_type(t) or _frozen_dataclass(t):
        compare = _same_fields
    elif issubclass(t, tuple) and t.__eq__ is tuple.__eq__:  # named tuples
        compare = _same_items
    elif t.__eq__ is object.__eq__ or t.__hash__ is None:
        compare = _identical  # compared by identity, or mutable
    else:
        compare = _equal_values
    _COMPARE[t] = compare
    return compare


def _frozen_dataclass(t: type) -> bool:
    params = getattr(t, "__dataclass_params__", None)
    return params is not None and params.frozen
