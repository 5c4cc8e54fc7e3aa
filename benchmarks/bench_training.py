"""A training step (target: 0.9x jax.jit with partition/combine at most).

`eqx.nn.MLP` (8 -> 32 x 3 -> 1) inside an `es.Module`, optax adam, batch 64; every
step takes the model and returns a new one (`eqx.apply_updates` inside the step),
as a training loop does. Three versions of the same step:

- `es.jit(step)(model, opt_state, x, y)`;
- `jax.jit` with `eqx.partition`/`eqx.combine`: partition the model, call the
  jitted step on its arrays (the static part closed over), combine the result;
- `eqx.filter_jit(step)`, for reference.

Target: `es.jit` <= 0.9x the `jax.jit` version.
"""

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


def make_steps() -> tuple[dict[str, Any], tuple[Any, ...]]:
    model = models.make_net()
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

    _, static = eqx.partition(model, eqx.is_array)

    @jax.jit
    def inner(params, opt_state, x, y):
        model, opt_state, value = step(eqx.combine(params, static), opt_state, x, y)
        return eqx.filter(model, eqx.is_array), opt_state, value

    def jax_step(model, opt_state, x, y):
        params, static_now = eqx.partition(model, eqx.is_array)
        params, opt_state, value = inner(params, opt_state, x, y)
        return eqx.combine(params, static_now), opt_state, value

    steps = {
        "es.jit": es.jit(step),
        "jax.jit + partition/combine": jax_step,
        "eqx.filter_jit": eqx.filter_jit(step),
    }
    return steps, (model, opt_state, x, y)


def _loop(step: Any, init: tuple[Any, ...]) -> Any:
    model, opt_state, x, y = init
    state = [model, opt_state]

    def one() -> Any:
        state[0], state[1], value = step(state[0], state[1], x, y)
        return value

    return one


def run(rep: h.Report, s: h.Settings) -> None:
    steps, init = make_steps()
    t = h.compare(
        {name: _loop(step, init) for name, step in steps.items()},
        s,
        raw=rep.raw,
        key="training.mlp",
    )
    rep.compare_row(
        GROUP, "training.jax_jit", "MLP + adam step, new module every step: es.jit / jax.jit + partition/combine",
        t, "es.jit", "jax.jit + partition/combine", "fresh", ("<=", 0.9),
    )  # fmt: skip
    rep.compare_row(
        GROUP, "training.filter_jit", "the same step: eqx.filter_jit / es.jit (speed-up)",
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
