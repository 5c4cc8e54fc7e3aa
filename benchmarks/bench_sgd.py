"""An MLP training step with SGD written out, at sizes an accelerator is for: µs per
step of `es.jit`, `eqx.filter_jit` and the hand loop, on whatever platform JAX finds.

An `eqx.nn.MLP` inside an `es.Module` (8 -> width x depth -> 1; 64x2, 512x3,
2,048x4 and 4,096x4), batch 1,024, mean squared error, plain SGD
(`p - lr * g`, through `eqx.apply_updates`), so every step returns a new module
as a training loop does. The peers, timed in the same interleaved rounds:

- `es.jit(step)`;
- `eqx.filter_jit(step)`;
- the hand loop: partition once, before the loop, and pass only the parameters
  through `jax.jit`.

Each runs two ways: the loop left asynchronous (each batch of steps is blocked
only at its end, so the host runs ahead of the device), and the loss read every
step (`float(loss)`, as a loop that logs it does: the host waits for the device
each step). A row gives each peer's median over the rounds and its spread (the
25th and 75th percentiles). Not in `run.py`'s default groups (the largest sizes
take seconds per step on a CPU): `python benchmarks/run.py --only sgd [--quick]`;
`--quick` is 64x2 and 256x2, fewer steps.
"""

import dataclasses
import statistics
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models


GROUP = "sgd"
TITLE = "SGD training step at accelerator sizes"
SIZES = {"64x2": (64, 2), "512x3": (512, 3), "2048x4": (2048, 4), "4096x4": (4096, 4)}
QUICK_SIZES = {"64x2": (64, 2), "256x2": (256, 2)}
BATCH = 1024
LR = 1e-3
PEERS = ("es.jit", "eqx.filter_jit", "hand loop")
MODES = {"async": "loop left asynchronous", "read": "loss read every step"}


def _loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def step(model: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
    updates = jax.tree.map(lambda g: -LR * g, grads)
    return eqx.apply_updates(model, updates), loss


def make_loops(width: int, depth: int) -> dict[str, Any]:
    """One training step per call for each peer and mode, each loop holding its own
    model; a call returns the step's loss (read, in the "read" mode)."""
    kx, ky = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (BATCH, 8))
    y = jax.random.normal(ky, (BATCH, 1))
    params0, static = eqx.partition(
        models.make_net(width=width, depth=depth), eqx.is_array
    )

    @jax.jit
    def hand(params, x, y):
        model, loss = step(eqx.combine(params, static), x, y)
        return eqx.filter(model, eqx.is_array), loss

    def loop(fn: Any, state: Any, read: bool) -> Any:
        held = [state]

        def one() -> Any:
            held[0], loss = fn(held[0], x, y)
            return float(loss) if read else loss

        return one

    model0 = eqx.combine(params0, static)
    loops = {}
    for mode in MODES:
        read = mode == "read"
        loops[f"es.jit, {mode}"] = loop(es.jit(step), model0, read)
        loops[f"eqx.filter_jit, {mode}"] = loop(eqx.filter_jit(step), model0, read)
        loops[f"hand loop, {mode}"] = loop(hand, params0, read)
    return loops


def _quantile(v: list[float], q: int) -> float:
    return (
        statistics.quantiles(v, n=4, method="inclusive")[q - 1] if len(v) > 1 else v[0]
    )


def run(rep: h.Report, s: h.Settings) -> None:
    # A step of the largest size takes milliseconds on an accelerator: batches of
    # 100 ms (20 in quick mode) hold enough steps for the asynchronous loop to run
    # ahead of the device.
    s = dataclasses.replace(s, batch_s=0.02 if s.quick else 0.1)
    for size, (width, depth) in (QUICK_SIZES if s.quick else SIZES).items():
        key = f"sgd.{size}"
        h.compare(make_loops(width, depth), s, block=True, raw=rep.raw, key=key)
        samples = rep.raw[key]["samples_s"]
        for mode, what in MODES.items():
            runs = {p: samples[f"{p}, {mode}"] for p in PEERS}
            t = {p: statistics.median(v) for p, v in runs.items()}
            spread = "; ".join(
                f"{p} {_quantile(v, 1) * 1e6:,.1f}-{_quantile(v, 3) * 1e6:,.1f} us"
                for p, v in runs.items()
            )
            name = f"MLP 8->{size}->1, batch {BATCH}, SGD, {what}"
            note = f"median of {len(runs['es.jit'])} rounds; 25th-75th: {spread}"
            rep.info_row(GROUP, f"{key}.{mode}", name, t, instance="fresh", note=note)
            rep.compare_row(
                GROUP,
                f"{key}.{mode}.hand",
                f"the same ({what}): es.jit / hand loop",
                t,
                "es.jit",
                "hand loop",
                "fresh",
            )
            rep.compare_row(
                GROUP,
                f"{key}.{mode}.filter_jit",
                f"the same ({what}): eqx.filter_jit / es.jit (speed-up)",
                t,
                "eqx.filter_jit",
                "es.jit",
                "fresh",
            )
