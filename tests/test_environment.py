"""Every environment variable `eqx_static` reads is checked where it is read: a bad
value raises a `ValueError` naming the variable, the value and what is accepted."""

import re

import eqx_static as es
import jax.numpy as jnp
import pytest
from eqx_static import _diverge, _jax
from helpers import run_python


SWITCHES = [
    ("EQX_STATIC_PUBLIC_JIT", False),
    ("EQX_STATIC_CHECK_SHARING", False),
    ("EQX_STATIC_CHECK_DIVERGENCE", True),
]


@pytest.mark.parametrize("name, default", SWITCHES)
@pytest.mark.parametrize("value", ["yes", "2", "true", "on", " 1x"])
def test_a_switch_with_a_bad_value_is_named(monkeypatch, name, default, value):
    monkeypatch.setenv(name, value)
    message = (
        f"The environment variable {name}={value!r} is not a switch eqx_static "
        "reads: set it to `1` (on) or `0` (off), or unset it (then it is "
        f"{'on' if default else 'off'})."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _jax.env_switch(name, default)


@pytest.mark.parametrize("name, default", SWITCHES)
@pytest.mark.parametrize(
    "value, on", [("1", True), ("0", False), (" 1 ", True), ("", None)]
)
def test_a_switch_reads_1_and_0_and_else_its_default(
    monkeypatch, name, default, value, on
):
    monkeypatch.setenv(name, value)
    assert _jax.env_switch(name, default) is (default if on is None else on)
    monkeypatch.delenv(name)
    assert _jax.env_switch(name, default) is default


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e3", "0.0", " "])
def test_the_divergence_timeout_with_a_bad_value_is_named(monkeypatch, value):
    """Read (and so checked) at every miss of a program that would be checked:
    here, the function that reads it, as a miss calls it."""
    monkeypatch.setenv("EQX_STATIC_DIVERGENCE_TIMEOUT", value)
    if not value.strip():  # empty: the default
        _diverge.check(None, None, None, None)
        return
    message = (
        f"The environment variable EQX_STATIC_DIVERGENCE_TIMEOUT={value!r} is not a "
        "number of seconds eqx_static reads: set it to a number greater than 0 "
        "(`1200`, `2.5`), or unset it (then it is 600)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _diverge.check(None, None, None, None)


@pytest.mark.parametrize("value", ["1200", "2.5", " 30 ", "1", ".5", "0.25", "7."])
def test_the_divergence_timeout_reads_seconds(monkeypatch, value):
    """Any number greater than 0, below 1 second too, with or without a fraction."""
    monkeypatch.setenv("EQX_STATIC_DIVERGENCE_TIMEOUT", value)
    assert _jax.env_seconds("EQX_STATIC_DIVERGENCE_TIMEOUT", 600.0) == float(value)


def test_the_divergence_switch_is_read_by_the_check(monkeypatch):
    monkeypatch.setenv("EQX_STATIC_CHECK_DIVERGENCE", "off")
    with pytest.raises(ValueError, match="EQX_STATIC_CHECK_DIVERGENCE='off'"):
        _diverge.check(None, None, None, None)


@pytest.mark.sharing
def test_the_sharing_check_switch_is_read_at_a_shared_miss(monkeypatch):
    @es.jit
    def f(x, tag):
        return x * 2

    f(jnp.ones(2), "a")
    monkeypatch.setenv("EQX_STATIC_CHECK_SHARING", "yes")
    with pytest.raises(ValueError, match="EQX_STATIC_CHECK_SHARING='yes'"):
        f(jnp.ones(2), "b")  # the same program: shared, and the switch read


def test_importing_with_a_bad_public_switch_names_it():
    out = run_python(
        code="import eqx_static",
        env={"EQX_STATIC_PUBLIC_JIT": "true"},
    )
    assert out.returncode != 0
    assert (
        "ValueError: The environment variable EQX_STATIC_PUBLIC_JIT='true'"
        in out.stderr
    )
