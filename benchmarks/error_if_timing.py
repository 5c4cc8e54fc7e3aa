"""When a failing `eqx.error_if` surfaces, under `es.jit` and `eqx.filter_jit`, on
the backend JAX picks: at the call, at the read of the result, not at all (the
call returns values), or never (the process waits; Equinox waits on `input()` on
a TPU, whose runtime does not raise from a host callback).

Each wrapper runs in a process of its own, with a timeout: stdin closed
(`--stdin closed`, `input()` then fails at once) or a pipe nobody writes to
(`--stdin open`, as a terminal nobody answers). Prints a table, then JSON:

    python benchmarks/error_if_timing.py [--timeout 120] [--stdin closed open]
"""

import argparse
import json
import os
import subprocess
import sys
import time


WRAPPERS = ("es.jit", "eqx.filter_jit")


def child(wrapper: str) -> dict:
    """Run one failing `error_if` program once: what surfaced, where, how fast."""
    import equinox as eqx
    import eqx_static as es
    import jax
    import jax.numpy as jnp

    def body(x):
        return eqx.error_if(x * 2.0, x > 0.0, "x must be <= 0") + 1.0

    f = es.jit(body) if wrapper == "es.jit" else eqx.filter_jit(body)
    ok = f(jnp.float32(-1.0))  # compiles; passes
    jax.block_until_ready(ok)
    row = {"wrapper": wrapper, "backend": jax.default_backend(), "passing": float(ok)}
    start = time.perf_counter()
    try:
        out = f(jnp.float32(1.0))
    except Exception as e:
        return row | _raised("raises at the call", e, start)
    row["call_s"] = time.perf_counter() - start
    try:
        value = float(jax.block_until_ready(out))
    except Exception as e:
        return row | _raised("raises at the read", e, start)
    return row | {"outcome": "returns without raising", "value": value}


def _raised(outcome: str, e: Exception, start: float) -> dict:
    first = (str(e).strip().splitlines() or [""])[0][:120]
    seconds = time.perf_counter() - start
    return {"outcome": outcome, "error": type(e).__name__, "first_line": first} | {
        "raised_after_s": seconds
    }


def run(wrapper: str, stdin: str, timeout: float) -> dict:
    """`child(wrapper)` in a process of its own; "hangs" past `timeout`."""
    command = [sys.executable, os.path.abspath(__file__), "--child", wrapper]
    pipe = subprocess.DEVNULL if stdin == "closed" else subprocess.PIPE
    row = {"wrapper": wrapper, "stdin": stdin}
    with subprocess.Popen(
        command, stdin=pipe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:
            out, err = p.communicate(timeout=timeout)  # never writes to an open stdin
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return row | {"outcome": "hangs", "timeout_s": timeout}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        tail = err.strip().splitlines()[-3:]
        return row | {"outcome": f"exits with {p.returncode}", "stderr": tail}
    return row | json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=WRAPPERS)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--stdin", nargs="+", default=["closed", "open"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)), flush=True)
        return
    rows = [run(w, s, args.timeout) for s in args.stdin for w in WRAPPERS]
    for r in rows:
        where = r.get("backend", "?")
        detail = r.get("error") or r.get("value", "")
        print(f"{r['wrapper']:15} {where:4} stdin {r['stdin']:6}: {r['outcome']} {detail}")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
