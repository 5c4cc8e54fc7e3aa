"""`module.f` for an `es.jit` method: a bound method that is a pytree."""

import functools
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from ._compat import BoundMethod, WRAPPER_FIELD_NAMES
from ._fields import instance_dict


class BoundJit(functools.partial):
    """An [`eqx_static.jit`][] method bound to a module instance.

    A pytree, as Equinox's `BoundMethod` is: its leaves are the module's, so it can
    be passed through `jax.jit`, `eqx.filter_grad` or stored in a module field. It is
    a `functools.partial` made in C, so that reading `module.f` costs no walk of the
    module (Equinox's `BoundMethod` construction visits every leaf)."""

    __slots__ = ()

    @property
    def __self__(self) -> Any:
        return self.args[0]

    @property
    def __func__(self) -> Any:
        return self.func.es_jit  # pyright: ignore[reportFunctionMemberAccess]

    @property
    def __wrapped__(self) -> Any:
        return self.__func__.fn

    def cache_info(self) -> Any:
        """See [`eqx_static.jit`][]."""
        return self.__func__.cache_info()

    def cache_clear(self) -> None:
        """See [`eqx_static.jit`][]."""
        self.__func__.cache_clear()

    def compile_info(self) -> Any:
        """See [`eqx_static.jit`][]."""
        return self.__func__.compile_info()

    def lower(self, *args: Any, **kwargs: Any) -> Any:
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


def _rebind(wrapper: Any, obj: Any) -> BoundJit:
    # A special method of an `es.Module` class is found by name as the function
    # installed on the class (see `_Jit.__set_name__`), not as the wrapper.
    return BoundJit(getattr(wrapper, "method", wrapper), obj)


jtu.register_pytree_with_keys(
    BoundJit,
    lambda b: (((jtu.GetAttrKey("__self__"), b.args[0]),), b.func),
    lambda func, children: BoundJit(func, *children),
    lambda b: ((b.args[0],), b.func),
)


def bound_method(func: Any, obj: Any) -> Any:
    """Equinox's `BoundMethod(func, obj)`, the same pytree, made without the
    metaclass call, which walks every leaf of `obj` (about 120 µs at 100 leaves)."""
    bound = object.__new__(BoundMethod)
    d = instance_dict(bound)
    d["__func__"] = func
    d["__self__"] = obj
    for k in WRAPPER_FIELD_NAMES:  # as `BoundMethod.__post_init__` sets them
        try:
            d[k] = getattr(func, k)
        except AttributeError:
            pass
    return bound


def special_method(self: Any) -> Callable:
    """The plain function installed on an `es.Module` class for a special method:
    the wrapper's method path, carrying the wrapper's attributes."""
    method = self.method
    functools.update_wrapper(method, self.fn)
    method.__qualname__ = f"{self._owner.__qualname__}.{self._name}"  # pyright: ignore[reportOptionalMemberAccess]
    method.cache_info = self.cache_info  # pyright: ignore[reportFunctionMemberAccess]
    method.cache_clear = self.cache_clear  # pyright: ignore[reportFunctionMemberAccess]
    method.compile_info = self.compile_info  # pyright: ignore[reportFunctionMemberAccess]
    method.lower = self.lower  # pyright: ignore[reportFunctionMemberAccess]
    method.fn = self.fn  # pyright: ignore[reportFunctionMemberAccess]
    return method
