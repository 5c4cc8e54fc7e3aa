"""Compile budgets: `es.jit(max_compiles=N)` and the warning on a compile storm."""

import logging
from typing import Any, Final

from ._cache import Compile
from ._explain import explain


logger: Final = logging.getLogger("eqx_static")


class RecompileError(RuntimeError):
    """An [`eqx_static.jit`][] function would compile more often than its
    `max_compiles` allows. The message says what changed, for this compile and
    every earlier one.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class Model(es.Module):
            n: int = eqx.field(static=True)

            @es.jit(max_compiles=1)
            def __call__(self, x):
                return x * self.n

        Model(n=2)(jnp.ones(2))
        with pytest.raises(es.RecompileError, match="static field 'n' changed 2 -> 3"):
            Model(n=3)(jnp.ones(2))
        ```
    """


def check_budget(wrapper: Any, key: tuple, leaves: list) -> None:
    """Raise `RecompileError` if compiling for `key` would exceed `max_compiles`."""
    limit, cache = wrapper._max_compiles, wrapper.cache
    if limit is None or cache.misses < limit:
        return
    from ._trace import known_keys, signature

    known = known_keys(wrapper)
    reason = explain(known, key, signature(leaves), wrapper._argnames) if known else "?"
    raise _budget_error(wrapper, cache.misses + 1, reason)


def _budget_error(wrapper: Any, n: int, reason: str) -> RecompileError:
    history = "".join(
        f"\n  compile {i + 1}: {', '.join(c.changed) or 'first call'}"
        for i, c in enumerate(wrapper.cache.compiles)
    )
    return RecompileError(
        f"{wrapper.qualname}: compile {n} exceeds `max_compiles="
        f"{wrapper._max_compiles}`: {reason}.\nEarlier compiles (what changed from "
        f"the one before):{history}\nIf these compiles are expected, raise "
        "`max_compiles`; otherwise make the value that changes a dynamic field (an "
        "array), or keep it fixed."
    )


def record_compile(
    wrapper: Any,
    key: tuple,
    sig: tuple,
    reason: str | None,
    seconds: float,
    args: tuple,
) -> None:
    """Record a compile (a miss already booked): raise `RecompileError` past
    `max_compiles` (a new signature of an entry, which could not be refused before
    it compiled); after `warn_after` compiles in which one field or argument
    changed from each compile to the next, warn once, naming it."""
    cache = wrapper.cache
    last, cache.last = cache.last, (key, sig)
    changed: tuple[str, ...] = ()
    if last is not None:
        changed = tuple(_names(explain([last], key, sig, wrapper._argnames)))
    cache.compiles.append(Compile(changed, seconds))
    limit = wrapper._max_compiles
    if limit is not None and cache.misses > limit:
        raise _budget_error(wrapper, cache.misses, reason or "?")
    n = wrapper._warn_after
    if n is None or cache.warned or len(cache.compiles) < n:
        return
    recent = cache.compiles[-(n - 1) :]
    common = set(recent[0].changed).intersection(*(c.changed for c in recent[1:]))
    if not common:
        return
    cache.warned = True
    name = sorted(common)[0]
    total = sum(c.seconds for c in cache.compiles)
    logger.warning(
        "%s has compiled %d times, and %r changed every time (%.2f s spent "
        "compiling). %s",
        wrapper.name(args),
        len(cache.compiles),
        name,
        total,
        _advice(wrapper, name, args),
    )


def _advice(wrapper: Any, name: str, args: tuple) -> str:
    """What to do about `name`, from a trial trace with it traced: a field or
    argument only used as a value can be dynamic; one that picks program
    structure (an `if`, a loop length, a shape) cannot."""
    verdict = _trial(wrapper, name, args)
    if verdict is None:
        return (
            f"If {name!r} is only used as a value (arithmetic, not an `if`, a loop "
            "length or a shape), make it dynamic (an array), and it is traced "
            "instead, with no compile per value; if it picks program structure, "
            "it must stay static: reduce the number of distinct values."
        )
    if verdict == "value":
        return (
            f"A trial trace with {name!r} traced succeeded: it is only used as a "
            "value. Make it dynamic (drop `static=True`, or pass an array), and it "
            "is traced instead, with no compile per value."
        )
    return (
        f"{name!r} picks program structure (a trial trace with it traced failed: "
        f"{verdict}), so it must stay static: reduce the number of distinct values."
    )


def _trial(wrapper: Any, name: str, args: tuple) -> str | None:
    """`"value"` if the call traces with `name` (a number: a static field of
    `self`, or an argument) as a traced value; JAX's complaint if it does not;
    None if that cannot be tried."""
    import jax
    import jax.numpy as jnp

    from ._fields import field_info, instance_dict, is_module

    names = wrapper._argnames
    if args and is_module(args[0]) and name in field_info(type(args[0])).static:
        self, value = args[0], instance_dict(args[0])[name]

        def call(v: Any) -> Any:
            copy = object.__new__(type(self))
            instance_dict(copy).update(instance_dict(self))
            instance_dict(copy)[name] = v
            return wrapper.fn(copy, *args[1:])
    elif name in names and names.index(name) < len(args):
        i = names.index(name)
        value = args[i]

        def call(v: Any) -> Any:
            return wrapper.fn(*args[:i], v, *args[i + 1 :])
    else:
        return None
    if type(value) not in (bool, int, float, complex):
        return None
    try:
        jax.eval_shape(call, jnp.asarray(value))
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerIntegerConversionError,
        jax.errors.TracerArrayConversionError,
    ) as e:
        return str(e).splitlines()[0]
    except Exception:
        return None
    return "value"


def _names(reason: str) -> list[str]:
    """The fields or arguments named in an explanation."""
    out = []
    for phrase in reason.split("; "):
        if "'" in phrase:
            out.append(phrase.split("'")[1])
        elif phrase.startswith("argument "):
            out.append(phrase.split()[1])
    return out
