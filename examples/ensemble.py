"""An ensemble of 1,000 model variants evaluated as one compiled program.

Every member shares the static settings (activation, whether to squash the
output) of one base model and differs only in its dynamic fields (weights and a
temperature), set with `base.with_dynamic(...)`. `jax.tree.map` stacks the
members' dynamic fields into one module with a leading axis of 1,000, which is
evaluated with `eqx.filter_vmap` inside an `es.jit` function: one compile for the
whole ensemble. For comparison, a Python loop calls the `es.jit`-compiled
`MLP.__call__` on each member: 1,000 different dynamic values, still one compile,
but 1,000 dispatches.

The script prints both timings and both caches (`cache_info()`), checks that the
two give the same predictions and that each wrapper compiled exactly once, and
exits non-zero otherwise.

Run:  python examples/ensemble.py            # 1,000 members
      python examples/ensemble.py --quick    # 50 members (or EXAMPLES_QUICK=1)
"""

import argparse
import os
import sys
import time

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


class MLP(es.Module):
    """A one-hidden-layer network: weights and temperature dynamic, options static."""

    w1: jax.Array  # (d, h)
    b1: jax.Array  # (h,)
    w2: jax.Array  # (h,)
    temperature: jax.Array  # ()
    activation: str = eqx.field(static=True)
    squash: bool = eqx.field(static=True)

    @es.jit
    def __call__(self, x: jax.Array) -> jax.Array:  # (n, d) -> (n,)
        act = getattr(jax.nn, self.activation)
        y = act(x @ self.w1 + self.b1[None, :]) @ self.w2 / self.temperature
        return jnp.tanh(y) if self.squash else y


@es.jit
def predict_all(ensemble: MLP, x: jax.Array) -> jax.Array:
    """Every member at once, `(n, d) -> (members, n)`: vmapped over the stacked
    dynamic fields."""
    return eqx.filter_vmap(lambda member: member(x))(ensemble)


def make_members(base: MLP, count: int, seed: int = 0) -> list[MLP]:
    """`count` variants of `base`: new dynamic fields, the same static ones."""
    rng = np.random.default_rng(seed)
    d, h = base.w1.shape
    return [
        base.with_dynamic(
            w1=jnp.asarray(rng.normal(size=(d, h)) / np.sqrt(d), jnp.float32),
            b1=jnp.asarray(rng.normal(size=h) * 0.1, jnp.float32),
            w2=jnp.asarray(rng.normal(size=h) / np.sqrt(h), jnp.float32),
            temperature=jnp.float32(rng.uniform(0.5, 2.0)),
        )
        for _ in range(count)
    ]


def stack(*leaves: jax.Array) -> jax.Array:
    """`jnp.stack(leaves)`, via NumPy: on the CPU it is the same array, but a
    1,000-operand `jnp.stack` first compiles a 1,000-operand concatenate (seconds)."""
    return jnp.asarray(np.stack(leaves))


def main() -> int:
    parser = argparse.ArgumentParser(description="An ensemble of model variants.")
    parser.add_argument(
        "--quick", action="store_true", help="50 members instead of 1,000"
    )
    args = parser.parse_args()
    quick = args.quick or os.environ.get("EXAMPLES_QUICK") == "1"
    count = 50 if quick else 1000
    d, h, n = 4, 16, 32

    base = MLP(
        w1=jnp.zeros((d, h)),
        b1=jnp.zeros(h),
        w2=jnp.zeros(h),
        temperature=jnp.ones(()),
        activation="gelu",
        squash=True,
    )
    members = make_members(base, count)
    # One module whose dynamic fields have a leading axis of size `count`; the
    # static fields are shared, so they stay as they are.
    ensemble = jax.tree.map(stack, *members)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(n, d)), jnp.float32)
    print(
        f"{count} members, static settings shared: activation={base.activation!r}, squash={base.squash}"
    )
    print(f"stacked w1: {ensemble.w1.shape}, temperature: {ensemble.temperature.shape}")

    # vmap: the first call compiles, the others reuse the program.
    t0 = time.perf_counter()
    batched = jax.block_until_ready(predict_all(ensemble, x))
    t_first = time.perf_counter() - t0
    repeats = 5
    t0 = time.perf_counter()
    for _ in range(repeats):
        batched = jax.block_until_ready(predict_all(ensemble, x))
    t_vmap = (time.perf_counter() - t0) / repeats

    # Loop: one dispatch per member. Two warm-up passes: es.jit builds and then
    # finalises each new member's compile key once, and memoises it per instance.
    for _ in range(2):
        jax.block_until_ready([m(x) for m in members])
    t0 = time.perf_counter()
    outputs = jax.block_until_ready([m(x) for m in members])
    t_loop = time.perf_counter() - t0
    looped = np.stack([np.asarray(o) for o in outputs])

    ens_info = predict_all.cache_info()
    call_info = MLP.__call__.cache_info()
    ens_compiles = predict_all.compile_info().compiles
    call_compiles = MLP.__call__.compile_info().compiles
    batched = np.asarray(batched)
    err = float(np.max(np.abs(batched - looped)))
    print()
    print(f"{'':<26} {'time':>10}")
    print(f"{'vmap, first call':<26} {t_first * 1e3:>8.1f}ms  (compiles)")
    print(f"{'vmap, per call':<26} {t_vmap * 1e3:>8.2f}ms")
    print(
        f"{'python loop, per pass':<26} {t_loop * 1e3:>8.2f}ms  ({t_loop / count * 1e6:.0f}us per member)"
    )
    print(f"speed-up of vmap over the loop: {t_loop / t_vmap:.0f}x")
    print()
    print(f"predict_all.cache_info()  = {ens_info}, {ens_compiles} XLA compile")
    print(f"MLP.__call__.cache_info() = {call_info}, {call_compiles} XLA compile")
    mean = ", ".join(f"{v:+.4f}" for v in batched.mean(0)[:3])
    print(f"max |vmap - loop| = {err:.1e}; ensemble mean, first 3 inputs: {mean}")

    # `MLP.__call__` misses twice: traced inside `predict_all`, then compiled for
    # the loop (from that same trace).
    failures: list[str] = []
    for name, info, compiles, misses in (
        ("predict_all", ens_info, ens_compiles, 1),
        ("MLP.__call__", call_info, call_compiles, 2),
    ):
        if info.misses != misses or compiles != 1:
            failures.append(
                f"{name} missed {info.misses} times and compiled {compiles} times, "
                f"expected {misses} and 1"
            )
    if not np.allclose(batched, looped, rtol=1e-5, atol=1e-5):
        failures.append(f"vmap and loop disagree (max abs diff {err})")
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print(
        f"\nOK: {count} variants, one compile each for the vmapped and the looped call; results match."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
