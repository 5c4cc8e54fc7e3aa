"""The compile key (`_key.py`, `_fields.py`): what keys a call. Static values are
compared by type *and* value, at any depth, so that values that compare equal in
Python (`1 == True == 1.0`, `0.0 == -0.0`) never share a compiled entry, and `nan`
shares one with itself; tree structure, classes, shapes, dtypes, weak types and
shardings key a call too; non-module arguments follow `eqx.filter_jit`'s rules;
unhashable statics of plain modules key by type and value as well; deep nesting
and values that contain themselves.

A shared entry shows up as a result of the wrong dtype or sign: calls are compared
with the eager call on dtype, weak type, value and `np.signbit`."""

import collections
import copy
import dataclasses
import math
import re
import struct
import sys
import textwrap
import typing
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import output, path, run_python, seed


# A call whose argument walks past 100,000 tokens, where cycles are first searched
# for: seconds under the suite's runtime type checks of every call, so out of the
# fast suite, yet run against every mutant (mutation runs drop those checks).
def _large(test: Any) -> Any:
    return pytest.mark.slow(pytest.mark.large(test))


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


@pytest.mark.slow
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


def _nan(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def test_nans_of_other_bits_are_other_static_values():
    """A nan's payload is part of its value (`bitcast_convert_type` reads it): two
    nans of other bits are two keys, as they are two compiles under filter_jit."""

    def f(x, c):
        return x + jax.lax.bitcast_convert_type(jnp.asarray(c, jnp.float32), jnp.uint32)

    jf, x = es.jit(f), jnp.zeros((), jnp.uint32)
    for c in (_nan(0x7FF8000000000000), _nan(0x7FFC000000000000)) * 2:
        assert int(jf(x, c)) == int(f(x, c))
    assert jf.cache_info() == es.CacheInfo(2, 2, None, 2)


class _Header(tuple):
    """A static leaf to JAX (not a pytree), whose `len` is not its stored one."""

    def __len__(self) -> int:
        return 1


def test_a_tuple_subclass_is_keyed_by_its_stored_items():
    """`==` and `hash` of a tuple subclass read its stored items, whatever its
    `__len__` says: so does its key."""

    def f(t, x):
        return x * tuple.__getitem__(t, 1)

    jf, x = es.jit(f), jnp.ones(2)
    for scale in (2.0, 3.0, 4.0):
        t = _Header((1, scale))
        np.testing.assert_array_equal(jf(t, x), f(t, x))
        np.testing.assert_array_equal(jf(t, x), eqx.filter_jit(f)(t, x))


# --- large static tuples (keyed once per object) --------------------------------------


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
    """The list makes the module's key mutable: it is read again on every call."""
    box = [1]
    m = _Table((box, *range(70)))
    x = jnp.array(0.0, jnp.float32)
    assert float(_table_total(m, x)) == 1 + sum(range(70))
    box[0] = 100  # changed in place: a new static value, a new key
    assert float(_table_total(m, x)) == 100 + sum(range(70))
    assert _table_total.cache_info().misses == 2


# --- types with their own equality ----------------------------------------------------


@es.jit
def _count(s, x):
    return x + 1


def test_a_frozen_dataclass_is_keyed_by_its_fields_whatever_its_eq():
    """Keyed by its fields, typed: `eq=False` (identity) and a hand-written `__eq__`
    do not change what the trace can read, which is the fields."""
    import dataclasses

    @dataclasses.dataclass(frozen=True, eq=False)
    class ByIdentity:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Loose:
        a: Any
        note: str

        def __eq__(self, other):  # the note does not take part
            return type(other) is Loose and self.a == other.a

        def __hash__(self):
            return hash(self.a)

    f = es.jit(lambda s, x: x * s.a)
    x = jnp.array(2.0, jnp.float32)
    for s in (ByIdentity(1), ByIdentity(1), ByIdentity(2)):
        assert float(f(s, x)) == 2.0 * s.a
    assert f.cache_info().misses == 2  # equal fields: one entry
    g = es.jit(lambda s, x: (x * s.a, s.note))
    for s in (Loose(1, "x"), Loose(1, "y"), Loose(1, "x")):
        assert g(s, x)[1] == s.note  # its own `==` would give "y" the "x" entry
    assert g.cache_info().misses == 2


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


# --- Equinox's wrapper attributes -----------------------------------------------------


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


class _Plain(eqx.Module):
    w: jax.Array


def _with_attributes(**attributes: Any) -> _Plain:
    m = _Plain(jnp.ones(2))
    for k, v in attributes.items():
        object.__setattr__(m, k, v)
    return m


def test_an_absent_wrapper_attribute_and_one_holding_none_are_two_keys():
    """Equinox's flatten keeps a module's wrapper attributes (`__doc__`,
    `__name__`, ...) when its instance dictionary holds more than its fields,
    `MISSING` where one is absent, and its unflatten sets them all: inside the
    call, each is what `eqx.filter_jit` shows."""

    def f(m):
        return m.w * 2.0, type(vars(m)["__doc__"]).__name__

    calls = [
        _with_attributes(__name__="a"),
        _with_attributes(__name__="a", __doc__=None),
    ]
    jf = es.jit(f)
    for m in calls * 2:
        got, want = jf(m), eqx.filter_jit(f)(m)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1] == want[1]
    missing = type(_jax.EQX_MISSING).__name__  # `_Missing`; `_Sentinel` before 0.13.8
    assert {eqx.filter_jit(f)(m)[1] for m in calls} == {missing, "NoneType"}
    assert jf.cache_info().misses == 2


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


def test_module_keys_carry_only_their_own_leaves():
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


# --- drop-in: statics that plain modules and real programs hold -----------------------


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


class _Link(NamedTuple):
    a: Any
    b: Any


class _Reiterated(NamedTuple):
    a: Any
    b: Any

    def __iter__(self) -> Any:  # the items the other way round, to `iter`
        return iter(tuple.__getitem__(self, slice(None, None, -1)))


@_large
@pytest.mark.parametrize("cls", [_Link, _Reiterated])
def test_a_cycle_through_a_named_tuple_is_a_clear_error(cls):
    """A list holding the named tuple that holds it: found, not walked forever,
    at the path JAX's flatten walks (its stored items, whatever its `__iter__`)."""
    items: list = []
    pair = cls(jnp.ones(2), items)
    items.append(pair)
    f = es.jit(lambda x, y: x)
    with pytest.raises(ValueError, match=r"y\[1\]\[0\] is the argument again"):
        f(jnp.ones(2), pair)


class _Opaque:
    """A static leaf to JAX: no children."""


@_large
def test_a_value_shared_in_two_places_is_not_a_cycle():
    """An argument past the size at which cycles are searched for (100,000 tokens),
    holding one list twice and an object JAX does not open: shared, not cyclic,
    and a leaf is not its own child; so it is keyed, and the search goes on as
    the walk grows."""
    shared = [(i,) for i in range(40_000)]
    f = es.jit(lambda x, t: x + len(t[0]) + len(t[1]))
    arg = [shared, shared, _Opaque()]
    for _ in range(2):
        assert float(f(jnp.zeros(()), arg)) == 80_000
    assert f.cache_info().misses == 1


def test_dict_keys_of_other_types_are_other_keys():
    """`{1: v}` and `{True: v}` are one dict to Python and to `eqx.filter_jit`'s
    tree structure; their keys are static values, compared by type."""
    f = es.jit(lambda x, d: (x, list(d)[0]))
    for k in (1, True, 1.0, 1, True):
        _, out = f(jnp.ones(2), {k: jnp.ones(2)})
        assert type(out) is type(k)
    assert f.cache_info().misses == 3


_FIRST_SIGHT = """
from typing import NamedTuple
import eqx_static as es
import jax.numpy as jnp

class Pair(NamedTuple):
    a: object
    b: object

x = jnp.ones(2)
for name, values in [
    ("dict keys", [{1: x}, {True: x}, {1.0: x}]),
    ("tuple items", [(1, x), (True, x), (1.0, x)]),
    ("list items", [[1, x], [True, x], [1.0, x]]),
    ("named tuple items", [Pair(1, x), Pair(True, x), Pair(1.0, x)]),
    ("empty containers", [None, (), [], {}]),
]:
    f = es.jit(lambda x, v: x)
    for v in values * 2:
        f(x, v)
    print(name, f.cache_info().misses)
"""


def test_a_fresh_process_keys_each_kind_of_argument_as_a_warm_one(capsys):
    """The first argument of a type that a process sees decides how that type is
    walked; the keys come out the same as in this process, which has walked every
    kind before: static values by type (three keys for 1, True and 1.0), and
    each empty container a key of its own."""
    exec(compile(_FIRST_SIGHT, "<first sight>", "exec"), {})
    warm = capsys.readouterr().out
    fresh = run_python(code=_FIRST_SIGHT, timeout=120)
    assert fresh.returncode == 0, output(fresh)
    assert fresh.stdout == warm
    assert warm.splitlines() == [
        "dict keys 3",
        "tuple items 3",
        "list items 3",
        "named tuple items 3",
        "empty containers 4",
    ]


@pytest.mark.parametrize(
    "first, bad",
    [
        ({1: 1}, {1: {1, 2}}),  # a dict of int keys, which a guard compares whole
        (collections.OrderedDict(a=1), collections.OrderedDict(a={1, 2})),
        ({"a": 1}, {"a": {1, 2}}),  # a dict of string keys, key by key
    ],
    ids=["int keys", "OrderedDict", "str keys"],
)
def test_an_unhashable_value_after_a_hit_is_told_as_on_a_first_call(first, bad):
    """Once a call has compiled, its guard sees the next call first: an argument
    that cannot be keyed gets the same error from it as from a new wrapper."""
    x = jnp.ones(2)
    f, fresh = es.jit(lambda d, x: x), es.jit(lambda d, x: x)
    f(first, x)
    errors = []
    for g in (fresh, f):
        with pytest.raises(TypeError) as info:
            g(bad, x)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "which is not hashable" in errors[0]


def test_dict_keys_that_do_not_sort_raise_as_under_filter_jit():
    def f(x, d):
        return x

    errors = []
    for g in (eqx.filter_jit(f), es.jit(f)):
        with pytest.raises(Exception) as info:
            g(jnp.ones(2), {1: 2, "a": 3})
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


@jax.tree_util.register_pytree_node_class
class _Box:
    """A registered pytree node with one child."""

    def __init__(self, x: Any):
        self.x = x

    def tree_flatten(self) -> tuple:
        return (self.x,), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> "_Box":
        return cls(*children)


@_large
@pytest.mark.parametrize(
    "make, where",
    [
        (lambda items: jax.tree_util.Partial(jnp.add, items), "y[0][0][0]"),
        (_Box, "y[0][0]"),
    ],
    ids=["Partial", "a node of one child"],
)
def test_a_cycle_through_a_pytree_of_its_own_is_a_clear_error(make, where):
    """A registered pytree node (a `jax.tree_util.Partial`, a node with one child)
    over a list that holds it: the search looks inside pytree nodes, one level at
    a time."""
    items: list = []
    node = make(items)
    items.append(node)
    f = es.jit(lambda x, y: x)
    with pytest.raises(ValueError, match=re.escape(f"{where} is the argument again")):
        f(jnp.ones(2), node)


class _Maybe(eqx.Module):
    a: Any
    b: jax.Array
    s: Any = eqx.field(static=True)


def _maybe(**fields: Any) -> _Maybe:
    m = object.__new__(_Maybe)
    for k, v in fields.items():
        object.__setattr__(m, k, v)
    return m


def test_an_unset_field_and_a_field_holding_none_are_two_keys():
    """Equinox leaves an unset field absent (a custom `__init__` may skip one), not
    None: `hasattr` tells them apart, and so do the keys, dynamic or static."""

    def f(m, x):
        return x * (2.0 if hasattr(m, "a") else 3.0) * (5.0 if hasattr(m, "s") else 7.0)

    b, x = jnp.ones(2), jnp.ones(2)
    jf = es.jit(f)
    ms = [_maybe(a=None, b=b, s=None), _maybe(b=b, s=None), _maybe(a=None, b=b),
          _maybe(b=b)]  # fmt: skip
    for m in ms * 2:
        np.testing.assert_array_equal(jf(m, x), f(m, x))
    assert jf.cache_info().misses == len(ms)


class _Swapped(NamedTuple):
    a: Any
    b: Any

    def __getitem__(self, i: Any) -> Any:  # by index, the items come out swapped
        return tuple.__getitem__(self, 1 - i)


class _Short(NamedTuple):
    a: Any
    b: Any

    def __len__(self) -> int:  # one item, to `len` and `reversed`
        return 1


class _Backwards(NamedTuple):
    a: Any
    b: Any

    def __reversed__(self) -> Any:  # the items the other way round
        return iter(tuple.__getitem__(self, slice(None)))


@pytest.mark.parametrize("cls", [_Swapped, _Short, _Backwards])
def test_a_named_tuple_with_its_own_indexing_is_read_as_jax_reads_it(cls):
    """JAX flattens a named tuple by its stored items, whatever its `__getitem__`,
    `__len__` or `__reversed__` says: so does the key, and the call gives the
    eager result."""

    def f(t):
        return t.a * 1.0 + t.b * 2.0

    t = cls(jnp.ones(2), jnp.zeros(2))
    want = f(t)
    np.testing.assert_array_equal(eqx.filter_jit(f)(t), want)
    np.testing.assert_array_equal(es.jit(f)(t), want)
    np.testing.assert_array_equal(es.jit(f)(t), want)  # and on a hit


@pytest.mark.skipif(
    sys.version_info[:2] == (3, 12),
    reason="CPython 3.12 caps C recursion at 1,500 frames: JAX's own flatten raises "
    "SystemError at this depth there, under jax.jit and eqx.filter_jit alike",
)
# 1,100 deep in the fast tier (past Python's default limit of 1,000 frames, which
# the hit runs under), 1,500 in the slow one: the key's walk under the runtime
# type checks grows with the square of the depth.
@pytest.mark.parametrize("depth", [1_100, pytest.param(1_500, marks=pytest.mark.slow)])
def test_deeply_nested_pytrees_other_than_plain_containers_key_fine(depth):
    """Named tuples 1,100 (or 1,500) deep: the key walk and the guard do not
    recurse. (The trace flattens the call with JAX's flatten, as `eqx.filter_jit`
    does, which recurses under Python's limit: raised here for it, as JAX needs it
    raised.)"""

    Box = collections.namedtuple("Box", "inner")
    v = jnp.ones(())
    for _ in range(depth):
        v = Box(v)

    def innermost(t):
        while isinstance(t, Box):
            t = t.inner
        return t + 1

    f = es.jit(innermost)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        assert float(f(v)) == 2.0
    finally:
        sys.setrecursionlimit(limit)
    assert float(f(v)) == 2.0  # a hit: nothing recurses
    assert f.cache_info().hits == 1


class PlainHolder(eqx.Module):
    """A plain module may hold a list or a dict in a static field (lineax's
    operators do); an `es.Module` refuses one at construction."""

    w: jax.Array
    s: Any = eqx.field(static=True)


@dataclasses.dataclass
class Settable:  # not frozen: Python cannot hash it
    n: Any


class FreshReads(Settable):
    """Each read of a dict field gives a new copy of it, freed once read, whose
    memory (and so `id`) the next copy may take. (Whether it does depends on what
    else allocates in between: without the suite's runtime type checks, as the
    mutation runs go, it does.)"""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        return value.copy() if type(value) is dict else value


class RaisingHash(Settable):
    """Its own `__hash__` raises `TypeError`, as a `__hash__` of None would."""

    def __hash__(self) -> int:
        raise TypeError("unhashable")


def _read(s: Any) -> list:
    """Every number and string in `s`, in the order Python reads them (a dict's
    keys and values in its own order): an array each, of the dtype JAX gives it."""
    out, stack = [], [s]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack += [part for item in reversed(v.items()) for part in item[::-1]]
        elif isinstance(v, list | tuple | set | frozenset):
            stack += list(v)[::-1]
        elif isinstance(v, Settable):
            stack.append(v.n)
        elif not isinstance(v, type):  # (the tags of `_as_tuples`)
            out.append(jnp.asarray([ord(c) for c in v] if type(v) is str else v))
    return out


def _holder_read(m: Any, x: jax.Array) -> Any:
    return m.w * x, _read(m.s)


def _fresh_read() -> Any:
    """`es.jit` of a new function: a cache of its own."""
    return es.jit(lambda m, x: _holder_read(m, x))


def _as_tuples(v: Any) -> Any:
    """`v` with each list, dict, set and `Settable` made a tuple (or a frozenset)
    tagged with its type: the hashable value the same key rule applies to."""
    if type(v) is list or type(v) is tuple:
        return (type(v), tuple(map(_as_tuples, v)))
    if type(v) is dict:
        return (dict, tuple((_as_tuples(k), _as_tuples(x)) for k, x in v.items()))
    if type(v) is set:
        return (set, frozenset(map(_as_tuples, v)))
    if isinstance(v, np.ndarray | jax.Array):
        return (type(v), str(v.dtype), _as_tuples(np.asarray(v).tolist()))
    return (type(v), _as_tuples(v.n)) if isinstance(v, Settable) else v


_INT, _FLOAT = [1], [1.0]  # each held twice below

# Pairs of static values that Python says are equal (or that are equal as a whole
# but not in the order the trace reads them), and pairs that are one key.
PLAIN_PAIRS = {
    "int, float": ([1], [1.0]),
    "int, bool": ([1], [True]),
    "0.0, -0.0": ([0.0], [-0.0]),
    "nan, the same nan": ([NAN], [float("nan")]),
    "nan, -nan": ([NAN], [-NAN]),
    "a list, a tuple": ([1], (1,)),
    "dict values": ({"a": 1}, {"a": 1.0}),
    "dict keys": ({1: "a"}, {1.0: "a"}),
    "dict order": ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    "a set": ([{1}], [{1.0}]),
    "a dataclass": ([Settable(0.0)], [Settable(-0.0)]),
    "nested": ([{"k": (1, [2.0])}], [{"k": (1, [2])}]),
    "nested, -0.0 deep": ([(1,), {"a": [[0.0]]}], [(1,), {"a": [[-0.0]]}]),
    "nested, equal": ([{"k": [NAN, -0.0]}], [{"k": [NAN, -0.0]}]),
    "lengths": ([[1, 2], [3]], [[1], [2, 3]]),
    "a list in two places": ([_INT, _FLOAT, _INT], [_INT, _FLOAT, _FLOAT]),
    "a new dict on each read": (
        [FreshReads({"k": 1}), FreshReads({"k": 1})],
        [FreshReads({"k": 1}), FreshReads({"k": 1.0})],
    ),
    "numpy arrays": ([np.array([1])], [np.array([1.0])]),
    "numpy arrays, -0.0": ([np.array(0.0)], [np.array(-0.0)]),
    "jax arrays, -0.0": ([jnp.array(0.0)], [jnp.array(-0.0)]),
}


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
# The key is made before the path is chosen: the public path's 40 runs are in the
# slow tier; the fast one reaches that path for unhashable statics through
# test_an_unhashable_static_changed_in_place_is_a_new_key[...-public].
@pytest.mark.parametrize(
    "where", ["dispatcher", pytest.param("public", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("warm", [1, 3])  # the second value on the general path, or
@pytest.mark.parametrize("pair", sorted(PLAIN_PAIRS))  # past the first one's guard
def test_an_unhashable_static_in_a_plain_module_is_keyed_by_type_and_value(
    pair, warm, where
):
    """A list, dict, set or plain dataclass in a plain module's static field is
    keyed by type and value all the way down, as the same values in tuples are:
    each call gives the eager result, and the pair is one key exactly where its
    tuples are. (`eqx.filter_jit` compares such a value with `==`, which says
    `[1] == [1.0] == [True]` and `[0.0] == [-0.0]`, and runs the first's program.)"""
    first, second = PLAIN_PAIRS[pair]
    x = jnp.array(2.0, jnp.float32)
    misses = []
    with path(where):
        for make in (lambda v: v, _as_tuples):
            f = _fresh_read()
            for s in [first] * warm + [second] * 2:
                m = PlainHolder(jnp.float32(1.5), make(s))
                _assert_same(f(m, x), _holder_read(m, x))
            misses.append(f.cache_info().misses)
    assert misses[0] == misses[1]


def _agree(got: Any, want: Any) -> bool:
    try:
        _assert_same(got, want)
    except AssertionError:
        return False
    return True


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
@pytest.mark.parametrize("pair", sorted(PLAIN_PAIRS))
def test_filter_jit_runs_the_first_program_for_an_equal_unhashable_static(pair):
    """What the table above guards against: `eqx.filter_jit` compares the value
    with `==`, so where Python says the two are equal, the second call runs the
    first one's program, and is wrong wherever the two eager results differ."""
    first, second = PLAIN_PAIRS[pair]
    x = jnp.array(2.0, jnp.float32)
    a, b = (PlainHolder(jnp.float32(1.5), s) for s in (first, second))
    g = eqx.filter_jit(lambda m, x: _holder_read(m, x))
    g(a, x)
    reused = first == second  # then the second call runs the first's program
    right = not reused or _agree(_holder_read(a, x), _holder_read(b, x))
    assert _agree(g(b, x), _holder_read(b, x)) == right


# A static value and a change in place that the trace would read.
PLAIN_CHANGES = {
    "int to float": ([1], lambda v: v.__setitem__(0, 1.0)),
    "0.0 to -0.0": ([0.0], lambda v: v.__setitem__(0, -0.0)),
    "append": ([1], lambda v: v.append(2)),
    "dict value": ({"a": 1}, lambda v: v.__setitem__("a", True)),
    "dict order": ({"a": 1, "b": 2}, lambda v: v.__setitem__("a", v.pop("a"))),
    "nested": ([{"k": (1,)}], lambda v: v[0].__setitem__("k", (1.0,))),
    "nested list": ([[{"k": [0.0]}]], lambda v: v[0][0]["k"].__setitem__(0, -0.0)),
    "a dataclass": ([Settable(1)], lambda v: setattr(v[0], "n", 1.0)),
    "a raising hash": ([RaisingHash(1)], lambda v: setattr(v[0], "n", 2)),
}


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("warm", [1, 3])  # changed before its guard, or after
@pytest.mark.parametrize("change", sorted(PLAIN_CHANGES))
def test_an_unhashable_static_changed_in_place_is_a_new_key(change, warm, where):
    """The key holds the value's form, not the value: changed in place between
    calls, it is another key, and each call gives the eager result; a fresh value
    equal to the first is still the first key; a value with a part whose own
    `__hash__` raises is compared whole, by `==` with a copy. (`eqx.filter_jit`
    keeps the list itself, which still equals itself: the old program runs.)"""
    value, mutate = PLAIN_CHANGES[change]
    x = jnp.array(2.0, jnp.float32)
    with path(where):
        f = _fresh_read()
        m = PlainHolder(jnp.float32(1.5), copy.deepcopy(value))
        for _ in range(warm):
            _assert_same(f(m, x), _holder_read(m, x))
        mutate(m.s)
        for _ in range(3):
            _assert_same(f(m, x), _holder_read(m, x))
        fresh = PlainHolder(jnp.float32(1.5), copy.deepcopy(value))
        _assert_same(f(fresh, x), _holder_read(fresh, x))
    assert f.cache_info().misses == 2


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_an_unhashable_static_that_contains_itself_is_keyed_by_its_shape(where):
    """A list in a static field may come to contain itself (Equinox refuses one at
    construction): it is keyed in finite time, by type and value, the inner
    reference as the container met before that it is. Two such lists of the same
    values are one key; of `1` and `1.0`, two. (`eqx.filter_jit` raises on the second call: it
    compares the two lists with `==`, which recurses without end.)"""

    def f(m, x):
        return x * m.w, jnp.asarray(m.s[0]), jnp.asarray(m.s[1][1][0])

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for head in (1, 1, 1.0, 1.0):
            m = PlainHolder(jnp.float32(1.5), [head])
            m.s.append(m.s)  # `[head, [head, [head, ...]]]`
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 2


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_numpy_scalar_read_last_in_a_static_tuple_keeps_the_items_before_it(
    where,
):
    """A static tuple whose last item read is a numpy scalar is keyed by all its
    items: `(1, np.float32(2))` and `(5, np.float32(2))` are two keys."""

    def f(m, x):
        return x * m.w + m.s[0] * m.s[1]

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for k in (1, 1, 5, 5):
            m = PlainHolder(jnp.float32(1.5), (k, np.float32(2.0)))
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 2


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_static_tree_structure_is_keyed_by_the_structure(where):
    """A `PyTreeDef` in a static field (where a module keeps the structure it
    unflattens to) is one key per structure."""

    def f(m, x):
        return x * m.w * m.s.num_leaves

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for tree in ((1, 2), (1, 2), (1, 2, 3), [1, 2], (1, 2)):
            m = PlainHolder(jnp.float32(1.5), jax.tree.structure(tree))
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 3


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_static_tuples_of_the_same_items_nested_otherwise_are_other_keys(where):
    """`((1,), 2)` and `((1, 2),)` hold the same items in the same order, at other
    depths: each tuple's length is part of its key."""

    def f(m, x):
        return x * m.w * len(m.s)

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for s in (((1,), 2), ((1,), 2), ((1, 2),), ((1, 2),)):
            m = PlainHolder(jnp.float32(1.5), s)
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 2


@dataclasses.dataclass(frozen=True)
class _MaybeFrozen:
    a: Any  # no default: once deleted, unset


def _none() -> _MaybeFrozen:
    return _MaybeFrozen(None)


def _unset() -> _MaybeFrozen:
    m = _MaybeFrozen(None)
    object.__delattr__(m, "a")
    return m


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_an_unset_field_of_a_static_frozen_dataclass_is_not_one_holding_none(where):
    """A frozen dataclass in a static field whose field was deleted is another key
    than one whose field holds None: the function can tell them apart."""

    def f(m, x):
        return x * m.w * (2.0 if hasattr(m.s, "a") else 3.0)

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for make in (_none, _none, _unset, _unset):
            m = PlainHolder(jnp.float32(1.5), make())
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 2


class Uncopyable:
    """Python cannot hash it (its `__eq__` is its own), it has no fields to read,
    and `copy.deepcopy` refuses it."""

    def __init__(self, n: Any):
        self.n = n

    def __eq__(self, other: object) -> bool:
        return type(other) is Uncopyable and self.n == other.n

    def __deepcopy__(self, memo: dict) -> Any:
        raise TypeError("not copyable")


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_an_unhashable_static_that_cannot_be_copied_is_keyed_by_its_own_eq(where):
    """A part of a static that has no form and cannot be copied is compared as it
    is, by its own `==`: equal values are one key, others another."""

    def f(m, x):
        return x * m.w + m.s[0].n

    x = jnp.array(2.0, jnp.float32)
    with path(where):
        jf = es.jit(f)
        for n in (1, 1, 2, 2, 1):
            m = PlainHolder(jnp.float32(1.5), [Uncopyable(n)])
            _assert_same(jf(m, x), f(m, x))
    assert jf.cache_info().misses == 2


def test_unhashable_wrapper_attributes_compare_by_value():
    """Equinox keeps `eqx.module_update_wrapper`'s attributes in the structure and
    compares them with `==` (equinox 0.13.3 copies a function's `__annotations__`
    dict onto `eqx.filter_grad(f)`): two equal dicts are one entry."""

    class Wrapped(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return self.w * x

    def wrapped(annotations: dict) -> Wrapped:
        m = Wrapped(jnp.ones(2))
        object.__setattr__(m, "__annotations__", annotations)
        return m

    traces = [0]

    @es.jit
    def f(m, x):
        traces[0] += 1
        return m(x)

    f(wrapped({"x": int}), jnp.ones(2))
    f(wrapped({"x": int}), jnp.ones(2))  # an equal dict: no retrace
    assert traces[0] == 1
    f(wrapped({"x": float}), jnp.ones(2))  # a different one: a new entry
    assert traces[0] == 2


# --- the key of a call ----------------------------------------------------------------


def test_static_values_are_keyed_by_type_and_value():
    traces = [0]

    class S(es.Module):
        n: Any = eqx.field(static=True)

        @es.jit
        def __call__(self):
            traces[0] += 1
            return jnp.asarray(self.n)

    outs = [S(n)() for n in (1, True, 1.0, 1, True, 1.0)]
    assert [o.dtype for o in outs] == [jnp.int32, jnp.bool_, jnp.float32] * 2
    assert [o.item() for o in outs] == [1, True, 1.0] * 2
    assert [type(o.item()) for o in outs[:3]] == [int, bool, float]
    assert traces[0] == 3
    assert S.__call__.cache_info() == es.CacheInfo(3, 3, None, 3)


def test_static_tuples_are_keyed_by_element_types():
    class S(es.Module):
        n: tuple = eqx.field(static=True)

        @es.jit
        def __call__(self):
            return jnp.asarray(self.n[0])

    assert [S(n)().dtype for n in ((1,), (True,), (1.0,))] == [
        jnp.int32,
        jnp.bool_,
        jnp.float32,
    ]
    assert S.__call__.cache_info().misses == 3


class _Cfg(NamedTuple):
    n: Any


def test_static_namedtuples_are_keyed_by_element_types():
    """A config `NamedTuple` in a static field is common; `Cfg(1) == Cfg(True)`."""

    class S(es.Module):
        cfg: _Cfg = eqx.field(static=True)

        @es.jit
        def __call__(self):
            return jnp.asarray(self.cfg.n)

    assert S(_Cfg(1))().dtype == jnp.int32
    assert S(_Cfg(True))().dtype == jnp.bool_
    assert S(_Cfg(1.0))().dtype == jnp.float32
    assert S.__call__.cache_info().misses == 3


def test_negative_zero_is_its_own_static_value():
    class S(es.Module):
        z: float = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.z

    x = jnp.array(1.0)
    assert not jnp.signbit(S(0.0)(x))
    assert jnp.signbit(S(-0.0)(x))
    assert S.__call__.cache_info().misses == 2


def test_concrete_class_is_part_of_the_key():
    s = seed()

    class Doubled(s.Child):
        def g(self, x):
            return 2.0 * x

    class Same(s.Child):  # no override at all: still another class
        pass

    x = jnp.array(1.5)
    kw = dict(dp=2.0, sp=True, dc=3.0, sc=True)
    assert s.Child(**kw)(x) == 9.0
    assert Doubled(**kw)(x) == 6.0
    assert Same(**kw)(x) == 9.0
    assert s.Child(**kw)(x) == 9.0
    assert Doubled(**kw)(x) == 6.0
    assert s.traces[0] == 3
    assert s.Parent.__call__.cache_info() == es.CacheInfo(2, 3, None, 3)


def test_tree_structure_is_part_of_the_key():
    traces = [0]

    class T(es.Module):
        ws: tuple
        bias: jax.Array | None

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            out = x * sum(self.ws)
            return out if self.bias is None else out + self.bias

    x = jnp.array(2.0)
    assert T((1.0, 2.0), None)(x) == 6.0
    assert T((3.0, 4.0), None)(x) == 14.0  # same structure: reuse
    assert traces[0] == 1
    assert T((1.0, 2.0, 3.0), None)(x) == 12.0
    assert traces[0] == 2
    assert T((1.0, 2.0), jnp.array(1.0))(x) == 7.0
    assert traces[0] == 3
    assert T((1.0, 2.0), None)(x) == 6.0
    assert traces[0] == 3
    assert T.__call__.cache_info().misses == 3


def test_shape_and_dtype_of_a_field_are_part_of_the_key():
    traces = [0]

    class W(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self):
            traces[0] += 1
            return self.w * 2

    assert (W(jnp.ones(3))() == 2).all()
    assert (W(jnp.zeros(3))() == 0).all()
    assert traces[0] == 1
    assert W(jnp.ones(4))().shape == (4,)
    assert traces[0] == 2
    out = W(jnp.ones(3, jnp.float16))()
    assert out.dtype == jnp.float16
    assert traces[0] == 3
    assert W(jnp.ones(3, jnp.float32))().dtype == jnp.float32
    assert W(jnp.ones(4))().shape == (4,)
    assert traces[0] == 3
    assert W.__call__.cache_info() == es.CacheInfo(3, 3, None, 3)


def test_weak_type_of_a_field_is_part_of_the_key():
    traces = [0]

    class W(es.Module):
        w: Any

        @es.jit
        def __call__(self):
            traces[0] += 1
            return self.w * 2

    # `jnp.asarray(2.0)` is weakly typed; a Python 2.0 is stored strongly typed.
    weak, strong = W(jnp.asarray(2.0)), W(jnp.array(2.0, jnp.float32))
    assert jax.typeof(weak()).weak_type
    assert jax.typeof(weak()).weak_type
    assert not jax.typeof(strong()).weak_type
    assert not jax.typeof(W(5.0)()).weak_type  # a stored number: strong
    assert traces[0] == 2
    assert W.__call__.cache_info().misses == 2
    assert float(W(5.0)()) == 10.0 and float(strong()) == 4.0


@pytest.mark.slow
def test_sharding_is_part_of_the_key(tmp_path):
    """Eight simulated CPU devices need a fresh process: XLA reads the flag once.

    JAX traces once per aval and compiles once per input layout, so a new sharding
    need not retrace: it is a hit that compiled, counted by `compile_info()` and
    explained."""
    script = textwrap.dedent(
        """
        import logging
        import jax, jax.numpy as jnp, numpy as np, eqx_static as es
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        assert len(jax.devices()) == 8
        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("eqx_static").addHandler(handler)
        logging.getLogger("eqx_static").setLevel(logging.INFO)
        compiles = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **kw: compiles.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )

        class W(es.Module):
            w: jax.Array

            @es.jit
            def __call__(self, x):
                return self.w * x

        mesh = Mesh(np.array(jax.devices()), ("i",))
        split = NamedSharding(mesh, P("i"))
        whole = NamedSharding(mesh, P())
        x = jnp.array(2.0)
        a = W(jax.device_put(jnp.arange(8.0), split))
        b = W(jax.device_put(jnp.arange(8.0), whole))
        c = W(jax.device_put(jnp.ones(8), split))
        es.jit(lambda v: v)(x)  # the first key probes JAX's dispatcher (a compile)
        del compiles[:]
        for m in (a, c, b, a, b):
            out = m(x)
            assert out.sharding.is_equivalent_to(m.w.sharding, 1), out.sharding
            np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(m.w))
        print("compiles", len(compiles))
        print("info", tuple(W.__call__.cache_info()))
        print("xla", W.__call__.compile_info().compiles)
        print("lines", lines)
        """
    )
    done = run_python(
        code=script,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
        cwd=tmp_path,  # not the repository: import the package as installed
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "compiles 2\n" in out, out  # once per layout
    assert "info (3, 2, None, 2)\n" in out, out  # two entries, each a miss (a compile)
    assert "xla 2\n" in out, out  # ...and counted as such
    assert "sharding" in out.split("lines", 1)[1], out  # ...and explained


@pytest.mark.slow
def test_a_sharding_that_lowers_to_a_compiled_program_is_not_budgeted(tmp_path):
    """`P()` and `P(None)` are other shardings to JAX's dispatcher and lowering, and
    the same program to its cache of executables: the second call lowers again and
    compiles nothing. The budget, the log and the books see no compile (the budget
    refused this call, and the log said "compiling", before the compile was
    planned as it starts), and the two keys hold one program."""
    script = textwrap.dedent(
        """
        import logging
        import jax, jax.numpy as jnp, numpy as np, eqx_static as es
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("eqx_static").addHandler(handler)
        logging.getLogger("eqx_static").setLevel(logging.INFO)
        mesh = Mesh(np.array(jax.devices()), ("i",))
        es.jit(lambda v: v)(jnp.ones(2))  # the first key probes JAX's dispatcher
        compiles = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **kw: compiles.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )

        @es.jit(max_compiles=1)
        def f(x):
            return x * 2

        for spec in (P(), P(None), P(None, None)):
            x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, spec))
            np.testing.assert_array_equal(np.asarray(f(x)), 2 * np.ones((8, 8)))
        del compiles[:1]  # ...and its device_put
        print("xla", len(compiles), "info", tuple(f.compile_info())[:2])
        print("compiling", sum("compiling" in line for line in lines))
        """
    )
    done = run_python(
        code=script,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "xla 1 info (1, 1)\ncompiling 0\n" in done.stdout, (
        done.stdout
    )  # at INFO: none


# --- arguments that are not modules: eqx.filter_jit's rules ---------------------------


def _compare_with_filter_jit(calls: list[tuple]) -> tuple[list[int], list[int]]:
    """Trace counts after each call, under `es.jit` and under `eqx.filter_jit`."""
    ours, theirs = [0], [0]

    @es.jit
    def f(*args):
        ours[0] += 1
        return jnp.zeros(())

    @eqx.filter_jit
    def g(*args):
        theirs[0] += 1
        return jnp.zeros(())

    a, b = [], []
    for args in calls:
        f(*args)
        g(*args)
        a.append(ours[0])
        b.append(theirs[0])
    return a, b


def test_non_module_arguments_follow_filter_jit():
    fn1, fn2 = jnp.sin, jnp.cos
    calls = [
        (jnp.ones(3),),
        (jnp.zeros(3),),  # array values are traced
        (np.ones(3, np.float32),),  # a NumPy array: traced too
        (jnp.ones(4),),  # new shape
        (2.5,),  # a Python float outside a module is static...
        (2.5,),
        (3.5,),  # ...so a new value recompiles
        ("relu",),
        ("relu",),
        ("tanh",),
        (fn1,),
        (fn1,),
        (fn2,),
        ((1.0, jnp.ones(2)),),
        ((2.0, jnp.zeros(2)),),
        ([1.0, jnp.ones(2)],),
        (None,),
        ({"a": jnp.ones(2), "b": 3},),
        ({"a": jnp.zeros(2), "b": 3},),
    ]
    ours, theirs = _compare_with_filter_jit(calls)
    assert ours == theirs
    assert ours[-1] == 13


def test_python_float_argument_recompiles_per_value_and_is_a_python_float():
    seen = []

    @es.jit
    def f(x, scale):
        seen.append(type(scale))
        return x * scale

    x = jnp.ones(2)
    assert (f(x, 2.0) == 2).all() and (f(x, 2.0) == 2).all()
    assert (f(x, 3.0) == 3).all()
    assert seen == [float, float]
    assert f.cache_info() == es.CacheInfo(1, 2, None, 2)


def test_static_arguments_are_keyed_by_type_and_value():
    """Stricter than `eqx.filter_jit`, which lets `1`, `True` and `1.0` share."""

    @es.jit
    def f(n):
        return jnp.asarray(n)

    assert [f(n).dtype for n in (1, True, 1.0)] == [jnp.int32, jnp.bool_, jnp.float32]
    assert f.cache_info().misses == 3


def test_string_and_function_arguments_are_static():
    @es.jit
    def f(x, act, fn):
        assert isinstance(act, str)
        return fn(x) if act == "fn" else x

    x = jnp.array([0.5, 1.0])
    assert (f(x, "fn", jnp.sin) == jnp.sin(x)).all()
    assert (f(x, "fn", jnp.cos) == jnp.cos(x)).all()
    assert (f(x, "id", jnp.cos) == x).all()
    assert (f(x, "fn", jnp.sin) == jnp.sin(x)).all()
    assert f.cache_info() == es.CacheInfo(1, 3, None, 3)


# --- typed static values --------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
def test_numpy_scalar_statics_are_keyed_by_sign():
    """np.float32(0.0) and np.float32(-0.0) as static values compile separately."""

    class N(es.Module):
        v: object = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + 1 / jnp.asarray(self.v)

    z = jnp.zeros((), jnp.float32)
    for v in (np.float32(0.0), np.float32(-0.0)):
        assert N(v=v).f(z) == z + 1 / jnp.asarray(v)
    assert N.f.cache_info() == es.CacheInfo(0, 2, None, 2)


def test_complex_statics_are_keyed_by_sign_and_nan_equals_itself():
    """Complex static values differ by the sign of zero; a nan part still hits."""

    class C(es.Module):
        c: complex = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + 1 / jnp.asarray(self.c).imag

    z = jnp.zeros((), jnp.float32)
    for v in (complex(1, 0.0), complex(1, -0.0)):
        assert C(c=v).f(z) == z + 1 / jnp.asarray(v).imag
    assert C.f.cache_info() == es.CacheInfo(0, 2, None, 2)
    C.f.cache_clear()
    for _ in range(5):
        C(c=complex(float("nan"), 0)).f(z)  # equal-valued modules
    assert C.f.cache_info() == es.CacheInfo(4, 1, None, 1)


def test_frozenset_statics_are_keyed_by_element_types():
    """frozenset({1}), frozenset({True}) and frozenset({1.0}) compile separately."""

    class S(es.Module):
        s: frozenset = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return jnp.asarray(next(iter(self.s)))

    z = jnp.zeros((), jnp.float32)
    for v in (frozenset({1}), frozenset({True}), frozenset({1.0})):
        out = S(s=v).f(z)
        assert out.dtype == jnp.asarray(next(iter(v))).dtype
    assert S.f.cache_info() == es.CacheInfo(0, 3, None, 3)


class Dims(tuple):
    def __new__(cls, *dims):
        return super().__new__(cls, dims)


def test_tuple_subclass_static_reaches_the_trace_unchanged():
    """A static tuple subclass with a *args constructor is the same value inside the trace."""

    class M(es.Module):
        dims: Dims = eqx.field(static=True)

        @es.jit
        def f(self, x):
            assert type(self.dims) is Dims
            return x * len(self.dims)

    m, x = M(dims=Dims(4, 5, 6)), jnp.ones(())
    assert m.f(x) == M.f.__wrapped__(m, x) == 3.0


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: Any


class Inner(eqx.Module):
    n: Any = eqx.field(static=True)


class Pair(typing.NamedTuple):
    a: Any
    b: Any


class ConfigHolder(es.Module):
    cfg: Any = eqx.field(static=True)

    @es.jit
    def as_array(self):
        return jnp.asarray(_first(self.cfg))

    @es.jit
    def reciprocal(self, x):
        return x / _first(self.cfg)


def _first(cfg: Any) -> Any:
    if isinstance(cfg, Cfg):
        return cfg.scale
    if isinstance(cfg, Inner):
        return cfg.n
    if isinstance(cfg, frozenset):
        return next(iter(cfg))
    while isinstance(cfg, tuple):
        cfg = cfg[0]
    return cfg


WRAPS = {
    "dataclass": Cfg,
    "module": Inner,
    "named tuple": lambda v: Pair(v, 0),
    "tuple": lambda v: (v,),
    "nested tuple": lambda v: ((v,),),
    "frozenset": lambda v: frozenset([v]),
}


@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_one_true_and_one_point_zero_differ_inside_a_static_value(wrap):
    make = WRAPS[wrap]
    got = [ConfigHolder(make(v)).as_array().dtype for v in (1, True, 1.0)]
    eager = [
        ConfigHolder.as_array.fn(ConfigHolder(make(v))).dtype for v in (1, True, 1.0)
    ]
    assert got == eager == [jnp.int32, jnp.bool_, jnp.float32]


@pytest.mark.parametrize("wrap", ["dataclass", "module", "tuple", "named tuple"])
def test_minus_zero_and_nan_inside_a_static_value(wrap):
    make = WRAPS[wrap]
    x = jnp.ones(())
    assert float(ConfigHolder(make(0.0)).reciprocal(x)) == np.inf
    assert (
        float(ConfigHolder(make(-0.0)).reciprocal(x)) == -np.inf
    )  # not the +0.0 entry
    before = ConfigHolder.reciprocal.cache_info().misses
    for _ in range(2):  # nan equals itself: one entry, then hits
        assert np.isnan(float(ConfigHolder(make(float("nan"))).reciprocal(x * 0)))
    assert ConfigHolder.reciprocal.cache_info().misses == before + 1


class Tagged(tuple):
    """A tuple subclass with its own equality: the unit takes part in it."""

    unit: str

    def __new__(cls, values: tuple, unit: str):
        self = super().__new__(cls, values)
        self.unit = unit
        return self

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tagged)
            and tuple(self) == tuple(other)
            and self.unit == other.unit
        )

    def __hash__(self) -> int:
        return hash((tuple(self), self.unit))


class Distance(es.Module):
    d: Tagged = eqx.field(static=True)

    @es.jit
    def metres(self, x):
        return x * sum(self.d) * (1000.0 if self.d.unit == "km" else 1.0)


def test_a_tuple_subclass_is_compared_by_its_own_eq():
    x = jnp.ones(())
    assert float(Distance(Tagged((1, 1), "m")).metres(x)) == 2.0
    assert float(Distance(Tagged((1, 1), "km")).metres(x)) == 2000.0


def test_a_static_tuple_holding_an_object_of_its_own_equality_is_compared_each_call():
    """A lookup table passed as a plain argument. A tuple of numbers and strings
    cannot change, and a hit checks it by identity; one holding an object with its
    own `__eq__` and hash, which may read state that changes, is compared again on
    every call (and its key is still found: one entry)."""
    hashes = [0]

    class Counted:
        def __hash__(self):
            hashes[0] += 1
            return 1

        def __eq__(self, other):
            return type(other) is Counted

    table = (Counted(), *range(1000))

    @es.jit
    def f(x, t):
        return x + t[3]

    for _ in range(3):
        before = hashes[0]
        assert float(f(jnp.ones(()), table)) == 3.0
        assert hashes[0] > before  # compared again, not taken by identity
    assert float(f(jnp.ones(()), (Counted(), *range(1000)))) == 3.0  # another one
    assert f.cache_info() == es.CacheInfo(3, 1, None, 1)


def test_a_static_value_of_its_own_equality_is_compared_on_every_call():
    """Nothing is remembered by identity for a value that can change: a static
    config whose `==` and hash read its state is compared again on each call, so a
    change of that state is a new key, on the same instance as on a fresh one."""

    class Config:
        def __init__(self, scale: float):
            self.scale = scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return isinstance(other, Config) and other.scale == self.scale

    class M(es.Module):
        w: jax.Array
        config: Config = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x * self.config.scale

    m, x = M(jnp.ones(3), Config(1.0)), jnp.ones(3)
    for scale in (1.0, 2.0, 3.0):
        m.config.scale = scale
        for instance in (m, m, jax.tree.map(lambda a: a + 0, m)):
            np.testing.assert_array_equal(instance(x), x * scale)
    assert M.__call__.cache_info().misses == 3


# --- nesting --------------------------------------------------------------------------


class Node(es.Module):
    w: jax.Array
    child: Any
    k: int = eqx.field(static=True)


def _total(m: Any) -> Any:
    s = 0.0
    while m is not None:
        s = s + m.w * m.k
        m = m.child
    return s


@pytest.mark.slow
@pytest.mark.parametrize("depth", [450, 900])
def test_modules_nested_as_deep_as_filter_jit_takes(depth):
    m = None
    for i in range(depth):
        m = Node(jnp.ones(()), m, i % 3)
    want = float(eqx.filter_jit(_total)(m))
    assert float(es.jit(_total)(m)) == want == float(_total(m))


def test_nested_lists_and_static_tuples_900_deep():
    x: Any = jnp.ones(())
    for _ in range(900):
        x = [x]

    def unwrap(v):
        while isinstance(v, list):
            v = v[0]
        return 2 * v

    assert float(es.jit(unwrap)(x)) == float(eqx.filter_jit(unwrap)(x)) == 2.0
    t: Any = (1,)
    for _ in range(900):
        t = (t, 1.0)
    assert float(ConfigHolder(t).as_array()) == 1.0


def test_a_call_nested_deeper_than_jax_flattens_is_traced():
    """JAX's flatten recurses, up to Python's recursion limit (past it, JAX raises
    `SystemError`, and so does `eqx.filter_jit`); the key does not, and a new key
    is traced at any depth, without raising the process's recursion limit."""
    depth = 3 * sys.getrecursionlimit()
    x: Any = jnp.ones(())
    for i in range(depth):  # with nodes that hold no leaf: None, an empty tuple
        x = [x, None, (), {"a": jnp.float32(i)}] if i % 2 else [x]

    def unwrap(v):
        total = 0.0
        while isinstance(v, list):
            total = total + v[3]["a"] if len(v) > 1 else total
            v = v[0]
        return 2 * v + total

    limit = sys.getrecursionlimit()
    want = 2.0 + sum(range(1, depth, 2))
    assert float(es.jit(unwrap)(x)) == float(unwrap(x)) == want
    assert sys.getrecursionlimit() == limit


class _NewArrays:
    """A pytree whose flatten makes a new array each time."""

    def __init__(self, x: np.ndarray):
        self.x = x


jax.tree_util.register_pytree_node(
    _NewArrays, lambda t: ((jnp.asarray(t.x),), None), lambda _, c: _NewArrays(c[0])
)


def test_a_flatten_that_makes_new_arrays_is_named():
    """The arrays a call was keyed with are the ones it traces: a flatten that makes
    new ones each time is refused, saying so (never an internal error)."""
    f = es.jit(lambda t: t.x * 2)
    with pytest.raises(ValueError, match="a pytree's flatten makes new arrays each"):
        f(_NewArrays(np.ones(2, np.float32)))


# --- statics that cannot change under their key -----------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _SlottedCfg:
    n: Any


def test_a_slotted_frozen_dataclass_is_keyed_by_its_fields_typed():
    """`@dataclass(frozen=True, slots=True)`: 1, True and 1.0 are three keys, each
    with its own dtype, as for a dataclass with a `__dict__`."""
    f = es.jit(lambda cfg, x: x + jnp.asarray(cfg.n))
    x = jnp.zeros((), jnp.float32)
    with jax.numpy_dtype_promotion("standard"):
        got = [f(_SlottedCfg(n), x).dtype for n in (1, True, 1.0)]
        want = [(x + jnp.asarray(n)).dtype for n in (1, True, 1.0)]
    assert got == want and f.cache_info().misses == 3
    dtypes = [
        es.jit(lambda c: jnp.asarray(c.n))(_SlottedCfg(n)).dtype for n in (1, True, 1.0)
    ]
    assert dtypes == [jnp.int32, jnp.bool_, jnp.float32]


@dataclasses.dataclass
class _Mutable:
    """A plain dataclass: `eq=True` without `frozen=True` sets `__hash__` to None."""

    scale: float


def test_an_unhashable_static_value_is_refused_with_the_fix_for_it():
    """As an argument, or as a non-array leaf of a module (where `eqx.filter_jit`
    refuses it too): a `TypeError` that names it and says to freeze the class.
    Nothing is remembered by `id()`: a changed object could not hit a stale entry."""

    class Holder(eqx.Module):
        w: jax.Array
        cfg: Any

    f = es.jit(lambda h, x: x * h.cfg.scale)
    g = es.jit(lambda cfg, x: x * cfg.scale)
    x = jnp.ones(2)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        eqx.filter_jit(lambda cfg, x: x * cfg.scale)(_Mutable(2.0), x)
    fix = "Pass a frozen dataclass instead: `@dataclass(frozen=True)`."
    for call, where in ((lambda: f(Holder(x, _Mutable(2.0)), x), "h.cfg"),
                        (lambda: g(_Mutable(2.0), x), "cfg")):  # fmt: skip
        with pytest.raises(TypeError) as info:
            call()
        assert f"got {where}, a _Mutable, which is not hashable" in str(info.value)
        assert str(info.value).endswith(fix)


def test_an_es_module_refuses_an_unhashable_static_field_with_the_fix():
    class M(es.Module):
        cfg: Any = eqx.field(static=True)

    with pytest.raises(TypeError) as info:
        M(_Mutable(2.0))
    assert str(info.value) == (
        "Static field 'cfg' of `test_an_es_module_refuses_an_unhashable_static_field_"
        "with_the_fix.<locals>.M` holds an unhashable _Mutable: a static field keys "
        "the compilation cache. Store a frozen dataclass instead: "
        "`@dataclass(frozen=True)`."
    )
