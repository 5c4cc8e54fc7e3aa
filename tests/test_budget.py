"""Compile budgets: `es.jit(max_compiles=N)` raises before the XLA compile past
the budget, and the storm warning says which field keeps changing and what to do
about it. Both count XLA compiles: a key whose program is the same as one already
compiled costs a trace and spends no budget."""

import contextlib
import inspect
import logging
import re
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from helpers import XlaCompiles


X = jnp.array([0.5, -1.0, 2.0])


# --- max_compiles -------------------------------------------------------------------


class Budgeted(es.Module):
    n: int = eqx.field(static=True)

    @es.jit(max_compiles=2)
    def __call__(self, x):
        return x * self.n


def test_max_compiles_raises_on_the_next_compile_and_says_why():
    Budgeted.__call__.cache_clear()
    Budgeted(1)(X)
    Budgeted(2)(X)
    Budgeted(1)(X)  # a hit: within the budget
    compiles = XlaCompiles()
    with pytest.raises(es.RecompileError) as info:
        Budgeted(3)(X)
    message = str(info.value)
    assert "compile 3 exceeds `max_compiles=2`" in message
    assert "static field 'n' changed 1 -> 3" in message or "2 -> 3" in message
    assert "compile 1: first call" in message and "compile 2: n" in message
    assert compiles.count == 0  # raised before XLA compiled
    assert Budgeted.__call__.compile_info().compiles == 2
    assert Budgeted.__call__.cache_info().misses == 3  # it traced


@pytest.mark.sharing
def test_a_reused_program_spends_no_budget():
    class Tagged(es.Module):
        n: int = eqx.field(static=True)
        tag: str = eqx.field(static=True)  # never used: the same program

        @es.jit(max_compiles=1)
        def __call__(self, x):
            return x * self.n

    for tag in "abcdef":
        Tagged(2, tag)(X)
    assert Tagged.__call__.compile_info().compiles == 1
    with pytest.raises(es.RecompileError, match="static field 'n' changed 2 -> 3"):
        Tagged(3, "a")(X)


def test_disable_jit_spends_no_budget():
    """Under `jax.disable_jit()` the function runs eagerly, as `eqx.filter_jit`
    does: every call runs it (a miss), and nothing compiles."""

    @es.jit(max_compiles=1)
    def f(x):
        return 2 * x

    with jax.disable_jit():
        for _ in range(3):
            f(X)
    assert f.cache_info().misses == 3 and f.compile_info().compiles == 0
    f(X)
    assert f.compile_info().compiles == 1


def test_max_compiles_counts_new_shapes_too():
    @es.jit(max_compiles=1)
    def f(x):
        return 2 * x

    f(jnp.ones(2))
    with pytest.raises(es.RecompileError, match="argument x shape"):
        f(jnp.ones(3))


@pytest.mark.parametrize("option", ["max_compiles", "warn_after", "maxsize"])
@pytest.mark.parametrize("value", [0, -1])
def test_budget_options_are_checked(option, value):
    with pytest.raises(ValueError, match=f"`{option}` must be None or a positive int"):
        es.jit(lambda x: x, **{option: value})


def test_budget_options_reject_a_bool():
    """`True` is an `int` to Python, not a count: the library's own check says so
    (beartype, under the import hook, accepts it as an int)."""
    with pytest.raises(ValueError, match="`maxsize` must be None or a positive int"):
        es.jit(lambda x: x, maxsize=True)


# --- the storm warning --------------------------------------------------------------


def _stormy(warn_after: int | None = 8) -> type:
    class Stormy(es.Module):
        w: jax.Array
        scale: float = eqx.field(static=True)
        bias: float = eqx.field(static=True, default=0.0)

        @es.jit(warn_after=warn_after)
        def __call__(self, x):
            traces[0] += 1
            return self.w * x * self.scale + self.bias

    traces = [0]
    Stormy.traces = traces  # pyright: ignore[reportAttributeAccessIssue]
    return Stormy


def test_storm_warning_names_the_field_once(caplog):
    cls = _stormy()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(12):
            cls(w=jnp.ones(3), scale=float(i))(X)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "has compiled 8 times" in message and "'scale' changed every time" in message
    assert "s spent compiling" in message
    assert "The programs differ only in their constants" in message
    assert "Make 'scale' dynamic" in message
    assert cls.traces[0] == 12  # one per call: the warning traced nothing more


@pytest.mark.sharing
def test_storm_names_the_field_least_changed_in_misses_that_reused_a_program(caplog):
    """Two fields changed at each of the last compiles, both named on the line
    where the programs differ: the warning names the one that changed least often
    in misses that reused a program (`b` alone changed once, and shared), though
    `a` changed at more compiles (early ones, with `c`)."""

    class Three(es.Module):
        a: int = eqx.field(static=True)
        b: int = eqx.field(static=True)
        c: int = eqx.field(static=True)

        @es.jit(warn_after=4)
        def __call__(self, x):
            return x * self.a + self.c + 0 * self.b

    calls = [(1, 0, 0), (2, 0, 0), (2, 0, 1), (3, 0, 1), (3, 0, 2), (3, 1, 2)]
    calls += [(4, 2, 2), (5, 3, 2), (6, 4, 2)]  # a and b at each of the last three
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for a, b, c in calls:
            Three(a, b, c)(X)
    assert Three.__call__.compile_info().compiles == 8  # the sixth call shared
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'a' changed at each of the last 3 compiles" in warning, warning


def test_storm_warning_names_the_class_called(caplog):
    """A method jitted on a parent, called on a subclass: the warning names the
    subclass's method, as the compile lines do."""

    class Sub(_stormy()):
        pass

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(8):
            Sub(w=jnp.ones(3), scale=float(i))(X)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"{Sub.__qualname__}.__call__ has compiled 8 times")


def test_storm_warning_says_why_a_structural_field_must_stay_static(caplog):
    class Looped(es.Module):
        w: jax.Array
        n: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            for _ in range(self.n):  # a loop length: program structure
                x = self.w * x
            return x

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for n in range(9):
            Looped(w=jnp.ones(3), n=n)(X)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "The programs differ in their structure" in message
    assert "'n' picks program structure" in message and "must stay static" in message


def test_storm_warning_for_a_python_number_argument(caplog):
    @es.jit
    def scaled(x, factor):
        return x * factor

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(9):
            scaled(X, float(i))
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "'factor' changed every time" in message
    assert "The programs differ only in their constants" in message


def test_storm_warning_can_be_switched_off_or_brought_forward(caplog):
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        off = _stormy(warn_after=None)
        for i in range(10):
            off(w=jnp.ones(3), scale=float(i))(X)
        assert not caplog.records
        early = _stormy(warn_after=3)
        for i in range(3):
            early(w=jnp.ones(3), scale=float(i))(X)
    assert (
        len(caplog.records) == 1
        and "compiled 3 times" in caplog.records[0].getMessage()
    )


def test_no_storm_warning_when_different_things_change(caplog):
    cls = _stormy()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(12):  # alternately a new scale and a new bias
            cls(w=jnp.ones(3), scale=float((i + 1) // 2), bias=float(i // 2))(X)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


# --- the messages in full, one per kind of change -----------------------------------

_EXPECTED = "(If these compiles are expected, raise `max_compiles`.)"
_TRANSFORMED_FIX = (
    "An eager `jax.grad`, `jax.vmap` or `jax.checkpoint` compiles each transformed "
    "program: put the transformation under a `jax.jit`."
)


def _second_compile(name: str, what: str, fix: str) -> str:
    """The budget error, in full, of a second compile over `max_compiles=1`."""
    return (
        f"{name}: compile 2 exceeds `max_compiles=1`: {what}.\n"
        "Earlier compiles (what changed from the one before):\n"
        f"  compile 1: first call\n{fix} {_EXPECTED}"
    )


def _line_of(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    (i,) = [i for i, line in enumerate(lines) if text in line]
    return start + i


@es.jit(max_compiles=1)
def _by_shape(x):
    return 2 * x


@es.jit(max_compiles=1)
def _by_value(x, n):
    return x * n  # n as a value


@es.jit(max_compiles=1)
def _by_length(x, n):
    for _ in range(n):
        x = jnp.sin(x)  # n as a loop length
    return x


@es.jit(max_compiles=1)
def _by_structure(x):
    return sum(x)  # x as a tuple


def _where(fn: Any, marker: str, rest: str) -> str:
    return f"test_budget.py:{_line_of(fn.fn, marker)} in {fn.fn.__name__} {rest}"


@pytest.mark.parametrize(
    "fn, first, second, what, fix",
    [
        (
            _by_shape, (jnp.ones(2),), (jnp.ones(3),),
            lambda: "argument x shape (2,) -> (3,)",
            "'x' is an array whose shape, dtype or sharding keeps changing, and each "
            "new one is a new program: pad or bucket shapes to a few sizes.",
        ),
        (
            _by_value, (X, 1.0), (X, 2.0),
            lambda: "argument n changed 1.0 -> 2.0; the programs differ only in a "
            f"constant, at {_where(_by_value, '# n as a value', '(mul)')}",
            "'n' is a Python value passed as an argument: pass `jnp.asarray(v)` "
            "instead, and it is traced, with no compile per value.",
        ),
        (
            _by_length, (X, 1), (X, 2),
            lambda: "argument n changed 1 -> 2; the programs first differ at "
            f"{_where(_by_length, '# n as a loop length', '(sin, new)')}",
            "'n' picks program structure (an `if`, a loop length, a shape), so it "
            "must stay static: reduce the number of distinct values.",
        ),
        (
            _by_structure, ((X,),), ((X, X),),
            lambda: "argument x structure changed; the programs first differ at "
            f"{_where(_by_structure, '# x as a tuple', '(add, new)')}",
            "Keep the structure of 'x' the same from call to call.",
        ),
    ],
    ids=["shape", "value", "loop length", "structure"],
)  # fmt: skip
def test_the_budget_error_in_full(fn, first, second, what, fix):
    fn.cache_clear()
    fn(*first)
    with pytest.raises(es.RecompileError) as info:
        fn(*second)
    assert str(info.value) == _second_compile(fn.fn.__name__, what(), fix)


def test_the_budget_error_lists_each_compile_s_changes():
    @es.jit(max_compiles=3)
    def f(x, a, b):
        return x * a * b

    f(X, 1.0, 1.0)
    f(X, 2.0, 2.0)  # two things changed
    f(X, 2.0, 3.0)
    with pytest.raises(es.RecompileError) as info:
        f(X, 2.0, 4.0)
    lines = str(info.value).splitlines()
    assert lines[1:5] == [
        "Earlier compiles (what changed from the one before):",
        "  compile 1: first call",
        "  compile 2: a, b",
        "  compile 3: b",
    ]


@contextlib.contextmanager
def caplog_at_warning() -> Iterator[list[logging.LogRecord]]:
    """The WARNING records of "eqx_static" logged in the block."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("eqx_static")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _storm(caplog: pytest.LogCaptureFixture) -> str:
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    return re.sub(r"\(\d+\.\d\d s spent", "(… s spent", record.getMessage())


def test_the_storm_warnings_in_full(caplog):
    """For a field used as a value, a loop length, and a shape that keeps changing."""
    value = _stormy(warn_after=3)
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(3):
            value(w=jnp.ones(3), scale=float(i))(X)
    at = f"test_budget.py:{_line_of(value.__call__.fn, 'traces[0] += 1') + 1} in __call__"
    assert _storm(caplog) == (
        "_stormy.<locals>.Stormy.__call__ has compiled 3 times, and 'scale' changed "
        "every time (… s spent compiling). The programs differ only in their "
        f"constants (at {at} (mul)): 'scale' is only used as a value. Make 'scale' "
        "dynamic: drop `static=True`, and a number is stored as an array and traced, "
        "with no compile per value."
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for n in range(1, 4):
            es.jit(_by_length.fn, warn_after=3, max_compiles=None)(X, n)
    where = _where(_by_length, "# n as a loop length", "(sin, new)")
    assert _storm(caplog) == (
        "_by_length has compiled 3 times, and 'n' changed every time (… s spent "
        f"compiling). The programs differ in their structure, not only in constants "
        f"(at {where}). 'n' picks program structure (an `if`, a loop length, a "
        "shape), so it must stay static: reduce the number of distinct values."
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for n in range(1, 4):
            es.jit(_by_shape.fn, warn_after=3, max_compiles=None)(jnp.ones(n))
    assert _storm(caplog) == (
        "_by_shape has compiled 3 times, and 'x' changed every time (… s spent "
        "compiling). 'x' is an array whose shape, dtype or sharding keeps changing, "
        "and each new one is a new program: pad or bucket shapes to a few sizes."
    )


def test_the_budget_error_for_a_new_jax_configuration():
    @es.jit(max_compiles=1)
    def f(key):
        return jax.random.uniform(key, (3,))

    key = jax.random.key(0)
    f(key)
    with jax.threefry_partitionable(not jax.config.jax_threefry_partitionable):
        with pytest.raises(es.RecompileError) as info:
            f(key)
    assert str(info.value) == _second_compile(
        "test_the_budget_error_for_a_new_jax_configuration.<locals>.f",
        "JAX's configuration changed",
        "Keep JAX's configuration (`jax.config`, and context managers such as "
        "`jax.default_device`) the same from call to call.",
    )


def test_the_storm_window_is_the_last_compiles():
    """The warning needs the same field changed in each compile of the window (the
    last `warn_after`, the first one's own change not counted); a window with
    different changes does not stop a later one from warning, once."""
    cls = _stormy(warn_after=3)
    with caplog_at_warning() as records:
        for scale, bias in [(0, 0), (0, 1), (1, 1), (2, 1)]:  # bias, then scale
            cls(w=jnp.ones(3), scale=float(scale), bias=float(bias))(X)
        assert [r.getMessage().split(",")[0] for r in records] == [
            "_stormy.<locals>.Stormy.__call__ has compiled 4 times"
        ]
        for scale in range(3, 10):
            cls(w=jnp.ones(3), scale=float(scale), bias=1.0)(X)
        assert len(records) == 1  # once


def test_a_storm_over_two_compiles():
    cls = _stormy(warn_after=2)
    with caplog_at_warning() as records:
        for scale in (0, 1):
            cls(w=jnp.ones(3), scale=float(scale))(X)
    (record,) = records
    assert "has compiled 2 times, and 'scale' changed every time" in record.getMessage()


@pytest.mark.sharing
def test_the_storm_culprit_is_the_field_never_seen_changing_alone_for_free():
    """`a_tag` and `lr` change together in every compile; `a_tag` once also changed
    alone and the program was shared: it is not what makes programs differ."""

    class Tagged(es.Module):
        a_tag: int = eqx.field(static=True)
        lr: float = eqx.field(static=True)

        @es.jit(warn_after=3)
        def __call__(self, x):
            scale = self.lr
            return x * scale  # where the programs differ: neither field is named

    with caplog_at_warning() as records:
        Tagged(0, 0.0)(X)
        Tagged(1, 0.0)(X)  # a_tag alone: the same program
        for i in (2, 3, 4):
            Tagged(i, float(i))(X)
    (record,) = records
    assert "and 'lr' changed every time" in record.getMessage()


def _two_places(x, k):
    if k == 2:
        x = jnp.sin(x)  # k as a branch
    return x * k  # k as a value


def test_the_storm_warning_says_where_the_last_compile_differs(caplog):
    """The second compile differs from the first in a constant (`x * k`); the third,
    from its closest, in structure (`sin`): the warning names the last one's."""
    f = es.jit(_two_places, warn_after=3)
    f.cache_clear()  # the cache is the function's: a test run before may have filled it
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for k in range(3):
            f(X, k)
    where = f"test_budget.py:{_line_of(_two_places, '# k as a branch')} in _two_places"
    assert _storm(caplog) == (
        "_two_places has compiled 3 times, and 'k' changed every time (… s spent "
        "compiling). The programs differ in their structure, not only in constants "
        f"(at {where} (sin where mul was)). 'k' picks program structure (an `if`, a loop "
        "length, a shape), so it must stay static: reduce the number of distinct "
        "values."
    )


def test_the_budget_error_for_a_new_call_signature():
    @es.jit(max_compiles=1)
    def total(*xs):
        return sum(xs)  # xs as a tuple

    total(X)
    with pytest.raises(es.RecompileError) as info:
        total(X, X)
    where = f"test_budget.py:{_line_of(total.fn, '# xs as a tuple')} in total"
    assert str(info.value) == _second_compile(
        "test_the_budget_error_for_a_new_call_signature.<locals>.total",
        f"argument xs structure changed; the programs first differ at {where} (add, "
        "new)",
        "Keep the structure of 'xs' the same from call to call.",
    )


def test_a_compile_of_an_eager_transformation_is_budgeted_and_booked():
    """An eager `jax.vmap` of the function compiles the batched program: counted
    against `max_compiles`, refused with the fix for it, and booked as a miss."""

    @es.jit(max_compiles=1)
    def g(x):
        return jnp.sin(x)

    g(X)
    with pytest.raises(es.RecompileError) as info:
        jax.vmap(g)(jnp.stack([X, X]))
    assert str(info.value) == _second_compile(
        "test_a_compile_of_an_eager_transformation_is_budgeted_and_booked.<locals>.g",
        "JAX compiled a transformed program",
        _TRANSFORMED_FIX,
    )
    info_ = g.cache_info()
    assert (info_.hits, info_.misses, g.compile_info().compiles) == (0, 2, 1)

    # Allowed, it compiles, and the next compile's record names it.
    @es.jit(max_compiles=2)
    def h(x):
        return jnp.sin(x)

    compiles = XlaCompiles()
    h(X)
    jax.vmap(h)(jnp.stack([X, X]))
    assert h.compile_info().compiles == compiles.of("h") == 2
    with pytest.raises(es.RecompileError, match="  compile 2: a transformed program\n"):
        h(X[:1])


def test_the_budget_error_after_a_first_use_under_a_transformation():
    """An eager `jax.grad` compiles twice: the forward program in the call, the
    backward one after it returned, each booked and budgeted. Then the first call
    outside `jax.grad`: what changed is that it is not transformed, and the fix is
    for that."""
    name = "test_the_budget_error_after_a_first_use_under_a_transformation.<locals>.f"

    @es.jit(max_compiles=1)
    def f(x):
        return jnp.sin(x).sum()

    with pytest.raises(es.RecompileError) as info:
        jax.grad(f)(X)
    assert str(info.value) == _second_compile(
        name, "JAX compiled a call it had staged", _TRANSFORMED_FIX
    )

    @es.jit(max_compiles=2)
    def f(x):  # noqa: F811  (the same name: the same messages)
        return jnp.sin(x).sum()

    jax.grad(f)(X)
    with pytest.raises(es.RecompileError) as info:
        f(X)
    assert str(info.value) == (
        f"{name}: compile 3 exceeds `max_compiles=2`: first call outside a "
        "transformation.\nEarlier compiles (what changed from the one before):\n"
        "  compile 1: first call\n  compile 2: a transformed program\n"
        f"{_TRANSFORMED_FIX} {_EXPECTED}"
    )


def test_the_budget_error_names_what_the_room_made_for_the_call_took_away():
    """With `maxsize=1` the new shape's signature takes the old one's place: the
    error still names the shape it changed from."""

    @es.jit(maxsize=1, max_compiles=1)
    def f(x):
        return jnp.sin(x).sum()

    f(X)
    with pytest.raises(es.RecompileError) as info:
        f(X[:2])
    assert str(info.value).startswith(
        "test_the_budget_error_names_what_the_room_made_for_the_call_took_away."
        "<locals>.f: compile 2 exceeds `max_compiles=1`: argument x shape (3,) -> (2,)."
    )


def test_the_storm_names_the_field_read_where_the_programs_differ(caplog):
    """Two static fields change together on every call; only `lr` reaches the
    program, on the line where the programs differ: the warning names `lr`, not
    the unread `a_tag` (which would win a tie broken by name)."""

    class Tagged(es.Module):
        a_tag: str = eqx.field(static=True)  # never read
        lr: float = eqx.field(static=True)

        @es.jit(warn_after=3)
        def __call__(self, x):
            return x * self.lr

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(4):
            Tagged(f"t{i}", 0.1 * (i + 1))(X)
    (warning,) = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    ]
    assert "'lr' changed every time" in warning
    assert "Make 'lr' dynamic" in warning


def test_a_function_wrapped_anew_in_a_loop_is_told_once(caplog):
    """The beginner's storm: `es.jit(lambda ...)` inside the training loop makes a
    new cache, which compiles, on every step. After the 8th such compile, one
    warning names the line that wraps it and the fix."""
    line = inspect.currentframe().f_lineno + 3  # pyright: ignore[reportOptionalMemberAccess]
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for _ in range(10):
            step = es.jit(lambda x: x * 2)  # wraps anew
            step(X)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "`test_a_function_wrapped_anew_in_a_loop_is_told_once.<locals>.<lambda>` was "
        f"wrapped by `es.jit` 8 times (at test_budget.py:{line}), and each wrap "
        "compiled: each `es.jit(...)` starts a cache of its own. Wrap it once, "
        "outside the loop, and call the wrapped function in the loop."
    ]


def test_wraps_compiled_only_under_a_transformation_are_not_counted(caplog):
    """A wrap whose first compile is JAX's, of a transformed program (`jax.vmap`
    of a new wrap each step): not counted as a loop, as it was not before."""
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for _ in range(10):
            jax.vmap(es.jit(lambda x: x * 2))(X)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_fresh_wraps_that_compile_other_programs_are_not_a_loop(caplog):
    """A test suite wraps a fresh function per test, and each test compiles more,
    or another program: no warning, however many times the code is wrapped."""

    def fresh():
        return es.jit(lambda x, n: x * n)  # n, a Python int: static

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(10):
            fresh()(X, n=i)  # another program each time
        for _ in range(10):
            step = fresh()
            step(X, n=1)
            step(X, n=2)  # the same wrap compiles again
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_sweep_is_told_it_is_a_sweep_not_that_one_value_keeps_changing(caplog):
    """An activation x depth x width sweep compiles once per configuration. The
    warning says only what is true: the activation changed at each of the last
    compiles (not "every time": the 2nd and 3rd compiles changed depth and width),
    it took 3 values, and the compiles are their combinations with the others:
    no advice to reduce its values."""

    @es.jit
    def run(model, x):
        return model(x)

    key = jax.random.key(0)
    acts = [jax.nn.relu, jnp.tanh, jax.nn.gelu]
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for act in acts:
            for depth in (1, 2):
                for width in (2, 3):
                    run(eqx.nn.MLP(2, 1, width, depth, act, key=key), X[:2])
    message = _storm(caplog)
    assert message.startswith(
        f"{_qualname(test_a_sweep_is_told_it_is_a_sweep_not_that_one_value_keeps_changing)}"
        ".<locals>.run has compiled 11 times, and 'model.activation' changed at each "
        "of the last 7 compiles (… s spent compiling)."
    )
    assert (
        "'model.activation' took only 3 values: the compiles come from their "
        in message
    )
    assert "reduce the number of distinct values" not in message


def _qualname(f: Any) -> str:
    return f.__qualname__


def test_every_time_is_said_only_of_a_change_at_every_compile(caplog):
    """Three compiles in a row each with a new `scale`, after one of `bias`: not
    every time."""
    cls = _stormy(warn_after=4)
    with caplog_at_warning() as records:
        for scale, bias in [(0, 0), (0, 1), (1, 1), (2, 1), (3, 1)]:
            cls(w=jnp.ones(3), scale=float(scale), bias=float(bias))(X)
    (record,) = records
    assert (
        "has compiled 5 times, and 'scale' changed at each of the last 3 compiles"
        in (record.getMessage())
    )
    assert "Make 'scale' dynamic" in record.getMessage()
