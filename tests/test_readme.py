"""The README's claims about behaviour (issue #15, "A README you can trust"),
checked against the installed JAX, Equinox and peers.

- Every ```python block of the README runs, in order, in one namespace; a line
  `print(...)  # TEXT` must print TEXT; a comment `# INFO:eqx_static:MESSAGE` (or
  WARNING) must be logged by the block it is in; a ```text block after the marker
  `<!-- output -->` is what the block before it prints.
- Each claim the README names this file for has its own test below.
"""

import contextlib
import functools
import gc
import importlib.util
import io
import logging
import re
import weakref
from pathlib import Path

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
_FENCE = re.compile(
    r"(?:^(?P<marker><!-- [^>]*-->)\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
_PRINTED = re.compile(r"^\s*print\(.*\)\s+# (?P<text>.*)$")
_LOGGED = re.compile(r"^\s*# (?P<level>INFO|WARNING):eqx_static:(?P<message>.*)$")


def _fences() -> list[tuple[str | None, str, str]]:
    return [(m["marker"], m["lang"], m["code"]) for m in _FENCE.finditer(README)]


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}:{record.name}:{record.getMessage()}")


def _run(code: str, namespace: dict, name: str) -> tuple[str, list[str]]:
    """Run `code`; return what it printed and what it logged on "eqx_static"."""
    records = _Records()
    logger = logging.getLogger("eqx_static")
    logger.addHandler(records)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), namespace)
    finally:
        logger.removeHandler(records)
        logger.setLevel(logging.NOTSET)
    return out.getvalue(), records.lines


def _check_comments(code: str, printed: str, logged: list[str], name: str) -> None:
    expected = [m["text"] for m in map(_PRINTED.match, code.splitlines()) if m]
    if expected:
        assert printed.splitlines() == expected, f"{name}: printed {printed!r}"
    for m in filter(None, map(_LOGGED.match, code.splitlines())):
        line = f"{m['level']}:eqx_static:{m['message']}"
        assert line in logged, f"{name}: {line!r} was not logged; got {logged}"


def test_quickstart_prints_what_its_comments_say():
    """The printed `repr` and `CacheInfo(...)` in the quickstart's comments."""
    fences = [f for f in _FENCE.finditer(_section("Quickstart")) if f["lang"]]
    (code,) = [f["code"] for f in fences if f["lang"] == "python"]
    assert "CacheInfo(hits=" in code
    printed, logged = _run(code, {"__name__": "__readme__"}, "<README quickstart>")
    _check_comments(code, printed, logged, "quickstart")


def test_readme_blocks_run():
    namespace: dict = {"__name__": "__readme__"}
    previous_output = None
    for i, (marker, lang, code) in enumerate(_fences()):
        if lang == "python":
            name = f"<README python block {i}>"
            printed, logged = _run(code, namespace, name)
            _check_comments(code, printed, logged, name)
            previous_output = printed
        elif lang == "text" and marker == "<!-- output -->":
            assert previous_output is not None
            assert previous_output.strip() == code.strip()


class Stormy(es.Module):
    lr: float = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.lr * x


def test_storm_warning_is_the_one_shown():
    (text,) = [c for m, lang, c in _fences() if m == "<!-- output: storm -->"]

    def calls():
        for i in range(10):
            Stormy(0.1 * (i + 1))(jnp.array(1.0))

    _, logged = _run("calls()", {"calls": calls}, "<storm>")
    warnings = [s for s in logged if s.startswith("WARNING:")]
    assert len(warnings) == 1
    seconds = re.compile(r"\(\d+\.\d+ s spent")
    assert seconds.sub("(T s spent", warnings[0]) == seconds.sub(
        "(T s spent", text.strip()
    )


# --- The one rule -------------------------------------------------------------------


class Child(es.Module):
    dp: float
    sp: bool = eqx.field(static=True)


def test_repr_shows_stored_numbers_as_numbers():
    c = Child(dp=2.0, sp=False)
    assert isinstance(c.dp, jax.Array) and c.dp.shape == ()
    assert repr(c) == "Child(dp=2.0, sp=False)"


# --- Comparison table ----------------------------------------------------------------


def _traces_for_float_values(jit, base=eqx.Module):
    traces = [0]

    class M(base):
        a: float

    @jit
    def f(m, x):
        traces[0] += 1
        return m.a * x

    for v in (1.0, 2.0, 3.0):
        f(M(v), jnp.ones(()))
    return traces[0]


def test_a_python_float_field_recompiles_under_filter_jit_but_not_here():
    """In an `eqx.Module` a Python float is a static leaf for both wrappers; an
    `es.Module` stores it as an array, so neither recompiles for a new value."""
    assert _traces_for_float_values(eqx.filter_jit) == 3
    assert _traces_for_float_values(es.jit) == 3
    assert _traces_for_float_values(eqx.filter_jit, es.Module) == 1
    assert _traces_for_float_values(es.jit, es.Module) == 1


def test_static_1_true_1point0():
    """Under `jax.jit` and `eqx.filter_jit`, static `1`, `True` and `1.0` share an
    entry (the first one's `int32`); `es.jit` keys them by type."""

    class M(eqx.Module):
        n: object = eqx.field(static=True)

    def dtypes(jit):
        f = jit(lambda m: jnp.asarray(m.n))
        return [f(M(v)).dtype for v in (1, True, 1.0)]

    assert dtypes(jax.jit) == [jnp.int32] * 3
    assert dtypes(eqx.filter_jit) == [jnp.int32] * 3
    assert dtypes(es.jit) == [jnp.int32, jnp.bool_, jnp.float32]


def _needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"needs `{module}`"
    )


@_needs("flax")
def test_flax_struct_column():
    from flax import struct

    @struct.dataclass
    class S:
        a: float
        n: object = struct.field(pytree_node=False, default=0)

    traces = [0]

    @jax.jit
    def f(s, x):
        traces[0] += 1
        return s.a * x

    for v in (1.0, 2.0, 3.0):
        f(S(v), jnp.ones(()))
    assert traces[0] == 1
    g = jax.jit(lambda s: jnp.asarray(s.n))
    assert [g(S(0.0, v)).dtype for v in (1, True, 1.0)] == [jnp.int32] * 3


@_needs("jax_dataclasses")
def test_jax_dataclasses_column():
    import jax_dataclasses as jdc

    @jdc.pytree_dataclass
    class J:
        a: float
        n: jdc.Static[object] = 0

    traces = [0]

    @jax.jit
    def f(s, x):
        traces[0] += 1
        return s.a * x

    for v in (1.0, 2.0, 3.0):
        f(J(v), jnp.ones(()))
    assert traces[0] == 1
    g = jax.jit(lambda s: jnp.asarray(s.n))
    assert [g(J(0.0, v)).dtype for v in (1, True, 1.0)] == [jnp.int32] * 3


@_needs("flax")
def test_nnx_column():
    """A Python float in a plain attribute is static (3 compiles); a `jax.Array` in
    a plain attribute is data (1 compile), without `nnx.Variable`."""
    from flax import nnx

    class M(nnx.Module):
        def __init__(self, a):
            self.a = a

    traces = [0]

    @nnx.jit
    def f(m, x):
        traces[0] += 1
        return m.a * x

    for v in (1.0, 2.0, 3.0):
        f(M(v), jnp.ones(()))
    assert traces[0] == 3
    for v in (1.0, 2.0, 3.0):
        f(M(jnp.asarray(v)), jnp.ones(()))
    assert traces[0] == 4

    @nnx.jit
    def g(m):
        return jnp.asarray(m.a)

    assert [g(M(v)).dtype for v in (1, True, 1.0)] == [jnp.int32] * 3


# --- How the cache works --------------------------------------------------------------


def test_a_static_value_is_hashed_once_per_object():
    hashes = [0]

    class Config:
        def __hash__(self):
            hashes[0] += 1
            return 0

        def __eq__(self, other):
            return isinstance(other, Config)

    class M(es.Module):
        w: jax.Array
        config: Config = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(jnp.ones(3), Config())
    m(jnp.ones(3))
    before = hashes[0]
    for _ in range(5):
        jax.tree.map(lambda a: a + 0, m)(jnp.ones(3))  # a new instance each call
    assert hashes[0] == before
    assert M.__call__.cache_info().misses == 1


# --- One compile per distinct program -------------------------------------------------


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


# --- Guarantees: what stays alive -------------------------------------------------------


class _Callback:
    """A static value that references an array (weakly referenceable)."""

    def __init__(self, arr):
        self.arr = arr

    def __call__(self, x):
        return x


def test_a_static_value_lives_until_cache_clear():
    class M(es.Module):
        w: jax.Array
        fn: object = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.fn(self.w * x)

    fn = _Callback(np.ones(3))
    ref = weakref.ref(fn)
    m = M(jnp.ones(3), fn)
    m(jnp.ones(3))
    module_ref = weakref.ref(m)
    del m, fn
    gc.collect()
    assert module_ref() is None  # the module is not kept
    assert ref() is not None  # the static value is, by the cache entry
    M.__call__.cache_clear()
    gc.collect()
    assert ref() is None


def test_a_partial_in_a_static_field_is_kept_until_cache_clear():
    class M(es.Module):
        w: jax.Array
        fn: object = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.fn(self.w * x)

    fn = functools.partial(_Callback(np.ones(3)))  # references an array
    ref = weakref.ref(fn.func)
    M(jnp.ones(3), fn)(jnp.ones(3))
    del fn
    gc.collect()
    assert ref() is not None
    M.__call__.cache_clear()
    gc.collect()
    assert ref() is None


def test_the_memo_does_not_outlive_the_module():
    class M(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(jnp.arange(3.0))
    m(jnp.ones(3))
    m(jnp.ones(3))  # a hit, from the memo
    leaf = weakref.ref(m.w)
    del m
    gc.collect()
    assert leaf() is None


def test_mutating_a_module_in_place_is_not_seen():
    """Frozen means frozen: the memo keeps the leaves that the first call saw."""

    class M(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(jnp.ones(3))
    m(jnp.ones(3))
    object.__setattr__(m, "w", jnp.zeros(3))
    np.testing.assert_array_equal(m(jnp.ones(3)), np.ones(3))  # stale
    np.testing.assert_array_equal(M(m.w)(jnp.ones(3)), np.zeros(3))
