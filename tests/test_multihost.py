"""`examples/multihost.py`: the same `es.jit` code on two processes agrees.

The example launches two worker processes (4 simulated CPU devices each, gloo
collectives, coordinator on 127.0.0.1), trains data-parallel over the 8-device
mesh, switches one static field, and flips a static field that a method's
program does not use. Each worker prints a `COUNTS process=I ...` line;
the workers compare their counts and losses with each other
(`process_allgather`) and the launcher compares the printed lines. These tests
run it once in quick mode, as a subprocess with the same strict settings as
`test_examples.py`, and check the printed numbers themselves: the same on both
processes, and the expected ones.

They are skipped, with the reason, only when a one-process
`jax.distributed.initialize` with gloo CPU collectives fails on this machine.
"""

import functools
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import free_address, output, ROOT, run_python


pytestmark = pytest.mark.slow  # two processes, gloo collectives

SCRIPT = ROOT / "examples" / "multihost.py"
TIMEOUT = 240  # seconds; the quick run takes about 10 on 2 cores


_PROBE = textwrap.dedent(
    """
    import socket, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    jax.distributed.initialize(
        coordinator_address=address, num_processes=1, process_id=0,
        coordinator_bind_address=address, initialization_timeout=30,
    )
    assert jax.process_count() == 1, jax.process_count()
    print(float(jax.jit(lambda x: x.sum())(jax.numpy.ones(3))))
    jax.distributed.shutdown()
    """
)


@functools.cache
def _unavailable() -> str | None:
    """Why `jax.distributed` with gloo cannot run here, or None if it can."""
    try:
        probe = run_python(code=_PROBE, strict=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "a one-process jax.distributed.initialize with gloo timed out"
    if probe.returncode != 0 or probe.stdout.strip() != "3.0":
        tail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"jax.distributed with gloo CPU collectives is unavailable: {tail}"
    return None


def _launch(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    # --launch: the local launcher even inside a SLURM job (CI may run in one).
    return run_python(str(SCRIPT), "--launch", *args, strict=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_run() -> subprocess.CompletedProcess[str]:
    return _launch("--quick", "--num-processes", "2", "--timeout", str(TIMEOUT - 30))


def _counts(stdout: str) -> dict[int, dict[str, str]]:
    """process id -> the key=value pairs of its COUNTS line."""
    found: dict[int, dict[str, str]] = {}
    for pid, rest in re.findall(r"^COUNTS process=(\d+) (.*)$", stdout, re.MULTILINE):
        assert int(pid) not in found, f"two COUNTS lines for process {pid}"
        found[int(pid)] = dict(re.findall(r"(\w+)=(\([^)]*\)|\S+)", rest))
    return found


def test_two_processes_run_and_agree(quick_run):
    out = output(quick_run)
    assert quick_run.returncode == 0, out
    assert "OK: 2 processes agree" in quick_run.stdout, out
    for pid in (0, 1):  # each worker's own allgather-based check passed
        assert f"[p{pid}] AGREE: all 2 processes" in quick_run.stdout, out
        assert (
            f"[p{pid}] process {pid} of 2: 4 local of 8 cpu devices" in quick_run.stdout
        ), out


def test_compile_counts_are_the_same_on_both_processes(quick_run):
    counts = _counts(quick_run.stdout)
    assert set(counts) == {0, 1}, output(quick_run)
    assert counts[0] == counts[1]
    c = counts[0]
    # the one static switch costs one compile; the Python counter agrees
    assert c["train_step_compiles"] == c["train_step_misses"] == "2"
    assert c["train_step_traces"] == "2"
    assert c["switch_compiles"] == "1"


def test_programs_are_shared_the_same_way_on_every_process(quick_run):
    """Same calls -> the same traces, programs and XLA compiles everywhere: the
    same cache entries and statistics, no compile for the unread field."""
    counts = _counts(quick_run.stdout)
    assert set(counts) == {0, 1}, output(quick_run)
    infos = {
        pid: re.search(
            rf"^\[p{pid}\] MLP\.predict\.cache_info\(\) = (CacheInfo\([^)]*\)); entries (\d+)$",
            quick_run.stdout,
            re.MULTILINE,
        )
        for pid in (0, 1)
    }
    assert all(m is not None for m in infos.values()), output(quick_run)
    assert infos[0].groups() == infos[1].groups()  # pyright: ignore[reportOptionalMemberAccess]
    c = counts[0]
    assert c["unread_flip_compiles"] == "0"  # log_every: not in the program
    assert c["read_flip_compiles"] == "1"  # use_tanh: in the program
    assert c["predict_compiles"] == "2"
    assert c["predict_misses"] == c["predict_traces"] == c["predict_entries"] == "7"
    assert counts[0]["predict_cache_info"] == counts[1]["predict_cache_info"]


def test_the_launcher_times_out_cleanly():
    """Workers that cannot finish in time are killed; the launcher says so and
    exits non-zero, promptly."""
    start = time.monotonic()
    result = _launch("--quick", "--timeout", "1", timeout=60)
    elapsed = time.monotonic() - start
    out = output(result)
    assert result.returncode != 0, out
    assert "did not finish within 1s (killed)" in result.stdout, out
    assert elapsed < 30, out


_WORKER = textwrap.dedent(
    """
    import json, sys
    import equinox as eqx, jax, jax.numpy as jnp, eqx_static as es

    pid, address = int(sys.argv[1]), sys.argv[2]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=address, num_processes=2, process_id=pid,
        initialization_timeout=60,
    )

    @jax.jit
    def inner(x):  # called from both branches: one private function, or two
        return jnp.sin(x) * 2.0, jnp.cos(x).sum()

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)  # never read: keys share programs
        mode: int = eqx.field(static=True)  # read: two programs

        @es.jit
        def __call__(self, x):
            a, _ = inner(x)
            return self.w * a if self.mode == 0 else self.w + inner(a)[0]

    x = jnp.ones(3)
    keys = [(tag, mode) for tag in "abcd" for mode in (0, 1)]
    if pid == 1:  # another history: other programs lowered first, keys reversed
        for i in range(100):
            jax.jit(lambda z, i=i: inner(z)[0] + i).trace(x).lower()
        keys = keys[::-1]
    for tag, mode in keys:
        M(jnp.ones(3), tag, mode)(x)
    warm = tuple(M.__call__.compile_info()[:2])

    @es.jit(max_compiles=2)
    def g(x, tag, mode):
        return x * (mode + 1)

    refused = None
    for i, (tag, mode) in enumerate([("a", 0), ("b", 0), ("a", 1), ("c", 0), ("b", 2)]):
        try:
            g(x, tag, mode)
        except es.RecompileError:
            refused = i
            break
    print("RESULT " + json.dumps({"warm": warm, "refused": refused,
                                  "budget": tuple(g.compile_info()[:2])}))
    jax.distributed.shutdown()
    """
)


def test_two_processes_warmed_up_differently_decide_the_same():
    """Two processes, each with another trace history and its keys in another
    order: which keys share a program, how many compiles, and which call a
    compile budget refuses are the same on both (a process that raised where
    the other compiled would leave it waiting in a collective)."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    address = free_address()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "error"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(pid), address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for pid in (0, 1)
    ]
    outs = [w.communicate(timeout=TIMEOUT) for w in workers]
    results = []
    for w, (out, err) in zip(workers, outs):
        assert w.returncode == 0, err[-3000:]
        (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
        results.append(line)
    assert results[0] == results[1]
    got = json.loads(results[0].removeprefix("RESULT "))
    assert got == {"warm": [2, 2], "refused": 4, "budget": [2, 2]}
