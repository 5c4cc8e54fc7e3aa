"""Solving an ODE with diffrax, the vector field an `es.Module`.

A harmonic oscillator `x'' = -omega^2 x (- 2 zeta x' if damped)` is written as an
`es.Module`: the frequency `omega` and damping rate `zeta` are dynamic fields (data,
traced), and `damped` is a static field (it picks the equation). `solve` runs
`diffrax.diffeqsolve` with Tsit5 and an adaptive step size under `@es.jit`.

The script sweeps `omega` over several values (one compile for all of them), then
switches `damped` on with `with_static` (one more compile), and checks every
solution against the closed form. It exits non-zero if a check fails, and exits 0
with a message if diffrax is not installed (`pip install diffrax`).

Run:  python examples/diffrax_ode.py            # 20 frequencies
      python examples/diffrax_ode.py --quick    # 5 frequencies (or EXAMPLES_QUICK=1)
"""

import argparse
import os
import sys
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


try:
    import diffrax  # pyright: ignore[reportMissingImports]
except ImportError:
    diffrax = None

T1 = 5.0
TS = jnp.linspace(0.0, T1, 11)


class Oscillator(es.Module):
    """The vector field of `y = (x, x')`."""

    omega: jax.Array  # dynamic: a sweep over values compiles once
    zeta: jax.Array  # dynamic (given as floats, stored as arrays)
    damped: bool = eqx.field(static=True)  # static: picks the equation

    def __call__(self, t: Any, y: jax.Array, args: Any) -> jax.Array:
        x, v = y[0], y[1]
        a = -(self.omega**2) * x
        if self.damped:
            a = a - 2 * self.zeta * v
        return jnp.stack([v, a])


@es.jit
def solve(field: Oscillator, y0: jax.Array) -> jax.Array:
    """`x(t)` at the times `TS`, starting from `y0 = (x(0), x'(0))`."""
    assert diffrax is not None
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Tsit5(),
        t0=0.0,
        t1=T1,
        dt0=0.01,
        y0=y0,
        saveat=diffrax.SaveAt(ts=TS),
        stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-7),
    )
    assert sol.ys is not None
    return sol.ys[:, 0]


def exact(omega: float, zeta: float, damped: bool) -> np.ndarray:
    """The closed form for `x(0) = 1`, `x'(0) = 0` (underdamped when damped)."""
    t = np.asarray(TS, dtype=np.float64)
    if not damped:
        return np.cos(omega * t)
    w = np.sqrt(omega**2 - zeta**2)
    return np.exp(-zeta * t) * (np.cos(w * t) + zeta / w * np.sin(w * t))


def main() -> int:
    parser = argparse.ArgumentParser(description="diffrax with an es.Module field.")
    parser.add_argument("--quick", action="store_true", help="5 frequencies")
    args = parser.parse_args()
    if diffrax is None:
        print("diffrax is not installed (pip install diffrax): nothing to run.")
        return 0
    quick = args.quick or os.environ.get("EXAMPLES_QUICK") == "1"
    omegas = np.linspace(1.0, 3.0, 5 if quick else 20).tolist()
    y0 = jnp.array([1.0, 0.0])
    zeta = 0.3

    failures: list[str] = []
    field = Oscillator(omega=1.0, zeta=zeta, damped=False)  # pyright: ignore (floats)
    for damped in (False, True):
        field = field.with_static(damped=damped)
        worst = 0.0
        for omega in omegas:
            xs = solve(field.with_dynamic(omega=omega), y0)
            worst = max(worst, float(np.max(np.abs(xs - exact(omega, zeta, damped)))))
        misses = solve.cache_info().misses
        print(
            f"damped={damped!s:<5}  {len(omegas)} values of omega  "
            f"max error {worst:.1e}  compiles so far {misses}"
        )
        if worst > 1e-4:
            failures.append(f"damped={damped}: max error {worst:.1e} > 1e-4")
    print(f"solve.cache_info() = {solve.cache_info()}")

    if solve.cache_info().misses != 2:
        failures.append(f"{solve.cache_info().misses} compiles, expected 2")
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print(
        f"\nOK: {2 * len(omegas)} solves, one compile per value of the static "
        "`damped`; every solution matches the closed form."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
