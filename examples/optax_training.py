"""Training an `es.Module` with optax, switching a static option mid-training.

The model wraps an `eqx.nn.MLP` (a scalar-to-scalar network) and adds a linear
skip connection, `y = mlp(x) + skip * x`, used only when the static option
`use_skip` is on. It is fitted to `y = sin(3x) + x` with `optax.adam`, in an
`@es.jit` train step that differentiates with `eqx.filter_value_and_grad` and
updates with `eqx.apply_updates`, making a new model every step.

Halfway through, one line -- `model.with_static(use_skip=True)` -- switches the
skip connection on. Its weight starts at zero, so the switch does not change the
function: the loss carries on from where it was. Adam's state holds two trees
shaped like the model, static fields included, so the same `with_static` is
applied to them (`switch_state`) and the optimiser carries on too. The switch costs exactly one
compile of the train step; the steps that only change arrays cost none.

Where the installed `eqx_static` has a compile budget (`es.RecompileError`), the
train step is declared with `max_compiles=2`, and the script shows what happens on
a third compile: a last batch of another size raises, naming the argument.

Run:  python examples/optax_training.py            # 500 + 500 steps
      python examples/optax_training.py --quick    # 100 + 100 steps (or EXAMPLES_QUICK=1)
"""

import argparse
import os
import sys
import time
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import optax


LEARNING_RATE = 1e-2
HAS_BUDGET = hasattr(es, "RecompileError")
BUDGET: dict[str, Any] = {"max_compiles": 2} if HAS_BUDGET else {}


class Regressor(es.Module):
    """`x -> mlp(x) (+ skip * x if use_skip)`, elementwise over a batch."""

    mlp: eqx.nn.MLP
    skip: jax.Array  # () -- an array, so it is data under every version
    use_skip: bool = eqx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:  # (n,) -> (n,)
        y = jax.vmap(self.mlp)(x)
        return y + self.skip * x if self.use_skip else y


def loss_fn(model: Regressor, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


optim = optax.adam(LEARNING_RATE)


@es.jit(**BUDGET)
def train_step(
    model: Regressor, opt_state: optax.OptState, x: jax.Array, y: jax.Array
) -> tuple[Regressor, optax.OptState, jax.Array]:
    """One optax step on every array of `model`."""
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    params = eqx.filter(model, eqx.is_array)
    updates, opt_state = optim.update(grads, opt_state, params)
    return eqx.apply_updates(model, updates), opt_state, loss


def switch_state(opt_state: optax.OptState, **changes: Any) -> optax.OptState:
    """The same static change in every copy of the model inside an optax state.

    Adam's moments are trees shaped like the model, static fields included, so
    they must follow a static switch; the moments themselves carry on.
    """

    def is_model(node: Any) -> bool:
        return isinstance(node, Regressor)

    def update(node: Any) -> Any:
        return node.with_static(**changes) if is_model(node) else node

    return jax.tree.map(update, opt_state, is_leaf=is_model)


def main() -> int:
    parser = argparse.ArgumentParser(description="optax training with a switch.")
    parser.add_argument("--quick", action="store_true", help="100 + 100 steps")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("EXAMPLES_QUICK") == "1"
    steps = 100 if quick else 500
    report = steps // 4

    model = Regressor(
        mlp=eqx.nn.MLP("scalar", "scalar", 16, 2, key=jax.random.key(0)),
        skip=jnp.zeros(()),
        use_skip=False,
    )
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    x = jnp.linspace(-2.0, 2.0, 64)
    y = jnp.sin(3 * x) + x

    def train(model, opt_state, label):
        history: list[float] = []
        for i in range(steps):
            model, opt_state, loss = train_step(model, opt_state, x, y)
            history.append(float(loss))
            if i % report == 0 or i == steps - 1:
                misses = train_step.cache_info().misses
                print(
                    f"{label if i == 0 else '':<16} {i:>5} {history[-1]:>9.5f} {misses:>9}"
                )
        return model, opt_state, history

    print(f"budget: {BUDGET or 'none (this eqx_static has no max_compiles)'}")
    print(f"{'phase':<16} {'step':>5} {'loss':>9} {'compiles':>9}")
    t0 = time.perf_counter()
    model, opt_state, before = train(model, opt_state, "use_skip=False")
    misses_phase1 = train_step.cache_info().misses

    at_switch = float(loss_fn(model, x, y))
    model = model.with_static(use_skip=True)  # the one-line switch
    opt_state = switch_state(opt_state, use_skip=True)  # ... and its optax state
    after_switch = float(loss_fn(model, x, y))
    print(f"{'-- switch --':<16} {'':>5} {at_switch:>9.5f} -> {after_switch:.5f}")

    model, opt_state, after = train(model, opt_state, "use_skip=True")
    misses_phase2 = train_step.cache_info().misses - misses_phase1
    elapsed = time.perf_counter() - t0
    final = float(loss_fn(model, x, y))
    print(f"\n{2 * steps} steps in {elapsed:.2f}s; final loss {final:.5f}")
    print(f"train_step.cache_info() = {train_step.cache_info()}")

    failures: list[str] = []
    if HAS_BUDGET:
        try:  # a last, smaller batch would be a third compile
            train_step(model, opt_state, x[:10], y[:10])
            failures.append("a third compile did not raise es.RecompileError")
        except es.RecompileError as e:  # pyright: ignore[reportAttributeAccessIssue]
            print(f"a batch of 10 is over budget: {str(e).splitlines()[0]}")
    if misses_phase1 != 1:
        failures.append(f"phase 1 compiled {misses_phase1} times, expected 1")
    if misses_phase2 != 1:
        failures.append(f"the switch cost {misses_phase2} compiles, expected 1")
    if not before[-1] < 0.5 * before[0]:
        failures.append(f"phase 1 loss did not decrease: {before[0]} -> {before[-1]}")
    if not abs(after_switch - at_switch) <= 1e-6 * at_switch:
        failures.append(f"the switch changed the loss: {at_switch} -> {after_switch}")
    if not final < at_switch:
        failures.append(f"phase 2 did not improve the fit: {at_switch} -> {final}")
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print(
        f"\nOK: optax trained through the switch with one extra compile; loss "
        f"{before[0]:.4f} -> {at_switch:.4f} -> {final:.4f}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
