"""The divergence check's cost: two processes (`jax.distributed`, 4 simulated CPU
devices each, gloo collectives, the coordinator on 127.0.0.1), as
`examples/multihost.py` runs them.

Each process calls an `es.jit` method whose program spans the 8-device mesh (its
input is sharded over it, and it sums: an all-reduce), in the same order:

- misses whose program is reused (a new value of a static field the program does not
  read: a trace and a lowering, no compile), with the check on and off, interleaved;
- misses that compile (a new value of a static field the program reads), with the
  check on and off, interleaved;
- hits, counting the checks they make (none).

Rows: a reused-program miss with the check / without it; the check itself (timed
inside `_diverge.check`, on process 1, which waits for process 0's verdict) / a miss
that compiles; of it, the key-value store's part (posting, the barrier, the verdict),
which holds the wait for the slower process's trace; the same exchange with the
processes in step (met at a barrier first): the round trips alone; the checks made
in the hits. Process 1's times are shown, process 0's in the JSON.

Run alone: `python benchmarks/bench_diverge.py` (prints the rows), or as the group
`diverge` of `python benchmarks/run.py --only diverge`. Skipped (one row saying why)
where two processes cannot start here.
"""

import functools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import _harness as h


GROUP = "diverge"
TITLE = "the divergence check (two processes)"
_TIMEOUT = 240  # seconds, for both processes


def _worker(pid: int, address: str, reps: int, hits: int) -> None:
    """One process: the timings, as a JSON line on stdout."""
    import jax  # initialized before eqx_static is imported (its import uses JAX)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=address, num_processes=2, process_id=pid,
        initialization_timeout=60, shutdown_timeout_seconds=60,
    )  # fmt: skip
    import equinox as eqx
    import eqx_static as es
    import jax.numpy as jnp
    import numpy as np
    from eqx_static import _diverge, _jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    checks: list[float] = []
    exchanges: list[float] = []
    check, exchange = _diverge.check, _diverge._exchange

    def timed(fn: Any, into: list[float]) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                into.append(time.perf_counter() - t0)

        return wrapper

    _diverge.check = timed(check, checks)
    _diverge._exchange = timed(exchange, exchanges)

    class Block(es.Module):
        w: jax.Array
        steps: int = eqx.field(static=True)  # read: a program per value
        tag: int = eqx.field(static=True)  # not read: one program

        @es.jit
        def __call__(self, x: jax.Array) -> jax.Array:
            for _ in range(self.steps):
                x = jnp.tanh(x @ self.w)
            return x.sum()

    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    rows = NamedSharding(mesh, P("data"))
    full = np.ones((64, 16), np.float32)
    x = jax.make_array_from_callback(full.shape, rows, lambda i: full[i])
    w = jnp.eye(16, dtype=jnp.float32) * 0.5

    def miss(steps: int, tag: int, on: bool) -> tuple[float, float | None]:
        os.environ["EQX_STATIC_CHECK_DIVERGENCE"] = "1" if on else "0"
        before = len(checks)
        t0 = time.perf_counter()
        jax.block_until_ready(Block(w, steps, tag)(x))
        took = time.perf_counter() - t0
        return took, (checks[-1] if len(checks) > before and on else None)

    miss(1, -1, True)  # warm: the first compile and the first check
    reused: dict[bool, list[float]] = {True: [], False: []}
    compiling: dict[bool, list[float]] = {True: [], False: []}
    reused_checks, compiling_checks, kv = [], [], []
    for i in range(reps):
        for on in (i % 2 == 0, i % 2 == 1):  # interleaved, alike on both processes
            took, c = miss(1, 2 * i + on, on)
            reused[on].append(took)
            if c is not None:
                reused_checks.append(c)
                kv.append(exchanges[-1])
            took, c = miss(2 + 2 * i + on, 0, on)
            compiling[on].append(took)
            if c is not None:
                compiling_checks.append(c)
    os.environ["EQX_STATIC_CHECK_DIVERGENCE"] = "1"
    # The exchange alone, the processes in step (met at a barrier first): the
    # key-value store's round trips, without the wait for a slower process.
    client, record = _jax.kv_store(), {"f": "f", "program": "p", "decision": "reuse"}
    in_step = []
    for i in range(reps * 4):
        client.wait_at_barrier(f"bench/{i}", 60_000)
        t0 = time.perf_counter()
        exchange(client, {**record, "at": "", "compiles": 0, "key": []}, None, 60.0)
        in_step.append(time.perf_counter() - t0)
    before = len(checks)
    hit = Block(w, 1, 0)
    for _ in range(hits):
        jax.block_until_ready(hit(x))
    med = statistics.median
    result = {
        "reused on": med(reused[True]), "reused off": med(reused[False]),
        "compiling on": med(compiling[True]), "compiling off": med(compiling[False]),
        "check (reused)": med(reused_checks), "check (compiling)": med(compiling_checks),
        "key-value store": med(kv), "in step": med(in_step),
        "hits": hits, "checks in hits": len(checks) - before,
    }  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()


def measure(reps: int, hits: int) -> tuple[list[dict] | None, str]:
    """Both processes' results, or None and why not."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))  # fmt: skip
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=4".strip()
    command = [sys.executable, __file__, "--worker", address, str(reps), str(hits)]
    procs = [
        subprocess.Popen([*command, str(pid)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for pid in (0, 1)
    ]  # fmt: skip
    results, why = [], ""
    for p in procs:
        try:
            out, err = p.communicate(timeout=_TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return None, f"the two processes did not finish within {_TIMEOUT} s"
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            why = why or (err.strip().splitlines() or ["no output"])[-1]
        else:
            results.append(json.loads(lines[0].removeprefix("RESULT ")))
    return (results, "") if len(results) == 2 else (None, why)


def run(rep: h.Report, s: h.Settings) -> None:
    results, why = measure(reps=4 if s.quick else 12, hits=100 if s.quick else 1_000)
    if results is None:
        rep.skip_row(GROUP, "diverge", TITLE, f"skipped: {why}")
        return
    rep.raw["diverge"] = results
    t = results[1]
    rep.compare_row(
        GROUP, "diverge.reused_miss",
        "2 processes: a miss that reuses a program, with the divergence check / without",
        {"with the check": t["reused on"], "without": t["reused off"]},
        "with the check", "without",
    )  # fmt: skip
    rep.compare_row(
        GROUP, "diverge.check_vs_compile",
        "2 processes: the divergence check at a miss / a miss that compiles (without the check)",
        {"check": t["check (compiling)"], "compiling miss": t["compiling off"]},
        "check", "compiling miss",
    )  # fmt: skip
    rep.compare_row(
        GROUP, "diverge.key_value_store",
        "2 processes: the key-value store's part of the check (post, barrier, verdict) / the check",
        {"key-value store": t["key-value store"], "check": t["check (reused)"]},
        "key-value store", "check",
    )  # fmt: skip
    rep.compare_row(
        GROUP, "diverge.in_step",
        "2 processes in step: the key-value store's round trips alone / a miss that reuses a program, without the check",
        {"round trips": t["in step"], "reused miss": t["reused off"]},
        "round trips", "reused miss",
    )  # fmt: skip
    rep.count_row(
        GROUP, "diverge.hits",
        f"2 processes: divergence checks in {t['hits']:,} hits",
        {"checks": t["checks in hits"]}, ("==", 0), ("checks",),
    )  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        address, reps, hits, pid = sys.argv[2:6]
        _worker(int(pid), address, int(reps), int(hits))
    else:
        report = h.Report()
        run(report, h.Settings.make(quick="--quick" in sys.argv))
        print(h.render(report.rows))
        print(json.dumps(report.raw, indent=1))
