"""Default arguments are bound from the signature of the callable `es.jit` wraps,
not from the one `functools.wraps` left in `__wrapped__`: a decorator's own
defaults and parameters are the ones the call uses, as in the eager call. Where the
callable has no signature to read, what the caller passed is passed on."""

import dataclasses
import functools
import operator

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import path


X = jnp.array([0.5, -1.0, 2.0])


def _scaled(x, s=2.0):
    return x * s


def _with_own_default(f):
    @functools.wraps(f)
    def wrapper(x, s=3.0):
        return f(x, s)

    return wrapper


def test_a_wraps_decorator_s_own_default_is_used():
    """The wrapper's default is `3.0`, the wrapped function's `2.0`: calling the
    wrapper without `s` uses `3.0`, eagerly and compiled; the default and the
    explicit `3.0` are one entry."""
    eager = _with_own_default(_scaled)
    f = es.jit(eager)
    np.testing.assert_array_equal(eager(X), X * 3.0)
    np.testing.assert_array_equal(f(X), eager(X))
    np.testing.assert_array_equal(f(X, 3.0), eager(X, 3.0))
    np.testing.assert_array_equal(f(X, s=2.0), eager(X, s=2.0))
    assert f.cache_info() == es.CacheInfo(1, 2, None, 2)


def _with_fewer_parameters(f):
    @functools.wraps(f)
    def wrapper(x):
        return f(x, 5.0)

    return wrapper


def test_a_wraps_wrapper_with_fewer_parameters_works():
    """The wrapper takes `x` only, the wrapped function `x, s=2.0`: the call
    binds to the wrapper's parameters and gives the eager result."""
    eager = _with_fewer_parameters(_scaled)
    f = es.jit(eager)
    np.testing.assert_array_equal(f(X), eager(X))
    np.testing.assert_array_equal(f(x=X), X * 5.0)
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)


def test_a_vmapped_function_with_a_default_works():
    """`jax.vmap(f)` keeps `f` in `__wrapped__` but takes `*args, **kwargs`:
    called with `x` alone, `f`'s default applies inside, as eagerly."""
    xs = jnp.stack([X, 2 * X])
    vmapped = jax.vmap(_scaled)
    f = es.jit(vmapped)
    np.testing.assert_array_equal(vmapped(xs), xs * 2.0)
    np.testing.assert_array_equal(f(xs), vmapped(xs))
    np.testing.assert_array_equal(f(xs), vmapped(xs))
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)


@dataclasses.dataclass
class _Options:
    """A plain dataclass: Python cannot hash it."""

    scale: float = 2.0


def test_a_default_the_caller_did_not_pass_belongs_to_the_function():
    """As under `eqx.filter_jit`, an unhashable default the caller did not pass is
    the function's own, never refused as an argument; the keyable defaults around
    it are still bound, so `f(x)` and `f(x, shift=1.0)` are one key. Passed by the
    caller, the same object is refused, with the fix for it."""

    def body(x, options=_Options(), tags={"a", "b"}, shift=1.0, *, power=1):  # noqa: B006, B008
        return (x * options.scale + shift + len(tags)) ** power

    f, filtered = es.jit(body), eqx.filter_jit(body)
    for call in (lambda g: g(X), lambda g: g(X, shift=1.0), lambda g: g(X, power=1)):
        got = call(f)
        np.testing.assert_array_equal(got, call(body))
        np.testing.assert_array_equal(got, call(filtered))
    np.testing.assert_array_equal(f(X, shift=2.0), body(X, shift=2.0))
    assert f.cache_info() == es.CacheInfo(2, 2, None, 2)
    with pytest.raises(
        TypeError, match=r"got options, a _Options, which is not hashable"
    ):
        f(X, _Options())


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_callable_without_a_signature_gets_what_the_caller_passed(where):
    """`operator.itemgetter(0)` has no signature to read: it is called with the
    arguments as passed, at the first call, a hit and through the guard."""
    g, pair = operator.itemgetter(0), (X, 2.0)
    with path(where):
        jg = es.jit(g)
        for _ in range(3):
            np.testing.assert_array_equal(jg(pair), g(pair))
        assert jg.cache_info() == es.CacheInfo(2, 1, None, 1)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_arguments_past_the_parameters_go_to_star_args(where):
    """`f(x, scale=2.0, *rest, shift=0.0)` called with more positional arguments
    than it has parameters: they fill `x` and `scale`, then `rest`, as Python
    binds them; `shift` is by keyword only."""

    def f(x, scale=2.0, *rest, shift=0.0):
        return x * scale + sum(rest) + shift

    with path(where):
        jf = es.jit(f)
        for args in [(X,), (X, 3.0), (X, 3.0, 1.0, 2.0), (X, 3.0, 1.0, 2.0)]:
            np.testing.assert_array_equal(jf(*args), f(*args))
            np.testing.assert_array_equal(jf(*args, shift=1.0), f(*args, shift=1.0))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_builtin_s_default_is_read_from_its_signature(where):
    """`sum(iterable, /, start=0)` keeps its default in C: read from its signature,
    it is used where the caller leaves it out; one passed replaces it."""
    with path(where):
        js = es.jit(sum)
        for _ in range(3):
            np.testing.assert_array_equal(js([X, X]), sum([X, X]))
            np.testing.assert_array_equal(js([X], 1.0), sum([X], 1.0))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_positional_only_name_passed_by_keyword_goes_to_kwargs(where):
    """`f(x, y, /, **kwargs)` called with `y=` by keyword: Python puts it in
    `kwargs`, beside the positional `y`, and so does the call."""

    def f(x, y, /, **kwargs):
        return x * y + sum(kwargs.values())

    with path(where):
        jf = es.jit(f)
        for _ in range(3):
            np.testing.assert_array_equal(jf(X, 2.0, y=3.0), f(X, 2.0, y=3.0))
            np.testing.assert_array_equal(jf(X, 2.0, x=1.0), f(X, 2.0, x=1.0))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_defaults_left_to_the_function_keep_their_keys_as_another_changes(where):
    """Two defaults that cannot be keyed (sets, left to the function) each keep
    their marker while a third default changes: changed back, the call is the
    key it was (a hit)."""
    tags, more = {"a"}, {"b", "c"}

    def f(x, tags=tags, more=more, scale=2.0):
        return x * scale * len(tags) * len(more)

    with path(where):
        jf = es.jit(f)
        for v in (2.0, 3.0, 2.0):
            f.__defaults__ = (tags, more, v)
            np.testing.assert_array_equal(jf(X), f(X))
        assert jf.cache_info() == es.CacheInfo(1, 2, None, 2)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_partial_s_keywords_left_to_the_function_keep_their_keys(where):
    """The same for a partial's keywords that the function's `**kwargs` takes:
    two sets keep their markers while a third keyword changes and changes back."""

    def g(x, **kwargs):
        return x * kwargs["scale"] * len(kwargs["tags"]) * len(kwargs["more"])

    p = functools.partial(g, tags={"a"}, more={"b", "c"}, scale=2.0)
    with path(where):
        jp = es.jit(p)
        for v in (2.0, 3.0, 2.0):
            p.keywords["scale"] = v
            np.testing.assert_array_equal(jp(X), p(X))
        assert jp.cache_info() == es.CacheInfo(1, 2, None, 2)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_function_without_parameters_is_called(where):
    """No parameters: no values to key but the function's, at the first call, a
    hit and through the guard."""

    def f():
        return jnp.arange(3.0)

    with path(where):
        jf = es.jit(f)
        for _ in range(3):
            np.testing.assert_array_equal(jf(), f())


def test_a_static_int_of_any_size_keys_and_guards():
    """A static `int` past Python's 4,300-digit `repr` limit keys, hits through its
    guard, and another such `int` is another key."""
    big = 10**5000

    @es.jit
    def f(x, n):
        return x * (n % 7)

    for n in (big, big, big + 1, big + 1, big):
        np.testing.assert_array_equal(f(X, n), X * (n % 7))
    assert f.cache_info() == es.CacheInfo(3, 2, None, 2)


# ----------------------------------------------------------------------------------
# Defaults are the function's at the call, as Python reads them.


def _same(got, want):
    """The same tree, leaf types and values (a Python value stays one)."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        if isinstance(w, jax.Array):
            assert isinstance(g, jax.Array) and g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        else:
            assert type(g) is type(w) and g == w


def _filtered(eager, *args):
    """`eqx.filter_jit`'s result, traced afresh (its cache keys no default)."""
    return eqx.filter_jit(lambda *a: eager(*a))(*args)


def _scale(s):
    return jnp.asarray(s, jnp.float32)


_MISSING = object()  # a sentinel default, compared by identity
_EMPTY: list = []  # one that is a container: it reaches the trace as an equal copy


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_sentinel_default_is_the_object_itself(where):
    """A default the caller left out reaches the traced function as the object
    itself when it is a leaf (`u is _MISSING` holds, as in the eager call and
    under `eqx.filter_jit`); a container without arrays arrives as an equal copy
    of the same type (a kept difference: a key compares values, so a copy equal
    to the default must run the same program)."""

    def f(x, u=_MISSING, v=_EMPTY):
        assert type(v) is list and v == _EMPTY
        return x * (2 if u is _MISSING else 3) * (5 if v is _EMPTY else 7)

    with path(where):
        got = es.jit(f)(jnp.ones(()))
        _same(got, _filtered(lambda x: f(x, v=[]), jnp.ones(())))
        _same(es.jit(f)(jnp.ones(()), 1), f(jnp.ones(()), 1, []))


def _positional():
    def f(x, scale=2.0):
        return x * _scale(scale), scale

    return es.jit(f), f, lambda v: setattr(f, "__defaults__", (v,))


def _keyword_only(replaced):
    def f(x, *, scale=2.0):
        return x * _scale(scale), scale

    def change(v):
        if replaced:
            f.__kwdefaults__ = {"scale": v}
        else:
            f.__kwdefaults__["scale"] = v  # pyright: ignore[reportOptionalSubscript]

    return es.jit(f), f, change


def _partial():
    p = functools.partial(lambda x, scale: (x * _scale(scale), scale), scale=2.0)
    return es.jit(p), p, lambda v: p.keywords.__setitem__("scale", v)


def _partial_of_a_default():
    """A partial's function's own default, beside the partial's keyword."""

    def f(x, scale=2.0, *, k):
        return x * _scale(scale) * _scale(k), scale

    p = functools.partial(f, k=1.0)
    return es.jit(p), p, lambda v: setattr(f, "__defaults__", (v,))


def _partial_into_kwargs():
    """A partial's keyword that `**kwargs` takes, beside the function's default."""

    def f(x, scale=2.0, **kwargs):
        return x * _scale(scale) * _scale(kwargs["k"]), scale

    p = functools.partial(f, k=1.0)
    return es.jit(p), p, lambda v: setattr(f, "__defaults__", (v,))


def _with_an_fn_attribute():
    """A function with an attribute `fn` of its own (as an `es.jit` method's
    wrapper has): its own defaults are read, not those of `fn`."""

    def f(x, scale=2.0):
        return x * _scale(scale), scale

    f.fn = lambda x, scale=9.0: None  # pyright: ignore[reportFunctionMemberAccess]
    return es.jit(f), f, lambda v: setattr(f, "__defaults__", (v,))


def _bound_method():
    class Plain:
        def f(self, x, scale=2.0):
            return x * _scale(scale), scale

    bound = Plain().f
    return es.jit(bound), bound, lambda v: setattr(Plain.f, "__defaults__", (v,))


def _after_one_of_its_own():
    """A default that is the function's own (Python cannot hash a set), then a
    positional-only one, and `*args`."""
    tags = {"a"}

    def f(x, tags=tags, scale=2.0, /, *rest):
        return x * _scale(scale) * len(tags), scale

    return es.jit(f), f, lambda v: setattr(f, "__defaults__", (tags, v))


def _method(which):
    class Model(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x, scale=2.0, *, key=None):
            return (
                self.w * x * _scale(scale) + _scale(0.0 if key is None else key),
                scale,
                key,
            )

    m, f = Model(jnp.ones(3)), Model.__call__.__wrapped__  # pyright: ignore
    if which == "scale":
        return m, lambda x: f(m, x), lambda v: setattr(f, "__defaults__", (v,))
    return m, lambda x: f(m, x), lambda v: f.__kwdefaults__.__setitem__("key", v)


def _static_method():
    class Holder:
        @staticmethod
        @es.jit
        def f(x, scale=2.0):
            return x * _scale(scale), scale

    f = Holder.f.__wrapped__  # pyright: ignore[reportFunctionMemberAccess]
    return Holder().f, f, lambda v: setattr(f, "__defaults__", (v,))


def _callable_module():
    class Scaled(eqx.Module):
        def __call__(self, x, scale=2.0):
            return x * _scale(scale), scale

    m = Scaled()
    return es.jit(m), m, lambda v: setattr(Scaled.__call__, "__defaults__", (v,))


def _module_of_a_jitted_call():
    """`es.jit(model)` whose `__call__` is an `es.jit` method: its function's."""

    class Scaled(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x, scale=2.0):
            return self.w * x * _scale(scale), scale

    m, f = Scaled(jnp.ones(3)), Scaled.__call__.__wrapped__  # pyright: ignore
    return es.jit(m), lambda x: f(m, x), lambda v: setattr(f, "__defaults__", (v,))


CHANGED = {
    "__defaults__": _positional,
    "__kwdefaults__ in place": lambda: _keyword_only(replaced=False),
    "__kwdefaults__ replaced": lambda: _keyword_only(replaced=True),
    "a partial's keywords": _partial,
    "a partial's function's default": _partial_of_a_default,
    "a partial's keyword in **kwargs": _partial_into_kwargs,
    "a function with an attribute fn": _with_an_fn_attribute,
    "es.jit(obj.method)": _bound_method,
    "after a default of its own": _after_one_of_its_own,
    "a method's default": lambda: _method("scale"),
    "a method's key=None": lambda: _method("key"),
    "a static method's default": _static_method,
    "es.jit(module)": _callable_module,
    "es.jit(module) of an es.jit method": _module_of_a_jitted_call,
}


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("kind", sorted(CHANGED))
def test_a_default_changed_after_wrapping_is_the_one_used(where, kind):
    """Each change is read at the next call, on the general path (a key's first
    two calls) and through its guard (the third), as eagerly and under a fresh
    `eqx.filter_jit`: a new key if the default is another value, the same key (a
    hit) when it comes back or is set to the same value again."""
    filtered = {}  # `eqx.filter_jit`'s result for each default, traced once
    with path(where):
        f, eager, change = CHANGED[kind]()
        for v in (2.0, 3.0, 2.0, 3.0, 3.0):
            change(v)
            for _ in range(3):
                _same(f(X), eager(X))
            if v not in filtered:
                filtered[v] = _filtered(eager, X)
            _same(f(X), filtered[v])
        info = f.__call__.cache_info() if isinstance(f, es.Module) else f.cache_info()
        assert info == es.CacheInfo(hits=18, misses=2, maxsize=None, currsize=2)
        change(jnp.asarray(4.0))  # an array: a traced argument
        for _ in range(3):
            _same(f(X), eager(X))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_an_array_default_replaced_is_traced_as_the_first_was(where):
    """An array default is a traced argument: replaced after wrapping by another
    array of the same shape and dtype, it runs the program of the first (a hit),
    with the new values."""

    first = jnp.asarray(2.0)

    def f(x, scale=first):
        return x * scale

    with path(where):
        jf = es.jit(f)
        np.testing.assert_array_equal(jf(X), f(X))
        f.__defaults__ = (jnp.asarray(3.0),)
        for _ in range(3):
            np.testing.assert_array_equal(jf(X), f(X))
        assert jf.cache_info() == es.CacheInfo(3, 1, None, 1)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_lower_binds_each_default_changed_as_a_call_does(where):
    """`lower` reads the function's defaults at the call, as a call does: one
    changed after wrapping, then changed again, is the one lowered and compiled."""

    def f(x, scale=2.0):
        return x * scale

    with path(where):
        jf = es.jit(f)
        for v in (3.0, 4.0):
            f.__defaults__ = (v,)
            np.testing.assert_array_equal(jf.lower(X).compile()(X), f(X))
            np.testing.assert_array_equal(jf(X), f(X))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_keyword_added_to_a_partial_for_a_defaulted_parameter_is_used(where):
    """A partial's keywords are compared whole: one added after wrapping, for a
    parameter whose default is the function's, is used from the next call on."""

    def f(x, a, b=2.0):
        return x * a + b

    p = functools.partial(f, a=1.0)
    with path(where):
        jp = es.jit(p)
        np.testing.assert_array_equal(jp(X), p(X))
        p.keywords["b"] = 5.0
        for _ in range(3):
            np.testing.assert_array_equal(jp(X), p(X))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
def test_a_default_taken_away_is_required_until_given_back(where):
    """Taken away, a default is a missing argument, with Python's own message;
    given back, it is used again. A partial's keyword taken away is left to the
    function again, and one added for its `**kwargs` is keyed as an argument."""

    def f(x, scale=2.0, *, shift=0.0):
        return x * scale + shift

    def g(x, **kwargs):
        return x * sum(kwargs.values())

    with path(where):
        jf, p = es.jit(f), functools.partial(g, a=2.0)
        jp = es.jit(p)
        f.__defaults__, f.__kwdefaults__ = None, None
        with pytest.raises(TypeError, match=r"f\(\) missing 1 required positional"):
            jf(X, shift=1.0)
        with pytest.raises(TypeError, match=r"f\(\) missing 1 required keyword-only"):
            jf(X, 2.0)
        assert jf.cache_info() == es.CacheInfo(0, 0, None, 0)  # refused, not missed
        f.__defaults__, f.__kwdefaults__ = (3.0,), {"shift": 1.0}
        np.testing.assert_array_equal(jf(X), f(X))
        for change in ({"b": 3.0}, {"b": 4.0}, {"a": 1.0}):
            p.keywords.clear()
            p.keywords.update(change)
            for _ in range(3):
                np.testing.assert_array_equal(jp(X), p(X))


class _Settings(es.Module):
    """A module argument whose static field is changed in place between calls."""

    s: float = eqx.field(static=True)


_DEFAULTS = st.sampled_from([2.0, 3.0, 2, True, "array", "set"])
_CHANGES = st.lists(
    st.tuples(st.sampled_from(["a", "b in place", "b", "k", "module"]), _DEFAULTS),
    max_size=4,
)


def _value(v):
    """A fresh default: a Python value, an array (traced), or a set, which Python
    cannot hash (the function's own)."""
    return jnp.asarray(5.0) if v == "array" else {1.0, 2.0} if v == "set" else v


def _number(v):
    return _scale(len(v) if isinstance(v, set) else v)


def _check_defaults_changed_between_calls(where, changes, donate):
    def f(x, m, a=2.0, *, b=1.0):
        out = x * _number(a) + _number(b) * _scale(m.s)
        return out, *(v for v in (a, b) if not isinstance(v, set))

    def g(x, m, k):
        return x * _number(k) + _scale(m.s), *([] if isinstance(k, set) else [k])

    p, m, kw = functools.partial(g, k=2.0), _Settings(1.0), f.__kwdefaults__
    with path(where):
        fs = [(es.jit(f, donate=donate), f), (es.jit(p, donate=donate), p)]
        for what, v in [("a", 2.0), *changes]:
            if what == "a":
                f.__defaults__ = (_value(v),)
            elif what == "b in place":
                kw["b"] = _value(v)  # pyright: ignore[reportOptionalSubscript]
            elif what == "b":
                f.__kwdefaults__ = kw = {"b": _value(v)}
            elif what == "k":
                p.keywords["k"] = _value(v)
            else:
                object.__setattr__(m, "s", _value(v) if v in (2.0, 3.0) else 1.5)
            for jitted, eager in fs:
                for _ in range(2):
                    _same(jitted(jnp.ones(3), m), eager(jnp.ones(3), m))
                _same(jitted(jnp.ones(3), m), _filtered(eager, jnp.ones(3), m))


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@hypothesis.settings(max_examples=4, deadline=None)
@hypothesis.given(changes=_CHANGES, donate=st.sampled_from(["none", "all"]))
def test_defaults_changed_between_calls_are_seen_as_python_sees_them(
    where, changes, donate
):
    """Defaults (`__defaults__`, `__kwdefaults__` in place or replaced, a partial's
    keywords) and a module argument's static field, changed between calls: each
    call returns what the eager call and a fresh `eqx.filter_jit` return, values
    and leaf types (a Python default comes back a Python value), and a default
    left out survives `donate="all"`. (4 examples a path; 16 in the slow tier.)"""
    _check_defaults_changed_between_calls(where, changes, donate)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["dispatcher", "public"])
@hypothesis.settings(max_examples=16, deadline=None)
@hypothesis.given(changes=_CHANGES, donate=st.sampled_from(["none", "all"]))
def test_more_defaults_changed_between_calls_are_seen_as_python_sees_them(
    where, changes, donate
):
    """As above, with more examples."""
    _check_defaults_changed_between_calls(where, changes, donate)


@dataclasses.dataclass(frozen=True)
class _Scale:
    s: float


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("donate", ["none", "all"])
def test_a_default_without_arrays_is_keyed_by_value_whatever_donate(where, donate):
    """A default left out that holds no arrays is keyed by its value, with or
    without `donate`: changed in place (`object.__setattr__` on a frozen
    dataclass), it is another key."""
    default = _Scale(2.0)

    def f(x, c=default):
        return x * _scale(c.s)

    with path(where):
        jf = es.jit(f, donate=donate)
        for v in (2.0, 3.0):
            object.__setattr__(default, "s", v)
            for _ in range(3):
                np.testing.assert_array_equal(jf(jnp.ones(3)), f(jnp.ones(3)))
