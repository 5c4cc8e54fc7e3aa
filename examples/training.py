"""Training with plain gradient descent, switching a static option mid-training.

A small tanh network is fitted to `y = sin(3x) + 0.5 + 0.5x^2` with `jax.grad`
and plain gradient descent (no optax). Its static option `use_bias` starts as
`False`: the network is then an odd function (`f(-x) = -f(x)`), so it cannot fit
the even part of the target and the loss plateaus. Halfway through, one line --
`model.with_static(use_bias=True)` -- switches the biases on. The biases were
initialised at zero (and got zero gradient while unused), so the switch does not
change the function: the loss carries on from where it was and keeps
decreasing.

`train_step` is an `es.jit` function; inside it, `jax.grad` differentiates
through the model's own `es.jit`-compiled `__call__`. The static switch costs
exactly one extra compile of each; the hundreds of steps that change only the
dynamic arrays cost none. The script checks both, and that the loss decreases,
and exits non-zero otherwise.

Run:  python examples/training.py            # 400 + 400 steps
      python examples/training.py --quick    # 100 + 100 steps (or EXAMPLES_QUICK=1)
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


LEARNING_RATE = 0.1


class MLP(es.Module):
    """`x -> w2 . tanh(w1 x + b1) + b2`; the biases are used only if `use_bias`."""

    w1: jax.Array  # (h,)
    b1: jax.Array  # (h,)
    w2: jax.Array  # (h,)
    b2: jax.Array  # ()
    use_bias: bool = eqx.field(static=True)

    @es.jit
    def __call__(self, x: jax.Array) -> jax.Array:  # (n,) -> (n,)
        pre = x[:, None] * self.w1[None, :]
        if self.use_bias:
            pre = pre + self.b1[None, :]
        y = jnp.tanh(pre) @ self.w2
        return y + self.b2 if self.use_bias else y


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@es.jit
def train_step(model: MLP, x: jax.Array, y: jax.Array) -> tuple[MLP, jax.Array]:
    """One step of plain gradient descent on every dynamic field of `model`."""
    loss, grads = jax.value_and_grad(loss_fn)(model, x, y)
    model = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, model, grads)
    return model, loss


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Gradient descent with a static switch."
    )
    parser.add_argument("--quick", action="store_true", help="100 + 100 steps")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("EXAMPLES_QUICK") == "1"
    steps = 100 if quick else 400
    report = steps // 4

    rng = np.random.default_rng(0)
    hidden = 32
    model = MLP(
        w1=jnp.asarray(rng.normal(size=hidden), jnp.float32),
        b1=jnp.zeros(hidden),
        w2=jnp.asarray(rng.normal(size=hidden) / np.sqrt(hidden), jnp.float32),
        b2=jnp.zeros(()),
        use_bias=False,
    )
    x = jnp.linspace(-1.5, 1.5, 64)
    y = jnp.sin(3 * x) + 0.5 + 0.5 * x**2

    step_info = train_step.cache_info
    call_info = MLP.__call__.cache_info

    def train(model: MLP, label: str) -> tuple[MLP, list[float]]:
        history: list[float] = []
        for i in range(steps):
            model, loss = train_step(model, x, y)
            history.append(float(loss))
            if i % report == 0 or i == steps - 1:
                print(
                    f"{label if i == 0 else '':<16} {i:>5} {history[-1]:>9.5f} "
                    f"{step_info().misses:>9}"
                )
        return model, history

    print(f"{'phase':<16} {'step':>5} {'loss':>9} {'compiles':>9}")
    t0 = time.perf_counter()
    model, before = train(model, "use_bias=False")
    misses_phase1 = step_info().misses

    at_switch = float(loss_fn(model, x, y))
    model = model.with_static(use_bias=True)  # the one-line switch
    after_switch = float(loss_fn(model, x, y))
    print(f"{'-- switch --':<16} {'':>5} {at_switch:>9.5f} -> {after_switch:.5f}")

    model, after = train(model, "use_bias=True")
    misses_phase2 = step_info().misses - misses_phase1
    elapsed = time.perf_counter() - t0
    final = float(loss_fn(model, x, y))

    print()
    print(f"{2 * steps} steps in {elapsed:.2f}s; final loss {final:.5f}")
    print(f"train_step.cache_info()   = {step_info()}")
    print(f"MLP.__call__.cache_info() = {call_info()}")

    failures: list[str] = []
    if misses_phase1 != 1:
        failures.append(f"phase 1 compiled {misses_phase1} times, expected 1")
    if misses_phase2 != 1:
        failures.append(f"the switch cost {misses_phase2} compiles, expected 1")
    # `MLP.__call__`: traced inside `train_step`, and compiled for the two eager
    # calls of `loss_fn` at the switch (one per value of `use_bias`).
    call_compiles = MLP.__call__.compile_info().compiles
    if call_compiles != 2 or call_info().misses != 3:
        failures.append(
            f"MLP.__call__ missed {call_info().misses} times and compiled "
            f"{call_compiles} times, expected 3 and 2"
        )
    if not before[-1] < before[0]:
        failures.append(f"phase 1 loss did not decrease: {before[0]} -> {before[-1]}")
    if not abs(after_switch - at_switch) <= 1e-6 * at_switch:
        failures.append(f"the switch changed the loss: {at_switch} -> {after_switch}")
    checkpoints = after[::report] + [final]
    if not all(b < a for a, b in zip(checkpoints, checkpoints[1:])):
        failures.append(f"phase 2 loss did not keep decreasing: {checkpoints}")
    if not final < 0.5 * at_switch:
        failures.append(f"phase 2 did not get past the plateau: {at_switch} -> {final}")
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print(
        f"\nOK: one extra compile for the static switch; loss {before[0]:.4f} -> "
        f"{at_switch:.4f} (odd functions only) -> {final:.4f}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
