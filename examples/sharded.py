"""Sharded dynamic fields: `es.jit` keeps their layout and compiles once per layout.

The script simulates 8 CPU devices (it sets `XLA_FLAGS` before importing JAX),
builds a 4 x 2 `jax.sharding.Mesh` with axes ("data", "model"), and places a
linear layer's weight and bias on it with `NamedSharding`: the weight's output
dimension and the bias are split over "model", the input batch over "data". The
layer's `es.jit` `__call__` runs on those shards; JAX's partitioner decides the
output's layout, here split over both axes.

It then shows that the compile key holds each traced field's sharding:
- new weights with the same layout (`with_dynamic`): no compile;
- the same weights replicated on every device: one compile, explained in the
  log as a sharding change of field 'w';
- back to the first layout: no compile (still cached).
The script checks these counts and the shardings, and exits non-zero otherwise.

Run:  python examples/sharded.py
(No `--quick` needed: it is small. `EXAMPLES_QUICK` is ignored.)
"""

import os


os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import logging  # noqa: E402
import sys  # noqa: E402

import eqx_static as es  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


class Linear(es.Module):
    w: jax.Array  # (d_in, d_out)
    b: jax.Array  # (d_out,)

    @es.jit
    def __call__(self, x: jax.Array) -> jax.Array:  # (n, d_in) -> (n, d_out)
        return jnp.tanh(x @ self.w + self.b[None, :])


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def spec(a: jax.Array) -> str:
    """A short description of an array's layout."""
    s = a.sharding
    if isinstance(s, NamedSharding):
        return f"{s.spec} on {len(s.device_set)} devices"
    return f"{type(s).__name__} on {len(s.device_set)} devices"


def main() -> int:
    handler = _Collect()
    log = logging.getLogger("eqx_static")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    devices = jax.devices()
    if len(devices) != 8:
        print(f"FAILED: expected 8 simulated CPU devices, got {len(devices)}")
        return 1
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    split_w = NamedSharding(mesh, P(None, "model"))
    split_b = NamedSharding(mesh, P("model"))
    replicated = NamedSharding(mesh, P())

    rng = np.random.default_rng(0)
    d_in, d_out, n = 16, 32, 64
    w = rng.normal(size=(d_in, d_out)).astype(np.float32) / 4
    b = rng.normal(size=d_out).astype(np.float32)
    x = jax.device_put(
        rng.normal(size=(n, d_in)).astype(np.float32), NamedSharding(mesh, P("data"))
    )
    layer = Linear(w=jax.device_put(w, split_w), b=jax.device_put(b, split_b))
    info = Linear.__call__.cache_info

    def compiles() -> int:  # XLA compiles: a new layout compiles without a trace
        return Linear.__call__.compile_info().compiles

    print(f"mesh: {dict(mesh.shape)} over {len(devices)} {devices[0].platform} devices")
    print(f"input  x   : {x.shape} {spec(x)}")
    print(f"field  w   : {layer.w.shape} {spec(layer.w)}")
    print(f"field  b   : {layer.b.shape} {spec(layer.b)}")
    y = layer(x)
    first_compiles = compiles()
    print(f"output y   : {y.shape} {spec(y)}")
    print()

    failures: list[str] = []
    if first_compiles != 1:
        failures.append(f"first call: {first_compiles} compiles, expected 1")
    expected_out = NamedSharding(mesh, P("data", "model"))
    if not y.sharding.is_equivalent_to(expected_out, y.ndim):
        failures.append(f"output sharding {y.sharding}, expected {expected_out}")
    if not layer.w.sharding.is_equivalent_to(split_w, 2):
        failures.append("the call changed the weight's sharding")
    reference = np.tanh(np.asarray(x) @ w + b)
    if not np.allclose(np.asarray(y), reference, atol=1e-5):
        failures.append("output differs from NumPy")

    steps = [
        (
            "same layout, new values",
            layer.with_dynamic(w=jax.device_put(2 * w, split_w)),
            0,
        ),
        (
            "w and b replicated",
            layer.with_dynamic(
                w=jax.device_put(w, replicated), b=jax.device_put(b, replicated)
            ),
            1,
        ),
        (
            "replicated again",
            layer.with_dynamic(
                w=jax.device_put(3 * w, replicated), b=jax.device_put(b, replicated)
            ),
            0,
        ),
        ("back to the first layout", layer, 0),
    ]
    print(f"{'call':<26} {'w layout':<31} {'output layout':<31} {'compiled':>8}")
    print(
        f"{'first call':<26} {spec(layer.w):<31} {spec(y):<31} {'yes' if first_compiles else 'no':>8}"
    )
    for label, model, expected in steps:
        before = compiles()
        out = model(x)
        compiled = compiles() - before
        print(
            f"{label:<26} {spec(model.w):<31} {spec(out):<31} {'yes' if compiled else 'no':>8}"
        )
        if compiled != expected:
            failures.append(f"{label}: {compiled} compiles, expected {expected}")
        ref = np.tanh(np.asarray(x) @ np.asarray(model.w) + np.asarray(model.b))
        if not np.allclose(np.asarray(out), ref, atol=1e-5):
            failures.append(f"{label}: output differs from NumPy")

    final = info()
    print()
    print(f"Linear.__call__.cache_info() = {final}, {compiles()} XLA compiles")
    print("explanations (logger 'eqx_static', INFO):")
    for line in handler.lines:
        print(f"  {line}")
    if compiles() != 2 or final.misses != 2:
        failures.append(
            f"expected 2 misses and 2 compiles (one per layout), got {final.misses} "
            f"and {compiles()}"
        )
    if failures:
        print("\nFAILED:", *failures, sep="\n  ")
        return 1
    print("\nOK: shardings kept; one compile per layout (2 layouts, 5 calls).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
