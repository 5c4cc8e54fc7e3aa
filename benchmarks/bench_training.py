"""A training step (targets: es.jit <= 0.8x `jax.jit` with partition/combine around
each call, and <= 1.0x the loop that partitions once and passes only the
parameters through `jax.jit`).

An `eqx.nn.MLP` inside an `es.Module`, 8 -> 32 x 3 -> 1 and 8 -> 128 x 4 -> 1,
optax adam, batch 64; every step takes the model and returns a new one
(`eqx.apply_updates` inside the step), as a training loop does. The versions:

- `es.jit(step)`, the step defined in a package (this module) and in a script
  (a function of `__main__`);
- `jax.jit` with `eqx.partition`/`eqx.combine` around each call (the static part
  closed over);
- the hand-optimised loop: partition once, before the loop, and pass only the
  parameters (and the optimiser's state) through `jax.jit`;
- `eqx.filter_jit(step)`, for reference.
"""

import types
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models
import optax


GROUP = "training"
TITLE = "training step"
SIZES = {"8->32x3->1": (32, 3), "8->128x4->1": (128, 4)}


def _in_main(fn: Any) -> Any:
    """`fn` as a function of `__main__`, as a script defines its step."""
    script = {**fn.__globals__, "__name__": "__main__"}
    return types.FunctionType(
        fn.__code__, script, fn.__name__, fn.__defaults__, fn.__closure__
    )


def make_steps(
    width: int = 32, depth: int = 3
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    model = models.make_net(width=width, depth=depth)
    opt = optax.adam(1e-3)
    opt_state = opt.init(eqx.filter(model, eqx.is_array))
    kx, ky = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (64, 8))
    y = jax.random.normal(ky, (64, 1))

    def loss(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    def step(model, opt_state, x, y):
        value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        updates, opt_state = opt.update(
            grads, opt_state, eqx.filter(model, eqx.is_array)
        )
        return eqx.apply_updates(model, updates), opt_state, value

    params0, static = eqx.partition(model, eqx.is_array)

    @jax.jit
    def inner(params, opt_state, x, y):
        model, opt_state, value = step(eqx.combine(params, static), opt_state, x, y)
        return eqx.filter(model, eqx.is_array), opt_state, value

    def partition_combine(model, opt_state, x, y):
        params, static_now = eqx.partition(model, eqx.is_array)
        params, opt_state, value = inner(params, opt_state, x, y)
        return eqx.combine(params, static_now), opt_state, value

    steps = {
        "es.jit": es.jit(step),
        "es.jit, step in a script": es.jit(_in_main(step)),
        "jax.jit + partition/combine": partition_combine,
        "eqx.filter_jit": eqx.filter_jit(step),
    }
    return steps, (model, opt_state, x, y, inner, params0)


def _loop(step: Any, init: tuple[Any, ...]) -> Any:
    model, opt_state, x, y = init[:4]
    state = [model, opt_state]

    def one() -> Any:
        state[0], state[1], value = step(state[0], state[1], x, y)
        return value

    return one


def _hand_loop(init: tuple[Any, ...]) -> Any:
    """Partitioned once: only the parameters go through `jax.jit` each step."""
    _, opt_state, x, y, inner, params = init
    state = [params, opt_state]

    def one() -> Any:
        state[0], state[1], value = inner(state[0], state[1], x, y)
        return value

    return one


def run(rep: h.Report, s: h.Settings) -> None:
    for size, (width, depth) in SIZES.items():
        steps, init = make_steps(width, depth)
        variants = {name: _loop(step, init) for name, step in steps.items()}
        variants["hand-optimised"] = _hand_loop(init)
        t = h.compare(variants, s, raw=rep.raw, key=f"training.{size}")
        for es_name, where in (
            ("es.jit", "package"),
            ("es.jit, step in a script", "script"),
        ):
            rep.compare_row(
                GROUP, f"training.{size}.{where}.partition",
                f"MLP {size} + adam, new module every step (step in a {where}): "
                "es.jit / jax.jit + partition/combine",
                t, es_name, "jax.jit + partition/combine", "fresh", ("<=", 0.8),
            )  # fmt: skip
            rep.compare_row(
                GROUP, f"training.{size}.{where}.hand",
                f"the same step (in a {where}): es.jit / the loop that partitions once",
                t, es_name, "hand-optimised", "fresh", ("<=", 1.0),
            )  # fmt: skip
        rep.compare_row(
            GROUP, f"training.{size}.filter_jit",
            f"MLP {size}: eqx.filter_jit / es.jit (speed-up)",
            t, "eqx.filter_jit", "es.jit", "fresh", readme=True,
        )  # fmt: skip


def profile(out: list[str]) -> None:
    steps, init = make_steps()
    one = _loop(steps["es.jit"], init)
    jax.block_until_ready(one())
    with h.profiled("es.jit training step (MLP, adam), 1,000 steps", out):
        for _ in range(1_000):
            v = one()
        jax.block_until_ready(v)
