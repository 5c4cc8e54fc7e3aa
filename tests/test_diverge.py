"""Processes that diverge raise instead of hanging (`es.DivergenceError`).

Two processes × 4 simulated CPU devices, `jax.distributed` with gloo collectives
and the coordinator on 127.0.0.1, as `examples/multihost.py` runs them. Each
worker calls `es.jit` programs that span the 8-device mesh and prints one line:
`RAISED <message>` (a `DivergenceError`) or `DONE <counts>`. Each test ends by
itself within 120 seconds. For the three kinds of divergence the issue names (a
static that differs per process; `max_compiles` reached on one process only; one
process misses while the other hits), every process raises with the same message,
or, in the last, the process that missed raises and the one stuck in a collective
is ended with the message and its stack; for the benign cases (a static from
`jax.process_index()` the program never reads, process-local programs, other
`PYTHONHASHSEED`s) none raises. With the check off, the first kind hangs: the
tests can fail.

The checks of a static that differs and of a budget run on both dispatch paths
(each key's own dispatcher, and `EQX_STATIC_PUBLIC_JIT=1`). Skipped, as `test_multihost.py`, where gloo is unavailable. The last tests
check the message, the description of a call and the fallback in this process.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from eqx_static import _diverge, _jax
from eqx_static._key import key_and_leaves
from helpers import free_address, ROOT
from test_multihost import _unavailable


pytestmark = pytest.mark.slow  # two processes, gloo collectives

BOUND = 120  # seconds: every two-process test ends within it

_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import jax

    pid, address, scenario = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=address, num_processes=2, process_id=pid,
        initialization_timeout=60, shutdown_timeout_seconds=60,
    )
    import equinox as eqx, jax.numpy as jnp, numpy as np
    import eqx_static as es
    from eqx_static import _diverge
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((8,), ("data",))
    full = np.arange(16, dtype=np.float32)
    x = jax.make_array_from_callback((16,), NamedSharding(mesh, P("data")), lambda i: full[i])

    class Model(es.Module):
        w: jax.Array
        steps: int = eqx.field(static=True)  # read: a program per value
        tag: int = eqx.field(static=True)  # never read

        @es.jit
        def __call__(self, x):
            for _ in range(self.steps):  # an all-reduce over both processes per step
                x = x * self.w + x.sum()
            return x.sum()

    @es.jit(max_compiles=1)
    def budgeted(x, k):
        return (x * k).sum()

    class Flags(es.Module):
        flags: frozenset = eqx.field(static=True)  # its order: the hash seed's

        @es.jit
        def __call__(self, x):
            return (x * 2 if "b" in self.flags else x).sum()

    def call(model):
        return float(model(x))

    w = jnp.float32(2.0)
    try:
        if scenario == "static":  # a static from each process's environment
            call(Model(w, 2 + pid, 0))
        elif scenario == "budget":  # the budget spent on process 0 alone
            if pid == 0:
                budgeted(jnp.ones(3), 5)  # a program of this process only
            float(budgeted(x, 1))
        elif scenario.startswith("one-sided"):  # one process misses, the other hits
            call(Model(w, 2, 0)), call(Model(w, 2, 0))
            call(Model(w, 3 if pid == int(scenario[-1]) else 2, 0))
        elif scenario == "benign":
            for _ in range(4):  # a static from process_index(), never read
                call(Model(w, 2, pid))
            local = es.jit(lambda v, n: v * n)  # a program of each process alone
            local(jnp.ones(3), pid + 2), local(jnp.ones(3), pid + 2)
            call(Model(w, 2, 1 - pid))  # a new key on each: a shared program
            call(Flags(frozenset("abcdefgh")))
        counts = {
            "model": tuple(Model.__call__.cache_info()) + tuple(Model.__call__.compile_info()[:2]),
            "checks": int(repr(_diverge._checks)[6:-1]),
        }
        print("DONE " + json.dumps(counts), flush=True)
    except es.DivergenceError as e:
        print("RAISED " + json.dumps(str(e)), flush=True)
        sys.exit(3)
    """
)


def _two(
    scenario: str, env: dict | None = None, each: tuple = ({}, {}), wait: float = BOUND
) -> tuple[list, float]:
    """Run the worker on two processes; their (exit code or None if still running
    after `wait` seconds, stdout, stderr), and the seconds they took."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    address = free_address()
    base = {k: v for k, v in os.environ.items() if not k.startswith("EQX_STATIC_")}
    base.update(
        JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), PYTHONWARNINGS="error",
        XLA_FLAGS="--xla_force_host_platform_device_count=4", **(env or {}),
    )  # fmt: skip
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(pid), address, scenario],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**base, **each[pid]}, cwd=ROOT,
        )
        for pid in (0, 1)
    ]  # fmt: skip
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, start + wait - time.monotonic()))
            out.append((p.returncode, o, e))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            out.append((None, o, e))
    return out, time.monotonic() - start


def _line(out: str, kind: str) -> str | dict:
    (line,) = [x for x in out.splitlines() if x.startswith(kind + " ")]
    return json.loads(line.removeprefix(kind + " "))


def _show(results: list) -> str:
    return "\n".join(
        f"--- process {i} (exit {code}) ---\n{o}\n{e[-3000:]}"
        for i, (code, o, e) in enumerate(results)
    )


def _raised_alike(results: list) -> str:
    """The message every process raised, the same on each."""
    assert [code for code, _, _ in results] == [3, 3], _show(results)
    messages = [_line(o, "RAISED") for _, o, _ in results]
    assert messages[0] == messages[1], _show(results)
    return messages[0]  # pyright: ignore[reportReturnType]


PATHS = [{}, {"EQX_STATIC_PUBLIC_JIT": "1"}]


@pytest.mark.parametrize("path", PATHS, ids=["dispatcher", "public"])
def test_a_static_that_differs_per_process_raises_on_every_process(path: dict):
    results, took = _two("static", env=path)
    message = _raised_alike(results)
    assert message.startswith(
        "Model.__call__: the processes diverged at a miss of a program that spans "
        "them (at <string>:"
    ), message
    assert "static field 'steps': process 0: 2 (int), process 1: 3 (int)" in message
    assert "decision: processes 0, 1: compile (compiles so far: 0)" in message
    assert "tag" not in message  # the same on both: not named
    assert took < BOUND


def test_without_the_check_the_same_processes_hang():
    """The test above can fail: with `EQX_STATIC_CHECK_DIVERGENCE=0` no process
    raises, and one (with a step more) still waits in a collective after 20 s."""
    results, _ = _two("static", env={"EQX_STATIC_CHECK_DIVERGENCE": "0"}, wait=20)
    assert None in [code for code, _, _ in results], _show(results)
    assert not any("RAISED" in o for _, o, _ in results)


@pytest.mark.parametrize("path", PATHS, ids=["dispatcher", "public"])
def test_a_budget_reached_on_one_process_only_raises_on_every_process(path: dict):
    """Process 0 would refuse at `max_compiles` where process 1 compiles: each
    would wait for the other (and the one that raised `RecompileError` never
    exited); both raise, and exit."""
    results, took = _two("budget", env=path)
    message = _raised_alike(results)
    assert message.startswith("budgeted: the processes diverged"), message
    assert (
        "decision: process 0: refuse (compiles so far: 1), "
        "process 1: compile (compiles so far: 0)"
    ) in message
    assert "program: processes 0, 1: " in message  # the same program
    assert took < BOUND


@pytest.mark.parametrize("missing", [0, 1])
def test_one_process_misses_while_the_other_hits(missing: int):
    """One process misses (a new static value) where the other hits and waits in
    the program's collective: after the timeout, the one that missed raises naming
    the call and what changed; the other is ended with the message and its stack,
    not left hanging (process 0 too, which holds JAX's coordinator). A warning is
    logged at half the timeout (under 60 s)."""
    results, took = _two(f"one-sided{missing}", env={"EQX_STATIC_DIVERGENCE_TIMEOUT": "10"})  # fmt: skip
    (c0, o0, e0), (c1, o1, e1) = results[missing], results[1 - missing]
    assert (c0, c1) == (3, 1) and "RAISED" not in o1, _show(results)
    message = _line(o0, "RAISED")
    assert isinstance(message, str)
    assert message.startswith("Model.__call__: this call missed (at <string>:"), message
    assert "static field 'steps' changed 2 -> 3) and would compile" in message
    assert f"but process {1 - missing} did not come to this miss within 10 s" in message
    assert "waiting for every process to come to this miss" in e0, e0
    assert (
        f"process {1 - missing} is ended, for another raised es.DivergenceError" in e1
    ), e1
    assert message in e1 and "It was waiting here:" in e1
    assert 'File "<string>", line' in e1  # its stack, down to the call
    assert took < BOUND


def test_benign_differences_raise_nothing():
    """A static from `jax.process_index()` the program never reads, programs of
    each process alone, a static frozenset under other hash seeds: no process
    raises; both make the same decisions; the check ran at each miss of a program
    spanning both (3), and at no hit."""
    seeds = ({"PYTHONHASHSEED": "1"}, {"PYTHONHASHSEED": "2"})
    results, took = _two("benign", each=seeds)
    assert [code for code, _, _ in results] == [0, 0], _show(results)
    done = [_line(o, "DONE") for _, o, _ in results]
    assert done[0] == done[1], _show(results)
    assert done[0] == {"model": [3, 2, None, 2, 1, 1], "checks": 3}
    assert took < BOUND


# ----------------------------------------------------------------------------------
# In this process: the message, the description of a call, the fallback.


def _record(key: list, decision: str = "compile", program: str = "p") -> dict:
    return {"f": "M.__call__", "at": "train.py:3", "compiles": 1,
            "program": program, "decision": decision, "key": key}  # fmt: skip


def test_the_message_groups_processes_by_value_and_is_empty_if_they_agree():
    same = [_record([["static field 'n'", "2 (int)"]]) for _ in range(4)]
    assert _diverge._compared(same) == ""
    differ = [
        _record([["static field 'n'", f"{2 + (i == 1)} (int)"]], program=f"p{i == 1}")
        for i in range(12)
    ]
    message = _diverge._compared(differ)
    assert "static field 'n': processes 0, 2, 3, 4, 5, 6, 7, 8, ... (11 in all): 2 (int), process 1: 3 (int)" in message  # fmt: skip
    assert "program: processes 0, 2, 3" in message
    # A key that differs but runs the same program, decided alike: no error.
    unread = [_record([["static field 'tag'", f"{i} (int)"]]) for i in range(2)]
    assert _diverge._compared(unread) == ""


def test_a_call_is_described_the_same_whatever_the_hash_seed_and_addresses():
    class M(eqx.Module):
        flags: frozenset = eqx.field(static=True)
        fn: object = eqx.field(static=True)
        on: bool = eqx.field(static=True)
        w: jax.Array

    M.__qualname__ = "M"
    m = M(frozenset("cab"), object(), True, jnp.ones(2))
    key, _ = key_and_leaves((m, 1))
    aval = ((2,), "float32", False, None)  # shape, dtype, weak type, sharding
    described = dict(_diverge._described(key, ("m", "x"), [aval]))
    assert described["argument m"] == "M"
    assert described["static field 'm.flags'"] == "['a', 'b', 'c'] (frozenset)"
    assert described["static field 'm.fn'"] == "<object object> (object)"
    assert described["static field 'm.on'"] == "True (bool)"
    assert described["field 'm.w'"] == "float32[2]"
    assert described["argument x"] == "1 (int)"


def test_a_function_and_a_huge_int_are_described_as_the_explanations_name_them():
    def double(x):
        return 2 * x

    class M(eqx.Module):
        fn: object = eqx.field(static=True)
        n: int = eqx.field(static=True)

    M.__qualname__, double.__qualname__ = "M", "double"
    key, _ = key_and_leaves((M(double, 2**15000),))  # past what `repr` prints
    described = dict(_diverge._described(key, ("m",), []))
    assert described["static field 'm.fn'"] == "double (function)"
    assert described["static field 'm.n'"] == "<an int of 15,001 bits> (int)"


def test_without_the_key_value_store_the_check_is_off_with_one_warning(monkeypatch):
    """A JAX whose distributed client lacks a name the check uses: no store, one
    warning (then none), and calls go on."""

    class Runtime:
        client = object()  # lacks every name

    for runtime, lacks in ((Runtime(), "'key_value_set'"), (None, "['global_state']")):
        monkeypatch.setattr(_jax, "_runtime", runtime)
        monkeypatch.setattr(_jax, "_store_lost", [])
        with pytest.warns(
            RuntimeWarning, match="diverge at a miss are not checked"
        ) as w:
            assert _jax.kv_store() is None
        assert lacks in str(w[0].message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _jax.kv_store() is None


def test_one_process_checks_nothing():
    before = repr(_diverge._checks)
    f = es.jit(lambda x, n: x * n)
    f(jnp.ones(2), 2), f(jnp.ones(2), 3)
    assert repr(_diverge._checks) == before
