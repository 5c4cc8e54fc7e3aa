"""`es.jit(depends_on=...)` (DESIGN §2.4, §3): relevance-aware compile keys.

Soundness comes first: whatever `depends_on` says, every result must equal what the
default `es.jit` returns and what eager evaluation returns. The adversarial tests
read static fields of `self` through every route that hides an attribute read
(`__dict__`, `vars`, `dataclasses.fields`, flattens, nested jitted functions whose
cache is already warm, `lax` control-flow bodies, properties) and flip each static
field in turn. Compile counts are checked exactly where the contract fixes them:
`cache_info().misses` and a trace counter in the body. Every class is defined inside
its test (or by a factory), so each test starts from empty caches.
"""

import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax import lax


X = jnp.array(0.75, jnp.float32)


def _assert_same(auto: Any, default: Any, eager: Any) -> None:
    """`auto` is bit-for-bit the default wrapper's result, and equals eager."""
    auto, default, eager = map(jnp.asarray, (auto, default, eager))
    assert auto.dtype == default.dtype == eager.dtype
    assert auto.shape == default.shape == eager.shape
    np.testing.assert_array_equal(auto, default)
    np.testing.assert_allclose(auto, eager, rtol=1e-6)


# --- 1. adversarial routes -------------------------------------------------------------
#
# Each route computes `_term(flag, k, x)` from the static fields `flag` and `k` of
# `m`, reading them only through that route; the static field `name` is never read.


def _term(flag: Any, k: Any, x: jax.Array) -> jax.Array:
    return x * (2.0 if flag else 3.0) + k


Term = Callable[[Any, jax.Array], jax.Array]


def _through_getitem(m, x):
    return _term(m.__dict__["flag"], m.__dict__["k"], x)


def _through_dict_get(m, x):
    return _term(m.__dict__.get("flag"), m.__dict__.get("k"), x)


def _through_setdefault(m, x):
    d = m.__dict__
    return _term(d.setdefault("flag", None), d.setdefault("k", None), x)


def _through_vars(m, x):
    return _term(vars(m)["flag"], vars(m)["k"], x)


def _through_copy_of_vars(m, x):
    d = {**vars(m)}
    return _term(d["flag"], d["k"], x)


def _through_items(m, x):
    d = {key: value for key, value in m.__dict__.items()}
    return _term(d["flag"], d["k"], x)


def _through_dataclasses_fields(m, x):
    d = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    return _term(d["flag"], d["k"], x)


def _through_unflatten(m, x):
    leaves, treedef = jtu.tree_flatten(m)
    copy = jtu.tree_unflatten(treedef, leaves)
    return _term(copy.flag, copy.k, x)


def _through_treedef(m, x):
    _, treedef = jtu.tree_flatten(m)
    cls, aux = treedef.node_data()  # pyright: ignore[reportGeneralTypeIssues]
    static = [f.name for f in dataclasses.fields(cls) if f.metadata.get("static")]
    values = dict(zip(static, aux[1:]))  # Equinox: (wrapper fields, *statics)
    return _term(values["flag"], values["k"], x)


def _through_partition(m, x):
    _, static = eqx.partition(m, eqx.is_array)
    return _term(static.flag, static.k, x)


def _read_by_attribute(m, x):
    return _term(m.flag, m.k, x)


_helper_traces = [0]


def _counted_read(m, x):
    _helper_traces[0] += 1
    return _term(m.flag, m.k, x)


_jax_jit_helper = jax.jit(_counted_read)
_filter_jit_helper = eqx.filter_jit(_counted_read)
_es_jit_helper = es.jit(_counted_read)
_es_jit_auto_helper = es.jit(_counted_read, depends_on="auto")


def _through_cond_closure(m, x):
    return lax.cond(
        x > 0, lambda y: _term(m.flag, m.k, y), lambda y: -_term(m.flag, m.k, y), x
    )


def _through_cond_operand(m, x):
    def branch(mm, y):
        return _term(mm.flag, mm.k, y)

    return lax.cond(x > 0, branch, branch, m, x)


def _through_scan(m, x):
    def step(carry, _):
        return _term(m.flag, m.k, carry), None

    return lax.scan(step, x, None, length=2)[0]


def _through_while_loop(m, x):
    def cond(c):
        return c[0] < (2 if m.flag else 1)

    def body(c):
        return c[0] + 1, _term(m.flag, m.k, c[1])

    return lax.while_loop(cond, body, (0, x))[1]


def _through_property(m, x):
    return _term(*m.prop, x)


def _through_cached_property(m, x):
    return _term(*m.cached, x)


def _route_class(term: Term, maxsize: int | None = None) -> Any:
    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)
        k: int = eqx.field(static=True)
        name: str = eqx.field(static=True)

        @property
        def prop(self) -> tuple[bool, int]:
            return self.flag, self.k

        @functools.cached_property
        def cached(self) -> tuple[bool, int]:
            return self.flag, self.k

        def eager(self, x):
            return self.w * term(self, x)

        @es.jit(depends_on="auto", maxsize=maxsize)
        def auto(self, x):
            return self.w * term(self, x)

        @es.jit
        def default(self, x):
            return self.w * term(self, x)

    return M


START: dict[str, Any] = {"flag": True, "k": 1, "name": "a"}
# Flip each static field in turn (and back), with a dynamic update in between.
STEPS: list[tuple[str, dict[str, Any]]] = [
    ("static", {"flag": False}),
    ("static", {"k": 2}),
    ("static", {"name": "b"}),
    ("static", {"flag": True}),
    ("dynamic", {"w": jnp.array(-0.5, jnp.float32)}),
    ("static", {"k": 1}),
    ("static", {"name": "a"}),
    ("static", {"flag": False}),
    ("static", {"k": 2, "name": "c"}),
]


def _configurations(cls: Any, fresh: bool) -> Iterator[Any]:
    """The module after each step: by `with_static`/`with_dynamic`, or (`fresh`)
    constructed anew from the accumulated field values."""
    fields: dict[str, Any] = {"w": jnp.array(1.5, jnp.float32), **START}
    m = cls(**fields)
    yield m
    for kind, change in STEPS:
        fields.update(change)
        if fresh:
            m = cls(**fields)
        elif kind == "static":
            m = m.with_static(**change)
        else:
            m = m.with_dynamic(**change)
        yield m


def _check_sequence(
    cls: Any,
    candidate: Callable[[Any, jax.Array], Any],
    fresh: bool = False,
    warm: Callable[[Any, jax.Array], Any] | None = None,
) -> None:
    modules = list(_configurations(cls, fresh))
    if warm is not None:  # the helper's own cache is warm for every configuration
        for m in modules:
            warm(m, X)
    helper_traces = _helper_traces[0]
    for i, m in enumerate(modules):
        if fresh and i % 2:
            _ = m.cached  # computed eagerly: the value now sits in the instance dict
        _assert_same(candidate(m, X), m.default(X), m.eager(X))
    if warm is not None:  # so the helper's body never ran inside an outer trace
        assert _helper_traces[0] == helper_traces


class Route(NamedTuple):
    term: Term
    fresh: bool = False
    warm: Callable[[Any, jax.Array], Any] | None = None


ROUTES = {
    "self.__dict__[name]": Route(_through_getitem),
    "self.__dict__.get": Route(_through_dict_get),
    "self.__dict__.setdefault": Route(_through_setdefault),
    "vars(self)[name]": Route(_through_vars),
    "{**vars(self)}": Route(_through_copy_of_vars),
    "self.__dict__.items()": Route(_through_items),
    "dataclasses.fields+getattr": Route(_through_dataclasses_fields),
    "tree_flatten+tree_unflatten": Route(_through_unflatten),
    "tree_flatten+treedef": Route(_through_treedef),
    "eqx.partition": Route(_through_partition),
    "warm jax.jit helper": Route(
        lambda m, x: _jax_jit_helper(m, x), warm=_jax_jit_helper
    ),
    "warm eqx.filter_jit helper": Route(
        lambda m, x: _filter_jit_helper(m, x), warm=_filter_jit_helper
    ),
    "warm es.jit helper": Route(lambda m, x: _es_jit_helper(m, x), warm=_es_jit_helper),
    "warm es.jit auto helper": Route(
        lambda m, x: _es_jit_auto_helper(m, x), warm=_es_jit_auto_helper
    ),
    "lax.cond closure": Route(_through_cond_closure),
    "lax.cond operand": Route(_through_cond_operand),
    "lax.scan body": Route(_through_scan),
    "lax.while_loop cond and body": Route(_through_while_loop),
    "property": Route(_through_property),
    # Fresh instances: `with_static` copies the instance dict, cached value included,
    # so the copy's cached value is stale even in eager code.
    "functools.cached_property": Route(_through_cached_property, fresh=True),
}


@pytest.mark.parametrize("route", ROUTES.values(), ids=ROUTES.keys())
def test_hidden_reads_never_give_stale_results(route):
    cls = _route_class(route.term)
    _check_sequence(cls, lambda m, x: m.auto(x), route.fresh, route.warm)


@pytest.mark.parametrize("route", ["property", "vars(self)[name]", "lax.scan body"])
def test_hidden_reads_with_maxsize(route):
    cls = _route_class(ROUTES[route].term, maxsize=2)
    _check_sequence(cls, lambda m, x: m.auto(x))


def test_the_harness_catches_a_stale_result():
    """The sequence does flip fields the term reads: a wrapper that keeps the first
    static configuration fails the comparison."""
    cls = _route_class(_read_by_attribute)
    first: list[Any] = []

    def stale(m: Any, x: jax.Array) -> Any:
        first[:] = first or [m]
        return es.with_dynamic(first[0], w=m.w).eager(x)

    with pytest.raises(AssertionError):
        _check_sequence(cls, stale)


def test_reads_only_through_a_module_in_a_dict():
    """A nested module held in a dict (a pytree that is not a list or a tuple) is
    watched like any other nested module."""

    class Inner(es.Module):
        s: jax.Array
        act: str = eqx.field(static=True)

    def body(self, x):
        inner = self.table["a"]
        return inner.s * (x if inner.act == "linear" else jnp.tanh(x))

    class M(es.Module):
        table: dict
        other: bool = eqx.field(static=True)
        auto = es.jit(body, depends_on="auto")
        default = es.jit(body)

    one = jnp.array(1.0, jnp.float32)
    for act, other in [("linear", False), ("tanh", False), ("tanh", True)]:
        m = M({"a": Inner(one, act), "b": 2.0}, other)
        _assert_same(m.auto(X), m.default(X), body(m, X))


def test_reads_through_a_namedtuple_of_lists_of_modules():
    class Inner(es.Module):
        s: jax.Array
        act: str = eqx.field(static=True)

    class Pair(NamedTuple):
        layers: list
        last: Any

    def body(self, x):
        for layer in [*self.pair.layers, self.pair.last]:
            x = layer.s * (x if layer.act == "linear" else jnp.tanh(x))
        return x

    class M(es.Module):
        pair: Pair
        auto = es.jit(body, depends_on="auto")
        default = es.jit(body)

    one = jnp.array(1.0, jnp.float32)
    lin, tanh = "linear", "tanh"
    for acts in [(lin, lin, lin), (tanh, lin, lin), (tanh, lin, tanh), (lin,) * 3]:
        *front, last = [Inner(one, a) for a in acts]
        m = M(Pair(front, last))
        _assert_same(m.auto(X), m.default(X), body(m, X))


@pytest.mark.parametrize("maxsize", [None, 4])
def test_a_read_that_depends_on_the_argument_shape(maxsize):
    """One entry, two argument shapes: the second shape's trace reads `b` under a
    configuration other than the one the entry was created for."""

    def body(self, y):
        return y * 10.0 if y.ndim == 1 and self.b else y * self.w

    class M(es.Module):
        w: jax.Array
        b: bool = eqx.field(static=True)
        auto = es.jit(body, depends_on="auto", maxsize=maxsize)
        default = es.jit(body)

    w = jnp.array(2.0, jnp.float32)
    scalar, vector = X, jnp.full(3, 0.75, jnp.float32)
    for b, y in [(False, scalar), (True, vector), (False, vector), (True, vector)]:
        m = M(w, b)
        _assert_same(m.auto(y), m.default(y), body(m, y))


def test_a_plain_function_whose_first_argument_is_not_always_a_module():
    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)

    def body(a, y):
        if isinstance(a, M):
            return y * a.w * (2.0 if a.flag else 3.0)
        return y * a

    auto, default = es.jit(body, depends_on="auto"), es.jit(body)
    w = jnp.array(2.0, jnp.float32)
    for a in [w, M(w, True), M(w, False), w]:
        _assert_same(auto(a, X), default(a, X), body(a, X))


def test_a_custom_vjp_backward_rule_reads_a_static_field():
    """The backward rule runs when the gradient is transposed, after the trace."""

    def body(self, x):
        @jax.custom_vjp
        def ident(x):
            return x

        def fwd(x):
            return x, None

        def bwd(_, ct):
            return (ct * (2.0 if self.flag else 3.0),)

        ident.defvjp(fwd, bwd)
        return ident(x) * self.w

    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)
        auto = es.jit(body, depends_on="auto")
        default = es.jit(body)

    for flag in [True, False, True]:
        m = M(jnp.array(1.0, jnp.float32), flag)
        _assert_same(
            jax.grad(M.auto, argnums=1)(m, X),
            jax.grad(M.default, argnums=1)(m, X),
            jax.grad(body, argnums=1)(m, X),
        )


def test_a_callback_reads_a_static_field_at_run_time():
    """`pure_callback` calls back into Python when the program runs; here only from a
    branch that the first call does not take."""

    def body(self, x):
        def callback():
            return np.float32(2.0 if self.flag else 3.0)

        shape = jax.ShapeDtypeStruct((), jnp.float32)
        return lax.cond(
            x > 0,
            lambda: jax.pure_callback(callback, shape),
            lambda: jnp.float32(0.0),
        )

    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)
        auto = es.jit(body, depends_on="auto")
        default = es.jit(body)

    for flag, x in [(True, -X), (False, X), (True, X)]:
        m = M(jnp.array(1.0, jnp.float32), flag)
        _assert_same(m.auto(x), m.default(x), body(m, x))


# --- 2. depends_on=(...) ---------------------------------------------------------------


def test_declared_fields_key_the_cache():
    traces = [0]

    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        unread: int = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def f(self, x):
            traces[0] += 1
            return self.w * x * (2.0 if self.sp else 3.0)

    m = M(jnp.array(2.0, jnp.float32), sp=False, unread=0)
    assert m.f(X) == 2.0 * 0.75 * 3.0
    assert (M.f.cache_info().misses, traces[0]) == (1, 1)
    m = m.with_static(unread=1)
    assert m.f(X) == 2.0 * 0.75 * 3.0
    assert (M.f.cache_info().misses, traces[0]) == (1, 1)
    m = m.with_static(sp=True)
    assert m.f(X) == 2.0 * 0.75 * 2.0
    assert (M.f.cache_info().misses, traces[0]) == (2, 2)
    m = m.with_static(unread=2)
    assert m.f(X) == 2.0 * 0.75 * 2.0
    assert M.f.cache_info() == es.CacheInfo(hits=2, misses=2, maxsize=None, currsize=2)
    assert traces[0] == 2


def test_undeclared_read_names_the_field_and_the_method():
    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        other: str = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def f(self, x):
            return self.w * x if self.other == "a" else x

    m = M(jnp.array(2.0, jnp.float32), sp=False, other="a")
    method = re.escape(f"{M.__qualname__}.f")
    for _ in range(2):  # a failed trace leaves nothing behind that answers later
        with pytest.raises(es.UndeclaredStaticRead, match=f"{method}.*'other'"):
            m.f(X)


def test_undeclared_read_through_a_bulk_route_raises():
    """`dict(vars(self))` reads every static field: one of them is undeclared."""

    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        other: str = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def f(self, x):
            return self.w * x if dict(vars(self))["sp"] else x

    with pytest.raises(es.UndeclaredStaticRead, match="'other'"):
        M(jnp.array(2.0, jnp.float32), sp=False, other="a").f(X)


def test_dotted_paths_into_nested_modules():
    traces = [0]

    class Encoder(es.Module):
        s: jax.Array
        act: str = eqx.field(static=True)
        unread: int = eqx.field(static=True)

    class M(es.Module):
        enc: Encoder
        layers: list
        sp: bool = eqx.field(static=True)

        @es.jit(depends_on=("sp", "enc.act", "layers.1.act"))
        def f(self, x):
            traces[0] += 1
            y = self.enc.s * (x if self.enc.act == "linear" else jnp.tanh(x))
            y = y if self.layers[1].act == "linear" else -y
            return y * 2.0 if self.sp else y

        @es.jit(depends_on=("sp", "enc.act"))
        def g(self, x):
            return x if self.enc.unread else -x

    one = jnp.array(1.0, jnp.float32)

    def make(act: str, unread: int, act1: str, layer0_unread: int) -> M:
        enc = Encoder(one, act, unread)
        layers = [Encoder(one, "linear", layer0_unread), Encoder(one, act1, 0)]
        return M(enc, layers, False)

    def eager(act: str, act1: str) -> jax.Array:
        y = X if act == "linear" else jnp.tanh(X)
        return y if act1 == "linear" else -y

    steps = [  # (act, enc.unread, layers.1.act, layers.0.unread, new compiles)
        ("linear", 0, "linear", 0, 1),
        ("linear", 1, "linear", 0, 0),
        ("linear", 1, "linear", 5, 0),
        ("tanh", 1, "linear", 5, 1),
        ("tanh", 1, "negate", 5, 1),
        ("linear", 0, "linear", 0, 0),
    ]
    for act, unread, act1, layer0_unread, compiles in steps:
        before = M.f.cache_info().misses
        np.testing.assert_allclose(
            make(act, unread, act1, layer0_unread).f(X), eager(act, act1), rtol=1e-6
        )
        assert M.f.cache_info().misses - before == compiles
    assert traces[0] == M.f.cache_info().misses == 3
    with pytest.raises(es.UndeclaredStaticRead, match=r"'enc\.unread'"):
        make("linear", 0, "linear", 0).g(X)


def test_a_module_in_a_dict_is_watched_under_declared_fields():
    class Inner(es.Module):
        s: jax.Array
        act: str = eqx.field(static=True)

    class M(es.Module):
        table: dict
        sp: bool = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def f(self, x):
            return x if self.table["a"].act == "linear" else -x

    m = M({"a": Inner(jnp.array(1.0, jnp.float32), "linear")}, sp=False)
    with pytest.raises(es.UndeclaredStaticRead, match="act"):
        m.f(X)


def test_calling_a_plain_method_of_self_reads_no_static_field():
    """`self.g` builds an Equinox `BoundMethod`, whose construction walks the leaves
    of `self`; that walk is not a read of the static fields."""
    traces = [0]

    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        other: int = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def declared(self, x):
            return self.g(x) * 2.0 if self.sp else self.g(x)

        @es.jit(depends_on="auto")
        def auto(self, x):
            traces[0] += 1
            return self.g(x) * 2.0 if self.sp else self.g(x)

        def g(self, x):
            return self.w * x

    m = M(jnp.array(2.0, jnp.float32), sp=True, other=0)
    assert m.declared(X) == m.auto(X) == 2.0 * 0.75 * 2.0
    assert m.with_static(other=1).declared(X) == m.with_static(other=1).auto(X)
    assert traces[0] == M.auto.cache_info().misses == 1
    assert m.with_static(sp=False).auto(X) == 2.0 * 0.75
    assert traces[0] == 2


def test_reading_a_plain_method_that_reads_a_static_field_is_observed():
    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        other: int = eqx.field(static=True)

        @es.jit(depends_on=("sp",))
        def declared(self, x):
            return self.g(x)

        @es.jit(depends_on="auto")
        def auto(self, x):
            return self.g(x)

        def g(self, x):
            return self.w * x + self.other

    with pytest.raises(es.UndeclaredStaticRead, match="'other'"):
        M(jnp.array(2.0, jnp.float32), sp=True, other=0).declared(X)
    for other in [0, 1, 0, 2]:
        assert M(jnp.array(2.0, jnp.float32), True, other).auto(X) == 1.5 + other


# --- 3. compile counts with "auto" -----------------------------------------------------


def _counted_class(maxsize: int | None = None) -> tuple[Any, list[int]]:
    traces = [0]

    class M(es.Module):
        w: jax.Array
        mode: str = eqx.field(static=True)
        k: int = eqx.field(static=True)
        other: bool = eqx.field(static=True)

        @es.jit(depends_on="auto", maxsize=maxsize)
        def f(self, x):
            traces[0] += 1
            if self.mode == "scaled":  # `k` is read only in this mode
                return self.w * x * self.k
            return self.w * x

    return M, traces


def _expected(m: Any) -> jax.Array:
    return m.w * X * (m.k if m.mode == "scaled" else 1)


def test_flipping_an_unread_field_compiles_nothing():
    cls, traces = _counted_class()
    m = cls(jnp.array(2.0, jnp.float32), mode="plain", k=1, other=False)
    np.testing.assert_allclose(m.f(X), _expected(m))
    assert cls.f.cache_info() == es.CacheInfo(
        hits=0, misses=1, maxsize=None, currsize=1
    )
    for change in [{"other": True}, {"k": 2}, {"other": False, "k": 3}]:
        m = m.with_static(**change)
        np.testing.assert_allclose(m.f(X), _expected(m))
        assert cls.f.cache_info().misses == traces[0] == 1
    assert cls.f.cache_info() == es.CacheInfo(
        hits=3, misses=1, maxsize=None, currsize=1
    )
    m = m.with_dynamic(w=jnp.array(-1.0, jnp.float32))
    np.testing.assert_allclose(m.f(X), _expected(m))
    assert cls.f.cache_info() == es.CacheInfo(
        hits=4, misses=1, maxsize=None, currsize=1
    )


def test_flipping_a_read_field_compiles_once():
    cls, traces = _counted_class()
    m = cls(jnp.array(2.0, jnp.float32), mode="plain", k=1, other=False)
    m.f(X)
    m = m.with_static(mode="other-plain")
    np.testing.assert_allclose(m.f(X), _expected(m))
    assert cls.f.cache_info().misses == traces[0] == 2
    m.f(X)
    assert cls.f.cache_info() == es.CacheInfo(
        hits=1, misses=2, maxsize=None, currsize=2
    )


@pytest.mark.parametrize("maxsize", [None, 8])
def test_a_field_read_only_in_some_branches_is_learned(maxsize):
    cls, traces = _counted_class(maxsize)
    m = cls(jnp.array(2.0, jnp.float32), mode="plain", k=1, other=False)
    calls = 0

    def call(m: Any, compiles: int | None) -> None:
        nonlocal calls
        before = traces[0]
        np.testing.assert_allclose(m.f(X), _expected(m))
        calls += 1
        if compiles is not None:
            assert traces[0] - before == compiles
        info = cls.f.cache_info()
        assert info.misses == traces[0] and info.hits + info.misses == calls

    call(m, 1)
    call(m := m.with_static(k=2), 0)  # k unread so far
    call(m := m.with_static(mode="scaled"), 1)  # this trace reads k
    call(m := m.with_static(k=3), 1)  # now k is relevant
    call(m := m.with_static(other=True), 0)
    call(m := m.with_static(k=2), None)
    call(m.with_static(k=3), 0)
    call(m := m.with_static(mode="plain"), None)
    for k in [1, 2, 3, 2]:  # k is relevant for the class now; results stay right
        call(m := m.with_static(k=k), None)
    for k in [1, 3]:
        call(m.with_static(mode="scaled", k=k), None)


def test_learned_set_is_per_class():
    class Base(es.Module):
        w: jax.Array
        a: bool = eqx.field(static=True)
        b: bool = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def f(self, x):
            return self.w * self.h(x)

        def h(self, x):
            return x * 2.0 if self.a else x

    class Sub(Base):
        def h(self, x):
            return x * 2.0 if self.b else x

    w = jnp.array(1.0, jnp.float32)
    for a, b in [(False, False), (True, False), (True, True), (False, True)]:
        assert Base(w, a, b).f(X) == X * (2.0 if a else 1.0)
        assert Sub(w, a, b).f(X) == X * (2.0 if b else 1.0)
    assert Base.f.cache_info().misses == 4  # Base: a = F, T; Sub: b = F, T


def test_static_values_keep_their_types():
    class M(es.Module):
        w: jax.Array
        k: Any = eqx.field(static=True)
        other: int = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def f(self, x):
            return self.w * x, jnp.asarray(self.k)

        @es.jit
        def g(self, x):
            return self.w * x, jnp.asarray(self.k)

    for k in [1, True, 1.0, 1, True]:
        m = M(jnp.array(1.0, jnp.float32), k, 0)
        (a, ka), (b, kb) = m.f(X), m.g(X)
        assert ka.dtype == kb.dtype and ka == kb and a == b
    assert M.f.cache_info().misses == 3


# --- 4. explanations -------------------------------------------------------------------


def test_avoided_compile_is_explained_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="eqx_static")
    cls, traces = _counted_class()
    m = cls(jnp.array(2.0, jnp.float32), mode="plain", k=1, other=False)
    m.f(X)
    caplog.clear()
    m.with_static(other=True).f(X)
    records = [r for r in caplog.records if r.name == "eqx_static"]
    assert len(records) == 1
    (r,) = records
    assert r.levelno == logging.DEBUG
    assert "no compile" in r.getMessage()
    assert "'other'" in r.getMessage() and "False -> True" in r.getMessage()
    assert f"{cls.__qualname__}.f" in r.getMessage()
    caplog.clear()
    m.with_static(mode="other-plain").f(X)
    records = [r for r in caplog.records if r.name == "eqx_static"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert "compiling" in records[0].getMessage()
    assert "'mode'" in records[0].getMessage()
    assert cls.f.cache_info() == es.CacheInfo(
        hits=1, misses=2, maxsize=None, currsize=2
    )
    assert traces[0] == 2


def test_avoided_compile_is_silent_at_info(caplog):
    caplog.set_level(logging.INFO, logger="eqx_static")
    cls, _ = _counted_class()
    m = cls(jnp.array(2.0, jnp.float32), mode="plain", k=1, other=False)
    m.f(X)
    m.with_static(other=True).f(X)
    assert [r for r in caplog.records if r.name == "eqx_static"] == []


# --- 5. random classes, random reads, random updates -----------------------------------


def _by_attribute(m: Any, name: str) -> Any:
    return getattr(m, name)


def _by_vars(m: Any, name: str) -> Any:
    return vars(m)[name]


def _by_dict_get(m: Any, name: str) -> Any:
    return m.__dict__.get(name)


def _by_fields(m: Any, name: str) -> Any:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}[name]


def _by_property(m: Any, name: str) -> Any:
    return getattr(m, "p_" + name)


def _by_setdefault(m: Any, name: str) -> Any:
    return m.__dict__.setdefault(name, None)


def _by_unflatten(m: Any, name: str) -> Any:
    return getattr(jtu.tree_unflatten(*reversed(jtu.tree_flatten(m))), name)


def _by_partition(m: Any, name: str) -> Any:
    return getattr(eqx.partition(m, eqx.is_array)[1], name)


READERS: dict[str, Callable[[Any, str], Any]] = {
    "attribute": _by_attribute,
    "vars": _by_vars,
    "dict_get": _by_dict_get,
    "setdefault": _by_setdefault,
    "fields": _by_fields,
    "property": _by_property,
    "unflatten": _by_unflatten,
    "partition": _by_partition,
}


class Guard(NamedTuple):
    """The step runs if the field (read by `reader`) equals `value`; for the field
    `"ndim"`, if the argument has that many dimensions."""

    field: str
    reader: str
    value: Any


class Step(NamedTuple):
    """`acc <- acc / 2 + coef * (field + 1)`, if the guard holds; in a `lax.cond`
    body if `in_cond`."""

    field: str
    reader: str
    guard: Guard | None
    in_cond: bool
    coef: float


def _apply(step: Step, m: Any, acc: jax.Array) -> jax.Array:
    g = step.guard
    if g is not None and g.field == "ndim" and acc.ndim != g.value:
        return acc
    if g is not None and g.field != "ndim" and READERS[g.reader](m, g.field) != g.value:
        return acc
    value = READERS[step.reader](m, step.field)
    return acc * 0.5 + step.coef * (float(value) + 1.0)


def _run(steps: tuple[Step, ...], dynamic: tuple[str, ...], m: Any, x: jax.Array):
    acc = x * getattr(m, dynamic[0])
    for step in steps:
        if step.in_cond:
            acc = lax.cond(
                jnp.all(x > 0), functools.partial(_apply, step, m), lambda a: -a, acc
            )
        else:
            acc = _apply(step, m, acc)
    return acc + getattr(m, dynamic[-1])


def _drawn_class(
    statics: tuple[str, ...],
    dynamic: tuple[str, ...],
    steps: tuple[Step, ...],
    maxsize: int | None,
) -> Any:
    def body(self, x):
        return _run(steps, dynamic, self, x)

    ns: dict[str, Any] = {"__module__": __name__, "__qualname__": "Drawn"}
    ns["__annotations__"] = {**{d: float for d in dynamic}, **{s: Any for s in statics}}
    ns.update({s: eqx.field(static=True) for s in statics})
    ns.update(
        {f"p_{s}": property(functools.partial(_by_attribute, name=s)) for s in statics}
    )
    ns["eager"] = body
    ns["auto"] = es.jit(body, depends_on="auto", maxsize=maxsize)
    ns["default"] = es.jit(body)
    return type("Drawn", (es.Module,), ns)


STATIC_VALUES = st.sampled_from([False, True, 0, 1, 2])
DYNAMIC_VALUES = st.sampled_from([0.5, 1.5, -2.0, 3.0])


@st.composite
def _steps(draw: Any, statics: tuple[str, ...]) -> tuple[Step, ...]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        guard = None
        if draw(st.booleans()):
            guard = Guard(
                draw(st.sampled_from([*statics, "ndim"])),
                draw(st.sampled_from(list(READERS))),
                draw(STATIC_VALUES),
            )
        field = draw(st.sampled_from(statics))
        reader = draw(st.sampled_from(list(READERS)))
        out.append(Step(field, reader, guard, draw(st.booleans()), 2.0 ** (i - 1)))
    return tuple(out)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(data=st.data())
def test_random_classes_reads_and_updates(data):
    statics = tuple(f"s{i}" for i in range(data.draw(st.integers(1, 4))))
    dynamic = tuple(f"d{i}" for i in range(data.draw(st.integers(1, 2))))
    steps = data.draw(_steps(statics))
    cls = _drawn_class(statics, dynamic, steps, data.draw(st.sampled_from([None, 2])))
    m = cls(
        **{d: data.draw(DYNAMIC_VALUES) for d in dynamic},
        **{s: data.draw(STATIC_VALUES) for s in statics},
    )
    arguments = st.sampled_from(
        [jnp.array(1.25, jnp.float32), jnp.array([1.25, 0.5], jnp.float32)]
    )
    x = data.draw(arguments)
    _assert_same(m.auto(x), m.default(x), m.eager(x))
    for _ in range(data.draw(st.integers(1, 8))):
        update = data.draw(st.sampled_from(["static", "dynamic", "argument"]))
        if update == "static":
            m = m.with_static(
                **{data.draw(st.sampled_from(statics)): data.draw(STATIC_VALUES)}
            )
        elif update == "dynamic":
            m = m.with_dynamic(
                **{data.draw(st.sampled_from(dynamic)): data.draw(DYNAMIC_VALUES)}
            )
        else:
            x = data.draw(arguments)
        _assert_same(m.auto(x), m.default(x), m.eager(x))
    info = cls.auto.cache_info()
    assert (
        info.hits + info.misses
        == cls.default.cache_info().hits + cls.default.cache_info().misses
    )


# --- 6. invalid depends_on -------------------------------------------------------------


@pytest.mark.parametrize(
    "depends_on",
    ["sp", "", "AUTO", ("sp", 1), (1,), 1, True, {"sp"}, ("sp", None)],
    ids=repr,
)
def test_invalid_depends_on(depends_on):
    with pytest.raises(ValueError, match="depends_on"):
        es.jit(lambda self, x: x, depends_on=depends_on)
    with pytest.raises(ValueError, match="depends_on"):
        es.jit(depends_on=depends_on)(lambda self, x: x)


@pytest.mark.parametrize(
    ("paths", "phrase"),
    [(("flg",), r"naming 'flg'.*Did you mean 'flag'\?"), (("w",), r"naming 'w'")],
)
def test_depends_on_paths_must_name_static_fields(paths, phrase):
    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)

        @es.jit(depends_on=paths)
        def f(self, x):
            return x * self.w

    with pytest.raises(ValueError, match=phrase):
        M(jnp.ones(()), True).f(jnp.ones(()))


def test_entries_keyed_on_an_older_learned_set_stay_valid():
    """Learning a field that only one branch reads costs no recompile of the
    configurations compiled before, which never read it."""
    traces = [0]

    class M(es.Module):
        w: jax.Array
        sp: bool = eqx.field(static=True)
        sq: bool = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def f(self, x):
            traces[0] += 1
            if self.sp:
                return x * self.w * (2.0 if self.sq else 3.0)
            return x * self.w

    def eager(m):
        return float(m.w) * ((2.0 if m.sq else 3.0) if m.sp else 1.0)

    m = M(jnp.array(1.5, jnp.float32), False, False)
    steps = [m, m.with_static(sp=True), m, m.with_static(sq=True), m]
    counts = []
    for s in steps:
        np.testing.assert_allclose(float(s.f(X)), eager(s) * float(X))
        counts.append(traces[0])
    # sp=False compiles once (reads only sp); sp=True compiles and learns sq;
    # sp=False again, and with sq flipped, reuse the first entry.
    assert counts == [1, 2, 2, 2, 2]
    assert M.f.cache_info().misses == 2
