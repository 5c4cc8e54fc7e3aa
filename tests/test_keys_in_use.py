"""Many keys of one class in use at once: a hit runs the guards its static values
look up, not every guard of the class in turn, so that every key in use keeps its
guard and is served by it, however many there are. The lookup only chooses: the
guard it finds still checks everything (`1`, `True` and `1.0` are three keys), and
each call must give what eager Python and `eqx.filter_jit` give."""

import random
from typing import Any

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _index(self: Any, x: jax.Array) -> tuple[jax.Array, Any, Any]:
    """A body whose program depends on the static `index` a little (on the length
    of its text: few programs), and whose outputs return it and its type."""
    return self.w * x + len(str(self.index)), self.index, type(self.index).__name__


class Block(es.Module):
    w: jax.Array
    index: Any = eqx.field(static=True)

    __call__ = es.jit(_index)


# `eqx.filter_jit` compares static values as Python does (`0 == False`): one
# wrapper per type of the static value, each of its own function (a cache each).
_filter_jits: dict[type, Any] = {}

# Static values of one field: ints, and values equal to some of them as Python
# compares them, of other types (each its own key).
_POOL = [*range(1_000), True, False, 1.0, 0.0, 2.5, "1", "a", b"1", None, (1, 2)]


def _assert_same(got: Any, want: Any, what: str) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert type(g) is type(w) or isinstance(g, jax.Array), what
        assert np.asarray(g).dtype == np.asarray(w).dtype, what
        np.testing.assert_array_equal(g, w, err_msg=what)


def _calls(keys: int, calls: int, seed: int) -> None:
    """`calls` calls, on fresh instances, of `keys` static values in random order,
    each compared with eager Python and `eqx.filter_jit`."""
    rng = random.Random(seed)
    values = rng.sample(_POOL[:keys] + _POOL[1_000:], keys)
    x = jnp.arange(3.0)
    general = Block.__call__.es_jit.f.general
    for i in range(calls):
        value = values[rng.randrange(keys)]
        m = Block(jnp.full(3, float(i)), value)
        what = f"call {i}, index {value!r}"
        want = _index(m, x)
        filter_jit = _filter_jits.get(type(value))
        if filter_jit is None:
            filter_jit = _filter_jits[type(value)] = eqx.filter_jit(
                lambda m, x: _index(m, x)
            )
        _assert_same(filter_jit(m, x), want, what)
        _assert_same(m(x), want, what)
    # Each key's first two calls at most take the general path (a guard is made
    # at the second): the others are served by the guard the lookup found.
    assert Block.__call__.es_jit.f.general - general <= 2 * keys


@hypothesis.settings(max_examples=6, deadline=None)
@hypothesis.given(keys=st.integers(1, 60), seed=st.integers(0, 2**32))
def test_many_keys_of_one_class_give_the_eager_result(keys, seed):
    """Up to 60 keys of one class, some equal as Python compares them and of other
    types, called in random order on fresh instances: each call's values and leaf
    types are those of eager Python and `eqx.filter_jit`."""
    _calls(keys, 3 * keys, seed)


@pytest.mark.slow
@hypothesis.settings(max_examples=3, deadline=None)
@hypothesis.given(keys=st.integers(200, 1_000), seed=st.integers(0, 2**32))
def test_up_to_1000_keys_of_one_class_give_the_eager_result(keys, seed):
    """As above, with up to 1,000 keys in use."""
    _calls(keys, 2 * keys, seed)


class Gate(es.Module):
    w: jax.Array
    index: int = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x + self.index


def test_twenty_keys_of_one_class_in_use_are_served_by_guards():
    """20 keys of one class in use at once (20 blocks, each with its static
    index), and a key called between each of them: once each key has made its
    guard (its second call), every call is a hit served by a guard, none by the
    general path. With a few guards per class tried in turn, keys pushed out
    would come back to the general path."""
    Gate.__call__.cache_clear()
    x = jnp.ones(3)
    blocks = [Gate(jnp.full(3, float(i)), i) for i in range(21)]
    for b in blocks * 2:
        b(x)
    general, info = Gate.__call__.es_jit.f.general, Gate.__call__.cache_info()
    assert general == 2 * 21
    for _ in range(3):
        for b in blocks[1:]:
            for m in (b, blocks[0]):
                fresh = jax.tree.map(lambda a: a + 1, m)
                np.testing.assert_array_equal(fresh(x), fresh.w * x + fresh.index)
    assert Gate.__call__.es_jit.f.general == general
    after = Gate.__call__.cache_info()
    assert (after.hits - info.hits, after.misses) == (3 * 20 * 2, info.misses)


class Listed(eqx.Module):
    w: jax.Array
    sizes: Any = eqx.field(static=True)  # a plain module may hold a list


def test_keys_whose_static_values_python_cannot_hash_are_served_by_guards():
    """Static values Python cannot hash (a list, in a plain `eqx.Module`) cannot
    be looked up: those keys' guards are tried in turn, and serve their calls."""

    @es.jit
    def f(m, x):
        return m.w * x + sum(m.sizes)

    x = jnp.ones(2)
    ms = [Listed(jnp.ones(2), [i, 1]) for i in range(4)] + [Listed(jnp.ones(2), (5,))]
    for m in ms * 2:
        f(m, x)
    general = f.f.general
    for m in ms * 2:
        fresh = jax.tree.map(lambda a: a * 2, m)
        np.testing.assert_array_equal(f(fresh, x), fresh.w * x + sum(m.sizes))
    assert f.f.general == general


def test_keys_the_lookup_does_not_tell_apart_give_the_eager_result():
    """Keys that differ below the top of the call (a static of a submodule) have
    one lookup value: their guards are tried in turn, a few of them held; more
    keys than that still give the eager result, through the general path."""

    class Outer(es.Module):
        inner: Gate

    @es.jit
    def f(m, x):
        return m.inner(x) * 2

    x = jnp.ones(3)
    outers = [Outer(Gate(jnp.full(3, float(i)), i)) for i in range(12)]
    for _ in range(3):
        for m in outers:
            np.testing.assert_array_equal(f(m, x), 2 * (m.inner.w * x + m.inner.index))
