"""Run each script in `examples/` as a user would, in quick mode.

Each example checks its own claims (compile counts, results) and exits non-zero
when one fails, so these tests assert the exit code and the final "OK" line. They
run in subprocesses, with JAX's strict dtype and rank promotion switched on, so
that the examples stay as strict as the rest of the test suite; the sharded example
simulates its 8 devices by setting `XLA_FLAGS` itself.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600

# script -> (arguments, phrase its output must contain)
CASES = {
    "seed.py": ((), "OK: 3 compiles for 10 calls"),
    "ensemble.py": (("--quick",), "OK: 50 variants, one compile each"),
    "training.py": (("--quick",), "OK: one extra compile for the static switch"),
    "sharded.py": ((), "OK: shardings kept; one compile per layout"),
}


def _run(script: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        EXAMPLES_QUICK="1",
        JAX_PLATFORMS="cpu",
        JAX_NUMPY_DTYPE_PROMOTION="strict",
        JAX_NUMPY_RANK_PROMOTION="raise",
        PYTHONWARNINGS="error",
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


# Examples with a test file of their own: script -> that file.
ELSEWHERE = {
    "multihost.py": "test_multihost.py",
    "optax_training.py": "test_examples_more.py",
    "diffrax_ode.py": "test_examples_more.py",
}


def test_every_example_is_tested():
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert set(CASES) <= scripts
    assert scripts - set(CASES) - set(ELSEWHERE) == set()
    for script in scripts & set(ELSEWHERE):
        test = ROOT / "tests" / ELSEWHERE[script]
        assert script in test.read_text(), (script, test)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example(script: str):
    args, phrase = CASES[script]
    result = _run(script, args)
    output = f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, output
    assert phrase in result.stdout, output
