"""`es.jit`: compile a function once per compile key, and say why it recompiled."""

import functools
import inspect
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any, Final, Generic, Literal, overload, ParamSpec, TypeVar

import jax
from jax._src import traceback_util

from ._aot import lower, Lowered
from ._budget import check_budget, RecompileError
from ._cache import Cache, CacheInfo, Entry, shared_cache
from ._explain import find_unhashable, leaf_origins
from ._fields import is_es_module_class
from ._key import (
    array_types,
    key_and_leaves,
    LEAF,
    node,
    top_node,
    watched,
)
from ._outputs import combine
from ._relevance import Handover, Relevance
from ._trace import _pending, after_miss, traced_fn, TracedFieldError


traceback_util.register_exclusion(__file__)

logger: Final = logging.getLogger("eqx_static")

_P = ParamSpec("_P")
_R = TypeVar("_R")
Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
_DONATE: Final = ("none", "all", "all-except-first", "warn", "warn-except-first")


_MSG_DECORATOR_ORDER: Final = """`@jaxtyped` must go below `@es.jit`, not above it.

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
        depends_on: Any,
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
        self._max_compiles = max_compiles
        self._warn_after = warn_after
        self._signature = _Signature(fn)
        self._argnames = self._signature.names
        fn_leaves: list = []
        self._fn_node = node(fn, fn_leaves)
        self._fn_leaves = tuple(fn_leaves)
        self._options = (donate, maxsize, depends_on, max_compiles, warn_after)
        options = (donate, repr(depends_on), maxsize, max_compiles, warn_after)
        self.cache: Cache = shared_cache((self._fn_node, options), maxsize)
        self._relevance = (
            Relevance(depends_on, self) if depends_on is not None else None
        )
        self._owner: type | None = None
        self._name: str | None = None
        self.method, self._call = self._make_call()

    # -- binding ---------------------------------------------------------------

    @property
    def __globals__(self) -> dict[str, Any]:
        # `@jaxtyped(...)` above `@es.jit` reads this first: fail there, and say why.
        import sys

        if sys._getframe(1).f_globals.get("__name__", "").startswith("jaxtyping"):
            raise TypeError(_MSG_DECORATOR_ORDER)
        raise AttributeError("__globals__")

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
        return self._call(args, kwargs)

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
        cache, pending, slow = self.cache, _pending, self._slow_call
        entries, local = cache.entries, cache.local
        signature = self._signature
        n = signature.n
        fn_leaves = self._fn_leaves
        always_slow = self._relevance is not None
        lru = cache.maxsize is not None
        donating = self._donate in ("all", "all-except-first")
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
            return dispatch((tuple(nodes), (), ()), leaves, (obj, *args), kwargs)

        def call(args: tuple, kwargs: dict[str, Any]) -> Any:
            __tracebackhide__ = True
            if kwargs or len(args) != n:
                args, kwargs = signature.bind(args, kwargs)
            key, leaves = key_and_leaves(args, kwargs, fn_leaves)
            return dispatch(key, leaves, args, kwargs)

        def dispatch(key: tuple, leaves: list, args: tuple, kwargs: dict) -> Any:
            __tracebackhide__ = True
            if watched.seen:  # called from a `depends_on` trace, on its `self`
                return self._handover(args, kwargs, key, leaves)
            try:
                entry = entries.get(key)
            except TypeError:  # an unhashable static value: the slow path says which
                entry = None
            if entry is None or always_slow:
                return slow(args, kwargs, key, leaves)
            events = pending.events
            try:
                if donating:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", _UNUSABLE_DONATION)
                        out = entry.jitted(*leaves)
                else:
                    out = entry.jitted(*leaves)
            finally:  # booked once, as a hit or a miss, even if the call raised
                if pending.events != events:  # it traced or compiled
                    after_miss(self, entry, leaves, args, key, time.perf_counter())
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

    def _handover(self, args: tuple, kwargs: dict, key: Any, leaves: list) -> Any:
        __tracebackhide__ = True
        handover = Handover((*args, *kwargs.values()), watched.seen)
        watched.seen = []
        previous, _pending.handover = _pending.handover, handover
        try:
            return self._slow_call(args, kwargs, key, leaves)
        finally:
            _pending.handover = previous
            handover.settle()

    def _slow_call(self, args: tuple, kwargs: dict, key: Any, leaves: list) -> Any:
        __tracebackhide__ = True
        if self._relevance is not None:
            return self._relevance.call(args, key, leaves)
        return self.call_entry(args, key, leaves)

    def call_entry(self, args: tuple, key: Any, leaves: list) -> Any:
        """Call the entry for `key` (made if new), booking a hit or a miss."""
        __tracebackhide__ = True
        out, missed = self.run(self.entry_for(key, leaves), args, key, leaves)
        return out

    def run(self, entry: Entry, args: tuple, full: Any, leaves: list) -> tuple:
        """Call `entry` for the call `full`; returns the output and whether the call
        traced or compiled. Every call is booked once, as a hit or a miss, even if
        it raises."""
        __tracebackhide__ = True
        events = _pending.events
        previous, _pending.current = _pending.current, full
        start = time.perf_counter()
        try:
            if self._donate in ("all", "all-except-first"):
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", _UNUSABLE_DONATION)
                    out = entry.jitted(*leaves)
            else:
                out = entry.jitted(*leaves)
        finally:
            _pending.current = previous
            missed = _pending.events != events
            if missed:
                after_miss(self, entry, leaves, args, full, start)
            else:
                self.cache.count_hit()
        return (combine(*out) if type(out) is tuple else out), missed

    def entry_for(
        self, key: Any, leaves: list, paths: tuple[str, ...] = (), full: Any = None
    ) -> Entry:
        """The entry under `key`, or a new one (checked against `max_compiles`) for
        the call `full` (`key` itself unless projected by `depends_on`)."""
        full = key if full is None else full
        cache = self.cache
        try:
            entry = cache.entries.get(key)
        except TypeError:
            raise TypeError(_unhashable_message(self.qualname, key)) from None
        if entry is not None:
            cache.touch(key)
            return entry
        return cache.insert(key, self.new_entry(full, leaves, key, paths))

    def new_entry(
        self,
        full: Any,
        leaves: list,
        key: Any = None,
        paths: tuple[str, ...] | None = None,
    ) -> Entry:
        """An entry for the call `full`, not yet in the cache unless `key` is given
        (`depends_on="auto"` keys it once its trace says what it read)."""
        check_budget(self, full, leaves)
        entry = Entry(full, key, paths)
        donated = _donated(self, full, leaves)
        entry.make = functools.partial(self._make_jitted, full, entry, donated)
        entry.jitted = entry.make()
        return entry

    def _make_jitted(self, key: tuple, entry: Entry, donated: tuple[int, ...]) -> Any:
        return jax.jit(traced_fn(self, key, entry), donate_argnums=donated)

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

    # -- introspection ---------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower the call for these arguments ahead of time.

        Returns an object with JAX's `as_text()` and `cost_analysis()`, whose
        `compile()` gives a callable that takes the same arguments as the wrapper.
        """
        return lower(self, args, kwargs)

    def leaves_of(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, list]:
        """The key and traced leaves of a call, as the hot path computes them."""
        args, kwargs = self._signature.bind(args, kwargs)
        key, leaves = key_and_leaves(args, kwargs, self._fn_leaves)
        Handover((), watched.seen).settle()  # no trace here: all count as read
        watched.seen = []
        return key, leaves

    def cache_info(self) -> CacheInfo:
        """Hits, misses (traces and compiles), `maxsize` and entries held."""
        return self.cache.info()

    def cache_clear(self) -> None:
        """Drop every compiled entry and reset the statistics."""
        self.cache.clear()


from ._bound import BoundJit, special_method  # noqa: E402  (after `_Jit`, which it refers to)


_UNUSABLE_DONATION: Final = "Some donated buffers were not usable"


def _remake(fn: Any, *options: Any) -> "_Jit":
    return _Jit(fn, *options)


def _donated(self: Any, key: tuple, leaves: list) -> tuple[int, ...]:
    """The positions of the leaves whose buffers `donate` gives to XLA."""
    if self._donate == "none":
        return ()
    skip = 0
    if self._donate.endswith("except-first") and key[0]:
        skip = len(self._fn_leaves) + _count_leaves(key[0][0])
    return tuple(
        i
        for i, x in enumerate(leaves)
        if (i >= skip or i < len(self._fn_leaves)) and isinstance(x, jax.Array)
    )


def _count_leaves(n: Any) -> int:
    return len(leaf_origins(((n,), (), ()), ()))


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
                f"`es.jit({name}=...)` counts compiled entries."
            )


def _unhashable_message(name: str, key: tuple) -> str:
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
    depends_on: Any = None,
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
    depends_on: Any = None,
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> Callable[[Callable[_P, _R]], _Jit[_P, _R]]: ...


def jit(
    fn: Any = None,
    /,
    *,
    donate: Donate = "none",
    depends_on: Any = None,
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> Any:
    """Compile a function or method once per compile key.

    `es.jit` traces exactly what `eqx.filter_jit` traces: every leaf of the
    arguments (and of the function, if it is a pytree) for which `eqx.is_array`
    holds is traced, and every other leaf is static. So it returns what the eager
    call and `eqx.filter_jit` return. On top of that, the key compares static values
    by type *and* value (`1`, `True` and `1.0` are three entries), binds default
    arguments first, and shares one cache among the wrappers of one function.

    **Arguments:**

    - `fn`: the function or method to compile (also a `staticmethod`).
    - `donate`: as in `eqx.filter_jit`: `"none"`, `"all"`, `"all-except-first"`,
        `"warn"` or `"warn-except-first"`: which arrays' buffers XLA may reuse for
        the outputs (`"all"` includes the buffers of `self`).
    - `depends_on`: which static fields of `self` enter the key. `None` (the
        default): all of them. A tuple of names or dotted paths (`("sp",
        "encoder.act")`): only those; reading any other static field of `self`
        while tracing raises [`eqx_static.UndeclaredStaticRead`][]. `"auto"`: the
        fields that the traces actually read. Either way every result equals what
        the default returns.
    - `maxsize`: at most this many compiled entries; the least recently used is
        evicted. `None` (the default) keeps them all.
    - `max_compiles`: raise [`eqx_static.RecompileError`][] instead of compiling
        more than this many times (a test-suite guard that says why).
    - `warn_after`: after this many compiles in which the same field or argument
        changed every time, log one WARNING on `"eqx_static"` that says so. `None`
        switches it off.

    **Returns:**

    A wrapper, reachable from the class or from an instance, with `cache_info()`,
    `cache_clear()` and `lower(*args)`. Each miss after the first logs one line at
    INFO on the logger `"eqx_static"`, naming what changed.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        m = Model(scale=2.0, square=False)
        m(jnp.array(3.0))                       # compiles
        m.with_dynamic(scale=5.0)(jnp.array(3.0))   # reuses: scale is an array
        m.with_static(square=True)(jnp.array(3.0))  # compiles: square is static
        assert Model.__call__.cache_info().misses == 2
        ```
    """
    if fn is None:
        return functools.partial(
            jit,
            donate=donate,
            depends_on=depends_on,
            maxsize=maxsize,
            max_compiles=max_compiles,
            warn_after=warn_after,
        )
    return _Jit(fn, donate, maxsize, depends_on, max_compiles, warn_after)


__all__ = ["CacheInfo", "RecompileError", "TracedFieldError", "jit"]
