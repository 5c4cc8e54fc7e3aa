"""Compile budgets: `es.jit(max_compiles=N)`, and the warning on a compile storm.

Both count XLA compiles, from the cache's record of them: a call whose program is
the same as one already compiled costs a trace and no compile, so it spends no
budget."""

import logging
from typing import Any, Final

from ._cache import Compile
from ._explain import explain, named_in
from ._program import Fingerprint, Program, structure


logger: Final = logging.getLogger("eqx_static")


class RecompileError(RuntimeError):
    """An [`eqx_static.jit`][] function would compile more often than its
    `max_compiles` allows. The message says what changed, for this compile and
    every earlier one. It is raised before XLA compiles.

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


def check_budget(wrapper: Any, reason: str | None) -> None:
    """Raise `RecompileError` if one more XLA compile would exceed `max_compiles`."""
    limit, cache = wrapper._max_compiles, wrapper.cache
    if limit is not None and cache.compiles >= limit:
        raise _budget_error(wrapper, cache.compiles + 1, reason or "?")


def _budget_error(wrapper: Any, n: int, reason: str) -> RecompileError:
    history = "".join(
        f"\n  compile {i + 1}: {', '.join(c.changed) or 'first call'}"
        for i, c in enumerate(wrapper.cache.history)
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
    fp: Fingerprint | None,
    executable: Any,
    key: Any,
    sig: tuple,
    reason: str | None,
    seconds: float,
    name: str,
) -> Program:
    """Record an XLA compile (the cache's lock is held) and return its program.
    After `warn_after` compiles in which one field or argument changed from each
    compile to the next, warn once, naming it. A compile that `jax.jit` made on
    its own (a new layout, see `layout_miss`) could not be refused before it
    happened: past `max_compiles`, it raises now."""
    cache = wrapper.cache
    last, cache.last = cache.last, (key, sig)
    changed = ()
    if last is not None:
        changed = tuple(named_in(explain([last], key, sig, wrapper._argnames)))
    shape = None if fp is None else structure(fp.text)
    program = cache.new_program(fp, executable, Compile(changed, seconds, shape))
    limit = wrapper._max_compiles
    if limit is not None and cache.compiles > limit:
        raise _budget_error(wrapper, cache.compiles, reason or "?")
    _storm(wrapper, name)
    return program


def _storm(wrapper: Any, name: str) -> None:
    cache, n = wrapper.cache, wrapper._warn_after
    if n is None or cache.warned or cache.compiles < n:
        return
    recent = cache.history[-n:]
    changes = [c.changed for c in recent[1:]]  # the first is what the others vary
    common = set(changes[0]).intersection(*changes[1:]) if changes else set()
    if not common:
        return
    cache.warned = True
    culprit = sorted(common)[0]
    total = sum(c.seconds for c in cache.history)
    logger.warning(
        "%s has compiled %d times, and %r changed every time (%.2f s spent "
        "compiling). %s",
        name,
        cache.compiles,
        culprit,
        total,
        _advice(culprit, [c.structure for c in recent]),
    )


def _advice(culprit: str, structures: list[bytes | None]) -> str:
    """What to do about `culprit`, from the programs it gave: if they differ only in
    their constants, it is only a value and can be dynamic; if their structure
    differs, it picks program structure (an `if`, a loop length, a shape)."""
    if None in structures:
        return (
            f"If {culprit!r} is only used as a value (arithmetic, not an `if`, a loop "
            "length or a shape), make it dynamic (an array), and it is traced "
            "instead, with no compile per value; if it picks program structure, "
            "it must stay static: reduce the number of distinct values."
        )
    if len(set(structures)) == 1:
        return (
            f"The programs differ only in their constants: {culprit!r} is only used "
            "as a value. Make it dynamic (drop `static=True`, or pass an array), and "
            "it is traced instead, with no compile per value."
        )
    return (
        f"The programs differ in their structure, not only in constants: {culprit!r} "
        "picks program structure (an `if`, a loop length, a shape), so it must stay "
        "static: reduce the number of distinct values."
    )
