"""Benchmark suite for `eqx_static` (the performance targets): one table of ratios, one process.

Run from the repository root:

    python benchmarks/run.py                  # full run (about 4 minutes on 2 cores)
    python benchmarks/run.py --quick          # CI smoke test (< 30 s), never asserts
    python benchmarks/run.py --plot --readme  # full run, scaling.svg, docs/benchmarks.md table
    python benchmarks/run.py --only call,training
    python benchmarks/run.py --profile        # also cProfile the hot paths

One file per group of rows, named after the target it measures:

    _harness.py         timing (interleaved rounds, min of medians), rows, JSON
    models.py           the seed Parent/Child and the models at n leaves
    bench_call.py       cache-hit calls, fresh and same instance; the floor
    bench_training.py   a training step
    bench_update.py     with_dynamic / es.edit / tree_at / replace
    bench_compiles.py   compile counts; first-call cost; a miss that reuses a program
    bench_memory.py     memory per key sharing a program, and per live instance
    bench_peers.py      flax.struct, jax_dataclasses, flax.nnx (skipped if absent)
    bench_sgd.py        an SGD step at accelerator sizes (only with `--only sgd`)
    bench_diverge.py    the divergence check on two processes (skipped if they cannot start)
    readme_table.py     the table of docs/benchmarks.md, generated from results/latest.json
    plot.py             results/scaling.svg

The full run of every group writes `results/latest.json` (the file the table of
docs/benchmarks.md is generated from); `--quick` writes `results/quick.json` and `--only`
`results/only-GROUPS.json` unless `--json` says otherwise. The targets are shown as
PASS/MISS for information only: the script exits 0 whatever it measures.
"""

import argparse
import dataclasses
import json
import logging
import random
import sys
import time
from pathlib import Path
from types import ModuleType


sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
import bench_call  # noqa: E402
import bench_compiles  # noqa: E402
import bench_diverge  # noqa: E402
import bench_memory  # noqa: E402
import bench_peers  # noqa: E402
import bench_sgd  # noqa: E402
import bench_training  # noqa: E402
import bench_update  # noqa: E402
import readme_table  # noqa: E402


GROUPS: dict[str, ModuleType] = {
    m.GROUP: m
    for m in (
        bench_call,
        bench_training,
        bench_update,
        bench_compiles,
        bench_memory,
        bench_peers,
        bench_diverge,
    )
}
# Groups run only when `--only` names them: too slow for a CPU's full run.
EXTRA: dict[str, ModuleType] = {bench_sgd.GROUP: bench_sgd}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test (< 30 s)")
    parser.add_argument("--json", type=Path, help="output JSON (default: see above)")
    parser.add_argument(
        "--only",
        help=f"comma-separated groups among {', '.join([*GROUPS, *EXTRA])}",
    )
    parser.add_argument("--plot", action="store_true", help="write results/scaling.svg")
    parser.add_argument(
        "--readme",
        action="store_true",
        help="regenerate the table in docs/benchmarks.md (full runs)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the hot paths")
    args = parser.parse_args(argv)
    # The seed's `dp: float` fields are data on purpose: its one-time announcement
    # (a WARNING per class, and the seed classes are made afresh) is not a result.
    logging.getLogger("eqx_static").setLevel(logging.ERROR)

    names = list(GROUPS) if not args.only else args.only.split(",")
    groups = {**GROUPS, **EXTRA}
    unknown = [n for n in names if n not in groups]
    if unknown:
        parser.error(f"unknown group(s) {unknown}; choose among {list(groups)}")
    complete = not args.quick and names == list(GROUPS)
    if args.json is not None:
        out = args.json
    elif args.quick:
        out = h.RESULTS / "quick.json"
    elif not complete:
        out = h.RESULTS / f"only-{'-'.join(names)}.json"
    else:
        out = readme_table.LATEST
    if args.readme and not (complete and out == readme_table.LATEST):
        parser.error(
            "--readme needs a full run of every group into results/latest.json"
        )

    s = h.Settings.make(args.quick)
    random.seed(0)
    info = h.machine()
    v = info["versions"]
    print(
        f"machine: {info['platform']}, {info['cpu_count']} CPUs, python {info['python']}, "
        f"jax {v['jax']} ({info['jax_backend']}), equinox {v['equinox']}, optax {v['optax']}, "
        f"flax {v['flax']}, jax_dataclasses {v['jax_dataclasses']}; eqx_static at {info['git']}"
    )
    print(
        f"mode: {'quick' if s.quick else 'full'}; groups {', '.join(names)}; "
        f"{s.rounds} rounds of {s.batch_s * 1e3:.0f} ms batches",
        flush=True,
    )

    rep = h.Report()
    start = time.perf_counter()
    durations: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        groups[name].run(rep, s)
        durations[name] = time.perf_counter() - t0
        print(f"  {name}: {durations[name]:.1f} s", flush=True)
    total = time.perf_counter() - start

    print(h.render(rep.rows))
    judged = [r for r in rep.rows if r.meets_target is not None]
    misses = [r for r in judged if not r.meets_target]
    print(
        f"\ntargets: {len(judged) - len(misses)} PASS, {len(misses)} MISS "
        "(informational; exit code 0)"
    )
    for r in misses:
        print(
            f"  MISS {r.key}: {r.name} = {h.fmt_ratio(r.ratio) or r.values} (target {r.target})"
        )
    print(f"wall time: {total:.1f} s")

    profile = None
    if args.profile:
        parts: list[str] = []
        for name in names:
            fn = getattr(groups[name], "profile", None)
            if fn is not None:
                fn(parts)
        profile = "\n".join(parts)
        print("\n" + profile)

    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": info,
        "mode": "quick" if s.quick else "full",
        "groups": names,
        "settings": dataclasses.asdict(s),
        "wall_seconds": total,
        "group_seconds": durations,
        "rows": [dataclasses.asdict(r) for r in rep.rows],
        "raw_seconds": rep.raw,
        "profile": profile,
    }
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {out}")

    if args.plot:
        import plot

        svg = "scaling.svg" if out == readme_table.LATEST else f"{out.stem}-scaling.svg"
        print(f"wrote {plot.plot(payload, out.parent / svg)}")
    if args.readme:
        readme_table.main(["--json", str(out)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
