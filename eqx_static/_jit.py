"""`es.jit`: the wrapper, its options and its hit path.

A call is keyed (`_key.py`) and looked up in the function's cache (`_cache.py`); a
hit calls the entry's own `jax.jit`, whose C++ dispatch checks the avals. Anything
else is a miss (`_miss.py`)."""

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, Final, Generic, Literal, overload, ParamSpec, TypeVar

import equinox as eqx
import jax

from ._aot import lower, Lowered
from ._bound import BoundJit, special_method
from ._budget import RecompileError
from ._cache import Cache, CacheInfo, CompileInfo, Entry, shared_cache
from ._compat import cache_size, hide_frames, jax_jit
from ._errors import reporting_errors, TracedFieldError
from ._explain import find_unhashable, leaf_origins
from ._fields import is_es_module_class
from ._key import (
    argname,
    array_types,
    CyclicValue,
    deep,
    Key,
    key_and_leaves,
    LEAF,
    node,
    top_node,
)
from ._miss import layout_miss, miss, quiet_donation, Refused, traced_function
from ._outputs import combine


hide_frames(__file__)

logger: Final = logging.getLogger("eqx_static")

_P = ParamSpec("_P")
_R = TypeVar("_R")
Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
_DONATE: Final = ("none", "all", "all-except-first", "warn", "warn-except-first")


_MSG_DECORATOR_ORDER: Final = """An `es.jit` wrapper has no `__globals__`: it is not a plain function.
If this comes from `@jaxtyped(...)` above `@es.jit`:
`@jaxtyped` must go below `@es.jit`, not above it.

Write
```
@es.jit
@jaxtyped(typechecker=beartype)
def f(self, x: Float[Array, "n"]) -> Float[Array, "n"]: ...
```
so that the annotations are checked once, while tracing, and a cache-hit call runs
no check at all. Above `@es.jit`, the check would run on every call.
"""
_MSG_CLASSMETHOD: Final = """`@es.jit` cannot wrap a `classmethod`: put
`@classmethod` above it:
```
@classmethod
@es.jit
def f(cls, x): ...
```
"""


class _Signature:
    """Binds a call's arguments as `inspect.Signature.bind` would, with defaults
    applied, so that `f(x)`, `f(x, 2.0)` and `f(x, scale=2.0)` are one call."""

    def __init__(self, fn: Callable):
        try:
            self.sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.sig = None
            self.n, self.names, self.tail = -1, (), ()
            return
        params = list(self.sig.parameters.values())
        positional = [
            p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        simple = len(positional) == len(params)  # no *args, keyword-only, **kwargs
        self.n = len(positional) if simple else -1
        self.names = tuple(p.name for p in positional)
        tail = []
        for p in reversed(positional):
            if p.default is p.empty:
                break
            tail.append(p.default)
        self.tail = tuple(reversed(tail))  # defaults of the trailing parameters

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        n = self.n
        if not kwargs and n >= 0 and n - len(self.tail) <= len(args) < n:
            return args + self.tail[len(args) - n :], kwargs
        if self.sig is None:
            return args, kwargs
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # let the function itself raise, as it would eagerly
        bound.apply_defaults()
        return bound.args, bound.kwargs


class _Jit(Generic[_P, _R]):
    """The wrapper returned by [`eqx_static.jit`][]."""

    def __init__(
        self,
        fn: Callable[_P, _R],
        donate: Donate,
        maxsize: int | None,
        max_compiles: int | None,
        warn_after: int | None,
    ):
        if isinstance(fn, classmethod):
            raise TypeError(_MSG_CLASSMETHOD)
        self._is_static = isinstance(fn, staticmethod)
        if isinstance(fn, staticmethod):
            fn = fn.__func__
        if not callable(fn):
            raise TypeError(
                f"`es.jit` takes a function or method, got {type(fn).__name__}."
            )
        _check_options(donate, maxsize, max_compiles, warn_after)
        functools.update_wrapper(self, fn)  # pyright: ignore[reportArgumentType]
        self.fn = fn
        self.qualname: str = getattr(fn, "__qualname__", repr(fn))
        self._donate = donate
        self.quiet_donation = donate in ("all", "all-except-first")
        self._max_compiles = max_compiles
        self._warn_after = warn_after
        self._signature = _Signature(fn)
        self._argnames = self._signature.names
        fn_leaves: list = []
        self._fn_node = node(fn, fn_leaves)
        self._fn_leaves = tuple(fn_leaves)
        self._options = (donate, maxsize, max_compiles, warn_after)
        identity = (self._fn_node, self._options)
        self.cache: Cache = shared_cache(fn, identity, maxsize)
        self._owner: type | None = None
        self._name: str | None = None
        self.method, self._call = self._make_call()

    # -- binding ---------------------------------------------------------------

    @property
    def __globals__(self) -> dict[str, Any]:
        # A wrapper has no globals. `@jaxtyped(...)` above `@es.jit` reads them first,
        # so the error names the order to use; `getattr(jit, "__globals__", d)` works.
        raise AttributeError(_MSG_DECORATOR_ORDER)

    def __set_name__(self, owner: type, name: str) -> None:
        self._owner, self._name = owner, name
        if (
            name.startswith("__")
            and name.endswith("__")
            and not self._is_static
            and is_es_module_class(owner)
            and owner.__module__ != "__main__"
        ):
            # `m(x)` looks `__call__` up on the class and calls a plain function
            # without binding anything: install one, saving the descriptor call.
            # (`es.Module.__getattribute__` still gives `m.__call__` as `BoundJit`.)
            # Not in `__main__`, whose classes cloudpickle copies by value: the
            # wrapper pickles, its closures do not.
            setattr(owner, name, special_method(self))

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None or self._is_static:
            return self
        return BoundJit(self.method, obj)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        __tracebackhide__ = True
        try:
            return self._call(args, kwargs)
        except eqx.EquinoxRuntimeError as e:
            e.__traceback__ = None  # as `eqx.filter_jit`: the user's frames only
            raise

    def __reduce__(self) -> Any:
        # By reference, as functions pickle: the wrapper holds a lock and a cache.
        # A wrapper that cannot be found by name (in a class or function defined in
        # `__main__` or a function body, copied by value by cloudpickle) is made
        # again from its function and options, and shares the cache here.
        owner, where = self._owner, getattr(self.fn, "__module__", None)
        if "<locals>" not in self.qualname and where != "__main__":
            return (getattr, (owner, self._name)) if owner else self.qualname
        return (_remake, (self.fn, *self._options))

    def __copy__(self) -> "_Jit[_P, _R]":
        return self

    def __deepcopy__(self, memo: dict) -> "_Jit[_P, _R]":
        return self

    def __repr__(self) -> str:
        return f"<es.jit {self.qualname}>"

    # -- the hot path ----------------------------------------------------------

    def _make_call(self) -> tuple[Callable, Callable]:
        """The call paths as closures: no attribute look-ups on a cache hit.
        `method(obj, *args)` is the path of `obj.f(*args)`."""
        cache = self.cache
        entries, local = cache.entries, cache.local
        signature = self._signature
        n = signature.n
        fn_leaves = self._fn_leaves
        lru = cache.maxsize is not None
        arrays = array_types  # the concrete array types seen so far

        def method(obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            if kwargs or len(args) != n - 1:
                return call((obj, *args), kwargs)
            leaves = [*fn_leaves]
            try:
                nodes = [top_node(obj, leaves)]
                for a in args:
                    if type(a) in arrays:
                        leaves.append(a)
                        nodes.append(LEAF)
                    else:
                        nodes.append(node(a, leaves))
            except RecursionError:  # deeply nested: the general path copes
                return call((obj, *args), kwargs)
            key = tuple.__new__(Key, (tuple(nodes), (), ()))
            try:
                return dispatch(key, leaves, (obj, *args), kwargs)
            except eqx.EquinoxRuntimeError as e:
                e.__traceback__ = None  # as `eqx.filter_jit`: the user's frames only
                raise

        def call(args: tuple, kwargs: dict[str, Any]) -> Any:
            __tracebackhide__ = True
            if kwargs or len(args) != n:
                args, kwargs = signature.bind(args, kwargs)
            try:
                key, leaves = key_and_leaves(args, kwargs, fn_leaves)
            except CyclicValue as e:
                raise _cyclic_error(self.qualname, self._argnames, e) from None
            return dispatch(key, leaves, args, kwargs)

        def dispatch(key: Key, leaves: list, args: tuple, kwargs: dict) -> Any:
            __tracebackhide__ = True
            try:
                entry = entries.get(key)
            except TypeError:  # an unhashable static value: say which
                raise TypeError(_unhashable_message(self.qualname, key)) from None
            except RecursionError:  # keys nested deeper than the limit compare
                entry = deep(entries.get, key)
            if entry is None or entry.busy:
                return miss(self, key, leaves, args, kwargs)
            try:
                out = entry.call(*leaves)
            except Refused as r:  # new shapes, a transformation, or `disable_jit`
                if r.entry is not entry:
                    raise
                return miss(self, key, leaves, args, kwargs)
            except BaseException:
                cache.count_hit()  # it ran a compiled program, which raised
                raise
            if cache_size(entry.jitted) != entry.size:  # more signatures than made
                layout_miss(self, entry, leaves, args)
            else:
                try:
                    local.hits[0] += 1
                except AttributeError:
                    cache.count_hit()
                if lru:
                    cache.touch(key)
            return combine(*out) if type(out) is tuple else out

        method.es_jit = self  # pyright: ignore[reportFunctionMemberAccess]
        return method, call

    # -- entries ---------------------------------------------------------------

    def make_jitted(self, key: Any, leaves: list) -> Callable[[Entry], Any]:
        """How to make the `jax.jit` of a new entry for the call `key`."""
        donated = _donated(self, key, leaves)

        def make(entry: Entry) -> Any:
            return jax_jit(traced_function(self, entry), donate_argnums=donated)

        return make

    def call_for(self, entry: Entry) -> Callable:
        """What a hit on `entry` calls: its `jax.jit`, made to raise Equinox's
        run-time errors if a program of it calls back into Python, and to hide
        JAX's unusable-donation warning if `donate` says so."""
        call = entry.jitted
        if any(p.has_callbacks for p in entry.programs.values()):
            call = reporting_errors(call)
        if self.quiet_donation:
            call = _quietly(call, self)
        return call

    def name(self, args: tuple) -> str:
        """`Class.method` for a method called on a module, else the qualname."""
        short = getattr(self.fn, "__name__", "fn")
        if (
            self._owner is not None
            and args
            and hasattr(args[0], "__dataclass_fields__")
        ):
            return f"{type(args[0]).__qualname__}.{short}"
        return self.qualname

    def leaves_of(self, args: tuple, kwargs: dict[str, Any]) -> tuple[Key, list]:
        """The key and traced leaves of a call, as the hot path computes them."""
        args, kwargs = self._signature.bind(args, kwargs)
        return key_and_leaves(args, kwargs, self._fn_leaves)

    # -- introspection ---------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower the call for these arguments ahead of time.

        Returns an object with JAX's `as_text()` and `cost_analysis()`, whose
        `compile()` gives a callable that takes the same arguments as the wrapper.
        """
        return lower(self, args, kwargs)

    def lower_bound(self, bound: tuple, args: tuple, kwargs: dict) -> Lowered:
        """`lower` for a method bound to an instance: the compiled callable takes
        the arguments after `bound`, as the bound method does."""
        return lower(self, args, kwargs, bound)

    def cache_info(self) -> CacheInfo:
        """Hits, misses (calls that traced), `maxsize` and entries held."""
        return self.cache.info()

    def compile_info(self) -> CompileInfo:
        """XLA compiles since the cache was cleared, the programs held now (keys
        whose programs are the same share one), and the seconds spent compiling."""
        return self.cache.compile_info()

    def cache_clear(self) -> None:
        """Drop every compiled entry and program, and reset the statistics."""
        self.cache.clear()


def _quietly(call: Callable, wrapper: Any) -> Callable:
    def quiet(*leaves: Any) -> Any:
        __tracebackhide__ = True
        with quiet_donation(wrapper):
            return call(*leaves)

    return quiet


def _remake(fn: Any, *options: Any) -> "_Jit":
    return _Jit(fn, *options)


def _donated(self: Any, key: Key, leaves: list) -> tuple[int, ...]:
    """The positions of the leaves whose buffers `donate` gives to XLA."""
    if self._donate == "none":
        return ()
    skip = 0
    if self._donate.endswith("except-first") and key.args:
        skip = len(self._fn_leaves) + _count_leaves(key.args[0])
    return tuple(
        i
        for i, x in enumerate(leaves)
        if (i >= skip or i < len(self._fn_leaves)) and isinstance(x, jax.Array)
    )


def _count_leaves(n: Any) -> int:
    return len(leaf_origins(Key((n,), (), ()), ()))


def _check_options(
    donate: Any, maxsize: Any, max_compiles: Any, warn_after: Any
) -> None:
    if donate not in _DONATE:
        raise ValueError(
            f"`es.jit(donate=...)` must be one of {', '.join(map(repr, _DONATE))}; "
            f"got {donate!r}."
        )
    for name, v in (
        ("maxsize", maxsize),
        ("max_compiles", max_compiles),
        ("warn_after", warn_after),
    ):
        if v is not None and (type(v) is not int or v < 1):
            raise ValueError(
                f"`{name}` must be None or a positive int, got {v!r}: "
                f"`es.jit({name}=...)` counts {_COUNTS[name]}."
            )


def _cyclic_error(name: str, argnames: tuple, e: CyclicValue) -> ValueError:
    """Name the argument of a call that contains itself (`e.path` starts at
    `[0][i]` for the i-th positional argument, `[1]['k']` for a keyword)."""
    head, _, rest = e.path[1:].partition("]")
    if head == "0":
        index, _, rest = rest[1:].partition("]")
        where = argname(argnames, int(index)) + rest
    else:
        key, _, rest = rest[1:].partition("]")
        where = key.strip("'") + rest
    return ValueError(
        f"`{name}` got an argument that contains itself: {where} is the argument "
        "again. `es.jit` keys a call by the structure of its arguments, as "
        "`eqx.filter_jit` does, so that structure must be finite: break the cycle "
        "before the call."
    )


_COUNTS: Final = {
    "maxsize": "compiled entries",
    "max_compiles": "XLA compiles",
    "warn_after": "XLA compiles",
}


def _unhashable_message(name: str, key: Key) -> str:
    culprit = find_unhashable(key) or "a static value"
    return (
        f"`{name}` got {culprit}, which is not hashable. Static field values and "
        "non-array arguments key the compilation cache, so they must be hashable: "
        "store a tuple instead of a list, or make an array a dynamic field."
    )


@overload
def jit(
    fn: Callable[_P, _R],
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> _Jit[_P, _R]: ...


@overload
def jit(
    fn: None = None,
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> Callable[[Callable[_P, _R]], _Jit[_P, _R]]: ...


def jit(
    fn: Any = None,
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
    **removed: Any,
) -> Any:
    """Compile a function or method once per distinct program.

    `es.jit` traces exactly what `eqx.filter_jit` traces: every leaf of the
    arguments (and of the function, if it is a pytree) for which `eqx.is_array`
    holds is traced, and every other leaf is static. So it returns what the eager
    call and `eqx.filter_jit` return. On top of that, the key compares static values
    by type *and* value (`1`, `True` and `1.0` are three entries), binds default
    arguments first, and shares one cache among the wrappers of one function.

    A new key is traced; its program is compiled only if this function has not
    compiled the same program already (the same module, constants included, the
    same shardings, donation and host callbacks). So changing a static field the
    program does not depend on costs one trace and no compile.

    **Arguments:**

    - `fn`: the function or method to compile (also a `staticmethod`).
    - `donate`: as in `eqx.filter_jit`: `"none"`, `"all"`, `"all-except-first"`,
        `"warn"` or `"warn-except-first"`: which arrays' buffers XLA may reuse for
        the outputs (`"all"` includes the buffers of `self`).
    - `maxsize`: at most this many compiled entries; the least recently used is
        evicted. `None` (the default) keeps them all.
    - `max_compiles`: raise [`eqx_static.RecompileError`][] instead of making more
        than this many XLA compiles (a test-suite guard that says why).
    - `warn_after`: after this many XLA compiles in which the same field or
        argument changed every time, log one WARNING on `"eqx_static"` that says
        so. `None` switches it off.

    **Returns:**

    A wrapper, reachable from the class or from an instance, with `cache_info()`
    (calls: hits and misses), `compile_info()` (XLA compiles), `cache_clear()` and
    `lower(*args)`. Each miss after the first logs one line at INFO on the logger
    `"eqx_static"`, naming what changed and whether it compiled.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)
            name: str = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        m = Model(scale=2.0, square=False, name="a")
        m(jnp.array(3.0))                           # traces and compiles
        m.with_dynamic(scale=5.0)(jnp.array(3.0))   # a hit: scale is an array
        m.with_static(square=True)(jnp.array(3.0))  # traces and compiles
        m.with_static(name="b")(jnp.array(3.0))     # traces: the same program
        assert Model.__call__.cache_info().misses == 3
        assert Model.__call__.compile_info().compiles == 2
        ```
    """
    if removed:
        raise TypeError(_removed_message(removed))
    if fn is None:
        return functools.partial(
            jit,
            donate=donate,
            maxsize=maxsize,
            max_compiles=max_compiles,
            warn_after=warn_after,
        )
    return _Jit(fn, donate, maxsize, max_compiles, warn_after)


def _removed_message(removed: dict[str, Any]) -> str:
    if "depends_on" in removed:
        return (
            "`es.jit(depends_on=...)` was removed in eqx_static 0.2. Every `es.jit` "
            "now compiles once per distinct program: a new key is traced, and if "
            "its program is one this function compiled already, that executable "
            "is reused. Changing a static field the method does not use costs one "
            "trace and no compile, with no option. Drop `depends_on=`."
        )
    names = ", ".join(map(repr, sorted(removed)))
    return (
        f"`es.jit` got unexpected keyword arguments {names}; it takes `donate`, "
        "`maxsize`, `max_compiles` and `warn_after`."
    )


__all__ = ["CacheInfo", "CompileInfo", "RecompileError", "TracedFieldError", "jit"]
