"""`results/scaling.svg`: cache-hit call cost against model size, log-log.

    python benchmarks/plot.py [JSON]     # default: benchmarks/results/latest.json

One line each for es.jit (fresh instance), es.jit (same instance), raw jax.jit on
an equivalent eqx.Module (fresh, and same dashed), eqx.filter_jit (fresh) and
flax.struct + jax.jit (fresh, when flax was installed), from the `call.leavesN`
and `peers.flax_wideN` comparisons of the JSON. Needs matplotlib.
"""

import json
import sys
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
SVG = HERE / "results" / "scaling.svg"


def series(data: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    raw = data["raw_seconds"]
    lines: dict[str, list[tuple[int, float]]] = {}

    def add(label: str, key: str, variant: str, n: int) -> None:
        t = raw.get(key, {}).get("per_call_s", {}).get(variant)
        if t is not None:
            lines.setdefault(label, []).append((n, t))

    sizes = data["settings"]["call_sizes"]
    for n in sizes:
        add("es.jit, fresh instance", f"call.leaves{n}", "es.jit fresh", n)
        add("es.jit, same instance", f"call.leaves{n}", "es.jit same", n)
        add("jax.jit on eqx.Module, fresh", f"call.leaves{n}", "jax.jit fresh", n)
        add("jax.jit on eqx.Module, same", f"call.leaves{n}", "jax.jit same", n)
        add("eqx.filter_jit, fresh", f"call.leaves{n}", "filter_jit fresh", n)
        add(
            "flax.struct + jax.jit, fresh",
            f"peers.flax_wide{n}",
            "flax.struct fresh",
            n,
        )
    return lines


def plot(data: dict[str, Any], path: Path = SVG) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "eqx_static"  # stable ids across runs
    styles = {
        "es.jit, fresh instance": dict(color="C0", marker="o"),
        "es.jit, same instance": dict(color="C0", marker="o", linestyle="--"),
        "jax.jit on eqx.Module, fresh": dict(color="C1", marker="s"),
        "jax.jit on eqx.Module, same": dict(color="C1", marker="s", linestyle="--"),
        "eqx.filter_jit, fresh": dict(color="C2", marker="^"),
        "flax.struct + jax.jit, fresh": dict(color="C3", marker="D"),
    }
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for label, pts in series(data).items():
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, [y * 1e6 for y in ys], label=label, **styles.get(label, {}))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("array leaves (one field per array)")
    ax.set_ylabel("cache-hit call (µs)")
    m = data["machine"]
    v = m["versions"]
    ax.set_title(
        f"cache-hit call cost ({m['cpu_count']} CPU cores, jax {v.get('jax')}, "
        f"equinox {v.get('equinox')}, git {str(m.get('git')).split()[0]})",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else HERE / "results" / "latest.json"
    print(f"wrote {plot(json.loads(src.read_text()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
