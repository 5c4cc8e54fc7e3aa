"""Run the ecosystem examples (optax, diffrax) as a user would, in quick mode.

As in `test_examples.py`: a subprocess with JAX's strict rank promotion and every
warning an error; the script checks its own claims and prints a final "OK" line.
Two differences: optax's own code mixes dtypes (`decay**count`, a Python float
and an int32 step count), so the optax example runs with JAX's standard dtype
promotion; and the diffrax example is skipped where diffrax is not installed (a
user's environment need not have it; the `test` extra does), after checking that
the script says so and exits 0.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600

# script -> (dtype promotion, phrase its output must contain)
CASES = {
    "optax_training.py": ("standard", "OK: optax trained through the switch"),
    "diffrax_ode.py": ("strict", "OK: 10 solves, one compile per value"),
}


def _run(script: str, promotion: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        EXAMPLES_QUICK="1",
        JAX_PLATFORMS="cpu",
        JAX_NUMPY_DTYPE_PROMOTION=promotion,
        JAX_NUMPY_RANK_PROMOTION="raise",
        PYTHONWARNINGS="error",
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize("script", sorted(CASES))
def test_example(script: str):
    promotion, phrase = CASES[script]
    result = _run(script, promotion)
    output = f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, output
    if script == "diffrax_ode.py" and importlib.util.find_spec("diffrax") is None:
        assert "diffrax is not installed" in result.stdout, output
        pytest.skip("diffrax is not installed")
    assert phrase in result.stdout, output
