"""Ahead-of-time compilation: `wrapper.lower(*args).compile()`, as `eqx.filter_jit`
offers it, with a compiled callable that takes the arguments `lower` took.

Lowering traces the call with a `jax.jit` of its own, apart from the one calls use,
so it neither books a call nor leaves a trace that a later call would compile
without the miss path. An AOT compile is the caller's own: it is not one of the
function's cached programs."""

from typing import Any

from ._miss import Allowed, quiet_donation
from ._outputs import combine


class Lowered:
    """A call lowered ahead of time by [`eqx_static.jit`][]'s `lower`.

    Exposes JAX's `as_text()`, `cost_analysis()` and `compile()`.

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

    def __init__(self, lowered: Any, wrapper: Any, key: tuple, bound: tuple):
        self.lowered = lowered
        self._wrapper = wrapper
        self._key = key
        self._bound = bound  # `m` for `m.f.lower(x)`: the compiled call takes `x`

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """JAX's `Lowered.as_text`."""
        return self.lowered.as_text(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """JAX's `Lowered.cost_analysis`."""
        return self.lowered.cost_analysis()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile; the result is called with the same arguments as the wrapper."""
        if compiler_options is None:
            compiled = self.lowered.compile()
        else:
            compiled = self.lowered.compile(compiler_options=compiler_options)
        return Compiled(compiled, self._wrapper, self._key, self._bound)


class Compiled:
    """A call compiled ahead of time; call it with the wrapper's arguments.

    Arguments with other static values or tree structure than the lowered ones
    raise `TypeError`; avals are checked by JAX.

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

        m = Model(scale=2.0, square=True)
        compiled = Model.__call__.lower(m, jnp.ones(2)).compile()
        assert (compiled(m.with_dynamic(scale=3.0), jnp.ones(2)) == 3.0).all()
        from_instance = m.__call__.lower(jnp.ones(2)).compile()
        assert (from_instance(jnp.ones(2)) == 2.0).all()  # `m` is bound
        ```
    """

    def __init__(self, compiled: Any, wrapper: Any, key: tuple, bound: tuple):
        self.compiled = compiled
        self._wrapper = wrapper
        self._key = key
        self._bound = bound

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
        return combine(*out) if type(out) is tuple else out

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """JAX's `Compiled.as_text`."""
        return self.compiled.as_text(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """JAX's `Compiled.cost_analysis`."""
        return self.compiled.cost_analysis()


def lower(
    wrapper: Any, args: tuple, kwargs: dict[str, Any], bound: tuple = ()
) -> Lowered:
    """`wrapper.lower(*args, **kwargs)` (with `bound`, the instance of a bound
    method, before `args`)."""
    key, leaves = wrapper.leaves_of((*bound, *args), kwargs)
    make = wrapper.make_jitted(key, leaves)
    entry = wrapper.cache.entry(key, make)
    with Allowed(entry), quiet_donation(wrapper):
        lowered = make(entry).trace(*leaves).lower()
    return Lowered(lowered, wrapper, key, bound)
