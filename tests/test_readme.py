"""The README's text: every ```python block runs, in order, in one namespace; a line
`print(...)  # TEXT` must print TEXT; a comment `# INFO:eqx_static:MESSAGE` (or
WARNING) must be logged by the block it is in; a ```text block after the marker
`<!-- output -->` is what the block before it prints; and the comparison table's
columns hold for the peers it names (flax, jax_dataclasses), where installed."""

import contextlib
import importlib.util
import io
import logging
import re
from pathlib import Path

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
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
    """Run `code` as the file `model.py` (the name the log lines show, as where the
    programs differ); return what it printed and what it logged on "eqx_static"."""
    records = _Records()
    logger = logging.getLogger("eqx_static")
    logger.addHandler(records)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "model.py", "exec"), namespace)
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
    where = re.compile(r"test_readme\.py:\d+")  # `Stormy` is defined here
    got = where.sub("model.py:5", seconds.sub("(T s spent", warnings[0]))
    assert got == seconds.sub("(T s spent", text.strip())


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


_MODULE_ROW = re.compile(r"^\| `(?P<name>[\w.]+\.py)` \|", re.M)


def test_module_map_is_current():
    """ "How it is built" lists every module of the package, and names only test
    files that exist. (Its line counts are written by `tools/house.py`.)"""
    section = _section("How it is built")
    package = Path(es.__file__).parent
    rows = {m["name"] for m in _MODULE_ROW.finditer(section)}
    assert rows == {p.name for p in package.glob("*.py")}
    tests = Path(__file__).parent
    for name in set(re.findall(r"`(test_\w+\.py)`", section)):
        assert (tests / name).exists(), name
