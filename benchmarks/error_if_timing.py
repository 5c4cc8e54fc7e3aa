"""When a failing `eqx.error_if` surfaces, under `es.jit` and `eqx.filter_jit`, on
the backend JAX picks: at the call, at the read of the result, not at all (the
call returns values), or never (the process waits: on a TPU Equinox asks for a
line on stdin after the error, and stays in a loop until it gets one).

Each case runs in a process of its own, with a timeout: the failing call is the
first (it traces and compiles) or a later one (a cache hit), with stdin closed
(`input()` then fails at once) or open, a pipe nobody writes to (a terminal nobody
answers). After the failure, a passing call shows whether the process can go on.
Prints a table, then the rows as JSON:

    python benchmarks/error_if_timing.py [--timeout 60] [--stdin closed open]
"""

import argparse
import json
import os
import subprocess
import sys
import time


WRAPPERS = ("es.jit", "eqx.filter_jit")
CALLS = ("first", "hit")


def child(wrapper: str, call: str) -> None:
    """Fail once, then pass once; print a JSON line as each step ends."""
    import equinox as eqx
    import eqx_static as es
    import jax
    import jax.numpy as jnp

    def body(x):
        return eqx.error_if(x * 2.0, x > 0.0, "x must be <= 0") + 1.0

    f = es.jit(body) if wrapper == "es.jit" else eqx.filter_jit(body)
    if call == "hit":
        jax.block_until_ready(f(jnp.float32(-1.0)))  # compiles; passes
    print(json.dumps({"backend": jax.default_backend()}), flush=True)
    for step, x in (("failing", 1.0), ("next", -1.0)):
        print(json.dumps({step: _outcome(f, jnp.float32(x))}), flush=True)


def _outcome(f, x) -> str:
    try:
        out = f(x)
    except Exception as e:
        return f"raises at the call: {type(e).__name__}"
    try:
        value = float(out)  # the read
    except Exception as e:
        return f"raises at the read: {type(e).__name__}"
    return f"returns {value}"


def run(wrapper: str, call: str, stdin: str, timeout: float) -> dict:
    """`child` in a process of its own; a step unfinished at `timeout` "hangs"."""
    command = [sys.executable, os.path.abspath(__file__), "--child", wrapper, call]
    pipe = subprocess.DEVNULL if stdin == "closed" else subprocess.PIPE
    row = {"wrapper": wrapper, "call": call, "stdin": stdin}
    start = time.perf_counter()
    with subprocess.Popen(
        command, stdin=pipe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:  # writes nothing to an open stdin, and keeps it open
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
    for line in out.splitlines():
        if line.startswith("{"):
            row.update(json.loads(line))
    for step in ("failing", "next"):
        if step not in row:
            row[step] = "hangs" if p.returncode == -9 else f"exits {p.returncode}"
    if p.returncode not in (0, -9):
        row["stderr"] = err.strip().splitlines()[-3:]
    return row | {"seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("WRAPPER", "CALL"))
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--stdin", nargs="+", default=["closed", "open"])
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    rows = [
        run(w, c, s, args.timeout) for s in args.stdin for c in CALLS for w in WRAPPERS
    ]
    print(
        "| wrapper | backend | failing call | stdin | the failing call | the next call |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        where = r.get("backend", "?")
        cells = (r["wrapper"], where, r["call"], r["stdin"], r["failing"], r["next"])
        print("| " + " | ".join(cells) + " |")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
