"""The seed scenario, end to end.

A `Parent` declares one dynamic field (`dp`) and one static field (`sp`) and puts
`@es.jit` on its `__call__`; that compiled method calls `g`, which only the
subclass `Child` defines, using the child's own dynamic `dc` and static `sc`.

The script calls the model twice, then changes one field at a time -- `sp`, `sc`
(static: one compile each) and `dp`, `dc` (dynamic: no compile) -- calling twice
after each change. For every call it prints whether it compiled (from
`cache_info().misses`), the wall time, the result and the same arithmetic done
eagerly in Python. It ends with `cache_info()` and the explanation lines that
`es.jit` logs at INFO on the logger "eqx_static" for each recompilation.

It checks that exactly 3 compiles happen, that every result equals the eager
value and that nothing is logged at WARNING, and exits non-zero otherwise.

Run:  python examples/seed.py
"""

import logging
import sys
import time
from collections.abc import Callable

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp


class Parent(es.Module):
    dp: jax.Array  # dynamic: data, traced, never baked in
    sp: bool = eqx.field(static=True)  # static: part of the compile key

    @es.jit
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dp * self.g(x) if self.sp else self.g(x)

    def g(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError


class Child(Parent):
    dc: jax.Array
    sc: bool = eqx.field(static=True)

    def g(self, x: jax.Array) -> jax.Array:
        return self.dc * x if self.sc else x


def eager(c: Child, x: float) -> float:
    """The same arithmetic in plain Python, no JAX."""
    dp, dc = float(c.dp), float(c.dc)
    g = dc * x if c.sc else x
    return dp * g if c.sp else g


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())


def main() -> int:
    handler = _Collect()
    log = logging.getLogger("eqx_static")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    x_value = 2.0
    x = jnp.array(x_value)
    c = Child(dp=2.0, sp=False, dc=3.0, sc=False)  # pyright: ignore (floats)
    info = Child.__call__.cache_info

    steps: list[tuple[str, Callable[[Child], Child]]] = [
        ("Child(dp=2.0, sp=False, dc=3.0, sc=False)", lambda m: m),
        ("with_static(sp=True)", lambda m: m.with_static(sp=True)),
        ("with_static(sc=True)", lambda m: m.with_static(sc=True)),
        ("with_dynamic(dp=3.0)", lambda m: m.with_dynamic(dp=3.0)),
        ("with_dynamic(dc=4.0)", lambda m: m.with_dynamic(dc=4.0)),
    ]

    failures: list[str] = []
    header = (
        f"{'step':<42} {'call':>4} {'compiled':>8} {'ms':>8} {'result':>7} {'eager':>7}"
    )
    print(f"x = {x_value}")
    print(header)
    print("-" * len(header))
    for label, change in steps:
        c = change(c)
        expected = eager(c, x_value)
        for call in (1, 2):
            before = info().misses
            t0 = time.perf_counter()
            out = jax.block_until_ready(c(x))
            ms = (time.perf_counter() - t0) * 1e3
            compiled = info().misses - before
            result = float(out)
            ok = result == expected
            if not ok:
                failures.append(f"{label} call {call}: {result} != eager {expected}")
            mark = "" if ok else "  <-- MISMATCH"
            print(
                f"{label if call == 1 else '':<42} {call:>4} "
                f"{'yes' if compiled else 'no':>8} {ms:>8.2f} {result:>7g} "
                f"{expected:>7g}{mark}"
            )

    final = info()
    print()
    print(f"Child.__call__.cache_info() = {final}")
    print("explanations (logger 'eqx_static', INFO):")
    for line in handler.lines:
        print(f"  {line}")

    if handler.warnings:
        failures.append(f"expected no warning, got {handler.warnings}")
    if final.misses != 3:
        failures.append(f"expected 3 compiles, got {final.misses}")
    if final.hits != 7:
        failures.append(f"expected 7 cache hits, got {final.hits}")
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print("\nOK: 3 compiles for 10 calls; every result equals the eager arithmetic.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
