"""Compile budgets: `es.jit(max_compiles=N)` raises before the XLA compile past
the budget, and the storm warning says which field keeps changing and what to do
about it. Both count XLA compiles: a key whose program is the same as one already
compiled costs a trace and spends no budget."""

import logging

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from helpers import XlaCompiles


X = jnp.array([0.5, -1.0, 2.0])


# --- max_compiles -------------------------------------------------------------------


class Budgeted(es.Module):
    n: int = eqx.field(static=True)

    @es.jit(max_compiles=2)
    def __call__(self, x):
        return x * self.n


def test_max_compiles_raises_on_the_next_compile_and_says_why():
    Budgeted.__call__.cache_clear()
    Budgeted(1)(X)
    Budgeted(2)(X)
    Budgeted(1)(X)  # a hit: within the budget
    compiles = XlaCompiles()
    with pytest.raises(es.RecompileError) as info:
        Budgeted(3)(X)
    message = str(info.value)
    assert "compile 3 exceeds `max_compiles=2`" in message
    assert "static field 'n' changed 1 -> 3" in message or "2 -> 3" in message
    assert "compile 1: first call" in message and "compile 2: n" in message
    assert compiles.count == 0  # raised before XLA compiled
    assert Budgeted.__call__.compile_info().compiles == 2
    assert Budgeted.__call__.cache_info().misses == 3  # it traced


def test_a_reused_program_spends_no_budget():
    class Tagged(es.Module):
        n: int = eqx.field(static=True)
        tag: str = eqx.field(static=True)  # never used: the same program

        @es.jit(max_compiles=1)
        def __call__(self, x):
            return x * self.n

    for tag in "abcdef":
        Tagged(2, tag)(X)
    assert Tagged.__call__.compile_info().compiles == 1
    with pytest.raises(es.RecompileError, match="static field 'n' changed 2 -> 3"):
        Tagged(3, "a")(X)


def test_disable_jit_spends_no_budget():
    """Under `jax.disable_jit()` the function runs eagerly, as `eqx.filter_jit`
    does: every call runs it (a miss), and nothing compiles."""

    @es.jit(max_compiles=1)
    def f(x):
        return 2 * x

    with jax.disable_jit():
        for _ in range(3):
            f(X)
    assert f.cache_info().misses == 3 and f.compile_info().compiles == 0
    f(X)
    assert f.compile_info().compiles == 1


def test_max_compiles_counts_new_shapes_too():
    @es.jit(max_compiles=1)
    def f(x):
        return 2 * x

    f(jnp.ones(2))
    with pytest.raises(es.RecompileError, match="argument x shape"):
        f(jnp.ones(3))


@pytest.mark.parametrize("option", ["max_compiles", "warn_after", "maxsize"])
@pytest.mark.parametrize("value", [0, -1])
def test_budget_options_are_checked(option, value):
    with pytest.raises(ValueError, match=f"`{option}` must be None or a positive int"):
        es.jit(lambda x: x, **{option: value})


def test_budget_options_reject_a_bool():
    """`True` is an `int` to Python, not a count: the library's own check says so
    (beartype, under the import hook, accepts it as an int)."""
    with pytest.raises(ValueError, match="`maxsize` must be None or a positive int"):
        es.jit(lambda x: x, maxsize=True)


# --- the storm warning --------------------------------------------------------------


def _stormy(warn_after: int | None = 8) -> type:
    class Stormy(es.Module):
        w: jax.Array
        scale: float = eqx.field(static=True)
        bias: float = eqx.field(static=True, default=0.0)

        @es.jit(warn_after=warn_after)
        def __call__(self, x):
            traces[0] += 1
            return self.w * x * self.scale + self.bias

    traces = [0]
    Stormy.traces = traces  # pyright: ignore[reportAttributeAccessIssue]
    return Stormy


def test_storm_warning_names_the_field_once(caplog):
    cls = _stormy()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(12):
            cls(w=jnp.ones(3), scale=float(i))(X)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "has compiled 8 times" in message and "'scale' changed every time" in message
    assert "s spent compiling" in message
    assert "The programs differ only in their constants" in message
    assert "Make 'scale' dynamic" in message
    assert cls.traces[0] == 12  # one per call: the warning traced nothing more


def test_storm_warning_says_why_a_structural_field_must_stay_static(caplog):
    class Looped(es.Module):
        w: jax.Array
        n: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            for _ in range(self.n):  # a loop length: program structure
                x = self.w * x
            return x

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for n in range(9):
            Looped(w=jnp.ones(3), n=n)(X)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "The programs differ in their structure" in message
    assert "'n' picks program structure" in message and "must stay static" in message


def test_storm_warning_for_a_python_number_argument(caplog):
    @es.jit
    def scaled(x, factor):
        return x * factor

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(9):
            scaled(X, float(i))
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "'factor' changed every time" in message
    assert "The programs differ only in their constants" in message


def test_storm_warning_can_be_switched_off_or_brought_forward(caplog):
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        off = _stormy(warn_after=None)
        for i in range(10):
            off(w=jnp.ones(3), scale=float(i))(X)
        assert not caplog.records
        early = _stormy(warn_after=3)
        for i in range(3):
            early(w=jnp.ones(3), scale=float(i))(X)
    assert (
        len(caplog.records) == 1
        and "compiled 3 times" in caplog.records[0].getMessage()
    )


def test_no_storm_warning_when_different_things_change(caplog):
    cls = _stormy()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(12):  # alternately a new scale and a new bias
            cls(w=jnp.ones(3), scale=float((i + 1) // 2), bias=float(i // 2))(X)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
