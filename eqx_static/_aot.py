"""Ahead-of-time compilation: `wrapper.lower(*args).compile()`, as `eqx.filter_jit`
offers it, with a compiled callable that takes the wrapper's own arguments."""

import time
from typing import Any

from ._fields import is_module
from ._key import key_and_leaves, watched
from ._outputs import combine
from ._relevance import Handover


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

    def __init__(self, lowered: Any, wrapper: Any, key: tuple):
        self.lowered = lowered
        self._wrapper = wrapper
        self._key = key

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
        return Compiled(compiled, self._wrapper, self._key)


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
        compiled = m.__call__.lower(jnp.ones(2)).compile()
        assert (compiled(m.with_dynamic(scale=3.0), jnp.ones(2)) == 3.0).all()
        ```
    """

    def __init__(self, compiled: Any, wrapper: Any, key: tuple):
        self.compiled = compiled
        self._wrapper = wrapper
        self._key = key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, leaves = self._wrapper.leaves_of(args, kwargs)
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


def lower(self: Any, args: tuple, kwargs: dict[str, Any]) -> "Lowered":
    """`wrapper.lower(*args, **kwargs)`: the call's entry (made if new), lowered,
    and the lowering booked as a miss if it traced."""
    args, kwargs = self._signature.bind(args, kwargs)
    key, leaves = key_and_leaves(args, kwargs, self._fn_leaves)
    Handover((), watched.seen).settle()  # lowering is no trace to watch
    watched.seen = []
    if self._relevance is not None and key[0] and is_module(args[0]):
        entry = self._relevance.lookup(key, leaves)
    else:
        entry = self.entry_for(key, leaves)
    full = key
    from ._trace import _pending, after_miss

    previous, _pending.current = _pending.current, full
    events = _pending.events
    try:
        lowered = entry.jitted.lower(*leaves)
    finally:
        _pending.current = previous
        if _pending.events != events:
            after_miss(self, entry, leaves, args, full, time.perf_counter())
    return Lowered(lowered, self, key)
