"""`es.jit` under `jax.set_mesh`, JAX's explicit-sharding API.

The script simulates 8 CPU devices (it sets `XLA_FLAGS` before importing JAX) and
makes a 4 x 2 mesh whose axes ("data", "model") are `AxisType.Explicit`: under
`jax.set_mesh(mesh)`, every array's type carries its sharding, and JAX's
partitioner follows it. A layer keeps its weight split over "model" and a static
`name` that the program never reads. It checks that:

- the call runs under the mesh, and its output is split as the types say;
- new weights with the same layout (`with_dynamic`) compile nothing;
- flipping the unread static `name` traces and compiles nothing (the program is
  provably the same: one executable serves both keys);
- every result equals the eager call's.

Run:  python examples/explicit_sharding.py
"""

import os


os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import sys  # noqa: E402

import equinox as eqx  # noqa: E402
import eqx_static as es  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402


class Layer(es.Module):
    w: jax.Array  # (d_in, d_out), split over "model"
    name: str = eqx.field(static=True)  # never read by the program

    @es.jit
    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ self.w)


def main() -> int:
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        w = jax.device_put(
            np.ones((4, 6), np.float32), NamedSharding(mesh, P(None, "model"))
        )
        x = jax.device_put(
            np.ones((8, 4), np.float32), NamedSharding(mesh, P("data", None))
        )
        layer = Layer(w, "a")
        out = layer(x)
        print(f"output {out.shape}, sharded {out.sharding.spec}")
        calls = [
            layer.with_dynamic(w=w * 2),  # new weights, same layout
            layer.with_static(name="b"),  # an unread static flipped
        ]
        results = [c(x) for c in calls]
        compiles = Layer.__call__.compile_info().compiles
        info = Layer.__call__.cache_info()
    eager = [np.tanh(np.asarray(x) @ np.asarray(c.w)) for c in (layer, *calls)]
    ok = all(np.allclose(np.asarray(r), e) for r, e in zip((out, *results), eager))
    print(f"cache_info: {info}; XLA compiles: {compiles}")
    if not ok or compiles != 1 or out.sharding.spec != P("data", "model"):
        print("FAILED: expected one compile, eager results and a split output")
        return 1
    print("OK: explicit sharding under jax.set_mesh; an unread flip compiles nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
