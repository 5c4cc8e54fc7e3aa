"""A key that traces again traces the call in hand: a new shape, a first use under
`jax.grad` or `jax.vmap`, and every call under `jax.disable_jit` run the caller's own
objects, never values the key kept to compare. A static value changed in place
after keying (a list in a plain `eqx.Module`'s static field, a frozen dataclass
changed with `object.__setattr__`) then cannot leak into another call, on the
dispatcher path and on the public `jax.jit` path alike."""

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import path


class Plain(eqx.Module):
    """A plain module may hold a list in a static field (lineax's operators do)."""

    coeffs: list = eqx.field(static=True)

    def __call__(self, x):
        return x * sum(self.coeffs)


@dataclasses.dataclass(frozen=True)
class Options:
    scale: float
    shift: float


class Held(es.Module):
    options: Options = eqx.field(static=True)

    def __call__(self, x):
        return x * self.options.scale + self.options.shift


def _plain(values: list[float]) -> tuple[Any, Callable[[Any], None]]:
    m = Plain(list(values))
    return m, lambda new: m.coeffs.__setitem__(slice(None), new)


def _options(values: list[float]) -> tuple[Any, Callable[[Any], None]]:
    o = Options(*values[:2])

    def change(new: list[float]) -> None:
        object.__setattr__(o, "scale", new[0])
        object.__setattr__(o, "shift", new[1])

    return o, change


def _held(values: list[float]) -> tuple[Any, Callable[[Any], None]]:
    o, change = _options(values)
    return Held(o), change


def _apply(v: Any, x: jax.Array) -> jax.Array:
    if isinstance(v, Options):
        return x * v.scale + v.shift
    return v(x)


# How a key traces again, each with the eager computation it must equal.
ROUTES: dict[str, Callable[[Callable, Any, jax.Array], Any]] = {
    "new shape": lambda f, v, x: f(v, jnp.concatenate([x, x])),
    "grad": lambda f, v, x: jax.grad(lambda y: f(v, y).sum())(x),
    "vmap": lambda f, v, x: jax.vmap(lambda y: f(v, y))(jnp.stack([x, 2 * x])),
    "disable_jit": lambda f, v, x: _eagerly(f, v, x),
}


def _eagerly(f: Callable, v: Any, x: jax.Array) -> Any:
    with jax.disable_jit():
        return f(v, x)


MAKERS = {"list in a plain module": _plain, "frozen dataclass": _options}
MAKERS["frozen dataclass in a static field"] = _held

numbers = st.lists(st.integers(-4, 4).map(float), min_size=2, max_size=3)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("kind", sorted(MAKERS))
@hypothesis.settings(max_examples=3, deadline=None)
@hypothesis.given(first=numbers, changed=numbers)
def test_a_static_changed_in_place_after_keying_never_reaches_another_call(
    where, route, kind, first, changed
):
    """Key a call, change its static value in place, then make the key trace again
    for a fresh value equal to the first (and for the changed object itself): each
    result equals the eager call's, as under `eqx.filter_jit`."""
    make, go = MAKERS[kind], ROUTES[route]
    x = jnp.arange(1.0, 4.0)
    with path(where):
        f = es.jit(_apply)
        v, change = make(first)
        np.testing.assert_allclose(f(v, x), _apply(v, x))
        change(changed)
        fresh, _ = make(first)
        for value in (fresh, v):
            np.testing.assert_allclose(go(f, value, x), go(_apply, value, x))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_under_disable_jit_the_call_runs_on_the_callers_own_objects(where):
    """Eagerly, the function receives the very objects passed, as `eqx.filter_jit`
    passes them under `jax.disable_jit` (not equal copies made from a key)."""
    seen = []

    def f(m, x):
        seen.append(m)
        return m(x)

    m = Plain([1.0, 2.0])
    with path(where):
        jf = es.jit(f)
        jf(m, jnp.ones(2))
        with jax.disable_jit():
            jf(m, jnp.ones(2))
    assert len(seen) == 2 and seen[1] is m


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_module_as_the_function_traces_its_own_objects(where):
    """`es.jit(model)`: a new shape traces the wrapped model itself, not one rebuilt
    from the key its wrappers share."""
    first = Plain([1.0, 2.0])
    with path(where):
        jf = es.jit(first)
        np.testing.assert_allclose(jf(jnp.ones(2)), 3.0 * jnp.ones(2))
        first.coeffs[:] = [5.0, 5.0]  # the wrapper holds this object: eager says 10
        np.testing.assert_allclose(jf(jnp.ones(3)), first(jnp.ones(3)))
        second = es.jit(Plain([1.0, 2.0]))  # equal to the key: shares its cache
        np.testing.assert_allclose(second(jnp.ones(4)), 3.0 * jnp.ones(4))


class Changing(eqx.Module):
    """A model whose arrays and list of arrays change in place after wrapping."""

    w: jax.Array
    ws: list
    flag: bool = eqx.field(static=True)

    def __call__(self, x):
        out = self.w * x + sum(self.ws)
        return {"out": out, "n": len(self.ws), "flag": self.flag}


def _same(a: Any, b: Any) -> None:
    """The same tree, the same leaf types, the same values."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert type(p) is type(q)
        np.testing.assert_array_equal(p, q)


# Each change in place (modules are frozen: `object.__setattr__` gets around it).
CHANGES: dict[str, Callable[[Changing], None]] = {
    "an array field": lambda m: object.__setattr__(m, "w", jnp.array(3.0)),
    "an array in a list": lambda m: m.ws.__setitem__(0, jnp.array(7.0)),
    "a list grown": lambda m: m.ws.append(jnp.array(10.0)),
    "a static field": lambda m: object.__setattr__(m, "flag", False),
    "a field's type": lambda m: object.__setattr__(m, "w", np.float32(2.0)),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_model_changed_in_place_after_wrapping_is_seen_at_the_call(change, where):
    """`es.jit(model)` sees the model as it is at each call, as its eager call
    does, and as `eqx.filter_jit` does when it wraps the model as it is then: at
    the same shape (a hit before the change) and at a new one."""
    with path(where):
        m = Changing(jnp.array(2.0), [jnp.array(1.0)], True)
        jf = es.jit(m)
        for n in (2, 2):
            _same(jf(jnp.ones(n)), m(jnp.ones(n)))
        CHANGES[change](m)
        _same(jf.lower(jnp.ones(4)).compile()(jnp.ones(4)), m(jnp.ones(4)))  # AOT
        for n in (2, 3, 2):
            x = jnp.ones(n)
            _same(jf(x), m(x))
            _same(jf(x), eqx.filter_jit(m)(x))


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_model_changed_in_place_is_seen_at_the_next_call(change, where):
    """Changed after its guard serves it, with nothing else between (no `lower`),
    the model is read as it is at the next call, and at the next few."""
    with path(where):
        m = Changing(jnp.array(2.0), [jnp.array(1.0)], True)
        jf = es.jit(m)
        for _ in range(3):
            _same(jf(jnp.ones(2)), m(jnp.ones(2)))
        CHANGES[change](m)
        for _ in range(3):
            _same(jf(jnp.ones(2)), m(jnp.ones(2)))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_model_unchanged_since_wrapping_is_served_by_its_guard(where):
    """`es.jit(model)` reads the model at every call; while it is as wrapped, the
    calls at one shape are served by the key's guard from the third on, as a
    function's are: two take the general path."""
    with path(where):
        m = Changing(jnp.array(2.0), [jnp.array(1.0)], True)
        jf = es.jit(m)
        jf.cache_clear()  # an equal model's wrapper shares the cache
        for _ in range(5):
            _same(jf(jnp.ones(2)), m(jnp.ones(2)))
        assert jf.cache_info() == es.CacheInfo(4, 1, None, 1)
        assert jf.f.general == 2


def test_a_key_that_traces_again_keeps_no_argument_alive():
    """The key compares; it does not hold the call: nothing of a call's list stays
    alive in the cache after the call (a copy is kept to compare against)."""

    class Coeffs(list):
        pass

    coeffs = Coeffs([1.0, 2.0])
    ref = weakref.ref(coeffs)
    jf = es.jit(_apply)
    jf(Plain(coeffs), jnp.ones(2))
    jf(Plain(coeffs), jnp.ones(3))
    del coeffs
    assert ref() is None
