"""`es.jit`: the wrapper, its options, the hit path, bound methods and AOT.

A call is keyed (`_key.py`) and looked up in its function's cache; a hit calls the
entry's own `jax.jit`, whose C++ dispatch checks the avals. Anything else goes to
the miss path (`_compile.py`)."""

import functools
import inspect
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any, Final, Generic, get_args, Literal, overload, ParamSpec, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from . import _compile as cp, _key as ky
from ._compat import hide_frames
from ._module import is_es_module_class
from ._report import unhashable_message


hide_frames(__file__)

_P = ParamSpec("_P")
_R = TypeVar("_R")
Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]

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
    """Binds a call with the callable's own signature (a decorator's defaults are its
    own) and defaults, so that `f(x)`, `f(x, 2.0)`, `f(x, scale=2.0)` are one key."""

    def __init__(self, fn: Callable):
        self.n, self.names, self.tail = -1, (), ()
        try:
            self.sig: inspect.Signature | None = inspect.signature(
                fn, follow_wrapped=False
            )
        except (TypeError, ValueError):
            self.sig = None
            return
        params = list(self.sig.parameters.values())
        positional = [
            p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(positional) == len(params):  # no *args, keyword-only, **kwargs
            self.n = len(positional)
        self.names = tuple(p.name for p in positional)
        # The defaults of the trailing parameters (only defaults follow a default).
        self.tail = tuple(p.default for p in positional if p.default is not p.empty)

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        n = self.n
        if not kwargs and n >= 0 and n - len(self.tail) <= len(args) < n:
            return args + self.tail[len(args) - n :], kwargs
        if self.sig is None:
            return args, kwargs
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the function raises, as it would eagerly
        bound.apply_defaults()
        return bound.args, bound.kwargs


class _Jit(Generic[_P, _R]):
    """The wrapper returned by [`eqx_static.jit`][]."""

    def __init__(self, fn: Callable[_P, _R], donate: Donate, maxsize: int | None,
                 max_compiles: int | None, warn_after: int | None):  # fmt: skip
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
        self._options = (donate, maxsize, max_compiles, warn_after)
        self._signature = _Signature(fn)
        fn_leaves: list = []
        fn_node = None if type(fn) is types.FunctionType else ky.node(fn, fn_leaves)
        self._fn_leaves = tuple(fn_leaves)
        self.cache = _shared_cache(fn, (fn_node, self._options), maxsize)
        self.f = cp.Function(
            fn, fn_node, len(fn_leaves), self._signature.names, donate,
            max_compiles, warn_after, self.cache,
        )  # fmt: skip
        self._owner: type | None = None
        self._name: str | None = None
        self.method, self._call = self._make_call()

    @property
    def __globals__(self) -> dict[str, Any]:
        # `@jaxtyped(...)` above `@es.jit` reads it first: name the order to use.
        raise AttributeError(_MSG_DECORATOR_ORDER)

    def __set_name__(self, owner: type, name: str) -> None:
        self._owner, self._name = owner, name
        self.f.method = True
        special = name.startswith("__") and name.endswith("__") and not self._is_static
        # `m(x)` looks `__call__` up on the class and calls a plain function without
        # binding anything: install one, saving the descriptor call. Not in
        # `__main__`, whose classes cloudpickle copies by value.
        if special and is_es_module_class(owner) and owner.__module__ != "__main__":
            setattr(owner, name, _special_method(self, owner, name))

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
        # By reference, as functions pickle. A wrapper that cannot be found by name
        # (in `__main__` or a function body, copied by value by cloudpickle) is made
        # again from its function and options, and shares the cache here.
        owner, where = self._owner, getattr(self.fn, "__module__", None)
        if "<locals>" not in self.qualname and where != "__main__":
            return (getattr, (owner, self._name)) if owner else self.qualname
        return (_Jit, (self.fn, *self._options))

    def __copy__(self) -> "_Jit[_P, _R]":
        return self

    def __deepcopy__(self, memo: dict) -> "_Jit[_P, _R]":
        return self

    def __repr__(self) -> str:
        return f"<es.jit {self.qualname}>"

    def _make_call(self) -> tuple[Callable, Callable]:
        """The paths of `obj.f(*args)` and of any call, as closures: a hit looks up no
        attribute."""
        f, cache, signature = self.f, self.cache, self._signature
        entries, calls, clock = cache.entries, cache.calls, cache.clock
        n, fn_leaves, lru = signature.n, self._fn_leaves, cache.maxsize is not None
        arrays, node, top_node, leaf = ky.array_types, ky.node, ky.top_node, ky.LEAF
        key_type, key_and_leaves, deep = ky.Key, ky.key_and_leaves, ky.deep
        new_entry, combine = cp.new_entry, cp.combine

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
                        nodes.append(leaf)
                    else:
                        nodes.append(node(a, leaves))
            except RecursionError:  # deeply nested: the general path copes
                return call((obj, *args), kwargs)
            key = tuple.__new__(key_type, (tuple(nodes), (), ()))
            try:
                entry = entries.get(key)
            except (TypeError, RecursionError):  # the general path says why, or copes
                return call((obj, *args), kwargs)
            next(calls)
            if entry is None:
                entry = new_entry(f, key, leaves)
            if lru:
                entry.used = next(clock)
            try:
                out = entry.call(*leaves)
            except eqx.EquinoxRuntimeError as e:
                e.__traceback__ = None  # as `eqx.filter_jit`: the user's frames only
                raise
            return combine(*out) if type(out) is tuple else out

        def call(args: tuple, kwargs: dict[str, Any]) -> Any:
            # Calls the key's dispatcher: JAX's C++ runs what it has for these avals,
            # and calls the miss path (which books a miss) for anything else.
            __tracebackhide__ = True
            if kwargs or len(args) != n:
                args, kwargs = signature.bind(args, kwargs)
            try:
                key, leaves = deep(key_and_leaves, args, kwargs, fn_leaves)
            except ky.CyclicValue as e:
                raise _cyclic_error(self.qualname, signature.names, e) from None
            next(calls)
            try:
                entry = entries.get(key)
            except TypeError:  # an unhashable static value: say which
                raise TypeError(unhashable_message(self.qualname, key)) from None
            except RecursionError:
                entry = deep(entries.get, key)
            if entry is None:
                entry = new_entry(f, key, leaves)
            if lru:
                entry.used = next(clock)
            out = entry.call(*leaves)
            return combine(*out) if type(out) is tuple else out

        method.es_jit = self  # pyright: ignore[reportFunctionMemberAccess]
        return method, call

    def leaves_of(self, args: tuple, kwargs: dict[str, Any]) -> tuple[ky.Key, list]:
        """The key and traced leaves of a call, as the hot path computes them."""
        args, kwargs = self._signature.bind(args, kwargs)
        return ky.deep(ky.key_and_leaves, args, kwargs, self._fn_leaves)

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Lower the call for these arguments ahead of time: JAX's `as_text()` and
        `cost_analysis()`, and `compile()`, whose result takes the wrapper's
        arguments."""
        return self.lower_bound((), args, kwargs)

    def lower_bound(self, bound: tuple, args: tuple, kwargs: dict) -> "Lowered":
        """`lower` for a method bound to `bound`, for the arguments after it."""
        key, leaves = self.leaves_of((*bound, *args), kwargs)
        return Lowered(cp.lower_call(self.f, key, leaves), self, key, bound)

    def cache_info(self) -> cp.CacheInfo:
        """Hits, misses, `maxsize` and the compiled signatures held."""
        return self.cache.info()

    def compile_info(self) -> cp.CompileInfo:
        """XLA compiles since the cache was cleared, the programs held now (keys
        whose programs are the same share one), and the seconds spent compiling."""
        return self.cache.compile_info()

    def cache_clear(self) -> None:
        """Drop every compiled entry and program, and reset the statistics."""
        ky.forget_all()  # the per-instance memo too: it may hold static values
        self.cache.clear()


def _check_options(donate: Any, *counts: Any) -> None:
    if donate not in get_args(Donate):
        raise ValueError(
            "`es.jit(donate=...)` must be one of "
            f"{', '.join(map(repr, get_args(Donate)))}; got {donate!r}."
        )
    for name, v in zip(("maxsize", "max_compiles", "warn_after"), counts):
        if v is not None and (type(v) is not int or v < 1):
            what = "compiled entries" if name == "maxsize" else "XLA compiles"
            raise ValueError(
                f"`{name}` must be None or a positive int, got {v!r}: "
                f"`es.jit({name}=...)` counts {what}."
            )


def _cyclic_error(name: str, argnames: tuple, e: ky.CyclicValue) -> ValueError:
    """Name the argument in `e.path` (`[0][i]...` positional, `[1]['k']...` keyword)."""
    head, _, rest = e.path[1:].partition("]")
    index, _, rest = rest[1:].partition("]")
    where = ky.argname(argnames, int(index)) if head == "0" else index.strip("'")
    return ValueError(
        f"`{name}` got an argument that contains itself: {where}{rest} is the "
        "argument again. `es.jit` keys a call by the structure of its arguments, as "
        "`eqx.filter_jit` does, so that structure must be finite: break the cycle "
        "before the call."
    )


# The caches, as `eqx.filter_jit` keeps its own: a plain function's for as long as
# the function lives (wrapping it again finds it), any other callable's (a module,
# `eqx.filter_grad(f)`) by its structure and static parts, for the process.
_by_function: Final = weakref.WeakKeyDictionary[Callable, dict[Any, cp.Cache]]()
_by_structure: Final[dict[Any, cp.Cache]] = {}
_caches_lock: Final = threading.Lock()


def _shared_cache(fn: Callable, identity: Any, maxsize: int | None) -> cp.Cache:
    with _caches_lock:
        if type(fn) is types.FunctionType:
            caches = _by_function.setdefault(fn, {})
        else:
            caches = _by_structure
        try:
            cache = caches.get(identity)
        except TypeError:  # an unhashable callable: its own cache
            return cp.Cache(maxsize)
        if cache is None:
            cache = caches[identity] = cp.Cache(maxsize)
        return cache


# ----------------------------------------------------------------------------------
# Methods.


class BoundJit(functools.partial):
    """An [`eqx_static.jit`][] method bound to an instance.

    A pytree, as Equinox's `BoundMethod` is: its leaves are the instance's, so it
    can be passed through `jax.jit` or `eqx.filter_grad`, or stored in a field. A
    `functools.partial` made in C, so that reading `module.f` walks nothing."""

    __slots__ = ()

    @property
    def __self__(self) -> Any:
        return self.args[0]

    @property
    def __func__(self) -> "_Jit":
        return self.func.es_jit  # pyright: ignore[reportFunctionMemberAccess]

    @property
    def __wrapped__(self) -> Any:
        return self.__func__.fn

    def cache_info(self) -> cp.CacheInfo:
        """See [`eqx_static.jit`][]."""
        return self.__func__.cache_info()

    def cache_clear(self) -> None:
        """See [`eqx_static.jit`][]."""
        self.__func__.cache_clear()

    def compile_info(self) -> cp.CompileInfo:
        """See [`eqx_static.jit`][]."""
        return self.__func__.compile_info()

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Lower the call for these arguments ahead of time; see `es.jit`."""
        return self.__func__.lower_bound((self.__self__,), args, kwargs)

    def __reduce__(self) -> Any:
        return (_rebind, (self.__func__, self.__self__))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BoundJit
            and other.func is self.func
            and other.__self__ is self.__self__
        )

    def __hash__(self) -> int:
        return hash((id(self.func), id(self.__self__)))

    def __repr__(self) -> str:
        name = self.__func__.qualname
        return f"<bound es.jit {name} of {type(self.__self__).__qualname__}>"


def _rebind(wrapper: Callable, obj: Any) -> BoundJit:
    # A special method of an `es.Module` class is found by name as the function
    # installed on the class (see `_Jit.__set_name__`), not as the wrapper.
    return BoundJit(getattr(wrapper, "method", wrapper), obj)


jtu.register_pytree_with_keys(
    BoundJit,
    lambda b: (((jtu.GetAttrKey("__self__"), b.args[0]),), b.func),
    lambda func, children: BoundJit(func, *children),
    lambda b: ((b.args[0],), b.func),
)


def _special_method(wrapper: "_Jit", owner: type, name: str) -> Callable:
    """The wrapper's method path as a plain function with its attributes."""
    method = wrapper.method
    functools.update_wrapper(method, wrapper.fn)
    method.__qualname__ = f"{owner.__qualname__}.{name}"
    for attr in ("cache_info", "cache_clear", "compile_info", "lower", "fn"):
        setattr(method, attr, getattr(wrapper, attr))
    return method


# ----------------------------------------------------------------------------------
# Ahead of time: `wrapper.lower(*args).compile()`, as `eqx.filter_jit` offers it,
# with a compiled callable that takes the arguments `lower` took. Lowering traces
# with a `jax.jit` of its own: it books no call, and an AOT compile is the caller's
# own, not one of the function's cached programs.


class Lowered:
    """A call lowered ahead of time by [`eqx_static.jit`][]'s `lower`: JAX's
    `as_text()`, `cost_analysis()` and `compile()`.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        @es.jit
        def f(x, y):
            return x * y

        compiled = f.lower(jnp.ones(3), jnp.ones(3)).compile()
        assert (compiled(jnp.ones(3), 2 * jnp.ones(3)) == 2).all()
        ```
    """

    def __init__(self, lowered: Any, wrapper: _Jit, key: ky.Key, bound: tuple):
        self.lowered = lowered
        # `bound` is `(m,)` for `m.f.lower(x)`: the compiled call takes `x`.
        self._wrapper, self._key, self._bound = wrapper, key, bound

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """JAX's `Lowered.as_text`."""
        return self.lowered.as_text(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """JAX's `Lowered.cost_analysis`."""
        return self.lowered.cost_analysis()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile; the result is called with the same arguments as the wrapper."""
        compiled = self.lowered.compile(compiler_options=compiler_options)
        return Compiled(compiled, self._wrapper, self._key, self._bound)


class Compiled:
    """A call compiled ahead of time; call it with the wrapper's arguments.

    Arguments with other static values or tree structure than the lowered ones
    raise `TypeError`; avals are checked by JAX.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float

            @es.jit
            def __call__(self, x):
                return self.scale * x

        m = Model(scale=2.0)
        compiled = Model.__call__.lower(m, jnp.ones(2)).compile()
        assert (compiled(m.with_dynamic(scale=3.0), jnp.ones(2)) == 3.0).all()
        bound = m.__call__.lower(jnp.ones(2)).compile()  # `m` is bound
        assert (bound(jnp.ones(2)) == 2.0).all()
        ```
    """

    def __init__(self, compiled: Any, wrapper: _Jit, key: ky.Key, bound: tuple):
        self.compiled = compiled
        self._wrapper, self._key, self._bound = wrapper, key, bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, leaves = self._wrapper.leaves_of((*self._bound, *args), kwargs)
        if key != self._key:
            raise TypeError(
                f"This compiled `{self._wrapper.qualname}` was lowered for other "
                "static values or tree structure than these arguments have. Lower "
                "it again for them, or call the `es.jit` wrapper, which compiles as "
                "needed."
            )
        out = self.compiled(*leaves)
        return cp.combine(*out) if type(out) is tuple else out

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """JAX's `Compiled.as_text`."""
        return self.compiled.as_text(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """JAX's `Compiled.cost_analysis`."""
        return self.compiled.cost_analysis()


# ----------------------------------------------------------------------------------


@overload
def jit(fn: Callable[_P, _R], /, *, donate: Donate = "none", maxsize: int | None = None,
        max_compiles: int | None = None, warn_after: int | None = 8,
        ) -> _Jit[_P, _R]: ...  # fmt: skip
@overload
def jit(fn: None = None, /, *, donate: Donate = "none", maxsize: int | None = None,
        max_compiles: int | None = None, warn_after: int | None = 8,
        ) -> Callable[[Callable[_P, _R]], _Jit[_P, _R]]: ...  # fmt: skip
def jit(fn: Any = None, /, *, donate: Donate = "none", maxsize: int | None = None,
        max_compiles: int | None = None, warn_after: int | None = 8,
        **removed: Any) -> Any:  # fmt: skip
    """Compile a function or method once per distinct program.

    `es.jit` traces what `eqx.filter_jit` traces (the leaves of the arguments, and of
    a pytree function, for which `eqx.is_array` holds; every other leaf is static),
    and returns what it returns. Its key compares static values by type *and* value
    (`1`, `True` and `1.0` are three keys), binds default arguments first, and is
    shared by the wrappers of one function. A new key is traced, and compiled only if
    the function has not compiled the same program (module, constants, shardings,
    donation and host callbacks) already: changing a static field the program does
    not read costs one trace and no compile.

    **Arguments:**

    - `fn`: the function or method to compile (also a `staticmethod`).
    - `donate`: as in `eqx.filter_jit` (`"none"`, `"all"`, `"all-except-first"`,
        `"warn"`, `"warn-except-first"`): which arrays' buffers XLA may reuse for the
        outputs (`"all"` includes those of `self`).
    - `maxsize`: at most this many compiled signatures, the least recently used
        evicted first; `None` keeps them all.
    - `max_compiles`: raise [`eqx_static.RecompileError`][] rather than make more XLA
        compiles than this (a test-suite guard that says why).
    - `warn_after`: after this many XLA compiles in which the same field or argument
        changed every time, log one WARNING on `"eqx_static"` saying so (`None`: off).

    **Returns:**

    A wrapper, on the class or an instance, with `cache_info()` (hits and misses),
    `compile_info()` (XLA compiles), `cache_clear()` and `lower(*args)`. Each miss
    after the first logs one INFO line on `"eqx_static"`: what changed, and whether
    it compiled.

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
