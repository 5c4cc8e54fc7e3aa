"""Compile counts: minimal under `depends_on="auto"` on real network code (DESIGN
§3 "Minimal"), bounded by `max_compiles`, and explained by the storm warning
(DESIGN §2.4 "Compile budget"). Every result is compared with the default wrapper
and with the eager call."""

import inspect
import logging
import random
from collections.abc import Callable
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


X = jnp.array([0.5, -1.0, 2.0])

OPS: dict[str, Callable[[Any, jax.Array], jax.Array]] = {
    "relu": lambda s, x: jax.nn.relu(s.w * x),
    "softplus": lambda s, x: jax.nn.softplus(s.w * x),
    "logsumexp": lambda s, x: jax.nn.logsumexp(s.w * x),
    "norm": lambda s, x: jnp.linalg.norm(s.w * x),
    "gelu in lax.cond": lambda s, x: jax.lax.cond(
        x.sum() > 0, jax.nn.gelu, lambda y: y, s.w * x
    ),
    "relu in lax.scan": lambda s, x: jax.lax.scan(
        lambda c, _: (jax.nn.relu(c) - 0.5, None), s.w * x, None, length=3
    )[0],
    "relu in a nested jax.jit": lambda s, x: jax.jit(jax.nn.relu)(s.w * x),
    "another es.jit method": lambda s, x: s.helper(x),
}


def _network(op: Callable[[Any, jax.Array], jax.Array]) -> tuple[type, list[int]]:
    traces = [0]

    class Net(es.Module):
        w: jax.Array
        unread: int = eqx.field(static=True)
        sign: int = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def __call__(self, x):
            traces[0] += 1
            return self.sign * op(self, x)

        @es.jit
        def default(self, x):
            return self.sign * op(self, x)

        @es.jit
        def helper(self, x):
            return jax.nn.relu(self.w * x)

    return Net, traces


@pytest.mark.parametrize("name", sorted(OPS))
def test_unread_flips_compile_once(name):
    net, traces = _network(OPS[name])
    m = net(w=jnp.array([1.0, 2.0, 3.0]), unread=0, sign=1)
    eager = net.default.__wrapped__  # the same body, uncounted
    for i in range(10):
        mi = m.with_static(unread=i)
        np.testing.assert_allclose(mi(X), eager(mi, X), rtol=1e-6)
        np.testing.assert_allclose(mi(X), mi.default(X), rtol=1e-6)
    assert traces[0] == 1
    assert net.__call__.cache_info().misses == 1
    flipped = m.with_static(sign=-1)  # a field the method reads: one compile
    np.testing.assert_allclose(flipped(X), eager(flipped, X), rtol=1e-6)
    assert traces[0] == 2


def test_a_warm_nested_helper_counts_as_reading_everything():
    """A nested `es.jit` call that hits its own cache runs no Python: its reads
    cannot be seen, so every static field counts as read (DESIGN §3)."""
    net, traces = _network(OPS["another es.jit method"])
    m = net(w=jnp.ones(3), unread=0, sign=1)
    for i in range(3):
        m.with_static(unread=i).helper(X)  # warm the helper for each value
    for i in range(3):
        mi = m.with_static(unread=i)
        np.testing.assert_allclose(mi(X), mi.default(X), rtol=1e-6)
    assert traces[0] == 3


def _branchy() -> tuple[type, list[int]]:
    traces = [0]

    class Branchy(es.Module):
        w: jax.Array
        mode: int = eqx.field(static=True)
        a: int = eqx.field(static=True)
        b: int = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def __call__(self, x):
            traces[0] += 1
            return self.eager(x)

        def eager(self, x):
            if self.mode == 0:
                return self.w * x * self.a
            if self.mode == 1:
                return self.w * x + self.b
            return self.w * x

    return Branchy, traces


def test_branch_stress_compiles_once_per_distinct_program():
    """Mode 0 reads `a`, mode 1 reads `b`, mode 2 neither: 3 + 3 + 1 = 7 programs
    among 27 configurations, whatever the order of the calls."""
    configs = [(mode, a, b) for mode in range(3) for a in range(3) for b in range(3)]
    for seed in range(3):
        cls, traces = _branchy()
        order = configs * 2
        random.Random(seed).shuffle(order)
        for mode, a, b in order:
            m = cls(w=jnp.ones(3), mode=mode, a=a, b=b)
            np.testing.assert_allclose(m(X), m.eager(X))
        assert traces[0] == 7, seed
        assert cls.__call__.cache_info().misses == 7


def test_a_method_calls_itself_with_another_static_value():
    class Recursive(es.Module):
        w: jax.Array
        mode: str = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def f(self, x):
            if self.mode == "outer":
                return self.with_static(mode="inner").f(x) + 1.0
            return self.w * x

    m = Recursive(w=jnp.full(3, 2.0), mode="outer")
    np.testing.assert_allclose(m.f(X), 2.0 * X + 1.0)
    np.testing.assert_allclose(m.with_static(mode="inner").f(X), 2.0 * X)


def test_classes_look_the_same_after_a_trace():
    class Base(es.Module):
        act: str = eqx.field(static=True, default="relu")

    class Net(Base):
        w: jax.Array = eqx.field(default_factory=lambda: jnp.ones(3))
        other: int = eqx.field(static=True, default=0)

        @es.jit(depends_on="auto")
        def __call__(self, x):
            return self.w * x if self.act == "relu" else -x

    before = {k: (v, inspect.getattr_static(Net, k)) for k, v in vars(Net).items()}
    base_before = dict(vars(Base))
    Net()(X)
    Net(other=1)(X)
    after = {k: (v, inspect.getattr_static(Net, k)) for k, v in vars(Net).items()}
    assert after == before and dict(vars(Base)) == base_before
    assert Net.act == "relu"  # a default declared on the parent class


def test_a_returned_closure_keeps_working_for_its_configuration():
    class Maker(es.Module):
        w: jax.Array
        k: int = eqx.field(static=True)
        other: int = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def make(self, x):
            return jax.tree_util.Partial(lambda y: y * self.k), self.w * x

    m = Maker(w=jnp.ones(3), k=3, other=0)
    first, _ = m.make(X)
    np.testing.assert_allclose(first(X), 3 * X)
    for other in (1, 2):
        again, _ = m.with_static(other=other).make(X)
        np.testing.assert_allclose(again(X), 3 * X)
    np.testing.assert_allclose(first(X), 3 * X)
    changed, _ = m.with_static(k=5).make(X)
    np.testing.assert_allclose(changed(X), 5 * X)


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
    with pytest.raises(es.RecompileError) as info:
        Budgeted(3)(X)
    message = str(info.value)
    assert "compile 3 exceeds `max_compiles=2`" in message
    assert "static field 'n' changed 1 -> 3" in message or "2 -> 3" in message
    assert "compile 1: first call" in message and "compile 2: n" in message
    assert Budgeted.__call__.cache_info().misses == 2  # nothing compiled


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
            return self.w * x * self.scale + self.bias

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
    assert "trial trace with 'scale' traced succeeded" in message
    assert "Make it dynamic" in message


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
    assert "trial trace with 'factor' traced succeeded" in message


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
