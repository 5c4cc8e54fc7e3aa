"""Shared by the test files: the seed classes, a count of XLA compiles made
independently of the library, a runner of Python in a fresh process, and a pytree
that fails loudly when anything walks the whole tree."""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
from eqx_static import _jax


ROOT = Path(__file__).resolve().parent.parent

# Whether keys share programs in this run (not on the public `jax.jit` path,
# `EQX_STATIC_PUBLIC_JIT=1`, where each key compiles its own).
SHARING = _jax.SHARING


def shared(programs: int, keys: int) -> int:
    """The compiles expected: one per distinct program where keys share programs,
    one per key (and signature) where they cannot."""
    return programs if SHARING else keys


@contextlib.contextmanager
def path(name: str) -> Iterator[None]:
    """`"dispatcher"`, or `"public"`: each key made meanwhile runs on a public
    `jax.jit`, as where JAX's private dispatcher cannot be built."""
    saved = _jax.DISPATCH, _jax.SHARING
    if name == "public":
        _jax.DISPATCH = _jax.SHARING = False
    try:
        yield
    finally:
        _jax.DISPATCH, _jax.SHARING = saved


def seed() -> types.SimpleNamespace:
    """Fresh copies of the README's `Parent`/`Child` (a cold cache each time),
    named plainly (`Child.__call__`) in log lines, with a trace counter."""
    traces = [0]

    class Parent(es.Module):
        dp: Any
        sp: bool = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            return self.dp * self.g(x) if self.sp else self.g(x)

        def g(self, x):
            raise NotImplementedError

    class Child(Parent):
        dc: Any
        sc: bool = eqx.field(static=True)

        def g(self, x):
            return self.dc * x if self.sc else x

    class OtherChild(Parent):
        dc: Any
        sc: bool = eqx.field(static=True)

        def g(self, x):
            return -x

    for cls in (Parent, Child, OtherChild):
        cls.__qualname__ = cls.__name__
    return types.SimpleNamespace(
        Parent=Parent, Child=Child, OtherChild=OtherChild, traces=traces
    )


def eager_seed(c: Any, x: float) -> float:
    """The seed's arithmetic, done in Python on Python floats."""
    g = float(c.dc) * x if c.sc else x
    return float(c.dp) * g if c.sp else g


# ----------------------------------------------------------------------------------
# XLA compiles, counted by JAX's own monitoring events: independent of the
# library's counters, which the tests compare with it.

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiled: list[str] = []  # the name of each program compiled, in order
_compiles_lock = threading.Lock()


def _on_event(event: str, duration: float, **kwargs: Any) -> None:
    if event == _COMPILE_EVENT:
        with _compiles_lock:
            _compiled.append(str(kwargs.get("fun_name")))


jax.monitoring.register_event_duration_secs_listener(_on_event)


class XlaCompiles:
    """XLA compiles in this process since this object was made (`.count`), and
    those of programs of one function's name (`.of("f")`: JAX names them
    `jit(f)`). Make the inputs first: an eager JAX operation compiles too."""

    def __init__(self):
        self.start = len(_compiled)

    @property
    def count(self) -> int:
        return len(_compiled) - self.start

    @property
    def names(self) -> list[str]:
        """The name JAX gave each program it compiled since, in order."""
        return _compiled[self.start :]

    def of(self, name: str) -> int:
        """Compiles of programs of a function named `name`: JAX names them
        `jit(<name>)`, and `es.jit` names its programs by the function's dotted
        qualified name (`jit(Model.__call__)`, `jit(test_x.<locals>.f)`)."""
        return sum(_named(event, name) for event in _compiled[self.start :])


def _named(event: str, name: str) -> bool:
    inner = event.removeprefix("jit(").removesuffix(")").split("#")[0]
    return inner == name or inner.endswith(f".{name}")


def _probe(a: jax.Array) -> jax.Array:
    return a * 3 + 1


_probe_input = jnp.ones(7, jnp.int32)
_seen = XlaCompiles()
jax.jit(_probe)(_probe_input)
# The counter must see a compile, or counting zero of them would prove nothing.
assert _seen.count == 1, "XLA compiles are not reported by jax.monitoring"
# The first key of a process probes JAX's dispatcher, which compiles a program of
# the package's own: made here, so that no test counts it (whichever runs first).
es.jit(_probe)(_probe_input)


# ----------------------------------------------------------------------------------
# A fresh process.


def free_address() -> str:
    """A free TCP port on 127.0.0.1, for a `jax.distributed` coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def run_python(
    *argv: str,
    code: str | None = None,
    env: dict[str, str] | None = None,
    strict: bool = False,
    timeout: float = 300,
    cwd: Path | str | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python argv...` (or `python -c code argv...`) in a fresh process, on the
    CPU, with the test environment's `XLA_FLAGS` left out unless `env` sets them.
    `strict`: JAX's strict promotion and warnings as errors, as the suite runs."""
    full = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    full["JAX_PLATFORMS"] = "cpu"
    if strict:
        full.update(
            JAX_NUMPY_DTYPE_PROMOTION="strict",
            JAX_NUMPY_RANK_PROMOTION="raise",
            # A TPU machine's JAX warns at import about its host's memory settings
            # (as pyproject's filterwarnings say); the later filters come first.
            PYTHONWARNINGS="error,ignore:Transparent hugepages:UserWarning,"
            "ignore:cloud_tpu_init failed:UserWarning",
        )
    full.update(env or {})
    command = [sys.executable, *(("-c", code) if code is not None else ()), *argv]
    return subprocess.run(
        command,
        cwd=cwd or ROOT,
        env=full,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def no_socket() -> str | None:
    """Why this machine lets no process open a socket on the loopback (which
    `jax.distributed` needs), or None if it does."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
    except OSError as e:
        return f"no socket can be opened here, and jax.distributed needs one: {e}"
    return None


def inherited_path() -> list[str]:
    """The folders of this process's `PYTHONPATH` other than this checkout (an
    accelerator machine's JAX may be found there, not in site-packages)."""
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return [p for p in path if p and Path(p).resolve() != ROOT]


def package_folders() -> list[str]:
    """The folders this interpreter imports installed packages from: its
    site-packages (a venv's and the system's it sees) and `inherited_path()`."""
    site = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    return [*dict.fromkeys([*site, *inherited_path()])]


def output(result: subprocess.CompletedProcess[str]) -> str:
    """A finished process's output, for an assertion message."""
    return f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


# ----------------------------------------------------------------------------------


class Bomb:
    """A pytree node whose flatten raises once armed: any whole-tree walk hits it."""

    armed = False


def _flatten_bomb(bomb: Bomb):
    if Bomb.armed:
        raise AssertionError("the whole tree was flattened")
    return (), None


jax.tree_util.register_pytree_node(Bomb, _flatten_bomb, lambda aux, children: Bomb())


def opaque_host_callbacks(monkeypatch: Any) -> None:
    """Make every lowering read as a TPU's: each host callback an opaque object (a
    `PyCapsule` there), with no Python function inside to read."""
    arguments = _jax.compile_arguments

    def opaque(lowering: Any) -> dict[str, Any]:
        out = arguments(lowering)
        return {**out, "host_callbacks": [object() for _ in out["host_callbacks"]]}

    monkeypatch.setattr(_jax, "compile_arguments", opaque)
