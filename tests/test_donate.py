"""`es.jit(donate=...)`, with `eqx.filter_jit`'s five values and meaning: which
buffers XLA may reuse, `self`'s included, and which it must leave alone."""

import functools
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import path


# --- donate= -----------------------------------------------------------------------


def test_donate_all():
    class M(es.Module):
        w: float

    @es.jit(donate="all")
    def f(m, x):
        return x * m.w

    m = M(2.0)
    for _ in range(3):
        x = jnp.ones(3)
        assert (f(m, x) == 2).all()


def test_donate_all_except_first_keeps_self():
    class M(es.Module):
        w: jax.Array

        @es.jit(donate="all-except-first")
        def __call__(self, x):
            return x * self.w

    m = M(jnp.arange(3.0))
    for _ in range(3):
        assert (m(jnp.ones(3)) == jnp.arange(3.0)).all()
    assert not m.w.is_deleted()


@pytest.mark.parametrize("donate", ["all", "warn"])
def test_donate_all_donates_the_buffers_of_self(donate):
    """As under `eqx.filter_jit`: a number stored in an `es.Module` is an array, so
    `donate="all"` donates it with the rest of `self`."""

    class M(es.Module):
        w: Any

        @es.jit(donate=donate)
        def __call__(self, x):
            return x * self.w, self.w * 2

    m = M(3.0)
    y, w2 = m(jnp.ones(3))
    assert (y == 3).all() and w2 == 6.0
    assert m.w.is_deleted()


def test_donate_all_except_first_keeps_the_first_argument_by_keyword():
    class M(es.Module):
        w: Any

    @es.jit(donate="all-except-first")
    def f(m, x):
        return x * m.w

    m, x = M(jnp.ones(3)), jnp.ones(3)
    f(m=m, x=x)  # bound to positions first: `m` is the first argument
    assert not m.w.is_deleted() and x.is_deleted()


class _Donor(es.Module):
    w: jax.Array

    @es.jit(donate="all")
    def all(self, x):
        return self.w + x, self.w * x  # two outputs: both buffers are usable

    @es.jit(donate="all-except-first")
    def except_first(self, x):
        return self.w + x, self.w * x

    @es.jit(donate="none")
    def none(self, x):
        return self.w + x, self.w * x


@pytest.mark.parametrize(
    "method, w_deleted, x_deleted",
    [("all", True, True), ("except_first", False, True), ("none", False, False)],
)
def test_donation_deletes_exactly_the_donated_buffers(method, w_deleted, x_deleted):
    m = _Donor(jnp.arange(3.0))
    x = jnp.ones(3)
    total, product = getattr(m, method)(x)
    np.testing.assert_array_equal(total, np.arange(3.0) + 1)
    np.testing.assert_array_equal(product, np.arange(3.0))
    assert m.w.is_deleted() is w_deleted
    assert x.is_deleted() is x_deleted


@pytest.mark.parametrize("donate", ["all", "all-except-first"])
def test_donation_of_plain_function_arguments(donate):
    @es.jit(donate=donate)
    def f(a, b):
        return a * 2 + b, a - b  # two outputs: both buffers are usable

    a, b = jnp.ones(4), jnp.arange(4.0)
    total, difference = f(a, b)
    np.testing.assert_array_equal(total, 2 + np.arange(4.0))
    np.testing.assert_array_equal(difference, 1 - np.arange(4.0))
    assert a.is_deleted() is (donate == "all")
    assert b.is_deleted()
    c = jnp.ones(4)
    f(c, jnp.ones(4))  # a second call hits the entry and donates again
    assert c.is_deleted() is (donate == "all")


# --- a default the caller did not pass ----------------------------------------------


class _Holder(es.Module):
    w: jax.Array


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize(
    "donate", ["all", "all-except-first", "warn", "warn-except-first"]
)
def test_a_default_left_out_is_never_donated(where, held, donate):
    """`eqx.filter_jit` leaves a default out of the call (the trace fills it in: a
    constant of the program), so it never donates it: neither does `es.jit`, an
    array default or a module default holding one. It outlives every call,
    compiled and eager, and the results are `filter_jit`'s; an array the caller
    passes is donated, as `filter_jit` donates it."""
    default = _Holder(jnp.arange(3.0)) if held else jnp.arange(3.0)

    def f(x, d=default):
        w = d.w if held else d
        return x + w, x * w  # two outputs: both donated buffers are usable

    with path(where):
        jf, filtered = es.jit(f, donate=donate), eqx.filter_jit(f, donate=donate)
        for _ in range(3):
            got, want = jf(jnp.ones(3)), filtered(jnp.ones(3))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        for leaf in jax.tree.leaves(default):
            assert not leaf.is_deleted()
        np.testing.assert_array_equal(f(jnp.ones(3))[0], 1 + np.arange(3.0))
        mine, theirs = _Holder(jnp.ones(3)), _Holder(jnp.ones(3))
        passed, passed_too = (mine, theirs) if held else (mine.w, theirs.w)
        jf(jnp.ones(3), passed)
        filtered(jnp.ones(3), passed_too)
        assert mine.w.is_deleted() and theirs.w.is_deleted()


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("donate", ["all", "all-except-first"])
def test_a_partial_s_keyword_that_kwargs_takes_is_never_donated(where, donate):
    """A partial's keyword that the function's `**kwargs` takes is a default the
    caller did not pass: an array in it is never donated, and it outlives every
    call; the array the caller passes is donated."""
    w = jnp.arange(3.0)

    def g(x, **kwargs):
        return x + kwargs["w"], x * kwargs["w"]  # both donated buffers usable

    p = functools.partial(g, w=w)
    with path(where):
        jp = es.jit(p, donate=donate)
        for _ in range(3):
            x = jnp.ones(3)
            for got, want in zip(jp(x), p(jnp.ones(3))):
                np.testing.assert_array_equal(got, want)
            assert x.is_deleted() is (donate == "all")
        assert not w.is_deleted()
