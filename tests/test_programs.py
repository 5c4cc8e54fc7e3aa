"""One XLA compile per distinct program, sound by construction.

A new compile key is traced and lowered; it compiles only if its program is not
provably the same as one this function compiled. Every test here uses a plain
`@es.jit`, compares every static configuration with the eager call and with
`eqx.filter_jit` (value, dtype, shape), and counts XLA compiles twice: with the
library's `compile_info()` and with JAX's own monitoring events (`XlaCompiles`).
"""

import dataclasses
import functools
import gc
import inspect
import json
import operator
import random
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from eqx_static import _jax
from helpers import output, run_python, shared, XlaCompiles
from jax import lax


X = jnp.array(0.75, jnp.float32)


def _assert_same(compiled: Any, eager: Any, filtered: Any) -> None:
    compiled, eager, filtered = map(jnp.asarray, (compiled, eager, filtered))
    assert compiled.dtype == eager.dtype == filtered.dtype
    assert compiled.shape == eager.shape == filtered.shape
    np.testing.assert_allclose(compiled, eager, rtol=1e-6)
    np.testing.assert_array_equal(compiled, filtered)


# --- every read route gives the eager result ------------------------------------------
#
# Each route computes `_term(flag, k, x)` from the static fields `flag` and `k` of
# `m`, reading them only through that route; the static field `name` is never read.
# The sequence flips each field in turn, so a result served from a stale program
# would differ from the eager one.


def _term(flag: Any, k: Any, x: jax.Array) -> jax.Array:
    return x * (2.0 if flag else 3.0) + k


Term = Callable[[Any, jax.Array], jax.Array]


class _Sneaky:
    """A mixin with its own `__getattribute__`, which reads fields its own way."""

    def __getattribute__(self, name: str) -> Any:
        if name == "sneaky":
            d = object.__getattribute__(self, "__dict__")
            return d["flag"], d["k"]
        return super().__getattribute__(name)


def _custom_jvp_term(m: Any, x: jax.Array) -> jax.Array:
    @jax.custom_jvp
    def f(y):
        return _term(m.flag, m.k, y)

    @f.defjvp
    def f_jvp(primals, tangents):  # the rule reads the static fields again
        (y,), (t,) = primals, tangents
        return f(y), t * (2.0 if m.flag else 3.0) * m.k

    return f(x)


def _custom_vjp_term(m: Any, x: jax.Array) -> jax.Array:
    @jax.custom_vjp
    def f(y):
        return _term(m.flag, m.k, y)

    def fwd(y):
        return f(y), None

    def bwd(_, t):  # runs after the trace, under `grad`
        return (t * (2.0 if m.flag else 3.0) * m.k,)

    f.defvjp(fwd, bwd)
    return f(x)


def _pure_callback_term(m: Any, x: jax.Array) -> jax.Array:
    def host(y):  # runs while the program runs, reading the static fields then
        return np.asarray(_term(m.flag, m.k, np.asarray(y)), dtype=np.float32)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), x)


_jax_jit_helper = jax.jit(lambda m, x: _term(m.flag, m.k, x))
_filter_jit_helper = eqx.filter_jit(lambda m, x: _term(m.flag, m.k, x))
_es_jit_helper = es.jit(lambda m, x: _term(m.flag, m.k, x))


class Route(NamedTuple):
    term: Term
    grad: bool = False  # also compare `jax.grad`, and `vmap(grad)`, of the method
    jvp: bool = False  # and `jax.jvp`
    programs: int = 4  # one per `flag, k`; `name` is never read
    slow: bool = False  # the heaviest: `pytest -m slow` runs them


ROUTES: dict[str, Route] = {
    "attribute": Route(lambda m, x: _term(m.flag, m.k, x)),
    "object.__getattribute__": Route(
        lambda m, x: _term(
            object.__getattribute__(m, "flag"), object.__getattribute__(m, "k"), x
        )
    ),
    "inspect.getattr_static": Route(
        lambda m, x: _term(
            inspect.getattr_static(m, "flag"), inspect.getattr_static(m, "k"), x
        )
    ),
    "eval over vars(self)": Route(
        lambda m, x: _term(eval("flag", vars(m)), eval("k", vars(m)), x)
    ),
    "a mixin's own __getattribute__": Route(lambda m, x: _term(*m.sneaky, x)),
    "self.__dict__": Route(lambda m, x: _term(m.__dict__["flag"], m.__dict__["k"], x)),
    "dataclasses.fields": Route(
        lambda m, x: _term(*[getattr(m, f.name) for f in dataclasses.fields(m)][1:3], x)
    ),
    "tree_flatten and unflatten": Route(
        lambda m, x: (lambda c: _term(c.flag, c.k, x))(
            jtu.tree_unflatten(*reversed(jtu.tree_flatten(m)))
        )
    ),
    "eqx.partition": Route(
        lambda m, x: (lambda s: _term(s.flag, s.k, x))(
            eqx.partition(m, eqx.is_array)[1]
        )
    ),
    "property": Route(lambda m, x: _term(*m.prop, x)),
    "lax.cond closure": Route(
        lambda m, x: lax.cond(
            x > 0, lambda y: _term(m.flag, m.k, y), lambda y: -_term(m.flag, m.k, y), x
        ),
        slow=True,
    ),
    "lax.scan body": Route(
        lambda m, x: lax.scan(
            lambda c, _: (_term(m.flag, m.k, c), None), x, None, length=2
        )[0],
        slow=True,
    ),
    "warm jax.jit helper": Route(lambda m, x: _jax_jit_helper(m, x), slow=True),
    "warm eqx.filter_jit helper": Route(
        lambda m, x: _filter_jit_helper(m, x), slow=True
    ),
    "warm es.jit helper": Route(lambda m, x: _es_jit_helper(m, x)),
    "custom_jvp rule under grad": Route(
        _custom_jvp_term, grad=True, jvp=True, slow=True
    ),
    "custom_jvp rule inside lax.cond under grad": Route(
        lambda m, x: lax.cond(x > 0, lambda y: _custom_jvp_term(m, y), jnp.negative, x),
        grad=True,
        jvp=True,
        slow=True,
    ),
    "custom_vjp backward rule": Route(_custom_vjp_term, grad=True, slow=True),
    # The callback of each key closes over its own module: never the same program.
    "pure_callback": Route(_pure_callback_term, programs=7),
}


def _route_class(term: Term) -> Any:
    class M(_Sneaky, es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)
        k: int = eqx.field(static=True)
        name: str = eqx.field(static=True)

        @property
        def prop(self) -> tuple[bool, int]:
            return self.flag, self.k

        def eager(self, x):
            return self.w * term(self, x)

        @es.jit
        def compiled(self, x):
            return self.w * term(self, x)

    return M


START: dict[str, Any] = {"flag": True, "k": 1, "name": "a"}
# Flip each static field in turn (and back), with a dynamic update in between.
STEPS: list[dict[str, Any]] = [
    {"flag": False},
    {"k": 2},
    {"name": "b"},
    {"flag": True},
    {"w": jnp.array(-0.5, jnp.float32)},
    {"k": 1},
    {"name": "a"},
    {"flag": False},
    {"k": 2, "name": "c"},
]


def _configurations(cls: Any) -> Iterator[Any]:
    fields: dict[str, Any] = {"w": jnp.array(1.5, jnp.float32), **START}
    yield cls(**fields)
    for change in STEPS:
        fields.update(change)
        yield cls(**fields)


@pytest.mark.parametrize(
    "route",
    [
        pytest.param(r, id=name, marks=[pytest.mark.slow] if r.slow else [])
        for name, r in ROUTES.items()
    ],
)
def test_every_read_route_gives_the_eager_result(route):
    cls = _route_class(route.term)
    modules = list(_configurations(cls))
    filtered = eqx.filter_jit(cls.eager)
    for m in modules:
        _assert_same(m.compiled(X), m.eager(X), filtered(m, X))
        if route.grad:
            _assert_same(
                jax.grad(m.compiled)(X),
                jax.grad(m.eager)(X),
                jax.grad(lambda x, m=m: filtered(m, x))(X),
            )
            xs = jnp.stack([X, 2 * X])
            _assert_same(
                jax.vmap(jax.grad(m.compiled))(xs),
                jax.vmap(jax.grad(m.eager))(xs),
                jax.vmap(jax.grad(lambda x, m=m: filtered(m, x)))(xs),
            )
        if route.jvp:
            _assert_same(
                jax.jvp(m.compiled, (X,), (X,))[1],
                jax.jvp(m.eager, (X,), (X,))[1],
                jax.jvp(lambda x, m=m: filtered(m, x), (X,), (X,))[1],
            )
    # Keys whose programs are the same (`name` flipped) cost a trace, not a compile.
    keys = {(m.flag, m.k, m.name) for m in modules}
    assert len(keys) == 7
    # The programs run at top level; an eager `grad`, `vmap` or `jvp` compiles its
    # transformed program in the call too (booked, but not one of these).
    programs = shared(route.programs, len(keys))
    assert cls.compiled.compile_info().programs == programs
    if not route.grad:
        assert cls.compiled.compile_info().compiles == programs
        assert cls.compiled.cache_info().misses == len(keys)


def test_the_routes_flip_what_they_read():
    """The sequence does change the program: a wrapper that kept the first
    configuration's program would fail `_assert_same`."""
    cls = _route_class(ROUTES["attribute"].term)
    first, *rest = _configurations(cls)
    stale = first.eager(X)
    assert any(not np.allclose(m.eager(X), stale) for m in rest)


@pytest.mark.sharing
def test_a_read_field_compiles_and_an_unread_one_does_not():
    """The 4 distinct programs of the sequence (one per `flag, k`) compile exactly
    once each; the 3 other keys (`name` flipped) reuse them."""
    cls = _route_class(ROUTES["attribute"].term)
    modules = list(_configurations(cls))
    eager = [m.eager(X) for m in modules]  # before counting: eager code compiles
    compiles = XlaCompiles()
    results = [m.compiled(X) for m in modules]
    assert compiles.count == cls.compiled.compile_info().compiles == 4
    assert len({(m.flag, m.k) for m in modules}) == 4
    for got, want in zip(results, eager):
        np.testing.assert_allclose(got, want)
    assert cls.compiled.compile_info().programs == 4
    assert cls.compiled.cache_info().misses == 7


def test_threads_racing_over_configurations_get_eager_results():
    """Four threads call random configurations and shapes: every result is the
    eager one, every call is booked once, and each program compiles once."""
    cls = _route_class(ROUTES["object.__getattribute__"].term)
    configs = [(f, k, n) for f in (True, False) for k in (1, 2) for n in "ab"]
    inputs = {s: jnp.full(s, 0.5, jnp.float32) for s in ((), (2,), (3,))}
    wrong: list[Any] = []
    seen: set = set()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            flag, k, name = rng.choice(configs)
            m = cls(w=jnp.float32(1.5), flag=flag, k=k, name=name)
            shape = rng.choice(list(inputs))
            x = inputs[shape]
            seen.add((flag, k, name, shape))
            if not np.allclose(m.compiled(x), m.eager(x)):
                wrong.append((flag, k, name))

    compiles = XlaCompiles()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    info = cls.compiled.cache_info()
    assert info.hits + info.misses == 600
    programs = shared(len({c[:2] + c[3:] for c in seen}), len(seen))  # `name`: unread
    assert cls.compiled.compile_info().compiles == programs
    assert compiles.count >= programs  # `jnp.float32(1.5)` compiles eagerly too


# --- real network code: unread flips compile nothing --------------------------------


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
    "eqx.error_if": lambda s, x: eqx.error_if(s.w * x, (s.w * x) > 1e6, "too big"),
}
XS = jnp.array([0.5, -1.0, 2.0])


def _network(op: Callable[[Any, jax.Array], jax.Array]) -> tuple[type, list[int]]:
    traces = [0]

    class Net(es.Module):
        w: jax.Array
        unread: int = eqx.field(static=True)
        sign: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            return self.sign * op(self, x)

        def eager(self, x):
            return self.sign * op(self, x)

        @es.jit
        def helper(self, x):
            return jax.nn.relu(self.w * x)

    return Net, traces


@pytest.mark.sharing
@pytest.mark.parametrize("name", sorted(OPS))
def test_ten_unread_flips_compile_nothing(name):
    net, traces = _network(OPS[name])
    m = net(w=jnp.array([1.0, 2.0, 3.0]), unread=0, sign=1)
    filtered = eqx.filter_jit(net.eager)
    flips = [m.with_static(unread=i) for i in range(1, 11)]
    _assert_same(m(XS), m.eager(XS), filtered(m, XS))
    eager = [mi.eager(XS) for mi in flips]  # before counting: eager code compiles
    compiles = XlaCompiles()
    results = [mi(XS) for mi in flips]
    assert compiles.count == 0
    for got, want in zip(results, eager):
        _assert_same(got, want, m(XS))
    assert traces[0] == 11 and net.__call__.cache_info().misses == 11
    assert net.__call__.compile_info().compiles == 1
    flipped = m.with_static(sign=-1)  # a field the program uses: one compile
    want, want_filtered = flipped.eager(XS), filtered(flipped, XS)
    compiles = XlaCompiles()
    _assert_same(flipped(XS), want, want_filtered)
    assert compiles.count == 1 and net.__call__.compile_info().compiles == 2


def _branchy() -> tuple[type, list[int]]:
    traces = [0]

    class Branchy(es.Module):
        w: jax.Array
        mode: int = eqx.field(static=True)
        a: int = eqx.field(static=True)
        b: int = eqx.field(static=True)

        @es.jit
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


@pytest.mark.sharing
@pytest.mark.parametrize(
    "seed",
    [
        0,
        pytest.param(1, marks=pytest.mark.slow),
        pytest.param(2, marks=pytest.mark.slow),
    ],
)
def test_branch_stress_compiles_once_per_distinct_program(seed):
    """Mode 0 uses `a`, mode 1 uses `b`, mode 2 neither: 3 + 3 + 1 = 7 programs
    among 27 configurations, whatever the order of the calls."""
    configs = [(mode, a, b) for mode in range(3) for a in range(3) for b in range(3)]
    cls, traces = _branchy()
    order = configs * 2
    random.Random(seed).shuffle(order)
    modules = [cls(w=jnp.ones(3), mode=mode, a=a, b=b) for mode, a, b in order]
    eager = [m.eager(XS) for m in modules]  # before counting: eager code compiles
    compiles = XlaCompiles()
    results = [m(XS) for m in modules]
    assert compiles.count == 7
    for got, want in zip(results, eager):
        np.testing.assert_allclose(got, want)
    assert cls.__call__.compile_info().compiles == 7
    assert traces[0] == 27 == cls.__call__.cache_info().misses


# --- what "provably the same" takes ---------------------------------------------------


def test_a_callback_made_in_each_trace_is_never_shared():
    """The module text of the programs is the same; the Python function each
    callback calls is a new object each trace (a lambda over `k`): shared only if
    identical, so three keys compile three times, each with its own `k`."""

    class M(es.Module):
        k: float = eqx.field(static=True)
        name: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            k = self.k
            return jax.pure_callback(
                lambda y: (np.asarray(y) * k).astype(np.float32),
                jax.ShapeDtypeStruct((), jnp.float32),
                x,
            )

    x = jnp.float32(2.0)
    compiles = XlaCompiles()
    results = [M(3.0, "a").f(x), M(5.0, "a").f(x), M(3.0, "b").f(x)]
    assert compiles.count == M.f.compile_info().compiles == 3
    assert [float(r) for r in results] == [6.0, 10.0, 6.0]


def test_a_debug_callback_over_a_static_that_differs_is_never_shared():
    seen: list[tuple[float, float]] = []

    class M(es.Module):
        k: float = eqx.field(static=True)

        @es.jit
        def f(self, x):
            k = self.k
            jax.debug.callback(lambda y: seen.append((float(y), k)), x)
            return x

    x = jnp.float32(2.0)
    compiles = XlaCompiles()
    M(3.0).f(x)
    M(5.0).f(x)
    assert compiles.count == M.f.compile_info().compiles == 2
    jax.effects_barrier()
    assert seen == [(2.0, 3.0), (2.0, 5.0)]


def test_a_callback_that_captures_a_list_is_shared_only_with_itself():
    """What a callback captures may change after the trace: two equal lists are
    two lists, and appending to one must not append to the other."""
    logs = {"a": [], "b": []}

    class M(es.Module):
        log: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            log = logs[self.log]
            jax.debug.callback(lambda y: log.append(float(y)), x)
            return x

    x = jnp.float32(1.0)
    M("a").f(x)
    M("b").f(x)
    jax.effects_barrier()
    assert logs == {"a": [1.0], "b": [1.0]}
    assert M.f.compile_info().compiles == 2


def _callback_class(compute: Callable[[Any, Any], Any]) -> Any:
    """A module whose program calls back into Python with `compute(self.cfg, y)`:
    its module text is the same for every `cfg`, only the callback differs."""

    class M(es.Module):
        cfg: Any = eqx.field(static=True)
        tag: str = eqx.field(static=True, default="a")  # never read

        @es.jit
        def f(self, x):
            cfg = self.cfg
            return jax.pure_callback(
                lambda y: np.asarray(compute(cfg, np.asarray(y)), np.float32),
                jax.ShapeDtypeStruct((), jnp.float32),
                x,
            )

    return M


def _with_default(v: int) -> Callable:
    def g(y, k=tuple([v])):  # a default made anew by each call
        return y * k[0]

    return g


def _with_keyword_default(v: int) -> Callable:
    def g(y, *, k=tuple([v])):
        return y * k[0]

    return g


def _with_attribute(v: int) -> Callable:
    def g(y):  # refers to itself: a cycle through its closure
        return y * g.k[0]  # pyright: ignore[reportFunctionMemberAccess]

    g.k = tuple([v])  # pyright: ignore[reportFunctionMemberAccess]
    return g


def _times(y: Any, k: tuple) -> Any:
    return y * k[0]


# A function, a partial: what each holds besides its code.
_HOLDERS = {
    "defaults": _with_default,
    "keyword defaults": _with_keyword_default,
    "function attributes": _with_attribute,
    "partial keywords": lambda v: functools.partial(_times, k=tuple([v])),
}


@dataclasses.dataclass(frozen=True)
class _Add:
    v: int

    def apply(self, y: Any) -> Any:
        return y + self.v


@dataclasses.dataclass(frozen=True)
class _Mul:  # the same fields as `_Add`, another behaviour
    v: int

    def apply(self, y: Any) -> Any:
        return y * self.v


class _RaisingEq:
    """Hashable by value, and its `==` raises."""

    def __init__(self, v: int):
        self.v = v

    def __hash__(self) -> int:
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        raise TypeError("no comparison")


@dataclasses.dataclass(frozen=True)
class _NoDict:
    """A value whose `__dict__` raises something other than `AttributeError`."""

    v: int

    def __getattribute__(self, name: str) -> Any:
        if name == "__dict__":
            raise RuntimeError("no __dict__ here")
        return object.__getattribute__(self, name)


@pytest.mark.parametrize(
    "first, second, compute",
    [
        pytest.param(
            _Add(2), _Mul(2), lambda c, y: c.apply(y), id="another class, equal fields"
        ),
        pytest.param(
            (_Add(1), _Add(2)),
            (_Add(1), _Add(1)),
            lambda c, y: c[0].apply(y) + 10 * c[1].v,
            id="one object met twice",
        ),
        pytest.param(
            _RaisingEq(1), _RaisingEq(2), lambda c, y: y + c.v, id="a raising __eq__"
        ),
        pytest.param(
            functools.partial(operator.mul, 2),
            functools.partial(operator.mul, 3),
            lambda c, y: c(y),
            id="partials over other arguments",
        ),
        pytest.param(
            _Add(2).apply, _Add(3).apply, lambda c, y: c(y), id="methods of others"
        ),
        *(
            pytest.param(make(2), make(3), lambda c, y: c(y), id=f"other {name}")
            for name, make in _HOLDERS.items()
        ),
    ],
)
def test_callbacks_over_captures_that_are_not_provably_the_same_are_not_shared(
    first, second, compute
):
    """Each pair differs in a way a looser comparison would miss: values of two
    classes with equal fields; a tuple whose second item is the object its first
    was compared with (a comparison that remembered only one side of each pair would
    call the second item the same); an `__eq__` that raises (not provably the same,
    and no error). Each pair compiles twice and gives the eager results."""
    M = _callback_class(compute)  # noqa: N806
    x = jnp.float32(3.0)
    compiles = XlaCompiles()
    got = [float(M(cfg).f(x)) for cfg in (first, second)]
    want = [float(compute(cfg, np.float32(3.0))) for cfg in (first, second)]
    assert got == want and want[0] != want[1]
    assert compiles.count == M.f.compile_info().compiles == 2


def test_a_capture_whose_comparison_raises_is_not_the_same():
    """A callback may capture what is not in the key at all (here a value looked up
    by a static name). If comparing two captures raises, they are not provably the
    same: compile, and raise nothing."""
    registry = {"a": _NoDict(1), "b": _NoDict(2)}

    class M(es.Module):
        name: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            cfg = registry[self.name]
            return jax.pure_callback(
                lambda y: np.asarray(np.asarray(y) + cfg.v, np.float32),
                jax.ShapeDtypeStruct((), jnp.float32),
                x,
            )

    x = jnp.float32(3.0)
    compiles = XlaCompiles()
    assert [float(M(name).f(x)) for name in "ab"] == [4.0, 5.0]
    assert compiles.count == M.f.compile_info().compiles == 2


@dataclasses.dataclass(frozen=True, slots=True)
class _SlottedAdd:
    v: int

    def apply(self, y: Any) -> Any:
        return y + self.v


class _Scale(NamedTuple):
    k: int


_EQUAL_CAPTURES = {
    "tuple": (lambda: tuple([2, "ab"]), lambda c, y: y * c[0] + len(c[1])),
    "frozen dataclass": (lambda: _Add(2), lambda c, y: c.apply(y)),
    "slotted frozen dataclass": (lambda: _SlottedAdd(2), lambda c, y: c.apply(y)),
    "named tuple": (lambda: _Scale(2), lambda c, y: y * c.k),
    "partial": (lambda: functools.partial(operator.mul, 2), lambda c, y: c(y)),
    "bound method": (lambda: _Add(2).apply, lambda c, y: c(y)),
    **{
        name: (functools.partial(make, 2), lambda c, y: c(y))
        for name, make in _HOLDERS.items()
    },
}


@pytest.mark.parametrize("name", _EQUAL_CAPTURES)
def test_a_callback_over_equal_captures_made_anew_is_not_shared(name):
    """Two keys capture equal values that are distinct objects (made anew for each
    module): equal now is not the same forever (a function's attributes, defaults
    or a partial's keywords can change after the second key is traced), so each
    key compiles its own program."""
    make, compute = _EQUAL_CAPTURES[name]
    M = _callback_class(compute)  # noqa: N806
    x = jnp.float32(3.0)
    compiles = XlaCompiles()
    modules = [M(make(), tag=tag) for tag in "ab"]
    assert modules[0].cfg is not modules[1].cfg
    results = [float(m.f(x)) for m in modules]
    assert results == [float(compute(make(), np.float32(3.0)))] * 2
    assert compiles.count == M.f.compile_info().compiles == 2
    assert M.f.cache_info().misses == 2


@pytest.mark.sharing
def test_error_if_programs_are_shared_across_an_unread_static():
    class Solver(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            y = eqx.error_if(self.w * x, x > 10.0, "x too large")
            return eqx.branched_error_if(y, x < -10.0, 0, ["x too small"])

    x = jnp.float32(1.0)
    modules = [Solver(jnp.float32(2.0), tag) for tag in "abcd"]
    compiles = XlaCompiles()
    results = [m.f(x) for m in modules]
    assert compiles.count == Solver.f.compile_info().compiles == 1
    assert [float(r) for r in results] == [2.0] * 4
    with pytest.raises(eqx.EquinoxRuntimeError, match="x too large"):
        modules[3].f(jnp.float32(11.0))
    with pytest.raises(eqx.EquinoxRuntimeError, match="x too small"):
        modules[2].f(jnp.float32(-11.0))


def test_programs_that_differ_only_in_a_large_constant_are_not_shared():
    """A constant baked into the program is part of it: another constant, another
    compile. Where JAX passes it as an argument of the program instead (jax 0.12.1
    hoists constants over `jax_embedded_constants_max_bytes`), the programs are the
    same code, and one executable serves both, each call with its own constant."""
    base = np.arange(100_000, dtype=np.float32)
    other = base.copy()
    other[54_321] = -1.0
    tables = {"base": base, "other": other}

    class M(es.Module):
        table: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + tables[self.table]  # baked in as a constant

    x = jnp.zeros(100_000, jnp.float32)
    lowered = jax.jit(lambda x: x + base).trace(x).lower()
    hoisted = bool(_jax.lowering_of(lowered).const_args)
    compiles = XlaCompiles()
    for _ in range(2):
        a, b = M("base").f(x), M("other").f(x)
        np.testing.assert_array_equal(a, base)
        np.testing.assert_array_equal(b, other)
    expected = shared(1, 2) if hoisted else 2
    assert compiles.count == M.f.compile_info().compiles == expected


@pytest.mark.sharing
def test_the_same_program_under_another_placement_is_not_shared():
    """Committed to a device, an input changes the program's input shardings."""

    class M(es.Module):
        name: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return 2 * x

    x = jnp.ones(3)
    placed = jax.device_put(jnp.ones(3), jax.devices()[0])
    compiles = XlaCompiles()
    M("a").f(x)
    M("b").f(placed)
    assert compiles.count == M.f.compile_info().compiles == 2
    M("c").f(x)  # the first program again
    assert compiles.count == 2


@pytest.mark.sharing
def test_static_outputs_come_back_per_call_when_a_program_is_shared():
    class M(es.Module):
        w: jax.Array
        name: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return {"name": self.name, "y": self.w * x, "again": (self.name, 1)}

    x = jnp.ones(2)
    a, b = M(jnp.ones(2), "a").f(x), M(jnp.ones(2), "b").f(x)
    assert M.f.compile_info().compiles == 1
    assert (a["name"], a["again"], b["name"], b["again"]) == (
        "a",
        ("a", 1),
        "b",
        ("b", 1),
    )
    assert M(jnp.ones(2), "a").f(x)["name"] == "a"  # hits keep theirs too
    eager = M.f.__wrapped__(M(jnp.ones(2), "b"), x)
    assert jtu.tree_structure(b) == jtu.tree_structure(eager)


@pytest.mark.sharing
def test_a_program_whose_keys_were_all_evicted_counts_as_not_compiled():
    class M(es.Module):
        k: int = eqx.field(static=True)
        name: str = eqx.field(static=True)

        @es.jit(maxsize=1)
        def f(self, x):
            return x * self.k

    x = jnp.ones(2)
    compiles = XlaCompiles()
    M(1, "a").f(x)  # compile 1
    M(1, "b").f(x)  # the same program; evicts (1, "a")
    assert compiles.count == 1
    M(2, "a").f(x)  # compile 2; evicts (1, "b"), the last key of program 1
    M(1, "a").f(x)  # compile 3: program 1 is gone
    assert compiles.count == M.f.compile_info().compiles == 3
    assert M.f.compile_info().programs == 1 == M.f.cache_info().currsize


def test_weak_types_of_outputs_are_part_of_the_program():
    """Two programs with the same module text whose outputs differ only in weak
    type (which the text does not show) are not shared."""

    class M(es.Module):
        weak: bool = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x + (1.0 if self.weak else jnp.float32(1.0))

    x = jnp.asarray(1.0)  # weakly typed itself
    weak, strong = M(True).f(x), M(False).f(x)
    assert weak.weak_type == M.f.__wrapped__(M(True), x).weak_type
    assert strong.weak_type == M.f.__wrapped__(M(False), x).weak_type
    assert weak.weak_type != strong.weak_type


# --- a program shared by keys: each key keeps what its own trace returned ----------


@pytest.mark.sharing
def test_returning_self_from_a_program_shared_with_another_value_of_a_field():
    """Keys that differ only in `tag` share one program; each returns its own
    `self`, with its own `tag`."""

    def body(self, x):
        y = self.w * x
        return (y, self) if x.ndim == 2 else y

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)
        f = es.jit(body)

    x1, x2 = jnp.ones(3), jnp.ones((2, 3))
    M(w=jnp.ones(()), tag="a").f(x1)
    M(w=jnp.ones(()), tag="b").f(x1)  # the same program, another `tag`
    M(w=jnp.ones(()), tag="a").f(x2)
    m = M(w=jnp.ones(()), tag="b")
    y, out = m.f(x2)  # the same program as `tag="a"` at this shape
    y0, out0 = body(m, x2)
    assert out.tag == out0.tag == "b"
    assert np.array_equal(y, y0)
    assert M.f.compile_info().compiles == 2


@pytest.mark.sharing
def test_returning_a_submodule_from_a_shared_program():
    class Sub(es.Module):
        k: int = eqx.field(static=True)

    def body(self, x):
        y = self.w * x
        return (y, self.sub) if x.ndim == 2 else y

    class M(es.Module):
        w: jax.Array
        sub: Sub
        name: str = eqx.field(static=True)  # never used
        f = es.jit(body)

    x2 = jnp.ones((2, 3))
    M(w=jnp.ones(()), sub=Sub(k=1), name="a").f(x2)
    y, sub = M(w=jnp.ones(()), sub=Sub(k=2), name="b").f(x2)
    assert sub == Sub(k=2)
    assert M.f.compile_info().compiles == 1


# --- real network code: unused statics compile nothing -----------------------------


@pytest.mark.sharing
@pytest.mark.parametrize("inner_base", [es.Module, eqx.Module])
def test_an_unused_static_field_of_any_nested_module_compiles_nothing(inner_base):
    """The program decides, whatever class holds the field: an `es.Module` or a
    plain `eqx.Module` nested in `self`."""

    class Inner(inner_base):
        w: jax.Array
        tag: str = eqx.field(static=True)  # never used

    class Outer(es.Module):
        inner: Inner

        @es.jit
        def __call__(self, x):
            return self.inner.w * x

    m = Outer(Inner(jnp.ones(3), "a"))
    m(jnp.ones(3))
    m.with_static(**{"inner.tag": "b"})(jnp.ones(3))
    assert Outer.__call__.cache_info().misses == 2
    assert Outer.__call__.compile_info().compiles == 1


_PLACED_FLIPS = textwrap.dedent(
    """
    import json
    import equinox as eqx, jax, numpy as np, eqx_static as es
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    names = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda e, d, **k: names.append(k.get("fun_name"))
        if e == "/jax/core/compile/backend_compile_duration" else None
    )

    class M(es.Module):
        tag: int = eqx.field(static=True)  # never read

        @es.jit
        def f(self, x):
            return x * 2

    x = np.arange(8, dtype=np.float32)
    mesh = Mesh(np.array(jax.devices()[::-1]), ("d",))  # another device order
    placements = {
        "device 1": jax.device_put(x, jax.devices()[1]),
        "reversed mesh": jax.device_put(x, NamedSharding(mesh, P("d"))),
    }
    got = {}
    for where, placed in placements.items():
        start = len(names)
        for tag in range(5):
            out = M(tag).f(placed)
            assert (np.asarray(out) == 2 * x).all() and out.sharding == placed.sharding
        got[where] = sum(n.endswith(".f)") for n in names[start:])
    print(json.dumps({"compiles": got, "booked": M.f.compile_info().compiles}))
    """
)


@pytest.mark.slow
def test_an_unread_flip_compiles_nothing_on_any_placement():
    """Five values of an unread static field on device 1 of 4, then on a mesh over
    the devices in reverse order: one compile per placement, none per flip."""
    result = run_python(
        code=_PLACED_FLIPS,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
        strict=True,
    )
    assert result.returncode == 0, output(result)
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == {"compiles": {"device 1": 1, "reversed mesh": 1}, "booked": 2}


@pytest.mark.sharing
def test_a_key_whose_program_is_shared_keeps_no_lowering():
    """Keys sharing one program keep no lowering (JAX's MLIR module) each: the live
    lowerings do not grow with the keys."""

    class M(es.Module):
        tag: int = eqx.field(static=True)  # never read

        @es.jit
        def f(self, x):
            return jnp.tanh(x) * 2

    def lowerings() -> int:
        gc.collect()
        return sum(type(o).__name__ == "MeshComputation" for o in gc.get_objects())

    x = jnp.ones(3)
    M(-1).f(x)
    before = lowerings()
    for tag in range(20):
        M(tag).f(x)
    assert M.f.compile_info()[:2] == (1, 1)
    assert lowerings() - before <= 1


def test_programs_held_count_a_program_with_nested_library_jits():
    """A function calling `lineax.linear_solve` (nested jits, Equinox's error
    checks): one key, one compile, and one program held."""
    lx = pytest.importorskip("lineax")

    @es.jit
    def solve(a, b):
        return lx.linear_solve(lx.MatrixLinearOperator(a), b).value

    a, b = jnp.eye(3) * 2.0, jnp.ones(3)
    np.testing.assert_allclose(solve(a, b), b / 2.0)
    assert solve.cache_info().currsize == 1
    assert solve.compile_info()[:2] == (1, 1)
