"""Explanations (`_report.py`): the INFO line logged on `"eqx_static"` for each
miss after the first names what changed, in field terms, old -> new, and whether
it compiled; and the error for an unhashable static value names where it is.

Each case makes a fresh wrapper (a new function, so a new cache), calls it with
the first arguments, then with the second, and checks the exact line."""

import logging
import zlib
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from helpers import seed


X = jnp.ones(2, jnp.float32)


class P(eqx.Module):
    w: jax.Array
    xs: Any = eqx.field(static=True)


class Q(eqx.Module):
    w: jax.Array


class Pair(NamedTuple):
    a: Any
    b: Any


def _halve(v):
    return v / 2


def _double(v):
    return v * 2


def _fresh() -> Any:
    def f(x, y=None, *rest, z=None):
        # Every argument's value and structure in the program, so that each new
        # key compiles (`test_programs.py` is about keys that do not).
        return x + jnp.float32(zlib.crc32(repr((y, rest, z)).encode()) % 2**20)

    return es.jit(f)


def _what(line: str) -> str:
    """A log line without where the programs differ (`test_where.py` checks that)."""
    return line.split("; the programs first differ")[0].split(
        "; the programs differ only"
    )[0]


def _explanations(caplog: Any, *calls: tuple[tuple, dict]) -> list[str]:
    f = _fresh()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        for args, kwargs in calls:
            f(*args, **kwargs)
    prefix = f"{f.qualname}: "
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert all(line.startswith(prefix) for line in got)
    # Where the programs differ is `test_where.py`'s: here, what changed.
    return [_what(line.removeprefix(prefix)) for line in got]


CASES = {
    "static argument, old -> new": (
        ((X, "tanh"), {}),
        ((X, "relu"), {}),
        "compiling (1 cached): argument y changed 'tanh' -> 'relu'",
    ),
    "typed static argument": (
        ((X, 1), {}),
        ((X, True), {}),
        "compiling (1 cached): argument y changed 1 -> True",
    ),
    "keyword argument": (
        ((X,), {"z": 1}),
        ((X,), {"z": 2.0}),
        "compiling (1 cached): argument z changed 1 -> 2.0",
    ),
    "static field of a module argument": (
        ((X, P(X, (1,))), {}),
        ((X, P(X, (2,))), {}),
        "compiling (1 cached): static field 'y.xs' changed (1,) -> (2,)",
    ),
    "static field changes type": (
        ((X, P(X, 1.0)), {}),
        ((X, P(X, "a")), {}),
        "compiling (1 cached): static field 'y.xs' changed 1.0 -> 'a'",
    ),
    "static list field changes an item's type": (
        ((X, P(X, [1])), {}),
        ((X, P(X, [1.0])), {}),
        "compiling (1 cached): static field 'y.xs' changed [1] -> [1.0]",
    ),
    "a function in a static field, by its name": (
        ((X, P(X, _halve)), {}),
        ((X, P(X, _double)), {}),
        "compiling (1 cached): static field 'y.xs' changed _halve -> _double",
    ),
    "static dict field, nested": (
        ((X, P(X, {"a": [0.0]})), {}),
        ((X, P(X, {"a": [-0.0]})), {}),
        "compiling (1 cached): static field 'y.xs' changed {'a': [0.0]} -> {'a': [-0.0]}",
    ),
    "dtype of an array in a tuple of arrays": (
        ((X, (X, X)), {}),
        ((X, (X, X.astype(jnp.int32))), {}),
        "compiling (1 cached): argument y[1] dtype float32 -> int32",
    ),
    "length of a tuple of arrays": (
        ((X, (X, X)), {}),
        ((X, (X, X, X)), {}),
        "compiling (1 cached): argument y structure changed",
    ),
    "class of a module argument": (
        ((X, P(X, 1)), {}),
        ((X, Q(X)), {}),
        "compiling (1 cached): argument y class P -> Q",
    ),
    "item of a tuple": (
        ((X, (X, 1)), {}),
        ((X, (X, 2)), {}),
        "compiling (1 cached): argument y[1] changed 1 -> 2",
    ),
    "module inside a tuple": (
        ((X, (Q(X), P(X, "a"))), {}),
        ((X, (Q(X), P(X, "b"))), {}),
        "compiling (1 cached): static field 'y[1].xs' changed 'a' -> 'b'",
    ),
    "tuple length": (
        ((X, (X, 2)), {}),
        ((X, (X, 2, 3)), {}),
        "compiling (1 cached): argument y structure changed",
    ),
    "tuple -> list, its items unread once the structure differs": (
        ((X, (X, 2)), {}),
        ((X, [X, 3]), {}),
        "compiling (1 cached): argument y structure changed",
    ),
    "dict keys": (
        ((X, {"a": X}), {}),
        ((X, {"a": X, "b": 1}), {}),
        "compiling (1 cached): argument y structure changed",
    ),
    "traced -> static": (
        ((X, X), {}),
        ((X, 3.0), {}),
        "compiling (1 cached): argument y changed kind: traced -> static",
    ),
    "None -> module": (
        ((X, None), {}),
        ((X, Q(X)), {}),
        "compiling (1 cached): argument y changed kind: None -> module",
    ),
    "static -> sequence": (
        ((X, 1), {}),
        ((X, (X, X)), {}),
        "compiling (1 cached): argument y changed kind: static -> sequence",
    ),
    "static -> tuple with a static": (
        ((X, 1), {}),
        ((X, (X, 1)), {}),
        "compiling (1 cached): argument y changed kind: static -> sequence",
    ),
    "static -> dict": (
        ((X, 1), {}),
        ((X, {"a": X}), {}),
        "compiling (1 cached): argument y changed kind: static -> dict",
    ),
    "static -> pytree": (
        ((X, 1), {}),
        ((X, Pair(X, X)), {}),
        "compiling (1 cached): argument y changed kind: static -> named tuple",
    ),
    "shape": (
        ((X,), {}),
        ((jnp.ones(3),), {}),
        "compiling (1 cached): argument x shape (2,) -> (3,)",
    ),
    "dtype of a leaf in a dict": (
        ((X, {"a": X}), {}),
        ((X, {"a": X.astype(jnp.int32)}), {}),
        "compiling (1 cached): argument y['a'] dtype float32 -> int32",
    ),
    "weak type": (
        ((jnp.asarray(1.0),), {}),
        ((jnp.asarray(1.0, jnp.float32),), {}),
        "compiling (1 cached): argument x weak type True -> False",
    ),
    "structure, and a shape below it": (
        ((X, {"a": X}), {}),
        ((X, {"a": jnp.ones(3), "b": 1}), {}),
        "compiling (1 cached): argument y structure changed",
    ),
    "a static value and a shape": (
        ((X, (X, 1)), {}),
        ((jnp.ones(3), (X, 2)), {}),
        "compiling (1 cached): argument y[1] changed 1 -> 2; argument x shape (2,) -> (3,)",
    ),
    "an item of `*rest`, as the body reads it": (
        ((X, 1, 2), {}),
        ((X, 1, 3), {}),
        "compiling (1 cached): argument rest[0] changed 2 -> 3",
    ),
    "an item of a named tuple, by its name": (
        ((X, Pair(X, 1)), {}),
        ((X, Pair(X, 2)), {}),
        "compiling (1 cached): argument y.b changed 1 -> 2",
    ),
    "number of positional arguments": (
        ((X, 1), {}),
        ((X, 1, 2), {}),
        "compiling (1 cached): argument rest structure changed",  # `*rest`
    ),
}


def test_a_positional_argument_is_named_as_the_body_reads_it_never_as_a_field(caplog):
    """`f(x, *args)`, `jax.vmap(g)` (whose own signature is `*args, **kwargs`) and a
    parameter named `args`: the value the call changed is "argument args[1]", as
    the function's body (or the wrapper's) indexes it, and the storm advice says
    it is an argument; a field is only ever a module's."""

    def star(x, *args):
        return x * args[1]

    def named(x, args):
        return x * args[1]

    def g(x, a, n):
        return x * a * n

    lines = {}
    for name, fn, first in [
        ("star", star, lambda n: (X, 1.0, n)),
        ("named", named, lambda n: (X, (1.0, n))),
        ("vmap", jax.vmap(g, in_axes=(0, None, None)), lambda n: (X, 1.0, n)),
    ]:
        f = es.jit(fn, warn_after=2)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="eqx_static"):
            for n in (2.0, 3.0, 4.0):
                f(*first(n))
        lines[name] = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    expected = {"star": "args[1]", "named": "args[1]", "vmap": "args[2]"}
    for name, path in expected.items():
        info = lines[name][0]
        (storm,) = [line for line in lines[name] if "has compiled" in line]
        assert f": argument {path} changed 2.0 -> 3.0;" in info, lines[name]
        assert "field '" not in info, info
        assert f"{path!r} is a Python value passed as an argument" in storm, storm


def test_a_static_list_changed_in_place_is_named_old_to_new(caplog):
    """The line shows the value the key was made from (a copy), not the list as it
    is now."""
    y = P(X, [1, 2])
    f = _fresh()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        f(X, y)
        y.xs[1] = 2.0
        f(X, y)
    got = [_what(r.getMessage()) for r in caplog.records if r.name == "eqx_static"]
    assert got == [
        f"{f.qualname}: compiling (1 cached): static field 'y.xs' changed "
        "[1, 2] -> [1, 2.0]"
    ]


def test_of_equally_close_signatures_the_most_recent_explains(caplog):
    assert _explanations(caplog, ((X, "a"), {}), ((X, "b"), {}), ((X, "c"), {})) == [
        "compiling (1 cached): argument y changed 'a' -> 'b'",
        "compiling (2 cached): argument y changed 'b' -> 'c'",
    ]


def test_a_key_evicted_by_maxsize_no_longer_explains_a_miss(caplog):
    """With `maxsize=1`, each new key evicts the one before: a miss is explained
    against the key held, never against one evicted, even one closer to it."""
    f, x3 = _fresh().fn, jnp.ones(3, jnp.float32)
    jf = es.jit(maxsize=1)(f)
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        for args in [(X, "a"), (X, "b"), (x3, "a")]:  # "b" evicts "a"
            jf(*args)
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert [_what(line.removeprefix(f"{jf.qualname}: ")) for line in got] == [
        "compiling (1 cached): argument y changed 'a' -> 'b'",
        "compiling (1 cached): argument y changed 'b' -> 'a'; "
        "argument x shape (2,) -> (3,)",
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_compile_line_names_the_change_old_to_new(caplog, case):
    first, second, line = CASES[case]
    assert _explanations(caplog, first, second) == [line]


class Inner(es.Module):
    s: int = eqx.field(static=True)


def _classes() -> tuple[type, type]:
    """A model class with its own compiled method (so its own cache), and a
    subclass of it."""

    class Model(es.Module):
        w: jax.Array
        inner: Inner
        act: str = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            seen = repr((self.act, self.inner.s, type(self).__name__))
            return self.w * x + jnp.float32(zlib.crc32(seen.encode()) % 2**20)

    class Sub(Model):
        pass

    return Model, Sub


@pytest.mark.parametrize(
    "second, line",
    [
        (
            lambda m, sub: m.with_static(act="relu"),
            "static field 'act' changed 'tanh' -> 'relu'",
        ),
        (
            lambda m, sub: m.with_static(**{"inner.s": 2}),
            "static field 'inner.s' changed 1 -> 2",
        ),
        (lambda m, sub: m.with_dynamic(w=jnp.ones(2)), "field 'w' shape () -> (2,)"),
        (
            lambda m, sub: sub(m.w, m.inner, m.act),
            "class _classes.<locals>.Model -> _classes.<locals>.Sub",
        ),
    ],
)
def test_the_compile_line_of_a_method_names_fields_of_self(caplog, second, line):
    model, sub = _classes()
    m = model(jnp.array(1.0, jnp.float32), Inner(1), "tanh")
    n = second(m, sub)
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        m(X)
        n(X)
    got = [_what(r.getMessage()) for r in caplog.records if r.name == "eqx_static"]
    name = f"{type(n).__qualname__}.__call__"
    assert got == [f"{name}: compiling (1 cached): {line}"]


class _Unhashable:
    __hash__ = None  # pyright: ignore[reportAssignmentType]


@pytest.mark.parametrize(
    "args, kwargs, culprit",
    [
        ((X, {1, 2}), {}, "y, a set"),
        ((X,), {"z": {1}}, "z, a set"),
        ((X, (1, [2, {3}])), {}, "y[1][1], a set"),
        ((X, ({3}, 1)), {}, "y[0], a set"),  # not the hashable 1
        ((X, (1, "a", {3}, 2.0)), {}, "y[2], a set"),
    ],
)
def test_an_unhashable_static_value_is_named(args, kwargs, culprit):
    f = _fresh()
    message = (
        f"`{f.qualname}` got {culprit}, which is not hashable. A non-array argument "
        "is static: it keys the compilation cache, as under `eqx.filter_jit`, so it "
        "must be hashable. Pass a frozenset instead: `"
    )
    with pytest.raises(TypeError) as info:
        f(*args, **kwargs)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    "value, fix",
    [
        ({1}, "a frozenset instead: `y=frozenset(...)`"),
        (_Unhashable(), "a hashable value instead, or an array if it is data"),
    ],
    ids=["set", "other"],
)
def test_an_unhashable_static_value_is_told_the_fix_for_its_type(value, fix):
    f = _fresh()
    with pytest.raises(TypeError) as info:
        f(X, value)
    assert str(info.value) == (
        f"`{f.qualname}` got y, a {type(value).__name__}, which is not "
        "hashable. A non-array argument is static: it keys the compilation cache, as "
        f"under `eqx.filter_jit`, so it must be hashable. Pass {fix}."
    )


class Gated(es.Module):
    a: jax.Array
    b: jax.Array
    c: jax.Array


class Scale(eqx.Module):
    """A callable pytree: its own leaves are traced before the arguments'."""

    s: jax.Array
    t: jax.Array

    def __call__(self, m, x):
        y = self.s * m.a * x + self.t * m.c
        if m.b > 0:  # a traced field where Python needs a bool
            return y
        return -y


@pytest.mark.parametrize("how", ["wrapped pytree", "module argument"])
def test_traced_field_error_names_the_field_behind_the_leaf(how):
    m = Gated(jnp.array(1.0), jnp.array(2.0), jnp.array(3.0))
    scale = Scale(jnp.array(2.0), jnp.array(1.0))
    if how == "wrapped pytree":
        f, args, path = es.jit(scale), (m, X), "m.b"
    else:
        f = es.jit(lambda scale, m, x: scale(m, x))
        args, path = (scale, m, X), "m.b"
    with pytest.raises(es.TracedFieldError) as info:
        f(*args)
    message = str(info.value)
    assert f"used the traced field 'b' of `Gated` (at {path})" in message
    assert isinstance(info.value, jax.errors.TracerBoolConversionError)


@pytest.mark.sharing
def test_a_key_that_reuses_a_program_says_so(caplog):
    class Tagged(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x

    with caplog.at_level(logging.INFO, logger="eqx_static"):
        w = jnp.float32(2.0)
        Tagged(w, "a")(X)
        Tagged(w, "b")(X)
        Tagged(w, "b")(jnp.ones(3))
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    name = f"{Tagged.__qualname__}.__call__"
    assert got == [
        f"{name}: traced (1 cached): static field 'tag' changed 'a' -> "
        "'b'; same program as compile 1, not compiled again",
        f"{name}: compiling (2 cached): argument x shape (2,) -> (3,)",
    ]


class _Weight(eqx.Module):
    w: jax.Array

    def __call__(self, x):
        return (self.w * x).sum()


def test_a_key_first_traced_under_a_transformation_says_so(caplog):
    """A new key under `jax.grad` is traced into the outer program (nothing of its
    own compiles): its line says so, with what changed from the closest key."""
    f = _fresh()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        f(X, "a")
        jax.grad(lambda x: f(x, "b").sum())(X)
        jax.grad(lambda x: f(x, "b").sum())(jnp.ones(3))
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    line = f"{f.qualname}: traced under a transformation (1 cached): argument y "
    assert got == [
        line + "changed 'a' -> 'b'",
        line + "changed 'a' -> 'b'; argument x shape (2,) -> (3,)",
    ]
    caplog.clear()
    model = es.jit(_Weight(jnp.float32(2.0)))  # the function's own leaf comes first
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        model(X)
        jax.grad(model)(jnp.ones(3))
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert got == [
        "_Weight.__call__: traced under a transformation (1 cached): argument x "
        "shape (2,) -> (3,)"
    ]


# --- the log line of a method ------------------------------------------------------


@pytest.fixture
def explanations(caplog):
    """The messages logged on `eqx_static` at INFO and above while the test runs."""
    caplog.set_level(logging.INFO, logger="eqx_static")

    def messages() -> list[str]:
        return [
            _what(r.getMessage())
            for r in caplog.records
            if r.name == "eqx_static" and r.levelno == logging.INFO
        ]

    return messages


# The README's classes, named plainly (`Child.__call__`) in the log lines.
_SEED = seed()
Parent, Child, OtherChild = _SEED.Parent, _SEED.Child, _SEED.OtherChild


@pytest.fixture
def seed_log(explanations):
    Parent.__call__.cache_clear()
    yield explanations
    Parent.__call__.cache_clear()


def test_explanation_static_field_changed(seed_log):
    c, x = Child(dp=2.0, sp=False, dc=3.0, sc=False), jnp.array(1.0)
    c(x), c(x)
    assert seed_log() == []  # the first miss says nothing; hits say nothing
    c = c.with_static(sp=True)
    c(x), c(x)
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): static field 'sp' changed False -> True"
    ]
    c.with_dynamic(dp=5.0, dc=1.0)(x)
    assert len(seed_log()) == 1


def test_explanation_argument_shape(seed_log):
    c = Child(dp=2.0, sp=False, dc=3.0, sc=False)
    c(jnp.ones(3))
    c(jnp.ones(4))
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): argument x shape (3,) -> (4,)"
    ]


def test_explanation_class(seed_log):
    x = jnp.array(1.0)
    Child(dp=2.0, sp=False, dc=3.0, sc=False)(x)
    assert OtherChild(dp=2.0, sp=False, dc=3.0, sc=False)(x) == -1.0
    assert seed_log() == [
        "OtherChild.__call__: compiling (1 cached): class Child -> OtherChild"
    ]


def test_explanation_picks_the_closest_entry_and_counts_entries(seed_log):
    x = jnp.array(1.0)
    c = Child(dp=2.0, sp=False, dc=3.0, sc=False)
    c(x)
    c.with_static(sp=True)(x)
    c.with_static(sp=True, sc=True)(x)  # closest: sp=True, sc=False
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): static field 'sp' changed False -> True",
        "Child.__call__: compiling (2 cached): static field 'sc' changed False -> True",
    ]


def test_explanation_field_dtype_and_weak_type(explanations):
    class W(es.Module):
        w: Any

        @es.jit
        def __call__(self):
            return self.w * 2

    W(jnp.asarray(2.0))()  # weakly typed
    W(2.0)()  # a stored number: float32, strongly typed
    W(jnp.array(2.0, jnp.float16))()
    lines = explanations()
    assert len(lines) == 2
    assert "W.__call__: compiling (1 cached): " in lines[0]
    assert "field 'w' weak type True -> False" in lines[0]
    assert "field 'w' dtype float32 -> float16" in lines[1]


def test_explanation_nested_static_field(explanations):
    class Enc(es.Module):
        act: str = eqx.field(static=True)

    class Model(es.Module):
        enc: Enc

        @es.jit
        def __call__(self, x):
            return jnp.tanh(x) if self.enc.act == "tanh" else x

    x = jnp.array(1.0)
    Model(Enc("id"))(x)
    Model(Enc("tanh"))(x)
    (line,) = explanations()
    assert "static field 'enc.act' changed 'id' -> 'tanh'" in line


def test_no_explanation_below_info(caplog):
    caplog.set_level(logging.WARNING, logger="eqx_static")
    s = seed()
    c, x = s.Child(dp=2.0, sp=False, dc=3.0, sc=False), jnp.array(1.0)
    c(x)
    c.with_static(sp=True)(x)
    lines = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert not [line for line in lines if "compiling" in line]
    assert s.Child.__call__.cache_info().misses == 2


@pytest.mark.parametrize("reader", ["nothing", "info", "max_compiles", "storm"])
def test_a_program_s_operations_are_recorded_only_if_something_reads_them(
    monkeypatch, caplog, reader
):
    """Each operation's digest (`ops_of`, the constants' bytes hashed) is computed
    at a compile only for the INFO line, a budget, or a storm watch near its
    threshold (from compile `warn_after // 2` on): no compile of a function
    without them records any; each compile with them does (the storm watch of
    `warn_after=4` from compile 2 on)."""
    from eqx_static import _report

    ops_of, at = _report.ops_of, set()  # at: compiles made before each record

    def spy(*args: Any) -> Any:
        at.add(f.compile_info().compiles)
        return ops_of(*args)

    monkeypatch.setattr(_report, "ops_of", spy)
    caplog.set_level(
        logging.INFO if reader == "info" else logging.WARNING, "eqx_static"
    )
    options: dict[str, Any] = {
        "warn_after": {"nothing": None, "storm": 4}.get(reader, 8)
    }
    if reader == "max_compiles":
        options["max_compiles"] = 3

    @es.jit(**options)
    def f(x, n):
        return x * n

    for n in range(3):
        assert f(X, n).tolist() == (X * n).tolist()
    assert at == {"nothing": set(), "storm": {1, 2}}.get(reader, {0, 1, 2})
    if reader == "nothing":  # the default storm watch, far from its threshold too
        f = es.jit(lambda x, n: x * n)
        f(X, 1)
        assert not at


X3 = jnp.ones(3)


# A placement by partition spec, on the one device every machine has.
_ROW = jax.sharding.NamedSharding(
    jax.sharding.Mesh(jax.devices()[:1], ("i",)), jax.sharding.PartitionSpec("i")
)


class _Weighted(es.Module):
    w: jax.Array

    @es.jit
    def __call__(self, x):
        return self.w.astype(x.dtype) * x


@pytest.mark.parametrize(
    "first, second, line",
    [
        (
            (jnp.ones(3), X3),
            (jnp.ones(3, jnp.int32), X3),
            "field 'w' dtype float32 -> int32",
        ),
        (
            (jnp.ones(3), X3),
            (jnp.ones(4), jnp.ones(4)),
            "field 'w' shape (3,) -> (4,); argument x shape (3,) -> (4,)",
        ),
        (
            (jnp.ones(3), X3),
            (jnp.ones(3), X3.astype(jnp.float16)),
            "argument x dtype float32 -> float16",
        ),
        (
            (jnp.float32(1.0), X3),
            (jnp.asarray(1.0), X3),
            "field 'w' weak type False -> True",
        ),
        (
            (jnp.ones(3), X3),
            (jax.device_put(jnp.ones(3), jax.devices()[0]), X3),
            f"field 'w' sharding uncommitted -> {jax.devices()[0]!r}",  # JAX's repr
        ),
        (
            (jnp.ones(3), X3),
            (jnp.ones(3), jax.device_put(X3, _ROW)),
            f"argument x sharding uncommitted -> {_ROW.spec!r}",  # JAX's repr
        ),
    ],
    ids=[
        "field dtype",
        "field shape",
        "argument dtype",
        "weak type",
        "placement on a device",
        "placement by a partition spec",
    ],
)
def test_a_traced_leaf_s_change_is_named(caplog, first, second, line):
    """A traced leaf's change of shape, dtype or weak type, as the field (or
    argument) that holds it; each leaf that changed."""
    _Weighted.__call__.cache_clear()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        _Weighted(first[0])(first[1])
        _Weighted(second[0])(second[1])
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert [_what(g) for g in got] == [
        f"_Weighted.__call__: compiling (1 cached): {line}"
    ]


class _Wrapper(es.Module):
    fn: Any = eqx.field(static=True)

    @property
    def __wrapped__(self) -> Any:
        return self.fn

    @es.jit
    def __call__(self, x):
        return self.fn(x)


@pytest.mark.sharing
def test_a_module_s_wrapper_attributes_are_named(caplog):
    """`eqx.module_update_wrapper` copies the wrapped function's name and docstring
    onto the instance: keyed as Equinox flattens them, and named as the module's
    extra attributes (of `self`, or of an argument)."""
    _Wrapper.__call__.cache_clear()
    plain = _Wrapper(jnp.negative)
    wrapped = eqx.module_update_wrapper(plain)
    f = es.jit(lambda w, x: w.fn(x))
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        plain(X)
        wrapped(X)
        f(plain, X)
        f(wrapped, X)
    got = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    same = "; same program as compile 1, not compiled again"
    assert got == [
        f"_Wrapper.__call__: traced (1 cached): self extra attributes changed{same}",
        f"{f.qualname}: traced (1 cached): argument w extra attributes changed{same}",
    ]
    # A program that reads them: a change of structure, and its fix names the argument.
    g = es.jit(lambda w, x: w.fn(x) + len(getattr(w, "__name__", "")), max_compiles=1)
    g(plain, X)
    with pytest.raises(es.RecompileError) as e:
        g(wrapped, X)
    assert str(e.value).startswith(
        f"{g.qualname}: compile 2 exceeds `max_compiles=1`: argument w extra "
        "attributes changed; the programs differ only in a constant, at "
    )
    assert str(e.value).endswith(
        "\nKeep the structure of 'w' the same from call to call. "
        "(If these compiles are expected, raise `max_compiles`.)"
    )


def test_a_change_of_value_is_named_before_a_change_of_jax_s_configuration(caplog):
    """A new value under another configuration: the value is named (the
    configuration is named only when nothing else changed)."""

    @es.jit
    def draw(key, n):
        return jax.random.uniform(key, (n,))

    key = jax.random.key(0)
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        draw(key, 2)
        with jax.threefry_partitionable(not jax.config.jax_threefry_partitionable):
            draw(key, 3)
    got = [_what(r.getMessage()) for r in caplog.records if r.name == "eqx_static"]
    assert got == [f"{draw.qualname}: compiling (1 cached): argument n changed 2 -> 3"]


class _Scaled(eqx.Module):
    w: jax.Array

    def __call__(self, x, y):
        return self.w.sum() * x + y.sum()


def test_a_module_as_the_function_pairs_its_arguments_by_name(caplog):
    """`es.jit(model)`, as `eqx.filter_jit(model)` is used: the model's own leaves
    come first, and the arguments' leaves are paired after them."""
    f = es.jit(_Scaled(jnp.ones(2)))
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        f(jnp.ones(3), jnp.ones(3))
        f(jnp.ones(5), jnp.ones(3))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert line.endswith("(1 cached): argument x shape (3,) -> (5,)")


def test_one_change_seen_through_an_optimiser_s_copies_is_named_once(caplog):
    """In the usual `make_step(model, opt_state, ...)` with adam, one width change
    shows in the model and in both moment copies of it: each difference is named
    once, at the model's path, "and the same under opt_state[0].mu and
    opt_state[0].nu" (adam's `ScaleByAdamState`, a named tuple, by its names)."""
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-3)

    @es.jit
    def make_step(model, opt_state, x):
        grads = eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(x)))(model)
        updates, opt_state = opt.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state

    x = jnp.ones((3, 2))
    with (
        caplog.at_level(logging.INFO, logger="eqx_static"),
        jax.numpy_dtype_promotion("standard"),  # optax's own arithmetic
    ):
        for width in (4, 6):
            model = eqx.nn.MLP(2, 1, width, 1, key=jax.random.key(0))
            make_step(model, opt.init(eqx.filter(model, eqx.is_array)), x)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    copies = "(and the same under opt_state[0].mu and opt_state[0].nu)"
    assert line.count(copies) == line.count(";") + 1 == 6
    assert f"field 'model.layers[0].weight' shape (4, 2) -> (6, 2) {copies}" in line
    assert "'opt_state" not in line  # named at the model's path only


def test_a_trace_under_a_transformation_is_named_after_the_class_called(seed_log):
    x = jnp.array(1.0)
    Child(dp=2.0, sp=False, dc=3.0, sc=False)(x)
    jax.grad(lambda c: c(x))(Child(dp=2.0, sp=True, dc=3.0, sc=False))
    assert seed_log() == [
        "Child.__call__: traced under a transformation (1 cached): static field "
        "'sp' changed False -> True"
    ]
