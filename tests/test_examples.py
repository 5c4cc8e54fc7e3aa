"""Run each script in `examples/` as a user would, in quick mode.

Each example checks its own claims (compile counts, results) and exits non-zero
when one fails, so these tests assert the exit code and the final "OK" line. They
run in fresh processes, with JAX's strict rank promotion and every warning an
error, so that the examples stay as strict as the rest of the test suite, and with
strict dtype promotion too, except the optax example: optax's own code mixes
dtypes (`decay**count`, a Python float and an int32 step count). The two sharded
examples (`sharded.py`, and `explicit_sharding.py` under `jax.set_mesh`) simulate
their 8 devices by setting `XLA_FLAGS` themselves; the diffrax example
says so and exits 0 where diffrax is not installed. No example logs the warning
of a Python float stored as an array, which the README teaches how to avoid.
`examples/multihost.py` has a test file of its own.
"""

import importlib.util
import re

import pytest
from helpers import output, ROOT, run_python


# script -> (arguments, dtype promotion, phrase its output must contain)
CASES = {
    "seed.py": ((), "strict", "OK: 3 compiles for 10 calls"),
    "ensemble.py": (("--quick",), "strict", "OK: 50 variants, one compile each"),
    "training.py": (
        ("--quick",),
        "strict",
        "OK: one extra compile for the static switch",
    ),
    "sharded.py": ((), "strict", "OK: shardings kept; one compile per layout"),
    "explicit_sharding.py": (
        (),
        "strict",
        "OK: explicit sharding under jax.set_mesh; an unread flip compiles nothing",
    ),
    "optax_training.py": (
        ("--quick",),
        "standard",
        "OK: optax trained through the switch",
    ),
    "diffrax_ode.py": (("--quick",), "strict", "OK: 10 solves, one compile per value"),
}


def test_every_example_is_tested():
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert scripts - set(CASES) == {"multihost.py"}
    assert "multihost.py" in (ROOT / "tests" / "test_multihost.py").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(CASES))
def test_example(script: str):
    args, promotion, phrase = CASES[script]
    result = run_python(
        str(ROOT / "examples" / script),
        *args,
        strict=True,
        env={"EXAMPLES_QUICK": "1", "JAX_NUMPY_DTYPE_PROMOTION": promotion},
        timeout=600,
    )
    assert result.returncode == 0, output(result)
    # Nothing that the README teaches to avoid: a float field stored as an array.
    assert not re.search(r"holds? (a )?Python", output(result)), output(result)
    if script == "diffrax_ode.py" and importlib.util.find_spec("diffrax") is None:
        assert "diffrax is not installed" in result.stdout, output(result)
        pytest.skip("diffrax is not installed")
    assert phrase in result.stdout, output(result)
