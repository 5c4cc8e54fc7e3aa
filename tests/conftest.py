"""Strict JAX settings for every test, as in Equinox's own test suite.

Implicit dtype promotion (`float32 + int32`) and implicit rank promotion
(`(3,) + (2, 3)`) raise instead of silently widening, so a test cannot pass by
accident of promotion; `pyproject.toml` turns every warning into an error.
"""

import gc
import os

import jax
import pytest


jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True)
def _strict_jax_config():
    """Fail loudly if a test or the library loosened the strict settings."""
    yield
    assert jax.config.jax_numpy_dtype_promotion == "strict"  # pyright: ignore[reportAttributeAccessIssue]
    assert jax.config.jax_numpy_rank_promotion == "raise"  # pyright: ignore[reportAttributeAccessIssue]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the slow tier (subprocesses, several processes, thread storms, "
        "deep nesting, large arguments); without it, the fast tier runs alone",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The fast tier by default: `slow` tests run with `--slow` (or when `-m`
    selects by marker itself, as the mutation runs do). On the public `jax.jit`
    path, tests of programs shared between keys are skipped."""
    from eqx_static import _jax  # here: jaxtyping's plugin must see it unimported

    if not _jax.SHARING:
        skip = pytest.mark.skip(reason="keys share no program on this path")
        for item in items:
            if item.get_closest_marker("sharing") is not None:
                item.add_marker(skip)
    if config.getoption("--slow") or config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once every test module is imported (JAX, Equinox and the rest), their
    objects are moved out of the cycle collector's reach: they live until the run
    ends anyway, and each full collection of the run no longer walks them (a
    fifth of a second each, 50-odd times a run). Objects the tests make are
    collected as before."""
    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The run's CPU time, beside the wall time pytest prints next: a loaded
    machine stretches the one and not the other."""
    t = os.times()
    cpu = t.user + t.system + t.children_user + t.children_system
    terminalreporter.write_line(
        f"CPU time: {cpu:.1f} s (pytest and the processes it started; the wall "
        "time follows)"
    )
