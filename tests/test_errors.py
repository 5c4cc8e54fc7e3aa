"""Run-time errors as `eqx.filter_jit` gives them: `eqx.error_if` and
`eqx.branched_error_if` inside an `es.jit` function raise Equinox's
`EquinoxRuntimeError`, with Equinox's message and traceback, hide JAX's log of the
failed callback, and honour `EQX_ON_ERROR` (read when Equinox is imported: each
mode runs in a process of its own). Every case is compared with `eqx.filter_jit`."""

import functools
import logging
import os
import re
import shutil
import textwrap
import traceback

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from eqx_static import _jax
from helpers import inherited_path, opaque_host_callbacks, path, run_python


def _positive(x):
    return eqx.error_if(x, x > 0, "positive!")


def _branched(x):
    return eqx.branched_error_if(
        x, x.sum() > 0, (x.sum() > 10).astype(int), ["big", "huge"]
    )


class Checked(es.Module):
    w: jax.Array

    @es.jit
    def f(self, x):
        return _positive(self.w * x)


def _failure(call):
    try:
        call()
    except BaseException as e:  # noqa: BLE001 (compared below)
        return e
    raise AssertionError("did not raise")


def _frames(e: BaseException) -> list[tuple[str, str]]:
    """The frames of the traceback, without those of jaxtyping's import hook (which
    the test suite puts around the library's functions)."""
    frames = traceback.extract_tb(e.__traceback__)
    return [(f.filename, f.name) for f in frames if "jaxtyping" not in f.filename]


@pytest.mark.parametrize("body", [_positive, _branched], ids=["error_if", "branched"])
def test_error_if_raises_what_filter_jit_raises(body, caplog):
    """The same error, raised the same way. (The messages themselves are compared
    in fresh processes below: the stack they show is the one recorded when
    Equinox's own compiled `error_if` was first traced in the process.)"""
    ours, theirs = es.jit(body), eqx.filter_jit(body)
    x = jnp.full(3, 5.0)
    with caplog.at_level(logging.DEBUG, logger="jax._src.callback"):
        for _ in range(2):  # the call that traces, then a hit
            mine = _failure(lambda: ours(x))
            filtered = _failure(lambda: theirs(x))
            assert type(mine) is type(filtered) is eqx.EquinoxRuntimeError
            assert isinstance(mine, RuntimeError)
            assert mine.__cause__ is None and mine.__suppress_context__
            # the caller's frames only, as filter_jit leaves them
            assert {f[0] for f in _frames(mine)} == {__file__}
            assert {f[0] for f in _frames(filtered)} == {__file__}
            assert str(mine).splitlines()[0] == str(filtered).splitlines()[0]
    assert not [r for r in caplog.records if "pure_callback failed" in r.getMessage()]
    assert ("positive!" if body is _positive else "huge") in str(mine)


def test_a_method_raises_with_the_message_and_the_stack_inside():
    Checked.f.cache_clear()  # the stack is recorded by the trace
    m = Checked(jnp.ones(3))
    e = _failure(lambda: m.f(jnp.ones(3)))
    assert type(e) is eqx.EquinoxRuntimeError
    message = str(e)
    assert message.startswith("Above is the stack outside of JIT.")
    assert "equinox.EquinoxRuntimeError: positive!" in message
    assert "return _positive(self.w * x)" in message  # a frame inside the method
    # the stack inside, a frame per line, outermost first
    frames = re.findall(r'^  File "(.+)", line \d+, in (\w+)$', message, re.M)
    assert frames == [(__file__, "f"), (__file__, "_positive")]
    assert _frames(e)[-1][0] == __file__
    np.testing.assert_array_equal(m.f(-jnp.ones(3)), -jnp.ones(3))  # no error: runs


def test_an_error_in_a_nested_es_jit_is_reported_by_the_outer_call():
    outer = es.jit(lambda m, x: m.f(x) + 1)
    e = _failure(lambda: outer(Checked(jnp.ones(3)), jnp.ones(3)))
    assert type(e) is eqx.EquinoxRuntimeError and "positive!" in str(e)


def _refuse(x):
    def callback(a):
        raise ValueError("not an Equinox error")

    return jax.pure_callback(callback, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_another_error_after_an_equinox_one_is_raised_as_filter_jit_raises_it():
    """Equinox's record of its last error stays after it is raised: a later failure
    that is not Equinox's is not dressed as one; and JAX's callback log is left
    as it was found, after a failure and after a success."""
    callback_log = logging.getLogger("jax._src.callback")
    filters = list(callback_log.filters)
    assert type(_failure(lambda: es.jit(_positive)(jnp.ones(3)))) is (
        eqx.EquinoxRuntimeError
    )
    assert callback_log.filters == filters
    # read: `es.jit` waits only for a program that may hold Equinox's check
    mine = _failure(lambda: jax.block_until_ready(es.jit(_refuse)(jnp.ones(3))))
    theirs = _failure(lambda: eqx.filter_jit(_refuse)(jnp.ones(3)))
    assert type(mine) is type(theirs) is not eqx.EquinoxRuntimeError
    assert "not an Equinox error" in str(mine) and "not an Equinox error" in str(theirs)
    es.jit(_positive)(-jnp.ones(3))
    assert callback_log.filters == filters


def _host_double(a):
    return np.asarray(a * 2, np.float32)


def _user_callback(x):
    return jax.pure_callback(_host_double, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _error_if_dropped(x):
    """An `error_if` whose result is unused: JAX drops its check before lowering."""
    eqx.error_if(x, x > 0, "never checked")
    return x * 2


class Tagged(es.Module):
    w: jax.Array
    tag: str = eqx.field(static=True)  # never read: the keys share one program

    @es.jit
    def f(self, x):
        return _positive(self.w * x)


@pytest.fixture
def waits(monkeypatch):
    """The arrays whose computation was waited for (`block_until_ready`)."""
    waited = []
    array = type(jnp.zeros(()))
    block = array.block_until_ready

    def spy(self):
        waited.append(self)
        return block(self)

    monkeypatch.setattr(array, "block_until_ready", spy)
    return waited


@pytest.mark.parametrize("tpu", [False, True], ids=["readable", "opaque"])
def test_only_a_program_that_may_hold_an_error_check_is_waited_for(
    waits, monkeypatch, tpu
):
    """`eqx.filter_jit` waits for the device on every call, so that `error_if` raises
    at the call. `es.jit` waits for a program that may hold Equinox's error check
    (read from the traced jaxpr, also where the lowering's host callbacks are
    opaque, as on a TPU), on the call that traces, on a hit, and on a key that
    shares the program; every other program keeps JAX's asynchronous dispatch."""
    if tpu:
        opaque_host_callbacks(monkeypatch)
    x = -jnp.ones(3)
    cases = [
        (lambda x: jnp.sin(x) * 2, False),
        (_user_callback, False),
        (_error_if_dropped, False),
        (_positive, True),
        (_branched, True),
    ]
    for body, checks in cases:
        f = es.jit(body)
        for _ in range(2):  # the call that traces, then a hit
            waits.clear()
            out = f(x)
            assert bool(waits) is checks, body
            np.testing.assert_array_equal(out, eqx.filter_jit(body)(x))
    Tagged.f.cache_clear()
    for tag in "ab":  # the second key shares the first one's program
        waits.clear()
        Tagged(jnp.ones(3), tag).f(x)
        assert waits
    with pytest.raises(eqx.EquinoxRuntimeError, match="positive!"):
        Tagged(jnp.ones(3), "c").f(-x)
    if _jax.SHARING:
        assert Tagged.f.compile_info().compiles == 1


def test_under_disable_jit_equinox_raises_as_it_does_eagerly():
    with jax.disable_jit():
        mine = _failure(lambda: es.jit(_positive)(jnp.ones(2)))
        filtered = _failure(lambda: eqx.filter_jit(_positive)(jnp.ones(2)))
    assert type(mine) is type(filtered)
    assert str(mine) == str(filtered)


# One wrapper, in a fresh process: each call's outcome, with the full message.
_MODES = textwrap.dedent(
    """
    import logging, sys, traceback
    import equinox as eqx, jax.numpy as jnp, eqx_static as es

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger().addHandler(handler)

    def body(x):
        return eqx.error_if(x, x > 0, "positive!")

    wrap = es.jit if sys.argv[1] == "es" else eqx.filter_jit
    f = wrap(body)
    for call in range(3):  # the call that traces, a hit, a hit through its guard
        try:
            out = f(jnp.ones(2))
            print("returned", out.tolist())
        except Exception as e:
            frames = traceback.extract_tb(e.__traceback__)
            print("raised", type(e).__name__, [fr.name for fr in frames])
            print(str(e))
    print("logged", [m for m in logged if "callback" in m])
    """
)


def _run_mode(mode: str, wrapper: str, tmp_path) -> str:
    done = run_python(
        wrapper,
        code=_MODES,
        env={"EQX_ON_ERROR": mode},
        stdin="c\n" * 20,  # the debugger of the breakpoint mode: continue
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "nan", "breakpoint"])
def test_eqx_on_error_modes_as_under_filter_jit(mode, tmp_path):
    """Outcomes, messages (stack included), tracebacks and logs, call for call."""
    ours = _run_mode(mode, "es", tmp_path)
    theirs = _run_mode(mode, "eqx", tmp_path)
    assert ours == theirs
    expected = {
        "raise": "raised EquinoxRuntimeError",
        "nan": "returned [nan, nan]",
        "breakpoint": "(jdb) returned [nan, nan]",  # the debugger, continued
    }
    assert expected[mode] in ours, ours
    assert "logged []" in ours
    if mode != "nan":
        assert ours.count("equinox.EquinoxRuntimeError: positive!") == 3


# --- a traced field where Python needs a value -------------------------------------


def test_traced_field_in_if_names_the_field():
    class Gate(es.Module):
        dp: float

        @es.jit
        def __call__(self, x):
            if self.dp > 0:
                return x
            return -x

    with pytest.raises(es.TracedFieldError) as info:
        Gate(1.0)(jnp.array(1.0))
    assert isinstance(info.value, jax.errors.ConcretizationTypeError)
    message = str(info.value)
    assert "'dp'" in message
    assert "Gate`" in message  # the class, by its qualified name
    assert "eqx.field(static=True)" in message


def test_traced_field_error_names_the_field_used_among_several():
    """The field JAX complained about, not the first dynamic field, and the error
    keeps the user's line and is also the JAX error it replaces."""
    import traceback

    class Gate(es.Module):
        a: float
        b: float
        c: float

        @es.jit
        def __call__(self, x):
            y = self.a * x + self.c
            if self.b > 0:  # the offending line
                return y
            return -y

    with pytest.raises(es.TracedFieldError) as info:
        Gate(1.0, 2.0, 3.0)(jnp.array(1.0))
    message = str(info.value)
    assert "traced field 'b'" in message and "'a'" not in message
    assert isinstance(info.value, jax.errors.TracerBoolConversionError)
    lines = traceback.format_tb(info.value.__traceback__)
    assert any("if self.b > 0:  # the offending line" in line for line in lines)


def test_traced_nested_field_names_the_path():
    class Enc(es.Module):
        scale: float

    class Model(es.Module):
        enc: Enc

        @es.jit
        def __call__(self, x):
            return x * int(self.enc.scale)

    with pytest.raises(es.TracedFieldError) as info:
        Model(Enc(2.0))(jnp.array(1.0))
    message = str(info.value)
    assert "'scale'" in message
    assert "enc.scale" in message
    assert "Enc`" in message
    assert "eqx.field(static=True)" in message


def test_traced_field_as_a_loop_length_names_the_field():
    """A static's classic use, an int that sets a loop length, traced instead."""

    class Repeat(es.Module):
        n: int

        @es.jit
        def __call__(self, x):
            for _ in range(self.n):
                x = x + 1
            return x

    with pytest.raises((TypeError, jax.errors.JAXTypeError)) as info:
        Repeat(3)(jnp.array(1.0))
    message = str(info.value)  # JAX's error names only `_es_leaves[0]`
    assert "'n'" in message and "Repeat`" in message
    assert "eqx.field(static=True)" in message


def test_traced_field_as_a_shape_names_the_field():
    class Pad(es.Module):
        n: int

        @es.jit
        def __call__(self, x):
            return jnp.zeros(self.n) + x

    with pytest.raises((TypeError, jax.errors.JAXTypeError)) as info:
        Pad(3)(jnp.array(1.0))
    message = str(info.value)  # JAX's error names only `_es_leaves[0]`
    assert "'n'" in message and "Pad`" in message
    assert "eqx.field(static=True)" in message


def test_a_traced_argument_is_named_with_the_fix_for_an_argument():
    """Not a field: the fix is to pass a Python value, or to branch in JAX. The
    error is still JAX's own type too."""

    @es.jit
    def f(x):
        return x if x > 0 else -x

    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        f(jnp.array(1.0))
    assert isinstance(info.value, es.TracedFieldError)
    message = str(info.value)
    assert message.startswith(f"{f.qualname} used the traced argument x where Python")
    assert "pass a Python value instead" in message and "JAX said:" in message


def test_traced_self_keeps_the_field_order_and_ignores_cached_properties():
    import functools

    class C(es.Module):
        x: jax.Array
        flag: bool = eqx.field(static=True)

        @functools.cached_property
        def mask(self) -> jax.Array:
            return self.x * 0

        @es.jit
        def order(self, y):
            seen.append(list(vars(self)))
            return y

    seen: list = []
    a = C(jnp.ones(2), True)
    a.mask  # noqa: B018  (computed eagerly: must not enter the key)
    a.order(jnp.ones(()))
    b = C(jnp.zeros(2), True)
    b.mask  # noqa: B018
    b.order(jnp.ones(()))
    assert C.order.cache_info().misses == 1
    # The traced `self` is what Equinox's unflatten makes: dynamic fields, then
    # the wrapper attributes (set, as the cached value made the dictionary longer
    # than the fields), then static fields; no cached value.
    rebuilt = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(a)))
    assert seen == [list(vars(rebuilt))]
    assert seen[0][0] == "x" and seen[0][-1] == "flag" and "mask" not in seen[0]


_NEED = (
    "where Python needs a concrete value (`if`, `int()`, a shape, a length, an "
    "index, a loop bound, ...)"
)


def _field_fix(name: str, cls: str, kind: str, annotation: str = "...") -> str:
    return (
        f"{cls}.__call__ used the traced field {name!r} of `{cls}` (at self.{name}) "
        f"{_NEED}. It is a dynamic field holding {kind}, traced, its value unknown "
        f"while compiling. If {name!r} selects program structure, declare it static: "
        f"`{name}: {annotation} = eqx.field(static=True)` (each new value then "
        "compiles once). Otherwise keep it dynamic and use `jnp.where` or "
        "`jax.lax.cond`."
    )


class _Number(es.Module):
    s: float

    @es.jit
    def __call__(self, x):
        return x if self.s > 0 else -x


class _Array(es.Module):
    w: jax.Array

    @es.jit
    def __call__(self, x):
        return x if self.w[0] > 0 else -x


@es.jit
def _argument(x, n):
    return x if n > 0 else -x


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: _Number(1.0)(jnp.ones(2)),
            _field_fix("s", "_Number", "a number stored as an array", "float"),
        ),
        (
            lambda: _Array(jnp.ones(2))(jnp.ones(2)),
            _field_fix("w", "_Array", "an array"),
        ),
        (
            lambda: _argument(jnp.ones(2), jnp.asarray(1)),
            f"_argument used the traced argument n {_NEED}. An array argument is "
            "traced, its value unknown while compiling: pass a Python value instead "
            "(static: one compile per value), or keep the array and use `jnp.where` or "
            "`jax.lax.cond`.",
        ),
    ],
    ids=["number field", "array field", "argument"],
)
def test_a_traced_value_error_in_full(call, message):
    """The whole message, for each kind of traced value, then JAX's own."""
    with pytest.raises(es.TracedFieldError) as info:
        call()
    ours, jax_said = str(info.value).split("\n\nJAX said: ")
    assert ours == message
    assert jax_said.startswith("Attempted boolean conversion of traced array")


def test_a_traced_field_error_in_a_nested_call_is_named_by_the_outer_one():
    """The outer call, whose numbers are concrete, names the inner `es.jit`'s field
    by its own argument; JAX's message is the inner one's, at the inner function."""

    @es.jit
    def outer(m, x):
        return m(x)

    with pytest.raises(es.TracedFieldError) as info:
        outer(_Number(1.0), jnp.ones(2))
    ours, said = str(info.value).split("\n\nJAX said: ")
    fix = _field_fix("s", "_Number", "a number stored as an array", "float")
    assert ours == fix.replace("_Number.__call__", outer.__qualname__).replace(
        "(at self.s)", "(at m.s)"
    )
    assert f"function _Number.__call__ at {__file__}:" in said


class _Sized(es.Module):
    n: int
    m: int

    @es.jit
    def __call__(self, x):
        return jnp.zeros((self.n,)) + x[: self.m]


class _Holder(es.Module):
    sized: _Sized

    @es.jit
    def __call__(self, x):
        return self.sized(x)


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_every_field_of_a_nested_call_is_named_in_one_error(depth):
    """Called directly, inside one `es.jit` call or inside two: both int fields the
    innermost call needs concrete are named, by the outermost call's paths."""
    model, path = _Sized(2, 2), "self"
    for _ in range(depth):
        model, path = _Holder(model), path + ".sized"
    with pytest.raises(es.TracedFieldError) as info:
        model(X)
    ours = str(info.value).split("\n\nJAX said: ")[0]
    assert f"2 traced fields {_NEED}: " in ours
    assert f"'n' of `_Sized` (at {path}.n), 'm' of `_Sized` (at {path}.m)" in ours


def test_a_traced_leaf_of_the_function_itself_raises_jax_s_error():
    """A callable pytree's own traced leaf is neither a field of an argument nor an
    argument: JAX's error, as under `eqx.filter_jit`."""

    class Gate(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return x if self.w[0] > 0 else -x

    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        es.jit(Gate(jnp.ones(2)))(jnp.ones(2))
    assert not isinstance(info.value, es.TracedFieldError)


def test_a_traced_field_error_shows_no_internals():
    """JAX's own note is quoted with the field's path for the leaf it names, and
    the user's function for where it was traced: nothing of the package's."""

    class Model(es.Module):
        n: int

        @es.jit
        def __call__(self, x):
            return jnp.zeros((self.n,)) + x

    with pytest.raises(es.TracedFieldError) as info:
        Model(3)(jnp.ones(3))
    said = str(info.value).split("JAX said: ", 1)[1]
    package = os.path.dirname(es.__file__)
    assert "self.n" in said and "_es_leaves" not in said and package not in said
    assert f".Model.__call__ at {__file__}:" in said


def test_a_traced_field_error_names_the_place_of_a_partial_s_function():
    """As JAX finds a function through `functools.partial`, so is its place named."""

    def sized(m, x, k):
        return jnp.zeros((m.n,)) + x * k

    with pytest.raises(es.TracedFieldError) as info:
        es.jit(functools.partial(sized, k=2.0))(_Port(3, X), jnp.ones(3))
    said = str(info.value).split("JAX said: ", 1)[1]
    line = sized.__code__.co_firstlineno
    assert f" at {__file__}:{line} " in said, said


_PLACE = textwrap.dedent(
    """
    import os
    import jax.numpy as jnp
    import eqx_static as es

    class Model(es.Module):
        n: int

        @es.jit
        def __call__(self, x):
            return jnp.zeros((self.n,)) + x

    try:
        Model(3)(jnp.ones(3))
    except es.TracedFieldError as e:
        said = str(e).split("JAX said: ", 1)[1]
        assert os.path.dirname(es.__file__) not in said, said
        assert f"function Model.__call__ at {__file__}:" in said, said
        print("named")
    """
)


@pytest.mark.slow
def test_a_traced_field_error_names_the_user_s_place_without_the_import_hook(
    tmp_path,
):
    """A script (no type-checking import hook, as the suite has) run from a folder
    named as the package, as a clone is: the place named is the script's."""
    clone = tmp_path / "eqx_static"
    shutil.copytree(
        os.path.dirname(es.__file__),
        clone / "eqx_static",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (clone / "place.py").write_text(_PLACE)
    path = os.pathsep.join([str(clone), *inherited_path()])
    done = run_python("place.py", env={"PYTHONPATH": path}, cwd=clone)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "named\n"


def _library_frames(e: BaseException) -> list[str]:
    """The frames of `e`'s traceback in this package's files."""
    package = es.__file__.rsplit("/", 1)[0]
    return [f.filename for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(package)]  # fmt: skip


@pytest.mark.parametrize("route", ["first call", "a guard's miss", "pytree function"])
def test_an_error_raised_by_the_user_s_function_shows_only_the_user_s_frames(route):
    """As `jax.jit` filters its own frames from the traceback of an error the traced
    function raises, the package's are filtered too: the frames left are the
    caller's, the function's own (the generated `<es.jit ...>` ones, which name it),
    and the line that raised; fewer than `eqx.filter_jit` leaves of its own."""

    class Boom(eqx.Module):
        def __call__(self, x):
            return f(x)

    def f(x):
        if x.shape[0] == 3:
            raise ValueError("three")
        return x

    wrapped = es.jit(Boom()) if route == "pytree function" else es.jit(f)
    if route == "a guard's miss":  # a key's second call made its guard
        wrapped(jnp.ones(2)), wrapped(jnp.ones(2))
    with pytest.raises(ValueError, match="three") as ours:
        wrapped(jnp.ones(3))
    assert _library_frames(ours.value) == []
    assert traceback.extract_tb(ours.value.__traceback__)[-1].name == "f"
    with pytest.raises(ValueError, match="three") as theirs:
        eqx.filter_jit(f)(jnp.ones(3))
    equinox_frames = [
        t
        for t in traceback.extract_tb(theirs.value.__traceback__)
        if "equinox" in t.filename
    ]
    assert len(equinox_frames) > 0  # the peer leaves its own: ours is not worse


def test_a_traced_field_used_as_a_shape_inside_diffrax_is_named():
    """The neural CDE of diffrax's examples, ported with `hidden_size` left
    dynamic: diffrax evaluates the vector field's shape in a trace of its own
    (`eqx.filter_eval_shape`), whose argument names end in the field's name."""
    diffrax = pytest.importorskip("diffrax")

    class Func(es.Module):
        mlp: eqx.nn.MLP
        data_size: int = eqx.field(static=True)
        hidden_size: int  # the port forgot `static=True`

        def __call__(self, t, y, args):
            return self.mlp(y).reshape(self.hidden_size, self.data_size)

    class CDE(es.Module):
        func: Func

        @es.jit
        def __call__(self, ts, xs, y0):
            control = diffrax.CubicInterpolation(
                ts, diffrax.backward_hermite_coefficients(ts, xs)
            )
            term = diffrax.ControlTerm(self.func, control).to_ode()
            return diffrax.diffeqsolve(term, diffrax.Tsit5(), ts[0], ts[-1], 0.1, y0).ys

    mlp = eqx.nn.MLP(4, 4 * 2, 8, 1, key=jax.random.key(0))
    model = CDE(Func(mlp, data_size=2, hidden_size=4))
    ts = jnp.linspace(0.0, 1.0, 5)
    with pytest.raises(es.TracedFieldError) as info:
        model(ts, jnp.ones((5, 2)), jnp.zeros(4))
    message = str(info.value)
    assert ".CDE.__call__ used the traced field 'hidden_size' of `" in message
    assert ".Func` (at self.func.hidden_size)" in message
    assert "`hidden_size: int = eqx.field(static=True)`" in message


# --- every concrete use of a traced number, all of a call's at once ------------------


X = jnp.arange(1.0, 5.0)


class _Port(es.Module):
    """An Equinox model ported as written: `n` is no longer static."""

    n: int
    w: jax.Array

    def split(self, key):
        return jr.split(key, self.n)

    def tile(self, x):
        return jnp.tile(x, self.n)

    def head(self, x):
        return x[: self.n]

    def loop(self, x):
        return jax.lax.fori_loop(0, self.n, lambda i, c: c * self.w, x)


_EVERYDAY = {
    "jr.split(key, self.n)": lambda m: es.jit(_Port.split)(m, jr.key(0)),
    "jnp.tile(x, self.n)": lambda m: es.jit(_Port.tile)(m, X),
    "x[: self.n]": lambda m: es.jit(_Port.head)(m, X),
    "lax.fori_loop(0, self.n, ...) under eqx.filter_grad": lambda m: eqx.filter_grad(
        lambda m, x: es.jit(_Port.loop)(m, x).sum()
    )(m, X),
}


@pytest.mark.parametrize("use", sorted(_EVERYDAY))
def test_every_concrete_use_of_a_traced_int_field_names_it(use):
    """Where JAX raises its own error (a parameter that must be hashable, a slice
    bound, the reverse mode of a loop with a traced bound), the port meets
    `TracedFieldError`, naming the field and the line that makes it static."""
    with pytest.raises(es.TracedFieldError) as info:
        _EVERYDAY[use](_Port(3, jnp.array(2.0)))
    message = str(info.value)
    assert "the traced field 'n' of `_Port` (at self.n)" in message
    assert "`n: int = eqx.field(static=True)`" in message
    assert "'w'" not in message.split("JAX said")[0]


class _SubPort(_Port):
    pass


@pytest.mark.parametrize("cls", [_Port, _SubPort])
@pytest.mark.parametrize("evaluated_first", [False, True], ids=["grad", "eval, grad"])
def test_a_loop_over_a_traced_int_field_is_named_at_every_grad(evaluated_first, cls):
    """A model evaluated, then trained (its program already traced), and a second
    step after the first error: each `grad` meets `TracedFieldError`, not JAX's
    error from the backward pass, naming the class called."""
    loop, m = es.jit(_Port.loop), cls(3, jnp.array(2.0))
    if evaluated_first:
        np.testing.assert_array_equal(loop(m, X), 8 * X)
    for _ in range(2):
        with pytest.raises(
            es.TracedFieldError,
            match=rf"^{cls.__name__}.loop used the traced field 'n' of `{cls.__name__}` \(at",
        ):
            eqx.filter_grad(lambda m, x: loop(m, x).sum())(m, X)


def _grad_inside(m, x):
    return eqx.filter_grad(lambda m, x: m.loop(x).sum())(m, x).w


def test_a_loop_over_a_traced_int_field_is_named_under_a_grad_inside_the_call():
    """The grad taken inside the compiled function: JAX's error (as under
    `eqx.filter_jit`) becomes `TracedFieldError`, naming `n`, not the float `w`
    whose being a constant would leave nothing to differentiate."""
    m = _Port(3, jnp.array(2.0))
    with pytest.raises(ValueError, match="Reverse-mode differentiation"):
        eqx.filter_jit(_grad_inside)(m, X)
    with pytest.raises(es.TracedFieldError) as info:
        es.jit(_grad_inside)(m, X)
    ours = str(info.value).split("\n\nJAX said: ")[0]
    assert "the traced field 'n' of `_Port` (at m.n)" in ours
    assert "`n: int = eqx.field(static=True)`" in ours and "'w'" not in ours


def _doubled_bound(m, x):  # the first operation takes no derivative
    return jax.lax.fori_loop(0, m.n * 2, lambda i, c: c * m.w, x)


@jax.custom_jvp
def _clipped(w):
    return jnp.maximum(w, 0.0)


@_clipped.defjvp
def _clipped_jvp(primals, tangents):
    (w,), (t,) = primals, tangents
    return _clipped(w), jnp.where(w > 0, t, 0.0)


def _after_a_custom_rule(m, x):  # `_clipped` is differentiated by its own rule
    w = _clipped(m.w)
    return jax.lax.fori_loop(0, m.n, lambda i, c: c * w, x)


def _after_an_integer_loop(m, x):  # no derivative flows through the first loop
    k = jax.lax.while_loop(lambda i: i < m.w * 3, lambda i: i + 1, 0)
    return jax.lax.fori_loop(0, m.n, lambda i, c: c * m.w, x * k)


def _in_a_jit(m, x):  # a call, whose program takes its inputs one for one
    loop = jax.jit(lambda w, x: jax.lax.fori_loop(0, m.n, lambda i, c: c * w, x))
    return loop(m.w, x)


def _in_a_scan(m, x):  # another nested program: any of its inputs counts
    def step(c, _):
        return jax.lax.fori_loop(0, m.n, lambda i, c: c * m.w, c), None

    return jax.lax.scan(step, x, None, length=1)[0]


_LOOPS = [_doubled_bound, _after_a_custom_rule, _after_an_integer_loop]


@pytest.mark.parametrize("fn", [*_LOOPS, _in_a_jit, _in_a_scan])
def test_a_loop_over_a_traced_int_field_is_named_wherever_it_is(fn):
    """The loop is found past what comes before it in the program (an operation
    on the field alone, one with a rule of its own, a loop that no derivative
    flows through) and inside a `jax.jit` or a `scan`."""
    m = _Port(3, jnp.array(2.0))
    with pytest.raises(ValueError, match="Reverse-mode differentiation"):
        eqx.filter_grad(lambda m, x: eqx.filter_jit(fn)(m, x).sum())(m, X)
    with pytest.raises(es.TracedFieldError) as info:
        eqx.filter_grad(lambda m, x: es.jit(fn)(m, x).sum())(m, X)
    assert "the traced field 'n' of `_Port`" in str(info.value)


class _Counted(eqx.Module):
    n: jax.Array  # a concrete 0-d number
    w: jax.Array


def _integer_carry(m, x):  # an integer that depends on `x`
    start = (x.sum() > 0).astype(jnp.int32)
    end = jax.lax.while_loop(lambda i: i < m.n, lambda i: i + 1, start)
    return x * m.w * end.astype(x.dtype)


def _constant_float_carry(m, x):  # its bound depends on `x`, its float carry not
    bound = m.n + 0.0 * x.sum()
    return x * m.w * jax.lax.while_loop(lambda c: c < bound, lambda c: c + 1.0, 0.0)


def _grad_counted(wrap, fn) -> tuple[jax.Array, int]:
    """A grad in `x` of `fn` wrapped, and how many times it was traced."""
    m, traces = _Counted(jnp.array(3), jnp.array(2.0)), []

    @wrap
    def f(m, x):
        traces.append(None)
        return fn(m, x).sum()

    return jax.grad(lambda x: f(m, x))(X), len(traces)


@pytest.mark.parametrize("fn", [_integer_carry, _constant_float_carry])
def test_a_grad_of_a_loop_no_derivative_flows_through_traces_as_filter_jit(fn):
    """A `while` loop whose carry takes no derivative (an integer, or a float that
    does not depend on what is differentiated) is differentiated: no trace more
    than under `eqx.filter_jit`."""
    ours, traced = _grad_counted(es.jit, fn)
    theirs, traced_by_equinox = _grad_counted(eqx.filter_jit, fn)
    np.testing.assert_array_equal(ours, theirs)
    assert traced == traced_by_equinox > 0


def _grads_counted(wrap, grad: str) -> tuple[list, int]:
    """Two grads of a wrapped program with a `while` loop and a concrete number,
    and how many times it was traced."""
    m, traces = _Counted(jnp.array(3), jnp.array(2.0)), []

    @wrap
    def f(m, x):
        traces.append(None)
        bound = m.n + 0.0 * x.sum()  # its derivative in `x`, if any, is dropped
        i = jax.lax.while_loop(lambda i: i < bound, lambda i: i + 1, 0)
        return (x * m.w * i).sum()

    @wrap
    def in_jit(m, x):  # the loop carries `m.w`, a constant under `jax.grad` in `x`
        traces.append(None)

        def scaled(w, x):
            def step(c):
                return c[0] + 1, c[1] * w

            return (x * jax.lax.while_loop(lambda c: c[0] < m.n, step, (0, w))[1]).sum()

        return jax.jit(scaled)(m.w, x)

    if grad == "eqx.filter_grad":
        return [eqx.filter_grad(f)(m, X).w for _ in range(2)], len(traces)
    g = in_jit if grad == "jax.grad, loop in jax.jit" else f
    return [jax.grad(lambda x: g(m, x))(X) for _ in range(2)], len(traces)


@pytest.mark.parametrize(
    "grad", ["jax.grad", "eqx.filter_grad", "jax.grad, loop in jax.jit"]
)
def test_a_grad_traces_a_call_with_a_while_loop_as_often_as_filter_jit(grad):
    """A program with a `while` loop and a concrete number works under reverse
    mode: the check for a loop bound that could not be differentiated traces it no
    more than `eqx.filter_jit` does (a trace runs the user's code once more)."""
    ours, traced = _grads_counted(es.jit, grad)
    theirs, traced_by_equinox = _grads_counted(eqx.filter_jit, grad)
    np.testing.assert_array_equal(ours, theirs)
    assert traced == traced_by_equinox > 0


def _solves_counted(wrap) -> tuple[jax.Array, int]:
    import diffrax

    m, traces = _Counted(jnp.array(1), jnp.array(1.5)), []

    @wrap
    def solve(m, y0):
        traces.append(None)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -a * y),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            y0,
            args=m.w * m.n,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
        )
        return sol.ys[-1].sum()

    return jax.grad(lambda y: solve(m, y))(jnp.ones(3)), len(traces)


@pytest.mark.slow
def test_a_grad_of_an_adaptive_diffrax_solve_traces_it_as_often_as_filter_jit():
    """Its loop, checkpointed, is differentiated by a rule of its own: no trace
    more than under `eqx.filter_jit`."""
    ours, traced = _solves_counted(es.jit)
    theirs, traced_by_equinox = _solves_counted(eqx.filter_jit)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert traced == traced_by_equinox > 0


@pytest.mark.parametrize("transform", ["jvp", "vmap"])
def test_a_loop_over_a_traced_int_field_runs_where_only_reverse_mode_fails(transform):
    """Forward mode and `vmap` of such a loop work, as under `eqx.filter_jit`:
    nothing is said of the field."""
    m = _Port(3, jnp.array(2.0))
    for loop in (es.jit(_Port.loop), eqx.filter_jit(_Port.loop)):
        if transform == "jvp":
            out, tangent = jax.jvp(
                functools.partial(loop, m), (X,), (jnp.ones_like(X),)
            )
            np.testing.assert_array_equal(tangent, jnp.full_like(X, 8.0))
        else:
            out = jax.vmap(loop, in_axes=(None, 0))(m, jnp.stack([X, X]))[0]
        np.testing.assert_array_equal(out, 8 * X)


class _Block(es.Module):
    depth: int
    width: int


class _Ported(es.Module):
    n: int
    block: _Block
    scale: jax.Array

    @es.jit
    def __call__(self, key, x):
        keys = jr.split(key, self.n)
        y = jnp.tile(x, self.block.width)[: self.block.depth]
        return y * self.scale, keys


def test_every_field_a_call_needs_concrete_is_named_in_one_error():
    """A port meets all its ints at once, not one per run: `n`, then `width` and
    `depth` of a nested module, each with its path and fix; the float `scale`,
    used only as a value, is not named."""
    with pytest.raises(es.TracedFieldError) as info:
        _Ported(3, _Block(2, 2), jnp.array(0.5))(jr.key(0), X)
    ours = str(info.value).split("\n\nJAX said: ")[0]
    assert ours == (
        f"_Ported.__call__ used 3 traced fields {_NEED}: 'n' of `_Ported` (at "
        "self.n), 'depth' of `_Block` (at self.block.depth), 'width' of `_Block` (at "
        "self.block.width). They are dynamic fields holding numbers stored as "
        "arrays, traced, their values unknown while compiling. If they select "
        "program structure, declare them static: `n: int = eqx.field(static=True)` "
        "and `depth: int = eqx.field(static=True)` and `width: int = "
        "eqx.field(static=True)` (each new value then compiles once). Otherwise "
        "keep them dynamic and use `jnp.where` or `jax.lax.cond`."
    )


def _print(x):
    jax.debug.print("x={}", x)


def _call_back(x):
    jax.debug.callback(lambda v: None, x)


@pytest.mark.parametrize("where", ["dispatcher", "public"])
@pytest.mark.parametrize("beside", [_print, _call_back])
def test_an_error_if_beside_other_host_python_raises_as_equinox_s(where, beside):
    """Host Python the package cannot account for (`jax.debug.print` stages no
    callback it reads, `jax.debug.callback` one of another kind) may sit beside
    an `eqx.error_if`: the program is waited for, and its failure raised as
    `eqx.filter_jit` raises it, at each call."""

    def f(x):
        beside(x)
        return eqx.error_if(x * 2, x > 0, "positive")

    with path(where):
        jf = es.jit(f)
        np.testing.assert_array_equal(jf(jnp.float32(-1.0)), f(jnp.float32(-1.0)))
        for _ in range(2):
            with pytest.raises(eqx.EquinoxRuntimeError, match="positive"):
                jf(jnp.float32(1.0))
