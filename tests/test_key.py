"""The compile key (`_key.py`): static values are compared by type *and* value, at
any depth, so that values that compare equal in Python (`1 == True == 1.0`,
`0.0 == -0.0`) never share a compiled entry, and `nan` shares one with itself.

A shared entry shows up as a result of the wrong dtype or sign: each call below is
compared with the eager call on dtype, weak type, value and `np.signbit`.
"""

import math
from typing import Any

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest


NAN = float("nan")

# Values that are `==` to one another across types, or equal with another sign.
ATOMS = [0, 1, True, False, 0.0, -0.0, 1.0, -1.0, -1, NAN, -NAN, 1 + 0j, 1 - 0j, 0j]


def _leaves(s: Any) -> list:
    if type(s) is tuple:
        return [leaf for x in s for leaf in _leaves(x)]
    return [s]


def _arrays(s: Any) -> tuple:
    """One array per atom in `s`, with the dtype JAX gives that Python value."""
    return tuple(jnp.asarray(leaf) for leaf in _leaves(s))


class Holder(es.Module):
    w: jax.Array
    s: Any = eqx.field(static=True)

    def eager(self, x):
        return self.w * x, _arrays(self.s)

    @es.jit
    def jitted(self, x):
        return self.w * x, _arrays(self.s)


class Nested(es.Module):
    inner: Holder
    t: Any = eqx.field(static=True)

    def eager(self, x):
        return self.inner.eager(x), _arrays(self.t)

    @es.jit
    def jitted(self, x):
        return self.inner.eager(x), _arrays(self.t)


def _plain(x, s):
    return x * 2, _arrays(s)


_plain_jit = es.jit(_plain)


def _assert_same(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype
        assert g.weak_type == w.weak_type
        np.testing.assert_array_equal(g, w)  # nan equals nan here
        if jnp.issubdtype(w.dtype, jnp.floating):
            assert np.signbit(g) == np.signbit(w)
        elif jnp.issubdtype(w.dtype, jnp.complexfloating):
            assert np.signbit(g.real) == np.signbit(w.real)
            assert np.signbit(g.imag) == np.signbit(w.imag)


statics = st.recursive(
    st.sampled_from(ATOMS),
    lambda inner: st.tuples(inner) | st.tuples(inner, inner),
    max_leaves=4,
)
routes = st.sampled_from(["module", "nested module", "argument", "keyword"])


def _call(route: str, s: Any, x: jax.Array) -> tuple[Any, Any]:
    w = jnp.array(1.5, jnp.float32)
    if route == "module":
        m = Holder(w, s)
        return m.jitted(x), m.eager(x)
    if route == "nested module":
        n = Nested(Holder(w, (s, 1)), s)
        return n.jitted(x), n.eager(x)
    if route == "argument":
        return _plain_jit(x, s), _plain(x, s)
    return _plain_jit(x, s=s), _plain(x, s=s)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.tuples(routes, statics), min_size=1, max_size=8))
def test_calls_with_colliding_statics_equal_the_eager_calls(calls):
    """The wrappers' caches persist across examples: any two of the values seen
    so far that shared an entry would give one of them the other's result."""
    x = jnp.array(2.0, jnp.float32)
    for route, s in calls:
        got, want = _call(route, s, x)
        _assert_same(got, want)


@pytest.mark.parametrize("route", ["module", "nested module", "argument", "keyword"])
@pytest.mark.parametrize(
    "values",
    [
        (1, True, 1.0, 1 + 0j),
        (0.0, -0.0),
        ((0.0,), (-0.0,)),
        (((0.0, 1),), ((-0.0, 1),)),
        ((1,), (True,), (1.0,)),
        ((1, (True,)), (1, (1,)), (1, (1.0,))),
        (0j, complex(0.0, -0.0), complex(-0.0, 0.0)),
    ],
)
def test_equal_but_differently_typed_statics_get_their_own_entries(route, values):
    x = jnp.array(2.0, jnp.float32)
    for s in (*values, *values):  # twice: the second round must hit, not collide
        got, want = _call(route, s, x)
        _assert_same(got, want)


def test_minus_zero_inside_a_tuple_is_its_own_entry():
    """`(0.0,)` and `(-0.0,)` compare equal and hash alike; typed, they differ."""

    class M(es.Module):
        s: tuple = eqx.field(static=True)

        @es.jit
        def reciprocal(self, x):
            return x / self.s[0]

    x = jnp.array(1.0, jnp.float32)
    assert float(M((0.0,)).reciprocal(x)) == math.inf
    assert float(M((-0.0,)).reciprocal(x)) == -math.inf
    assert M.reciprocal.cache_info().misses == 2


def test_nan_shares_one_entry_with_itself():
    class M(es.Module):
        s: Any = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + jnp.asarray(_leaves(self.s)[0], jnp.float32)

    x = jnp.array(1.0, jnp.float32)
    for s in (NAN, float("nan"), (NAN,), (float("nan"),)):
        assert np.isnan(float(M(s).f(x)))
    assert M.f.cache_info().misses == 2  # one for the float, one for the tuple


def test_minus_nan_keeps_its_sign():
    x = jnp.array(2.0, jnp.float32)
    for s in (NAN, -NAN):
        got, want = _call("argument", s, x)
        _assert_same(got, want)


# --- large static tuples (keyed once per object) ------------------------------------


def _mixed(n: int, arrays: list) -> tuple:
    """A tuple of `n` items (more than the 64 that are keyed once per object),
    with `arrays` among the static ints."""
    return (*arrays, *range(n - len(arrays)))


@es.jit
def _sum_table(table, x):
    total = x
    for t in table:
        total = total + (t if isinstance(t, jax.Array) else jnp.float32(t))
    return total


def _sum_eager(table, x):
    return _sum_table.fn(table, x)  # pyright: ignore[reportAttributeAccessIssue]


def test_a_large_tuple_with_arrays_traces_them_on_every_call():
    x = jnp.array(0.5, jnp.float32)
    table = _mixed(70, [jnp.array(1.0, jnp.float32), jnp.array(2.0, jnp.float32)])
    for _ in range(2):  # the same object twice: its leaves are passed both times
        np.testing.assert_array_equal(_sum_table(table, x), _sum_eager(table, x))
    other = _mixed(70, [jnp.array(5.0, jnp.float32), jnp.array(7.0, jnp.float32)])
    np.testing.assert_array_equal(_sum_table(other, x), _sum_eager(other, x))
    assert float(_sum_table(other, x)) == 0.5 + 5 + 7 + sum(range(68))


def test_a_large_static_tuple_is_keyed_by_its_values():
    x = jnp.array(0.5, jnp.float32)
    a, b = _mixed(80, []), (1.0, *_mixed(79, []))
    for t in (a, b, a, b):
        got, want = _sum_table(t, x), _sum_eager(t, x)
        np.testing.assert_array_equal(got, want)


class _Table(eqx.Module):  # an Equinox module: its numbers stay Python ints
    table: Any


@es.jit
def _table_total(m, x):
    return x + sum(v[0] if type(v) is list else v for v in m.table)


def test_a_list_inside_a_large_tuple_is_read_again_after_it_changes():
    """The list makes the module's key mutable: it is never memoised."""
    box = [1]
    m = _Table((box, *range(70)))
    x = jnp.array(0.0, jnp.float32)
    assert float(_table_total(m, x)) == 1 + sum(range(70))
    box[0] = 100  # changed in place: a new static value, a new key
    assert float(_table_total(m, x)) == 100 + sum(range(70))
    assert _table_total.cache_info().misses == 2


# --- types with their own equality --------------------------------------------------


@es.jit
def _count(s, x):
    return x + 1


def test_a_dataclass_without_eq_is_compared_by_identity():
    import dataclasses

    @dataclasses.dataclass(frozen=True, eq=False)
    class Opt:
        a: int

    f = es.jit(lambda s, x: x * s.a)
    x = jnp.array(2.0, jnp.float32)
    one, other = Opt(1), Opt(1)
    for s in (one, other, one):
        assert float(f(s, x)) == 2.0
    assert f.cache_info().misses == 2  # two objects, equal fields: two entries


def test_a_dataclass_with_a_hand_written_eq_is_compared_by_it():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Opt:
        a: Any
        note: str

        def __eq__(self, other):  # the note does not take part
            return type(other) is Opt and self.a == other.a

        def __hash__(self):
            return hash(self.a)

    f = es.jit(lambda s, x: x * s.a)
    x = jnp.array(2.0, jnp.float32)
    for s in (Opt(1, "x"), Opt(1, "y")):
        assert float(f(s, x)) == 2.0
    assert f.cache_info().misses == 1  # equal by its own `__eq__`: one entry


def test_a_generated_dataclass_eq_is_compared_typed():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Opt:
        a: Any

    f = es.jit(lambda s, x: (jnp.asarray(s.a), x))
    x = jnp.array(2.0, jnp.float32)
    for s in (Opt(1), Opt(True), Opt(1.0)):
        assert f(s, x)[0].dtype == jnp.asarray(s.a).dtype
    assert f.cache_info().misses == 3


def test_a_tuple_subclass_with_its_own_eq_is_compared_by_it():
    class Loose(tuple):
        __hash__ = tuple.__hash__

        def __eq__(self, other):  # its own equality, the same as tuple's here
            return tuple.__eq__(self, other)

    f = es.jit(lambda s, x: x * 2)
    x = jnp.array(2.0, jnp.float32)
    for s in (Loose((1,)), Loose((1.0,)), Loose((True,))):
        assert float(f(s, x)) == 4.0
    assert f.cache_info().misses == 1  # equal by its own `__eq__`: one entry


# --- Equinox's wrapper attributes --------------------------------------------------


def _square(x: jax.Array) -> jax.Array:
    """Squares."""
    return x * x


@es.jit
def _call_wrapped(g, x):
    return g(x), g.__name__, g.__doc__, g.__annotations__


def test_the_wrapper_attributes_of_a_module_argument_are_kept():
    g = eqx.filter_grad(_square)
    x = jnp.array(3.0, jnp.float32)
    got = _call_wrapped(g, x)
    want = _call_wrapped.fn(g, x)  # pyright: ignore[reportAttributeAccessIssue]
    assert float(got[0]) == float(want[0]) == 6.0
    assert got[1:] == want[1:] == ("_square", "Squares.", _square.__annotations__)


def test_arrays_passed_to_keyword_only_parameters_are_traced():
    @es.jit
    def f(x, *, scale, shift=None):
        return x * scale if shift is None else x * scale + shift

    x = jnp.array(2.0, jnp.float32)
    for scale in (jnp.array(3.0, jnp.float32), jnp.array(4.0, jnp.float32)):
        assert float(f(x, scale=scale)) == 2.0 * float(scale)
        assert float(f(x, scale=scale, shift=x)) == 2.0 * float(scale) + 2.0
    assert f.cache_info().misses == 2  # new values of traced keywords: no compile


def test_static_tuples_whose_hashes_collide_keep_their_entries():
    """`hash(-1) == hash(-2)` in CPython, so `(-1,)` and `(-2,)` hash alike: the
    key must still compare their values."""
    assert hash((-1,)) == hash((-2,))
    x = jnp.array(1.0, jnp.float32)
    for s in ((-1,), (-2,), (-1,), (-2,)):
        got, want = _call("argument", s, x)
        _assert_same(got, want)
        got, want = _call("module", s, x)
        _assert_same(got, want)


def test_minus_zero_inside_a_frozenset_is_its_own_entry():
    f = es.jit(lambda s, x: x / next(iter(s)))
    x = jnp.array(1.0, jnp.float32)
    assert float(f(frozenset([0.0]), x)) == math.inf
    assert float(f(frozenset([-0.0]), x)) == -math.inf
    assert f.cache_info().misses == 2


class _Pair(es.Module):
    w: jax.Array
    k: int = eqx.field(static=True)


def test_memoised_module_keys_carry_only_their_own_leaves():
    """Each module argument's key and leaves are kept while it lives: a later
    call reuses them, and must pass exactly the same leaves."""

    @es.jit
    def f(a, b, x):
        return a.w * x + b.w * b.k

    a, b = _Pair(jnp.array(2.0, jnp.float32), 1), _Pair(jnp.array(3.0, jnp.float32), 2)
    x = jnp.array(1.5, jnp.float32)
    for _ in range(3):
        assert float(f(a, b, x)) == 2.0 * 1.5 + 3.0 * 2
        assert float(f(b, a, x)) == 3.0 * 1.5 + 2.0 * 1
    assert f.cache_info().misses == 2  # (k=1, k=2) and (k=2, k=1)


# --- drop-in: statics that plain modules and real programs hold ---------------------


class _Touchy:
    """A static value whose `__eq__` raises for anything but itself, with one hash
    for all (every comparison is a collision)."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 0

    def __eq__(self, other):
        if other is self:
            return True
        raise TypeError("cannot compare")


def test_a_static_whose_eq_raises_on_a_hash_collision_is_another_key():
    """The key compares such a value as unequal to any other and runs. (Here
    `eqx.filter_jit` raises: JAX compares the tree structures' metadata and lets
    the error through.)"""

    class P(eqx.Module):
        w: jax.Array
        tag: object = eqx.field(static=True)

    f = es.jit(lambda p, x: p.w * x)
    x = jnp.ones(2)
    for name in "abc":
        p = P(jnp.ones(2), _Touchy(name))
        np.testing.assert_array_equal(f(p, x), p.w * x)
        np.testing.assert_array_equal(f(p, x), p.w * x)  # and finds itself again
    assert f.cache_info() == es.CacheInfo(3, 3, None, 3)


def test_a_static_value_is_hashed_once_per_object():
    """At construction (the hashability check) and in the key: one hash."""
    hashes = [0]

    class Counted:
        def __hash__(self):
            hashes[0] += 1
            return 1

        def __eq__(self, other):
            return type(other) is Counted

    class M(es.Module):
        w: jax.Array
        c: object = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(jnp.ones(2), Counted())
    m(jnp.ones(2))
    m.with_dynamic(w=jnp.zeros(2))(jnp.ones(2))  # a new instance, the same static
    assert hashes[0] == 1


@pytest.mark.parametrize(
    "make, where",
    [
        (lambda d: ((d,), {}), "y['self']"),
        (lambda d: ((), {"y": [1, d]}), "y[1]['self']"),
        (lambda d: (([d, (0, d)],), {}), "y[0]['self']"),
    ],
)
def test_an_argument_that_contains_itself_is_a_clear_error(make, where):
    """A cycle has no end to key: `eqx.filter_jit` raises `SystemError`; this says
    where, and the process goes on."""
    d = {"a": jnp.ones(2)}
    d["self"] = d
    f = es.jit(lambda x, y: x)
    args, kwargs = make(d)
    with pytest.raises(ValueError) as info:
        f(jnp.ones(2), *args, **kwargs)
    assert str(info.value) == (
        f"`{f.qualname}` got an argument that contains itself: {where} is the "
        "argument again. `es.jit` keys a call by the structure of its arguments, as "
        "`eqx.filter_jit` does, so that structure must be finite: break the cycle "
        "before the call."
    )
    assert float(f(jnp.ones(2), 1.0)[0]) == 1.0  # and nothing is broken


def test_deeply_nested_pytrees_other_than_plain_containers_key_fine():
    """Named tuples 1,500 deep (JAX's flatten is one level at a time, so the walk
    recurses in Python, under a raised limit)."""
    import collections

    Box = collections.namedtuple("Box", "inner")
    v = jnp.ones(())
    for _ in range(1500):
        v = Box(v)

    def innermost(t):
        while isinstance(t, Box):
            t = t.inner
        return t + 1

    f = es.jit(innermost)
    assert float(f(v)) == 2.0 and float(f(v)) == 2.0
    assert f.cache_info().hits == 1
