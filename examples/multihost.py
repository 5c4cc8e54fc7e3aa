"""The same `es.jit` code on several processes: data-parallel training over a global mesh.

One command starts everything. The script is its own launcher: run without
arguments, it picks a free port on 127.0.0.1, spawns N copies of itself as
workers (default 2, each with 4 simulated CPU devices, so 8 devices in all),
prints what each worker printed, and exits non-zero if any worker fails, if the
workers disagree, or if they do not finish within `--timeout` seconds (then it
kills them). A worker is

    python examples/multihost.py --worker --process-id I --num-processes N \\
        --coordinator 127.0.0.1:PORT

It calls `jax.distributed.initialize(...)` (process 0 hosts the coordinator,
bound to 127.0.0.1 only; CPU collectives go through gloo), builds one mesh over
every process's devices with the axis "data", and trains a small MLP with optax
(SGD with momentum), data-parallel:

- the model is an `es.Module`: its weights are a dynamic field holding global
  `jax.Array`s replicated over the mesh (`NamedSharding(mesh, P())`); `use_tanh`
  is a static field (it picks the activation) and `log_every` a static field that
  only the Python loop reads;
- `train_step(model, opt_state, x, y)` is an `@es.jit` function; each process
  makes its own slice of the batch, and `jax.make_array_from_process_local_data`
  joins the slices into one global batch sharded over "data" (all 8 devices);
  JAX's partitioner inserts the gradient all-reduce;
- a few steps, then `model.with_static(use_tanh=True)`: exactly one more compile
  of `train_step`; then more steps with no compile;
- `MLP.predict` is a plain `@es.jit` method that uses `use_tanh` but not
  `log_every`: flipping `log_every` costs a trace and no XLA compile (the program
  is the same), while flipping `use_tanh` compiles once.

Each worker counts traces twice -- a Python counter incremented in the traced
bodies, and `cache_info().misses` -- and XLA compiles with `compile_info()`, and
prints its counts, its cache_info()s and its losses. Then the workers exchange them
(`jax.experimental.multihost_utils.process_allgather`) and each one checks that
every process compiled the same number of times, holds the same cache entries
and saw bit-identical losses; the launcher checks the printed counts again.

Why they agree: `es.jit` decides to trace from the call alone (classes, static
field values, tree structure, and each array's shape, dtype and sharding), and to
compile from the lowered program alone, never from anything local to a process,
so the same calls in the same order give the same decisions -- and the same
programs, which JAX requires of every process.

Run:
    python examples/multihost.py                      # 2 processes x 4 CPU devices
    python examples/multihost.py --num-processes 3    # 3 x 4
    python examples/multihost.py --quick              # a few steps (or EXAMPLES_QUICK=1)

On a real cluster, start one copy per host (or per task) with no launcher
arguments under SLURM, e.g. `srun --ntasks=2 python examples/multihost.py`
(detected from `SLURM_JOB_ID` and `SLURM_NTASKS`), or pass `--auto` under any
launcher JAX detects (Open MPI, Kubernetes, Cloud TPU, ...). The script then calls
`jax.distributed.initialize()` with auto-detection and runs the worker directly
on the real devices (no simulated devices, no local launcher). `--launch` forces
the local launcher even inside a SLURM job.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P


DEVICES_PER_PROCESS = 4
PER_DEVICE_BATCH = 16
D_IN, HIDDEN = 8, 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9
PORT_IN_USE = 75  # a worker's exit code when process 0 cannot bind the port
UNREAD_FLIPS = 4  # flips of `log_every` under `MLP.predict`


# ---------------------------------------------------------------- the model

TRACES = {"train_step": 0, "predict": 0}  # incremented while tracing only


class MLP(es.Module):
    """`x -> w2 . act(w1 x + b1) + b2`, with act = tanh or relu (a static choice)."""

    # Dynamic: the weights, one dict of global arrays, w1 (D_IN, HIDDEN),
    # b1 (HIDDEN,), w2 (HIDDEN,), b2 (). optax's state mirrors this dict, which
    # holds no static field, so the state carries over a static switch.
    params: dict[str, jax.Array]
    use_tanh: bool = eqx.field(static=True)  # changes the program
    log_every: int = eqx.field(static=True)  # read by the Python loop only

    def forward(self, x: jax.Array) -> jax.Array:  # (n, D_IN) -> (n,)
        p = self.params
        h = x @ p["w1"] + p["b1"][None, :]
        h = jnp.tanh(h) if self.use_tanh else jax.nn.relu(h)
        return h @ p["w2"] + p["b2"]

    @es.jit  # uses use_tanh, not log_every: flipping that compiles nothing
    def predict(self, x: jax.Array) -> jax.Array:
        TRACES["predict"] += 1
        return self.forward(x)


OPTIMIZER = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)


@es.jit
def train_step(
    model: MLP, opt_state: Any, x: jax.Array, y: jax.Array
) -> tuple[MLP, Any, jax.Array]:
    """One data-parallel step: x and y are sharded over "data", the weights
    replicated; JAX's partitioner adds the all-reduce of the gradients."""
    TRACES["train_step"] += 1

    def loss_fn(params: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((model.with_dynamic(params=params).forward(x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(model.params)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, model.params)
    model = model.with_dynamic(params=optax.apply_updates(model.params, updates))
    return model, opt_state, loss


# ---------------------------------------------------------------- launcher


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")
    ).split()
    flags.append(f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("EXAMPLES_QUICK", None)  # the launcher passes --quick explicitly
    return env


def _run_workers(
    args: argparse.Namespace, port: int
) -> tuple[list[int | None], list[str], list[str], bool]:
    """Start the workers and wait for all of them; return their exit codes (None:
    killed by the launcher), stdouts, stderrs, and whether the deadline passed."""
    n = args.num_processes
    command = [sys.executable, os.path.abspath(__file__), "--worker"]
    command += ["--num-processes", str(n), "--coordinator", f"127.0.0.1:{port}"]
    command += ["--timeout", str(args.timeout)]
    if args.quick:
        command.append("--quick")
    env = _worker_env()
    with tempfile.TemporaryDirectory(prefix="multihost-") as tmp:
        outs = [open(os.path.join(tmp, f"{i}.out"), "w+") for i in range(n)]
        errs = [open(os.path.join(tmp, f"{i}.err"), "w+") for i in range(n)]
        procs = [
            subprocess.Popen(
                [*command, "--process-id", str(i)],
                stdout=outs[i],
                stderr=errs[i],
                stdin=subprocess.DEVNULL,
                env=env,
            )
            for i in range(n)
        ]
        deadline = time.monotonic() + args.timeout
        give_up_at = deadline
        timed_out = False
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if PORT_IN_USE in codes:
                give_up_at = now  # no coordinator: the others would only wait
            elif any(c not in (None, 0) for c in codes):
                # A worker failed; the others may wait for it until their own
                # timeouts. Give them a moment to report, then stop them.
                give_up_at = min(give_up_at, now + 5)
            if now >= give_up_at:
                timed_out = now >= deadline
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                break
            time.sleep(0.05)
        texts = []
        for f in outs + errs:
            f.seek(0)
            texts.append(f.read())
            f.close()
    return codes, texts[:n], texts[n:], timed_out


_COUNTS = re.compile(r"^COUNTS process=(\d+) (.*)$", re.MULTILINE)


def launch(args: argparse.Namespace) -> int:
    n = args.num_processes
    print(
        f"launching {n} processes x {DEVICES_PER_PROCESS} CPU devices on 127.0.0.1 "
        f"(timeout {args.timeout:.0f}s){' [quick]' if args.quick else ''}",
        flush=True,
    )
    t0 = time.perf_counter()
    port = _free_port()
    codes, outs, errs, timed_out = _run_workers(args, port)
    if codes[0] == PORT_IN_USE:  # another program took the port in between
        print(f"port {port} was taken before process 0 could bind it; retrying once")
        codes, outs, errs, timed_out = _run_workers(args, _free_port())
    elapsed = time.perf_counter() - t0

    for i in range(n):
        status = "killed by the launcher" if codes[i] is None else f"exit {codes[i]}"
        print(f"\n===== process {i} ({status}) =====")
        lines = outs[i].rstrip().splitlines()
        shown = [line for line in lines if not line.startswith("[Gloo]")]
        print("\n".join(shown))
        if len(shown) < len(lines):
            print(f"({len(lines) - len(shown)} '[Gloo] ... connected' lines not shown)")
        if codes[i] != 0:
            print(f"----- process {i} stderr -----")
            print(errs[i].rstrip()[-4000:])

    failures: list[str] = []
    for i, c in enumerate(codes):
        if c is None and timed_out:
            failures.append(
                f"process {i} did not finish within {args.timeout:.0f}s (killed)"
            )
        elif c is None:
            failures.append(f"process {i} was killed after another process failed")
        elif c != 0:
            failures.append(f"process {i} exited with {c}")
    counts = [dict(_COUNTS.findall(o)).get(str(i)) for i, o in enumerate(outs)]
    if not failures:
        if any(c is None for c in counts):
            failures.append("a process printed no COUNTS line")
        elif len(set(counts)) != 1:
            failures.append("the processes printed different compile counts")
    print()
    if failures:
        print("FAILED:", *failures, sep="\n  ")
        return 1
    print(f"all {n} processes finished in {elapsed:.1f}s and agree: {counts[0]}")
    print(
        f"OK: {n} processes agree: train_step compiled twice (one static switch), "
        f"MLP.predict compiled once across {UNREAD_FLIPS} unread static flips "
        "(each one trace) and once more for a read one."
    )
    return 0


# ---------------------------------------------------------------- worker


def worker(args: argparse.Namespace, auto: bool) -> int:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    t0 = time.perf_counter()
    if auto:
        try:  # SLURM, Open MPI, Kubernetes, Cloud TPU, ...: JAX reads the environment
            jax.distributed.initialize()
        except ValueError as e:
            print(
                f"--auto: JAX found no cluster environment to initialize from ({e}).\n"
                "Run under SLURM (srun) or another launcher JAX detects, or without "
                "--auto to launch local processes.",
                file=sys.stderr,
            )
            return 2
    else:
        host, port = args.coordinator.rsplit(":", 1)
        if args.process_id == 0:
            try:  # fail fast (and tell the launcher) if the port is taken
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, int(port)))
            except OSError as e:
                print(
                    f"process 0: cannot bind {args.coordinator}: {e}", file=sys.stderr
                )
                return PORT_IN_USE
        budget = max(10, int(args.timeout))
        try:
            jax.distributed.initialize(
                coordinator_address=args.coordinator,
                num_processes=args.num_processes,
                process_id=args.process_id,
                coordinator_bind_address=args.coordinator,  # never all interfaces
                initialization_timeout=budget,
                shutdown_timeout_seconds=budget,
            )
        except Exception as e:
            print(f"process {args.process_id}: initialize failed: {e}", file=sys.stderr)
            if args.process_id == 0 and "Failed to start RPC server" in str(e):
                return PORT_IN_USE
            raise
    me, n = jax.process_index(), jax.process_count()
    init_time = time.perf_counter() - t0

    def say(line: str) -> None:
        print(f"[p{me}] {line}", flush=True)

    devices = jax.devices()
    # Naming the axis type keeps jax 0.8 (our floor) from warning about its default.
    mesh = jax.make_mesh(
        (len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Explicit,)
    )
    replicated = NamedSharding(mesh, P())
    by_data = NamedSharding(mesh, P("data"))
    say(
        f"process {me} of {n}: {jax.local_device_count()} local of {len(devices)} "
        f"{devices[0].platform} devices, mesh {dict(mesh.shape)}; init {init_time:.1f}s"
    )

    def global_replicated(a: np.ndarray) -> jax.Array:
        """The same host value on every process -> one array replicated over the mesh."""
        return jax.make_array_from_callback(a.shape, replicated, lambda index: a[index])

    # Every process builds the same weights from the same seed.
    rng = np.random.default_rng(0)
    model = MLP(
        params={
            "w1": global_replicated(
                (rng.normal(size=(D_IN, HIDDEN)) / np.sqrt(D_IN)).astype(np.float32)
            ),
            "b1": global_replicated(np.zeros(HIDDEN, np.float32)),
            "w2": global_replicated(
                (rng.normal(size=HIDDEN) / np.sqrt(HIDDEN)).astype(np.float32)
            ),
            "b2": global_replicated(np.zeros((), np.float32)),
        },
        use_tanh=False,
        log_every=2,
    )
    # optax's state (the momentum, shaped like the weights), made on the mesh, replicated.
    opt_state = jax.jit(OPTIMIZER.init, out_shardings=replicated)(model.params)
    true_w = np.linspace(-1.0, 1.0, D_IN).astype(np.float32)

    def batch(step: int) -> tuple[jax.Array, jax.Array]:
        """This process's slice of the step's batch, joined into one global batch."""
        local_n = PER_DEVICE_BATCH * jax.local_device_count()
        global_n = PER_DEVICE_BATCH * len(devices)
        local_rng = np.random.default_rng([step, me])
        x = local_rng.normal(size=(local_n, D_IN)).astype(np.float32)
        y = np.sin(x @ true_w).astype(np.float32)
        return (
            jax.make_array_from_process_local_data(by_data, x, (global_n, D_IN)),
            jax.make_array_from_process_local_data(by_data, y, (global_n,)),
        )

    def host(a: jax.Array) -> float:
        return float(np.asarray(a.addressable_data(0)))

    steps = 3 if args.quick else 20
    losses: list[float] = []
    step_misses: list[int] = []

    def train(model: MLP, opt_state: Any) -> tuple[MLP, Any]:
        for _ in range(steps):
            step = len(losses)
            x, y = batch(step)
            model, opt_state, loss = train_step(model, opt_state, x, y)
            losses.append(host(loss))
            step_misses.append(train_step.compile_info().compiles)
            if step % model.log_every == 0 or len(losses) == 2 * steps:
                say(
                    f"step {step:>3} use_tanh={model.use_tanh!s:<5} loss {losses[-1]:.6f} "
                    f"train_step compiles {step_misses[-1]}"
                )
        return model, opt_state

    t1 = time.perf_counter()
    model, opt_state = train(model, opt_state)
    first_phase = train_step.compile_info().compiles
    model = model.with_static(use_tanh=True)  # the one static switch
    say("-- model.with_static(use_tanh=True) --")
    model, opt_state = train(model, opt_state)
    switch_cost = train_step.compile_info().compiles - first_phase
    w1 = model.params["w1"]
    if not (
        w1.sharding.is_equivalent_to(replicated, w1.ndim) and w1.is_fully_replicated
    ):
        say(f"the weights left the replicated layout: {w1.sharding}")
        return 1

    # predict uses use_tanh, never log_every: a flip of log_every is a new key
    # (one trace), whose program is the one compiled already.
    x, _ = batch(10_000)
    info = MLP.predict.cache_info

    def predict_compiles() -> int:
        return MLP.predict.compile_info().compiles

    model.predict(x)
    first_predict = predict_compiles()
    for k in range(UNREAD_FLIPS):
        model = model.with_static(log_every=3 + k)
        model.predict(x)
    unread_cost = predict_compiles() - first_predict
    model.with_static(use_tanh=False).predict(x)
    read_cost = predict_compiles() - first_predict - unread_cost
    model.with_static(log_every=100).predict(x)
    late_unread_cost = predict_compiles() - first_predict - unread_cost - read_cost
    train_time = time.perf_counter() - t1

    step_info, predict_info = train_step.cache_info(), info()
    step_compiles = train_step.compile_info().compiles
    say(f"train_step.cache_info()  = {step_info}")
    say(f"MLP.predict.cache_info() = {predict_info}; entries {predict_info.currsize}")
    summary = (
        f"train_step_traces={TRACES['train_step']} train_step_misses={step_info.misses} "
        f"train_step_compiles={step_compiles} switch_compiles={switch_cost} "
        f"predict_traces={TRACES['predict']} predict_misses={predict_info.misses} "
        f"predict_compiles={predict_compiles()} "
        f"unread_flip_compiles={unread_cost + late_unread_cost} "
        f"read_flip_compiles={read_cost} predict_entries={predict_info.currsize} "
        f"predict_cache_info={tuple(predict_info)}"
    )
    print(f"COUNTS process={me} {summary}", flush=True)
    say(
        f"losses {' '.join(f'{v:.6f}' for v in losses)}; {2 * steps} steps + predicts in {train_time:.1f}s"
    )

    # Every process must have made the same decisions and seen the same numbers.
    mine = np.array(
        [
            -1 if v is None else v  # maxsize is None
            for v in (
                TRACES["train_step"],
                *step_info,
                step_compiles,
                TRACES["predict"],
                *predict_info,
                predict_compiles(),
                switch_cost,
                unread_cost,
                read_cost,
                late_unread_cost,
            )
        ],
        dtype=np.int64,
    )
    all_counts = np.asarray(multihost_utils.process_allgather(mine))
    all_losses = np.asarray(
        multihost_utils.process_allgather(np.array(losses, np.float32))
    )
    failures: list[str] = []
    if not (all_counts == all_counts[0]).all():
        failures.append(f"compile counts differ across processes:\n{all_counts}")
    if not (all_losses == all_losses[0]).all():
        failures.append(f"losses differ across processes:\n{all_losses}")
    keys = 1 + UNREAD_FLIPS + 2  # the first, the unread flips, the read, the late
    expected = {
        "train_step compiles": (step_compiles, 2),
        "train_step traces": (TRACES["train_step"], 2),
        "train_step misses": (step_info.misses, 2),
        "compiles for the static switch": (switch_cost, 1),
        "MLP.predict compiles for the first call": (first_predict, 1),
        "MLP.predict compiles for unread flips": (unread_cost + late_unread_cost, 0),
        "MLP.predict compiles for the read flip": (read_cost, 1),
        "MLP.predict traces": (TRACES["predict"], keys),
        "MLP.predict misses": (predict_info.misses, keys),
        "MLP.predict entries": (predict_info.currsize, keys),
    }
    for what, (got, want) in expected.items():
        if got != want:
            failures.append(f"{what}: {got}, expected {want}")
    if not losses[-1] < losses[0]:
        failures.append(f"the loss did not decrease: {losses[0]} -> {losses[-1]}")
    if failures:
        say("FAILED: " + "; ".join(failures))
        return 1
    say(
        f"AGREE: all {n} processes have the same compile counts, cache entries and losses"
    )
    jax.distributed.shutdown()
    return 0


# ---------------------------------------------------------------- entry point


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few steps (or EXAMPLES_QUICK=1)"
    )
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds, for everything"
    )
    parser.add_argument(
        "--worker", action="store_true", help="run one worker (used by the launcher)"
    )
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument(
        "--coordinator", default=None, help="127.0.0.1:PORT (with --worker)"
    )
    parser.add_argument(
        "--auto",
        action="store_true",
        help="jax.distributed.initialize() auto-detection",
    )
    parser.add_argument(
        "--launch", action="store_true", help="use the local launcher even under SLURM"
    )
    args = parser.parse_args()
    args.quick = args.quick or os.environ.get("EXAMPLES_QUICK") == "1"
    if args.worker:
        if args.coordinator is None:
            parser.error("--worker needs --coordinator")
        return worker(args, auto=False)
    under_slurm = "SLURM_JOB_ID" in os.environ and "SLURM_NTASKS" in os.environ
    if args.auto or (under_slurm and not args.launch):
        return worker(args, auto=True)
    if args.num_processes < 1:
        parser.error("--num-processes must be at least 1")
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
