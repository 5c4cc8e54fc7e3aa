"""The hit path for every signature a user writes: `def __call__(self, x, *,
key=None)` as Equinox writes it, a positional default (`scale=2.0`), `*xs`,
`**options`, a plain function with positional-only and keyword-only parameters,
and one of every kind at once. A user calls these with a few keys of one class in
turn (a static flag flipped, a static int changed), fresh instances as a training
loop makes them, keywords passed, spelled otherwise or left to their defaults, and
models nested 1 to 1,000 deep. Every call returns what the eager call and
`eqx.filter_jit` return (values, leaf types, tree), and the books (hits, misses,
compiles, programs, traces, keys held) are those counted by hand (each new key or
new shape a miss, every other call a hit) and, in the slow tier, those of the same
calls through the general path alone (the guards dropped before each call). Once
warm, the guards serve the calls: the general path's count stays put.

A guard is code: its source is in tracebacks and `inspect.getsource` while it
lives, and on the DEBUG log `eqx_static.guards` with the check a call failed."""

import dataclasses
import functools
import gc
import inspect
import linecache
import logging
import random
import sys
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _guard


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import models  # noqa: E402  (the benchmarks' own models)


# --- what the calls are made of ---------------------------------------------------

SHAPES = ((4,), (2,))  # the shapes of `x`: a new one is a miss of the same key
XS = [jnp.linspace(-1.0, 2.0, s[0], dtype=jnp.float32) for s in SHAPES]
A, B = jnp.float32(0.5), jnp.float32(-1.5)  # traced scalars: one key whatever value
KEYS = jax.random.key(1), jax.random.key(2)
FIRSTS = [(True, 1), (False, 1), (True, 3)]  # (flag, n): static fields of the module


class Base(es.Module):
    """The fields of every module here: an array, a chain of `Link`s below it
    (`None` at depth 1), a static flag and a static int. Each kind subclasses it
    with one `es.jit` method."""

    w: jax.Array
    inner: Any
    flag: bool = eqx.field(static=True)
    n: int = eqx.field(static=True)


class Link(es.Module):
    """One module of a deep model: an array at the ends of the chain (`None`
    between: a deep key of few leaves, cheap to compile), a static `k`, the next."""

    w: Any
    child: Any
    k: int = eqx.field(static=True)

    def __init__(self, w: Any, child: Any, k: int):
        # Its own: Equinox's dataclass `__init__` flattens the arguments (the whole
        # chain below), so that a chain is made in time quadratic in its depth.
        self.w, self.child, self.k = w, child, k


@functools.cache
def _link_chain(links: int) -> Any:
    """`links` modules nested, or None (made once: the modules do not change)."""
    link = None
    for i in range(links):
        ends = i == 0 or i == links - 1
        w = jnp.full(4, i + 1.0, jnp.float32) / 8 if ends else None
        link = Link(w, link, i)
    return link


def _core(m: Any, x: jax.Array) -> jax.Array:
    y = m.w * x * m.n
    if m.inner is not None and m.inner.w is not None:
        y = y + jnp.sum(m.inner.w)
    return -y if m.flag else y


# The bodies, undecorated: what the eager call and `eqx.filter_jit` run.


def body_key(self, x, *, key=None):
    y = _core(self, x)
    if key is not None:  # its bits (cheap to compile, as `normal` is not)
        y = y + jnp.sum(jax.random.key_data(key)).astype(x.dtype)
    return y, self.n


def body_scale(self, x, scale=2.0):
    return _core(self, x) * scale, {"n": self.n}


def body_star(self, *xs):
    y = _core(self, xs[0])
    for extra in xs[1:]:
        y = y if extra is None else y * extra
    return [y, len(xs)]


def body_options(self, x, **options):
    y = _core(self, x)
    for name in ("a", "b"):
        if name in options:
            y = y * options[name]
    if options.get("mode") == "neg":
        y = -y
    return y, tuple(sorted(options))


def body_plain(x, /, y, *, z=1):
    v = jnp.sum(y.w) if isinstance(y, Link) else y
    return x * v * z, z


def body_mixed(x, y=2, /, *xs, scale=1.0, z, **kw):
    out = x * y * scale * z
    for e in xs:
        out = out if e is None else out * e
    for k in sorted(kw):
        out = -out if isinstance(kw[k], str) else out * kw[k]
    return out, len(xs), tuple(sorted(kw))


# Each kind: a fresh `es.jit` of a fresh function of the kind's signature (its own
# cache, its own guards), whose traces are counted.


def _class(kind: str, traces: list[int]) -> tuple[str, type]:
    """A fresh subclass of `Base` with the kind's method, and the method's name."""
    if kind == "key":

        class M(Base):
            @es.jit
            def __call__(self, x, *, key=None):
                traces[0] += 1
                return body_key(self, x, key=key)

        return "__call__", M
    if kind == "scale":

        class M(Base):
            @es.jit
            def f(self, x, scale=2.0):
                traces[0] += 1
                return body_scale(self, x, scale)

    elif kind == "star":

        class M(Base):
            @es.jit
            def f(self, *xs):
                traces[0] += 1
                return body_star(self, *xs)

    else:

        class M(Base):
            @es.jit
            def f(self, x, **options):
                traces[0] += 1
                return body_options(self, x, **options)

    return "f", M


@dataclasses.dataclass
class Built:
    """One fresh build of a kind: the `es.jit` wrapper, what a call calls (the
    module's method, or the function), and the traces of its body."""

    jit: Any
    first: Callable[[Any], Any]  # a call's first value -> what to call
    cls: type | None
    traces: list[int]


def build(kind: str) -> Built:
    traces = [0]
    if kind in FUNCTIONS:
        if kind == "plain":

            def f(x, /, y, *, z=1):
                traces[0] += 1
                return body_plain(x, y, z=z)

        else:

            def f(x, y=2, /, *xs, scale=1.0, z, **kw):
                traces[0] += 1
                return body_mixed(x, y, *xs, scale=scale, z=z, **kw)

        jf = es.jit(f)
        return Built(jf, lambda x: lambda *a, **k: jf(x, *a, **k), None, traces)
    name, cls = _class(kind, traces)
    jit = getattr(cls, name).es_jit
    return Built(jit, lambda m: getattr(m, name), cls, traces)


BODIES = {"key": body_key, "scale": body_scale, "star": body_star,
          "options": body_options, "plain": body_plain, "mixed": body_mixed}  # fmt: skip
FILTER_JIT = {k: eqx.filter_jit(b) for k, b in BODIES.items()}


@dataclasses.dataclass(frozen=True)
class Arg:
    """The arguments after the first value: `key` names the compile key they make
    (arguments of another key id change the key); `spellings` are the ways of
    passing them, each `(args, kwargs)` of `x` and `depth` (after the module; for
    the functions, after `x`)."""

    key: str
    spellings: tuple[Callable[[Any, int], tuple[tuple, dict]], ...]


ARGS: dict[str, list[Arg]] = {
    "key": [
        Arg("no key", (lambda x, d: ((x,), {}), lambda x, d: ((x,), {"key": None}))),
        Arg("key", (lambda x, d: ((x,), {"key": KEYS[0]}),)),
        Arg("key", (lambda x, d: ((x,), {"key": KEYS[1]}),)),  # another value
    ],
    "scale": [
        Arg("2.0", (lambda x, d: ((x,), {}), lambda x, d: ((x, 2.0), {}),
                    lambda x, d: ((x,), {"scale": 2.0}))),
        Arg("3.0", (lambda x, d: ((x, 3.0), {}), lambda x, d: ((x,), {"scale": 3.0}))),
        Arg("3", (lambda x, d: ((x, 3), {}),)),  # an int: another key
        Arg("array", (lambda x, d: ((x, A), {}), lambda x, d: ((x,), {"scale": A}))),
        Arg("array", (lambda x, d: ((x, B), {}),)),
    ],
    "star": [
        Arg("1", (lambda x, d: ((x,), {}),)),
        Arg("2 arrays", (lambda x, d: ((x, x + 1), {}),)),
        Arg("2 arrays", (lambda x, d: ((x, x * 2), {}),)),
        Arg("array, static", (lambda x, d: ((x, 2.0), {}),)),
        Arg("array, None, array", (lambda x, d: ((x, None, x - 1), {}),)),
    ],
    "options": [
        Arg("{}", (lambda x, d: ((x,), {}),)),
        Arg("a", (lambda x, d: ((x,), {"a": A}),)),
        Arg("a b", (lambda x, d: ((x,), {"a": A, "b": B}),
                    lambda x, d: ((x,), {"b": B, "a": A}))),
        Arg("mode", (lambda x, d: ((x,), {"mode": "neg"}),)),
        Arg("a c mode", (lambda x, d: ((x,), {"mode": "neg", "a": B, "c": None}),
                         lambda x, d: ((x,), {"c": None, "a": A, "mode": "neg"}))),
    ],
    "plain": [
        Arg("array, 1", (lambda x, d: ((A,), {}), lambda x, d: ((), {"y": A}),
                         lambda x, d: ((B,), {"z": 1}))),
        Arg("array, 2", (lambda x, d: ((A,), {"z": 2}), lambda x, d: ((), {"z": 2, "y": B}))),
        Arg("1.5, 1", (lambda x, d: ((1.5,), {}), lambda x, d: ((), {"y": 1.5, "z": 1}))),
        Arg("chain, 1", (lambda x, d: ((_link_chain(d),), {}),)),
        Arg("chain, 2", (lambda x, d: ((), {"y": _link_chain(d), "z": 2}),)),
    ],
    "mixed": [
        Arg("defaults", (lambda x, d: ((), {"z": 1}), lambda x, d: ((2,), {"z": 1}),
                         lambda x, d: ((2,), {"scale": 1.0, "z": 1}))),
        Arg("z 2", (lambda x, d: ((), {"z": 2}), lambda x, d: ((2,), {"z": 2}))),
        Arg("y array", (lambda x, d: ((A,), {"z": 1}),
                        lambda x, d: ((B,), {"scale": 1.0, "z": 1}))),
        Arg("xs", (lambda x, d: ((3, A), {"z": A}), lambda x, d: ((3, B), {"z": B}))),
        Arg("xs None, q", (lambda x, d: ((2, A, None), {"z": 2, "q": "s"}),
                           lambda x, d: ((2, B, None), {"q": "s", "z": 2}))),
        Arg("a b", (lambda x, d: ((), {"z": 1, "b": A, "a": B}),
                    lambda x, d: ((2,), {"a": A, "b": B, "z": 1}))),
        Arg("scale", (lambda x, d: ((), {"z": 1, "scale": A}),)),
    ],
}  # fmt: skip
KINDS = sorted(ARGS)
FUNCTIONS = ("mixed", "plain")  # the others are methods of a module


@dataclasses.dataclass(frozen=True)
class Call:
    """One call: the module's static fields (`FIRSTS`), the arguments and how they
    are spelled, the shape of `x`, and whether the module is a fresh copy."""

    first: int
    arg: int
    spelling: int
    shape: int
    fresh: bool

    def key(self, kind: str) -> tuple:
        """The compile key, by hand: what the general path tells apart."""
        return (self.first if kind not in FUNCTIONS else 0), ARGS[kind][self.arg].key


# --- running calls ------------------------------------------------------------------


def _copy(m: Any) -> Any:
    return jax.tree.map(lambda a: a, m)  # a fresh instance, as a training loop makes


@contextmanager
def recursion_for(depth: int) -> Iterator[None]:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * depth + 1_000))  # to copy deep chains
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


class Runner:
    """The calls of one kind at one depth on one build: each call's first value is
    a module made once per `FIRSTS` entry (or a copy of it), or `x` itself."""

    def __init__(self, kind: str, depth: int, built: Built):
        self.kind, self.depth, self.built = kind, depth, built
        self.modules = {}
        if built.cls is not None:
            for i, (flag, n) in enumerate(FIRSTS):
                inner = _link_chain(depth - 1)
                self.modules[i] = built.cls(jnp.float32(1.5), inner, flag, n)

    def arguments(self, c: Call) -> tuple[Any, tuple, dict]:
        x = XS[c.shape]
        args, kwargs = ARGS[self.kind][c.arg].spellings[c.spelling](x, self.depth)
        if self.built.cls is None:
            return x, args, kwargs
        m = self.modules[c.first]
        return (_copy(m) if c.fresh else m), args, kwargs

    def __call__(self, c: Call) -> Any:
        first, args, kwargs = self.arguments(c)
        return self.built.first(first)(*args, **kwargs)

    def books(self) -> tuple:
        """Hits and misses, compiles, programs held, traces, and keys held."""
        compiles = self.built.jit.compile_info()
        return (
            self.built.jit.cache_info(),
            compiles.compiles,
            compiles.programs,
            self.built.traces[0],
            len(self.built.jit.f.entries),
        )


_references: dict[tuple, tuple[Any, Any]] = {}


def reference(kind: str, depth: int, c: Call) -> tuple[Any, Any]:
    """The eager call's result and `eqx.filter_jit`'s, for the same values (on
    a module of a build of the kind whose `es.jit` is never called): once per
    call description, as the bodies are deterministic."""
    at = (kind, depth, c.first, c.arg, c.spelling, c.shape)
    if at not in _references:
        runner = _reference_runner(kind, depth)
        first, args, kwargs = runner.arguments(dataclasses.replace(c, fresh=False))
        _references[at] = (
            BODIES[kind](first, *args, **kwargs),
            FILTER_JIT[kind](first, *args, **kwargs),
        )
    return _references[at]


_reference_runners: dict[tuple, Runner] = {}


def _reference_runner(kind: str, depth: int) -> Runner:
    if (kind, depth) not in _reference_runners:
        _reference_runners[kind, depth] = Runner(kind, depth, build(kind))
    return _reference_runners[kind, depth]


def _kind_of(x: Any) -> tuple:
    if isinstance(x, jax.Array):
        return ("array", x.shape, x.dtype, jax.typeof(x).weak_type)
    return ("leaf", type(x))


def assert_same(want: Any, got: Any, *, exact: bool, what: str) -> None:
    """The same tree, the same leaf kinds (shape, dtype, weak type; a Python type),
    the same values; with `exact`, every leaf the same Python class too."""
    assert jax.tree.structure(want) == jax.tree.structure(got), what
    for i, (w, g) in enumerate(zip(jax.tree.leaves(want), jax.tree.leaves(got))):
        assert _kind_of(w) == _kind_of(g), f"{what}: leaf {i}"
        if exact:
            assert type(w) is type(g), f"{what}: leaf {i}"
        if isinstance(w, jax.Array):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=what)
        else:
            assert w == g, f"{what}: leaf {i}: {w!r} != {g!r}"


def check_sequence(kind: str, depth: int, calls: list[Call], general: bool) -> None:
    """The calls, then each of their keys warmed up and called again with every
    spelling on fresh modules: through the guards (and, with `general`, through
    the general path alone), against the eager call, `eqx.filter_jit` and the books
    counted by hand."""
    keys = {c.key(kind): c for c in calls}
    warm = [dataclasses.replace(c, spelling=0, shape=0, fresh=True) for c in keys.values()]  # fmt: skip
    batch = [
        dataclasses.replace(c, spelling=s, shape=0, fresh=True)
        for c in keys.values()
        for s in range(len(ARGS[kind][c.arg].spellings))
    ]
    everything = [*calls, *warm, *warm, *batch]
    with recursion_for(depth):
        hot = Runner(kind, depth, build(kind))
        alone = Runner(kind, depth, build(kind)) if general else None
        seen: set[tuple] = set()
        served = hot.built.jit.f.general
        for i, c in enumerate(everything):
            if i == len(everything) - len(batch):
                served = hot.built.jit.f.general  # warm: the guards serve the rest
            what = f"call {i} of {len(everything)}: {c}"
            eager, filter_jit = reference(kind, depth, c)
            assert_same(eager, filter_jit, exact=False, what=f"{what}, filter_jit")
            got = hot(c)
            assert_same(filter_jit, got, exact=True, what=f"{what}, es.jit")
            assert_same(eager, got, exact=False, what=f"{what}, es.jit vs eager")
            seen.add((*c.key(kind), c.shape))
            info, compiles, programs, traces, held = books = hot.books()
            # Each new key or new shape is a miss, which traces; every other call
            # is a hit; each key is held once.
            assert (info.hits, info.misses) == (i + 1 - len(seen), len(seen)), what
            assert traces == len(seen) and programs <= compiles <= len(seen), what
            assert held == len({k[:2] for k in seen}), what
            if alone is not None:
                alone.built.jit._slots.clear()  # the general path alone
                out = alone(c)
                assert alone.built.jit.f.general == i + 1
                assert_same(filter_jit, out, exact=True, what=f"{what}, general")
                assert books == alone.books(), what
        assert hot.built.jit.f.general == served
        assert served <= 2 * len(keys)  # a guard made at a key's second call


def random_calls(
    rng: random.Random, kind: str, count: int, chosen: list[tuple] | None = None
) -> list[Call]:
    """`count` calls of the `chosen` keys of one class (else two to five at
    random), in random turn."""
    args = ARGS[kind]
    if chosen is None:
        firsts = [0] if kind in FUNCTIONS else range(len(FIRSTS))
        pool = sorted({(f, a.key) for f in firsts for a in args})
        chosen = rng.sample(pool, rng.randint(2, min(5, len(pool))))
    calls = []
    for _ in range(count):
        first, key = rng.choice(chosen)
        arg = rng.choice([i for i, a in enumerate(args) if a.key == key])
        calls.append(
            Call(
                first,
                arg,
                rng.randrange(len(args[arg].spellings)),
                rng.randrange(len(SHAPES)),
                rng.random() < 0.7,
            )
        )
    return calls


def static_pair(rng: random.Random, kind: str) -> list[tuple]:
    """Two keys told apart by a static value alone: the module's flag or int
    field, or (for the functions) `z`."""
    if kind == "mixed":
        return [(0, "defaults"), (0, "z 2")]
    if kind == "plain":
        return rng.choice([[(0, "array, 1"), (0, "array, 2")],
                           [(0, "chain, 1"), (0, "chain, 2")]])  # fmt: skip
    key = rng.choice(sorted({a.key for a in ARGS[kind]}))
    return [(0, key), (rng.choice([1, 2]), key)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_signature_agrees_with_the_general_path(kind):
    """A seeded sequence of 12 calls of two keys told apart by a static value,
    two modules deep, its books counted by hand. (Each program compiles once per
    wrapper: the slow tier runs sequences of more keys, also through the general
    path alone.)"""
    rng = random.Random(kind)
    calls = random_calls(rng, kind, 12, static_pair(rng, kind))
    check_sequence(kind, 2, calls, general=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_key_of_a_signature_in_turn(kind):
    """Every key the kind's arguments make, with one module's static fields (and
    one key of another's), 40 calls in random turn, 10 modules deep, also through
    the general path alone: the guards tell every two argument structures apart."""
    keys = list(dict.fromkeys(a.key for a in ARGS[kind]))
    chosen = [(0, k) for k in keys] + ([(1, keys[0])] if kind not in FUNCTIONS else [])
    calls = random_calls(random.Random(f"every key {kind}"), kind, 40, chosen)
    check_sequence(kind, 10, calls, general=True)


# Depth changes what the package walks on the host, not the program's operations;
# but a program of 1,000 inputs takes long to compile on an accelerator (on a TPU
# one kind of the test below ran over 150 s), so 1,000 deep is drawn on a CPU only.
DEPTHS = [1, 2, 10, 100, *([1_000] if jax.default_backend() == "cpu" else [])]


@st.composite
def sequences(draw: Any, kind: str) -> tuple[int, list[Call]]:
    """A depth, and 1 to 20 calls of two to five keys of one class in turn."""
    depth = draw(st.sampled_from(DEPTHS))
    args = ARGS[kind]
    firsts = [0] if kind in FUNCTIONS else range(len(FIRSTS))
    # The static fields of one or two modules: keys often differ in one place.
    firsts = draw(
        st.lists(st.sampled_from(firsts), min_size=1, max_size=2, unique=True)
    )
    pool = sorted({(f, a.key) for f in firsts for a in args})
    chosen = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=5, unique=True))
    calls = []
    for _ in range(draw(st.integers(1, 20))):
        first, key = draw(st.sampled_from(chosen))
        arg = draw(st.sampled_from([i for i, a in enumerate(args) if a.key == key]))
        spelling = draw(st.integers(0, len(args[arg].spellings) - 1))
        shape = draw(st.integers(0, len(SHAPES) - 1))
        calls.append(Call(first, arg, spelling, shape, draw(st.booleans())))
    return depth, calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_signature_agrees_with_the_general_path_hypothesis(kind):
    """Sequences of up to 20 calls of two to five keys, 1 to 1,000 modules deep,
    also through the general path alone (about 20 s a kind)."""

    @hypothesis.settings(max_examples=10, deadline=None)
    @hypothesis.given(sequences(kind))
    def check(drawn: tuple[int, list[Call]]) -> None:
        check_sequence(kind, *drawn, general=True)

    check()


# --- depth ----------------------------------------------------------------------------


def _deepest(m: Any) -> Any:
    link = m.head
    while link.child is not None:
        link = link.child
    return link


def _few_leaves(depth: int) -> Any:
    """A model `depth` modules deep of two arrays (at the ends of its chain)."""

    class Deep(es.Module):
        head: Link

        @es.jit
        def __call__(self, x):
            return x + self.head.w

    return Deep(_link_chain(depth))


@pytest.mark.parametrize(
    "model, depth",
    [
        *[("chain", d) for d in (1, 10, 100)],
        pytest.param("chain", 1_000, marks=pytest.mark.slow),  # 1,000 arrays: 7 s
        ("few leaves", 1_000),
    ],
)
def test_fresh_deep_models_hit_through_a_guard(model, depth):
    """A chain of modules `depth` deep (the benchmarks' `chain`, an array in each
    module; or arrays at its ends only): fresh copies are hits served by the key's
    guard, a static field changed at the bottom is another key (the guard checks
    the whole depth), and every call returns what the eager call returns."""
    with recursion_for(depth):
        x = models.x_input()
        m = models.chain(depth)[0] if model == "chain" else _few_leaves(depth)
        method = type(m).__call__
        want = method.fn(m, x)
        for _ in range(2):  # the second call makes the guard
            assert_same(want, m(x), exact=False, what="warm-up")
        general = method.es_jit.f.general
        for i in range(4):
            assert_same(want, _copy(m)(x), exact=False, what=f"fresh copy {i}")
        assert method.es_jit.f.general == general == 2
        assert method.cache_info() == es.CacheInfo(5, 1, None, 1)
        changed = _copy(m)
        object.__setattr__(_deepest(changed), "k", -1)
        for _ in range(3):  # a miss, then a hit; then its own guard serves it
            assert_same(method.fn(changed, x), changed(x), exact=False, what="k")
        assert method.es_jit.f.general == general + 2
        assert method.cache_info() == es.CacheInfo(7, 2, None, 2)


# --- a guard is code you can read -------------------------------------------------------


def _scaled() -> tuple[Any, list[int]]:
    """A fresh `es.jit` of a function of a keyword-only default, which raises for
    an `x` of five elements (while tracing)."""
    traces = [0]

    def scaled(x, *, scale=2.0):
        traces[0] += 1
        if x.shape == (5,):
            raise RuntimeError("five elements, on purpose")
        return x * scale

    return es.jit(scaled), traces


def _guard_of(jf: Any, x: Any) -> Callable:
    jf(x), jf(x)  # the second call makes the guard
    (guard,) = jf._slots[type(x)]
    return guard


def test_a_guard_s_source_is_in_tracebacks_and_in_getsource():
    """`inspect.getsource` reads a guard's source, and a user's exception raised
    under a guard (a new shape, traced from the guard's dispatch) shows the
    guard's frame with its line."""
    jf, _ = _scaled()
    x = jnp.ones(3, jnp.float32)
    guard = _guard_of(jf, x)
    filename = guard.__code__.co_filename
    source = inspect.getsource(guard)
    assert source.startswith("def guard(p_x, p_scale):")
    assert source == "".join(linecache.getlines(filename))
    with pytest.raises(RuntimeError, match="on purpose") as raised:
        jf(jnp.ones(5, jnp.float32))
    frames = [
        f
        for f in traceback.extract_tb(raised.value.__traceback__)
        if f.filename == filename
    ]
    assert len(frames) == 1 and "ENTRY" in (frames[0].line or "")
    assert frames[0].line == linecache.getline(filename, frames[0].lineno).strip()
    shown = "".join(traceback.format_exception(raised.value))
    assert f'File "{filename}", line {frames[0].lineno}' in shown
    assert frames[0].line in shown


def test_a_guard_s_source_is_kept_while_the_guard_lives():
    """A guard's lines stay in `linecache` (also through `checkcache`, which
    tracebacks run) until the guard is collected: after `cache_clear`, or when
    `maxsize` evicts its key."""
    x = jnp.ones(3, jnp.float32)
    for drop in ("cache_clear", "maxsize"):
        jf, _ = _scaled()
        if drop == "maxsize":
            jf = es.jit(jf.fn, maxsize=1)
        guard = _guard_of(jf, x)
        filename, alive = guard.__code__.co_filename, weakref.ref(guard)
        linecache.checkcache()
        assert linecache.getline(filename, 1).startswith("def guard(")
        del guard
        if drop == "cache_clear":
            jf.cache_clear()
        else:
            jf(x, scale=3.0)  # another key: the first is evicted, with its guard
            assert jf.cache_info().currsize == 1 and not jf._slots[type(x)]
        gc.collect()
        assert alive() is None, drop
        assert filename not in linecache.cache, drop


def test_the_debug_log_shows_new_guards_and_the_check_that_failed(caplog, monkeypatch):
    """With `eqx_static.guards` at DEBUG, a new guard's source is logged, and a
    call that falls through the guards of its class logs the line that turned it
    away; at the default level, nothing is logged, and no guard is run again to
    find the line."""

    class Gate(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)

        @es.jit
        def __call__(self, x, *, key=None):
            return -self.w * x if self.flag else self.w * x

    def not_at_the_default_level(*args: Any) -> None:
        raise AssertionError("a guard's checks traced for the log, unlogged")

    x = jnp.ones(3, jnp.float32)
    with monkeypatch.context() as patch:
        patch.setattr(_guard, "first_failure", not_at_the_default_level)
        Gate(jnp.float32(2.0), True)(x)
        Gate(jnp.float32(2.0), True)(x)  # a guard, made at the default level
        Gate(jnp.float32(2.0), False)(x)  # and a call no guard serves
    assert not [r for r in caplog.records if r.name == "eqx_static.guards"]
    Gate.__call__.cache_clear()
    with caplog.at_level(logging.DEBUG, logger="eqx_static.guards"):
        Gate(jnp.float32(2.0), True)(x)
        Gate(jnp.float32(2.0), True)(x, key=None)
        (guard,) = Gate.__call__.es_jit._slots[Gate]
        filename = guard.__code__.co_filename
        new = [r.getMessage() for r in caplog.records if "a new guard" in r.message]
        assert len(new) == 1
        name = Gate.__call__.__qualname__  # as the log names it, and the file
        assert new[0] == f"{name}: a new guard, {filename}:\n{inspect.getsource(guard)}"
        assert filename.endswith(f": {name}")
        caplog.clear()
        Gate(jnp.float32(2.0), False)(x)
    (fell,) = [r.getMessage() for r in caplog.records if "failed at" in r.message]
    at = fell.split("failed at ", 1)[1]
    assert at.startswith(f"{filename}:")
    lineno = int(at[len(filename) + 1 :].split(":", 1)[0])
    assert at == f"{filename}:{lineno}: {linecache.getline(filename, lineno).strip()}"
    assert "is True" in at  # the check of the static flag


def test_first_failure_never_dispatches():
    """`_guard.first_failure` (the DEBUG log's) runs a guard's checks only: for
    a call the guard passes (here of a new shape, which would trace) it returns
    None and the books do not move; for one it turns away, the failing line. The
    trace function in place before is put back."""
    jf, traces = _scaled()
    x = jnp.ones(3, jnp.float32)
    guard = _guard_of(jf, x)
    filename = guard.__code__.co_filename
    books = jf.cache_info(), jf.f.general, traces[0]
    assert _guard.first_failure(guard, (jnp.ones(4, jnp.float32), 2.0)) is None
    assert _guard.first_failure(guard, (x, 2.0)) is None
    assert (jf.cache_info(), jf.f.general, traces[0]) == books

    def outer(frame: Any, event: str, arg: Any) -> None:  # a debugger's, say
        return None

    previous = sys.gettrace()
    sys.settrace(outer)
    try:
        failed = _guard.first_failure(guard, (x, 3.0))
    finally:
        after = sys.gettrace()
        sys.settrace(previous)
    assert after is outer
    assert failed is not None and failed.startswith(f"{filename}:")
    lineno = int(failed[len(filename) + 1 :].split(":", 1)[0])
    assert failed.endswith(linecache.getline(filename, lineno).strip())
    assert "p_scale" in failed
    assert (jf.cache_info(), jf.f.general, traces[0]) == books
    jf(jnp.ones(4, jnp.float32))  # the shape first_failure saw: a miss now
    assert jf.cache_info().misses == books[0].misses + 1 == traces[0]


# --- found on the way ---------------------------------------------------------------


def test_a_parameter_may_be_named_type():
    """`def act(x, type="relu")`: a parameter may have any name Python allows,
    as under `eqx.filter_jit` (the function made for the signature once called
    `type(...)` with the parameters in scope, and so called the argument)."""

    def act(x, type="relu"):
        return jax.nn.relu(x) if type == "relu" else x

    x = jnp.array([-1.0, 2.0], jnp.float32)
    jf = es.jit(act)
    for _ in range(3):
        np.testing.assert_array_equal(jf(x), act(x))
        np.testing.assert_array_equal(jf(x, type="id"), act(x, type="id"))


def test_a_second_wrapper_of_a_function_gets_guards_of_its_own():
    """Wrappers of one function share its keys (`es.jit(f)` made anew each step);
    each makes its own guards (they hold its own leaves), at its first call of a
    key that has run."""

    def double(x):
        return 2 * x

    x = jnp.ones(3)
    a = es.jit(double)
    a(x), a(x)
    b = es.jit(double)
    general = b.f.general
    for _ in range(5):
        np.testing.assert_array_equal(b(x), 2 * x)
    assert b.f.general == general + 1  # b's first call only
    assert b.cache_info() == es.CacheInfo(6, 1, None, 1)


class Keyed(es.Module):
    w: jax.Array
    n: int = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x + self.n


def test_a_guard_pushed_out_by_more_keys_in_turn_comes_back(monkeypatch):
    """Nine keys of one class in turn, one more than the guards a class keeps:
    a key whose guard was pushed out gets one again, after twice as many calls on
    the general path each time (so keys in turn do not write a guard per call);
    used alone afterwards, it is served by its guard."""
    made = []
    write = _guard.guard
    monkeypatch.setattr(_guard, "guard", lambda *a: made.append(a[3]) or write(*a))
    Keyed.__call__.cache_clear()
    models, x, rounds = [Keyed(jnp.ones(()), n) for n in range(9)], jnp.ones(2), 20
    for _ in range(rounds):
        for m in models:
            np.testing.assert_array_equal(m(x), x + m.n)
    assert 9 <= len(made) <= 9 * (1 + rounds.bit_length())  # 1, 2, 4, ... calls
    for _ in range(8):
        models[0](x)
    general = Keyed.__call__.es_jit.f.general
    for _ in range(3):
        np.testing.assert_array_equal(models[0](x), x)
    assert Keyed.__call__.es_jit.f.general == general
