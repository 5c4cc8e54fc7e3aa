"""The books are exact where JAX compiles on its own: with PGLE on, for a key
first used under a transformation, under another JAX context, for a new sharding,
and when the compile budget refuses a key. A hit is a call that ran an executable
it had; every other call is a miss. `compile_info().compiles` is checked against
JAX's own monitoring events (`XlaCompiles`), counting the programs named
`jit(<function>)`. The budget and the storm warning name what changed, from the
records of each compile."""

import functools
import json
import logging
import re
import textwrap

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import output, run_python, XlaCompiles


X = jnp.array([0.5, -1.0, 2.0])


# --- JAX compiling on its own -------------------------------------------------------


# On the CPU, PGLE's profile is empty, and JAX warns: its recompile happens anyway.
@pytest.mark.filterwarnings("ignore:PGLE collected an empty trace:RuntimeWarning")
def test_pgle_recompiles_are_counted():
    """With profile-guided latency estimation on, JAX compiles a program again
    after profiling its first runs. 9 calls over 3 keys that share one program:
    every XLA compile JAX makes for the function is in `compile_info()`."""

    @es.jit
    def pgle_f(x, tag):
        return jnp.sin(x) * 2

    before = jax.config.jax_enable_pgle  # pyright: ignore[reportAttributeAccessIssue]
    jax.config.update("jax_enable_pgle", True)
    try:
        compiles = XlaCompiles()
        results = [pgle_f(X, tag) for _ in range(3) for tag in "abc"]
        jax.block_until_ready(results)
        counted = compiles.of("pgle_f")
    finally:
        jax.config.update("jax_enable_pgle", before)
    for r in results:
        np.testing.assert_allclose(r, jnp.sin(X) * 2, rtol=1e-6)
    assert counted > 1  # PGLE did compile again
    assert pgle_f.compile_info().compiles == counted
    info = pgle_f.cache_info()
    assert info.hits + info.misses == 9 and info.currsize <= info.misses


@pytest.mark.filterwarnings("ignore:PGLE collected an empty trace:RuntimeWarning")
def test_a_pgle_recompile_is_budgeted_with_its_own_fix():
    @es.jit(max_compiles=1)
    def pgle_g(x):
        return jnp.sin(x) * 2

    before = jax.config.jax_enable_pgle  # pyright: ignore[reportAttributeAccessIssue]
    jax.config.update("jax_enable_pgle", True)
    calls = 0
    try:
        with pytest.raises(es.RecompileError) as info:
            for _ in range(8):
                calls += 1
                jax.block_until_ready(pgle_g(X))
    finally:
        jax.config.update("jax_enable_pgle", before)
    # The refused recompile traced nothing, and is a miss all the same.
    assert pgle_g.cache_info() == es.CacheInfo(calls - 2, 2, None, 1)
    assert str(info.value) == (
        "test_a_pgle_recompile_is_budgeted_with_its_own_fix.<locals>.pgle_g: compile "
        "2 exceeds `max_compiles=1`: JAX compiled it again (profile-guided).\nEarlier "
        "compiles (what changed from the one before):\n  compile 1: first call\n"
        "JAX's profile-guided optimisation (`jax_enable_pgle`) compiles each program "
        "again once it has profiled it. (If these compiles are expected, raise "
        "`max_compiles`.)"
    )


@pytest.mark.filterwarnings("ignore:PGLE collected an empty trace:RuntimeWarning")
def test_a_failing_error_if_raises_at_a_pgle_recompile():
    """JAX's profile-guided recompile, after its profiled runs, comes through the
    miss path with the call: a failing `eqx.error_if` in it raises Equinox's error
    at the call, as at any miss (the run is waited for)."""
    _, f = _checked()
    ok, bad = jnp.float32(0.5), jnp.float32(2.0)
    options = {"jax_enable_pgle": True, "jax_pgle_profiling_runs": 3}
    before = {k: getattr(jax.config, k) for k in options}
    for k, v in options.items():
        jax.config.update(k, v)
    try:
        for _ in range(3):  # the first compile, then profiled runs
            jax.block_until_ready(f(ok))
        assert f.cache_info().misses == 1
        with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
            f(bad)
        assert f.cache_info().misses == 2  # the recompile's miss
    finally:
        for k, v in before.items():
            jax.config.update(k, v)


def _checked():
    def checked(x):
        return eqx.error_if(x * 2, x > 1.0, "too big")

    return checked, es.jit(checked)


def test_a_key_first_used_under_grad_books_its_top_level_compile():
    """The key is first traced under `jax.grad` (inside an outer `jax.jit`, whose
    compile is its own). Its first top-level call compiles: booked as a miss and a
    compile, and a failing `eqx.error_if` there raises Equinox's error at once."""
    eager, f = _checked()
    ok, bad = jnp.float32(0.5), jnp.float32(2.0)
    g = jax.jit(jax.grad(f))(ok)
    assert float(g) == float(jax.grad(eager)(ok)) == 2.0
    assert f.cache_info().misses == 1 and f.compile_info().compiles == 0
    compiles = XlaCompiles()
    with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
        f(bad)
    assert f.compile_info().compiles == compiles.of("checked") == 1
    assert f.cache_info() == es.CacheInfo(0, 2, None, 1)
    assert float(f(ok)) == float(eager(ok)) == 1.0
    assert f.cache_info() == es.CacheInfo(1, 2, None, 1)
    assert compiles.of("checked") == 1


_THREEFRY = jax.config.jax_threefry_partitionable  # pyright: ignore[reportAttributeAccessIssue]

# Another JAX context, and whether the current one is the first (the default).
CONTEXTS = {
    "x64": (
        lambda: jax.enable_x64(True),
        lambda: not jax.config.jax_enable_x64,  # pyright: ignore[reportAttributeAccessIssue]
    ),
    "threefry_partitionable": (
        lambda: jax.threefry_partitionable(not _THREEFRY),
        lambda: jax.config.jax_threefry_partitionable == _THREEFRY,  # pyright: ignore[reportAttributeAccessIssue]
    ),
    "default_device": (
        lambda: jax.default_device(jax.devices()[0]),
        lambda: jax.config.jax_default_device is None,  # pyright: ignore[reportAttributeAccessIssue]
    ),
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
def test_a_key_under_another_context_keeps_its_first_record(context):
    """The same key called under another JAX context is a miss of its own, with a
    program of its own: here the check is made in the first (default) context
    only, as a check needed only at one precision or one setting would be. The
    first context's record stays: a failing `eqx.error_if` there afterwards
    raises Equinox's error, not JAX's raw one."""
    other, in_first = CONTEXTS[context]

    def checked(x):
        y = x * 2
        if in_first():
            y = eqx.error_if(y, x > 1.0, "too big")
        return y

    f = es.jit(checked)
    ok, bad = jnp.float32(0.5), jnp.float32(2.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
        eqx.filter_jit(checked)(bad)  # before counting: it compiles `jit(checked)`
    compiles = XlaCompiles()
    assert float(f(ok)) == float(checked(ok)) == 1.0
    with other():
        assert float(f(bad)) == float(checked(bad)) == 4.0
    with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
        f(bad)
    assert float(f(ok)) == 1.0
    assert f.cache_info() == es.CacheInfo(2, 2, None, 2)
    assert f.compile_info().programs == 2
    assert f.compile_info().compiles == compiles.of("checked") == 2


_SHARDED = textwrap.dedent(
    """
    import json, logging
    import jax, numpy as np, eqx_static as es

    names, explained = [], []
    logger = logging.getLogger("eqx_static")
    logger.setLevel(logging.INFO)
    handler = logging.Handler()
    handler.emit = lambda record: explained.append(record.getMessage())
    logger.addHandler(handler)

    def on_event(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(on_event)

    @es.jit
    def doubled(x):
        return x * 2

    x = np.arange(8, dtype=np.float32)
    on0 = jax.device_put(x, jax.devices()[0])
    on1 = jax.device_put(x, jax.devices()[1])
    start = len(names)
    out = [doubled(on0), doubled(on1), doubled(on0), doubled(on1)]
    assert all((np.asarray(o) == 2 * x).all() for o in out)
    print(json.dumps({
        "cache": list(doubled.cache_info()),
        "compiles": doubled.compile_info().compiles,
        "counted": sum(n.endswith(".doubled)") for n in names[start:]),
        "devices": [next(iter(o.devices())).id for o in out],
        "explained": explained,
    }))
    """
)


@pytest.mark.slow
def test_a_new_sharding_on_a_known_key_is_a_miss():
    """The same key with an array committed to device 0, then to device 1 (of 4):
    the second sharding compiles, and is booked as a miss, not a hit; each call
    runs where its input is."""
    result = run_python(
        code=_SHARDED,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
        strict=True,
    )
    assert result.returncode == 0, output(result)
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["cache"] == [2, 2, None, 2]  # hits, misses, maxsize, currsize
    assert got["compiles"] == got["counted"] == 2
    assert got["devices"] == [0, 1, 0, 1]
    assert got["explained"] == [
        "doubled: compiling (1 cached): argument x sharding CpuDevice(id=0) -> "
        "CpuDevice(id=1)"
    ]


# --- the budget and the storm warning -----------------------------------------------


def test_a_refused_key_is_refused_again_and_compiles_nothing():
    """After `max_compiles` refuses a key, calling it again raises again, and no
    XLA compile is made for it, on the second call or the third."""

    @es.jit(max_compiles=1)
    def budgeted(x, n):
        return x * n

    np.testing.assert_allclose(budgeted(X, 1), X)
    compiles = XlaCompiles()
    for _ in range(3):
        with pytest.raises(es.RecompileError, match="argument n changed 1 -> 2"):
            budgeted(X, 2)
    assert compiles.count == 0
    assert budgeted.compile_info().compiles == 1
    np.testing.assert_allclose(budgeted(X, 1), X)  # the budgeted key still runs
    assert compiles.count == 0


def test_a_refused_compile_of_a_program_with_a_host_callback_holds_nothing():
    """A program with `jax.debug.print` is not shared, so JAX compiles it in the
    call that runs it, where the budget refuses it: the refused shape holds no
    program and no signature, each refused call is a miss, and the budgeted shape
    still runs, a hit (it raised `RecompileError` before the budget was checked as
    the compile starts)."""

    @es.jit(max_compiles=2)
    def printed(x):
        jax.debug.print("{}", x.shape)
        return x * 2

    printed(X), printed(jnp.ones(4))
    five, want = jnp.ones(5), np.asarray(2 * X)
    compiles = XlaCompiles()
    for _ in range(2):
        with pytest.raises(es.RecompileError, match="compile 3 exceeds"):
            printed(five)
    assert printed.compile_info()[:2] == (2, 2)
    np.testing.assert_allclose(printed(X), want)
    assert printed.cache_info() == es.CacheInfo(1, 4, None, 2)
    assert compiles.count == 0


@pytest.mark.sharing
def test_the_storm_warning_names_the_field_that_makes_programs_differ(caplog):
    """`a_tag` is never read and changes on every call; `lr` is used as a value and
    changes on every second call. Both changed at every compile, but only `lr`
    made the programs differ: `a_tag` also changed alone, sharing a program. The
    warning names `lr`."""

    class Tagged(es.Module):
        w: jax.Array
        lr: float = eqx.field(static=True)
        a_tag: str = eqx.field(static=True)

        @es.jit(warn_after=4)
        def __call__(self, x):
            return self.w * x * self.lr

    compiles = XlaCompiles()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(8):
            m = Tagged(w=jnp.ones(3), lr=float(i // 2 + 1), a_tag=f"t{i}")
            np.testing.assert_allclose(m(X), X * (i // 2 + 1))
    assert compiles.of("__call__") == Tagged.__call__.compile_info().compiles == 4
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].name == "eqx_static"
    message = warnings[0].getMessage()
    assert "has compiled 4 times, and 'lr' changed every time" in message
    assert "a_tag" not in message
    assert "Make 'lr' dynamic" in message


def test_recompile_error_names_a_static_string_argument():
    """A static string argument is named by its name, in the explanation and in
    the list of earlier compiles, not by one of its values."""

    @es.jit(max_compiles=2)
    def activate(x, act):
        return getattr(jax.nn, act)(x)

    np.testing.assert_allclose(activate(X, "relu"), jax.nn.relu(X))
    np.testing.assert_allclose(activate(X, "tanh"), jax.nn.tanh(X), rtol=1e-6)
    with pytest.raises(es.RecompileError) as info:
        activate(X, "sigmoid")
    message = str(info.value)
    assert "compile 3 exceeds `max_compiles=2`" in message
    assert re.search(r"argument act changed '(relu|tanh)' -> 'sigmoid'", message)
    assert "\n  compile 1: first call\n  compile 2: act\n" in message


def test_an_eager_grad_books_its_backward_compile():
    """JAX compiles the backward program after the call returned: booked by the
    program's name, which is the function's own."""

    @es.jit
    def sin_sum(x):
        return jnp.sin(x).sum()

    compiles = XlaCompiles()
    g = jax.grad(sin_sum)(X)
    assert float(g[0]) == pytest.approx(float(jnp.cos(X[0])))
    assert sin_sum.compile_info().compiles == compiles.of("sin_sum") == 2


@pytest.mark.parametrize("checkpoint", [jax.checkpoint, eqx.filter_checkpoint])
def test_calls_staged_into_an_eager_checkpoint_are_booked_and_budgeted(checkpoint):
    """An eager `jax.checkpoint` stages the call and compiles it after it returned:
    booked, and refused past the budget."""

    @es.jit(max_compiles=1)
    def scaled(x, k):
        return x * k

    compiles = XlaCompiles()
    assert float(checkpoint(lambda x: scaled(x, 2).sum())(X)) == 2 * float(X.sum())
    assert scaled.compile_info().compiles == compiles.of("scaled") == 1
    with pytest.raises(es.RecompileError, match="compile 2 exceeds `max_compiles=1`"):
        checkpoint(lambda x: scaled(x, 3).sum())(X)
    assert scaled.compile_info().compiles == compiles.of("scaled") == 1


# --- books that stay exact whatever happens mid-call --------------------------------


def _interrupt_once_after(function: str, filename: str):
    """A trace function that raises `KeyboardInterrupt` (as Ctrl-C would) once, the
    moment `function` in `filename` returns."""
    fired = []

    def trace(frame, event, arg):
        code = frame.f_code
        if code.co_name != function or not code.co_filename.endswith(filename):
            return None
        if event == "return" and not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return trace

    return trace, fired


@pytest.mark.sharing
@pytest.mark.parametrize("marker", ["alone", "find"])
def test_an_interrupt_right_after_a_program_is_marked_leaves_no_mark(marker):
    """Ctrl-C lands just after a new program is marked as being compiled (`_mark`
    returns): the function's first program (`alone`), or one after another
    (`find`). A later first call of another key with the same program must not
    wait for a compile that will never finish."""
    import sys
    import threading

    @es.jit
    def f(x, tag):
        return x * 2

    if marker == "find":
        f(X[:1], "z")  # another program held: the next is looked for
    trace, fired = _interrupt_once_after("_mark", "_compile.py")
    sys.settrace(trace)
    try:
        with pytest.raises(KeyboardInterrupt):
            f(X, "a")
    finally:
        sys.settrace(None)
    assert fired
    done = []
    t = threading.Thread(target=lambda: done.append(float(f(X, "b")[0])), daemon=True)
    t.start()
    t.join(timeout=30)
    assert done == [1.0], "a call waited for a mark nobody clears"


def test_cache_clear_while_a_call_traces_keeps_the_books_exact():
    """`cache_clear()` from inside the trace (as another thread could): the call
    is booked after the clear, and the counts never go negative."""
    holder = []

    @es.jit
    def f(x):
        holder[0].cache_clear()
        return x * 2

    holder.append(f)
    f(X)
    info = f.cache_info()
    assert info.hits >= 0 and info.hits + info.misses == 1
    assert info.currsize <= info.misses
    assert f.compile_info().programs <= info.currsize


# --- Every callable, and calls refused before they are keyed -------------------------


def _times(a, x):
    return a * x


def _sine(x):
    return jnp.sin(x)


class _Doubler:
    """A callable instance of a plain class."""

    def __call__(self, x):
        return 2 * x


class _Scale(eqx.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x

    def shifted(self, x):
        return self.w + x


# How the messages name each kind of callable: a module or a callable instance by
# its class's `__call__`, a partial by the function it wraps.
NAMES = {
    "function": "_sine",
    "module": "_Scale.__call__",
    "functools.partial": "partial(_times)",
    "callable instance": "_Doubler.__call__",
}
CALLABLES = {
    "function": lambda: _sine,
    "lambda": lambda: lambda x: jnp.cos(x),
    "module": lambda: _Scale(jnp.array(2.0)),
    "bound method of a module": lambda: _Scale(jnp.array(2.0)).shifted,
    "functools.partial": lambda: functools.partial(_times, 3.0),
    "callable instance": lambda: _Doubler(),
    "eqx.filter_grad": lambda: eqx.filter_grad(lambda x: jnp.sum(x**3)),
}


@pytest.mark.parametrize("kind", sorted(CALLABLES))
def test_every_kind_of_callable_is_booked_and_budgeted(kind):
    """`es.jit(model)` is how Equinox users jit a model: its compiles, and those
    of a partial, a bound method, a callable instance or a lambda, are booked as
    JAX reports them, and the budget refuses the one past it."""
    fn = CALLABLES[kind]()
    f = es.jit(fn, max_compiles=1)
    x, longer = jnp.arange(3.0), jnp.arange(4.0)
    want = fn(x)
    compiles = XlaCompiles()
    np.testing.assert_allclose(f(x), want)
    np.testing.assert_allclose(f(x), want)
    assert f.compile_info().compiles == compiles.count == 1
    with pytest.raises(
        es.RecompileError, match="compile 2 exceeds `max_compiles=1`"
    ) as info:
        f(longer)
    assert f.compile_info().compiles == compiles.count == 1
    assert f.cache_info() == es.CacheInfo(1, 2, None, 1)
    if kind in NAMES:
        assert str(info.value).startswith(f"{NAMES[kind]}: compile 2"), info.value


# The name JAX gives each kind's program, in its compile events, profiles and dumps:
# the function's qualified name, with its module in front of a name without a dot,
# and `partial.` in front of a partial's function; a number after it from the second
# live function of that name on (the filter_grad wrapper is named after the lambda it
# wraps, as the "lambda" kind is).
PROGRAM_NAMES = {
    "function": f"{__name__}._sine",
    "lambda": "<lambda>.<locals>.<lambda>",
    "module": "_Scale.__call__",
    "bound method of a module": "_Scale.shifted",
    "functools.partial": "partial._times",
    "callable instance": "_Doubler.__call__",
    "eqx.filter_grad": "<lambda>.<locals>.<lambda>",
}


@pytest.mark.parametrize("kind", sorted(CALLABLES))
def test_jax_names_each_kind_of_callable_s_program_after_it(kind):
    """A program's name is the function's, readable in a profile or a dump, and
    the package books JAX's compile events to the function by it."""
    f = es.jit(CALLABLES[kind]())
    x = jnp.ones((3, 11))  # a shape no other test here has
    compiles = XlaCompiles()
    f(x)
    [name] = compiles.names
    assert re.fullmatch(rf"jit\({re.escape(PROGRAM_NAMES[kind])}(#\d+)?\)", name), name
    assert f.compile_info().compiles == 1


def test_a_function_without_a_module_is_named_in_the_package_s_own():
    def double(x):
        return 2 * x

    double.__qualname__, double.__module__ = "double", None  # as `exec` can leave it
    f = es.jit(double)
    compiles = XlaCompiles()
    f(X)
    assert compiles.names == ["jit(es.double)"]


def test_live_functions_of_one_name_get_a_number_each():
    """Two functions alive at once with one qualified name: each program is booked
    to its own function, by a name with a number from the second on."""

    def make():
        def twin(x):
            return x + 1

        return twin

    twins = [es.jit(make()) for _ in range(3)]
    compiles = XlaCompiles()
    outs = [f(X) for f in twins]
    name = f"{make.__qualname__}.<locals>.twin"
    assert compiles.names == [f"jit({name})", f"jit({name}#2)", f"jit({name}#3)"]
    for out in outs:
        np.testing.assert_array_equal(out, X + 1)
    assert [f.compile_info().compiles for f in twins] == [1, 1, 1]


def test_calls_refused_before_they_are_keyed_are_neither_hits_nor_misses():
    """As `functools.lru_cache` raises on an unhashable argument before it counts:
    a call refused for an unhashable or a cyclic argument is not booked."""

    @es.jit
    def f(x, options):
        return x

    cyclic: list = []
    cyclic.append(cyclic)
    for refused in ({1, 2}, [{"a": {1}}], cyclic):
        with pytest.raises((TypeError, ValueError), match=r"\.f` got"):
            f(X, refused)
    f(X, (1, 2))
    assert f.cache_info() == es.CacheInfo(0, 1, None, 1)
    with pytest.raises(TypeError):
        f(X, {3})
    f(X, (1, 2))
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)
