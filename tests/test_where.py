"""Why it compiled, down to the line: each compile after the first says where, in
the user's code, the new program first differs from the closest compiled one, or
that only a constant differs and where it enters; in the INFO line, in
`RecompileError` and in the storm warning. A shared program and a shape change
name no line.

The line is found from each operation's source location in the traced program,
and is the line of the user's code that traced the operation that differs (the
innermost frame outside JAX, Equinox and this package)."""

import inspect
import logging
import re
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


X = jnp.ones(3)
HERE = "test_where.py"


def _line(fn: Any, text: str) -> int:
    """The line of `fn`'s source that contains `text`."""
    lines, start = inspect.getsourcelines(fn)
    (i,) = [i for i, line in enumerate(lines) if text in line]
    return start + i


def _compile_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "eqx_static" and "compiling" in r.getMessage()
    ]


class Act(es.Module):
    w: jax.Array
    act: str = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        y = self.w * x
        return getattr(jax.nn, self.act)(y)  # the activation


class Branch(es.Module):
    w: jax.Array
    flip: bool = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        y = self.w * x
        if self.flip:
            y = -y  # the branch
        return y


class Loop(es.Module):
    w: jax.Array
    n: int = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        for _ in range(self.n):
            x = jnp.sin(self.w * x)  # the loop body
        return x


class Const(es.Module):
    w: jax.Array
    lr: float = eqx.field(static=True)

    @es.jit(warn_after=3)
    def __call__(self, x):
        y = jnp.sin(self.w * x)
        return y * self.lr  # the constant


@pytest.mark.parametrize(
    "cls, first, second, marker, what",
    [
        (Act, "relu", "tanh", "# the activation", "(tanh where max was)"),
        (Branch, False, True, "# the branch", "(neg, new)"),
        (Branch, True, False, "# the branch", "(neg, gone)"),
        (Loop, 1, 2, "# the loop body", "(mul, new)"),
    ],
    ids=["activation", "branch", "branch not taken", "loop length"],
)
def test_the_compile_line_names_where_the_programs_first_differ(
    caplog, cls, first, second, marker, what
):
    cls.__call__.cache_clear()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        cls(jnp.ones(3), first)(X)
        cls(jnp.ones(3), second)(X)
    (line,) = _compile_lines(caplog)
    where = f"{HERE}:{_line(cls.__call__.fn, marker)} in __call__ {what}"
    assert line.endswith(f"; the programs first differ at {where}")


def _says_a_constant_differs(caplog, f: Any, arg: str, mark: str, op: str) -> None:
    """`f(X, 1)`, then `f(X, 2)`: the one compile line says `arg` changed and only a
    constant differs, entering at the line of `f`'s source marked `mark` (in `op`)."""
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        f(X, 1)
        f(X, 2)
    (line,) = _compile_lines(caplog)
    where = f"{HERE}:{_line(f.fn, mark)} in {f.fn.__name__} ({op})"
    assert line.endswith(
        f"argument {arg} changed 1 -> 2; the programs differ only in a constant, at "
        f"{where}"
    )


def test_a_constant_says_so_and_where_it_enters(caplog):
    Const.__call__.cache_clear()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        Const(jnp.ones(3), 0.1)(X)
        Const(jnp.ones(3), 0.2)(X)
    (line,) = _compile_lines(caplog)
    where = f"{HERE}:{_line(Const.__call__.fn, '# the constant')} in __call__ (mul)"
    assert line.endswith(
        "static field 'lr' changed 0.1 -> 0.2; the programs differ only in a "
        f"constant, at {where}"
    )


def test_a_program_never_shared_is_still_told_where_it_differs(capfd, caplog):
    """A `jax.debug.print` makes a program unshareable, compiled by JAX's own miss:
    its operations are recorded all the same, and the next compile names where the
    programs differ."""

    @es.jit
    def f(x, n):
        jax.debug.print("x {}", x)
        return x * n  # the constant

    _says_a_constant_differs(caplog, f, "n", "# the constant", "mul")
    assert capfd.readouterr().out.count("x [1. 1. 1.]") == 2


def test_the_same_location_in_recompile_error_and_storm_warning(caplog):
    budgeted = es.jit(max_compiles=1)(Act.__call__.fn)
    m = Act(jnp.ones(3), "relu")
    budgeted(m, X)
    with pytest.raises(es.RecompileError) as info:
        budgeted(m.with_static(act="tanh"), X)
    where = f"{HERE}:{_line(Act.__call__.fn, '# the activation')} in __call__"
    assert f"; the programs first differ at {where} (tanh where max was)." in str(
        info.value
    )
    Const.__call__.cache_clear()
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(4):
            Const(jnp.ones(3), 0.1 * (i + 1))(X)
    (warning,) = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    ]
    line = _line(Const.__call__.fn, "# the constant")
    assert f"The programs differ only in their constants (at {HERE}:{line} in " in (
        warning
    )


@pytest.mark.sharing
def test_no_line_for_a_shared_program_or_a_shape_change(caplog):
    class Tagged(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.w * x

    with caplog.at_level(logging.INFO, logger="eqx_static"):
        Tagged(jnp.ones(3), "a")(X)
        Tagged(jnp.ones(3), "b")(X)  # the same program: shared
        Tagged(jnp.ones(4), "b")(jnp.ones(4))  # a new shape
    lines = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert len(lines) == 2
    assert lines[0].endswith("same program as compile 1, not compiled again")
    assert lines[1].endswith(
        "field 'w' shape (3,) -> (4,); argument x shape (3,) -> (4,)"
    )
    assert not [line for line in lines if "differ at" in line]


class Parent(es.Module):
    w: jax.Array
    deep: bool = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.g(x)

    def g(self, x):
        raise NotImplementedError


class Child(Parent):
    def g(self, x):
        return jax.lax.cond(
            x.sum() > 0,
            lambda y: jnp.cos(y) if self.deep else jnp.sin(y),  # in a cond branch
            lambda y: y,
            self.w * x,
        )


def test_a_method_of_a_parent_on_a_subclass_through_a_cond_branch(caplog):
    """The line is where the operation that differs was traced: in the subclass's
    method, inside a `lax.cond` branch."""
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        Child(jnp.ones(3), False)(X)
        Child(jnp.ones(3), True)(X)
    (line,) = _compile_lines(caplog)
    where = (
        f"{HERE}:{_line(Child.g, '# in a cond branch')} in <lambda> (cos where sin was)"
    )
    assert line.endswith(f"; the programs first differ at {where}")


def test_nested_es_jit_scan_and_filter_vmap(caplog):
    class Inner(es.Module):
        w: jax.Array
        act: str = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return getattr(jnp, self.act)(self.w * x)  # inner op

    @es.jit
    def outer(inner, xs):
        def step(c, x):
            return c, eqx.filter_vmap(lambda m, y: m(y))(inner, x)

        return jax.lax.scan(step, 0.0, xs)[1]

    xs = jnp.ones((2, 4, 3))
    stacked = eqx.filter_vmap(lambda w: Inner(w, "sin"))(jnp.ones((4, 3)))
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        outer(stacked, xs)
        outer(stacked.with_static(act="cos"), xs)
    lines = [line for line in _compile_lines(caplog) if line.startswith(outer.qualname)]
    (line,) = lines
    where = re.escape(f"{HERE}:{_line(Inner.__call__.fn, '# inner op')} in __call__")
    assert re.search(f"first differ at {where} \\(cos where sin was\\)$", line), line


def test_a_function_in_an_equinox_layer_names_the_user_s_line(caplog):
    """The activation of an `eqx.nn.MLP` changed: the change names the functions,
    and the line is the user's call of the layer, not Equinox's code."""

    class Net(es.Module):
        mlp: eqx.nn.MLP

        @es.jit
        def __call__(self, x):
            return self.mlp(x)  # the layer

    net = Net(eqx.nn.MLP(3, 3, 4, 1, key=jax.random.key(0)))
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        net(X)
        eqx.tree_at(lambda n: n.mlp.activation, net, jax.nn.tanh)(X)
    (line,) = _compile_lines(caplog)
    where = f"{HERE}:{_line(Net.__call__.fn, '# the layer')} in __call__"
    assert line.endswith(
        f"field 'mlp.activation' changed relu -> tanh; the programs first differ at "
        f"{where} (tanh where max was)"
    ), line


def test_a_library_s_line_follows_the_user_s(caplog):
    """A static learning rate flows into optax: the line is the user's call, and
    then the line inside optax where the constant enters."""
    optax = pytest.importorskip("optax")

    class Step(es.Module):
        lr: float = eqx.field(static=True)

        @es.jit
        def __call__(self, params, grads):
            opt = optax.sgd(self.lr)
            updates, _ = opt.update(grads, opt.init(params))  # the update
            return optax.apply_updates(params, updates)

    with caplog.at_level(logging.INFO, logger="eqx_static"):
        Step(0.1)(X, X)
        Step(0.2)(X, X)
    (line,) = _compile_lines(caplog)
    user = f"{HERE}:{_line(Step.__call__.fn, '# the update')} in __call__"
    assert re.search(
        rf"differ only in a constant, at {re.escape(user)}, inside optax "
        r"\w+\.py:\d+ \(mul\)$",
        line,
    ), line


def test_a_library_that_traces_a_body_itself_still_names_the_user_s_line(caplog):
    """diffrax traces its solver's steps inside its own loop, from its own frames:
    the operations that differ are placed at the user's `diffeqsolve(...)` line,
    then diffrax's."""
    diffrax = pytest.importorskip("diffrax")

    class ODE(es.Module):
        rate: jax.Array
        solver: Any = eqx.field(static=True)

        @es.jit
        def __call__(self, y0):
            term = diffrax.ODETerm(lambda t, y, args: -self.rate * y)
            return diffrax.diffeqsolve(term, self.solver, 0.0, 1.0, 0.1, y0).ys  # solve

    with caplog.at_level(logging.INFO, logger="eqx_static"):
        ODE(jnp.float32(1.0), diffrax.Tsit5())(jnp.ones(2))
        ODE(jnp.float32(1.0), diffrax.Euler())(jnp.ones(2))
    (line,) = _compile_lines(caplog)
    user = f"{HERE}:{_line(ODE.__call__.fn, '# solve')} in __call__"
    assert re.search(
        rf"first differ at {re.escape(user)}, inside diffrax \w+\.py:\d+ \(", line
    ), line


@es.jit
def _table(x, k):
    y = x * 2
    return y + np.full(3, float(k), np.float32)  # an array constant


def test_an_array_constant_says_where_it_enters(caplog):
    """A NumPy array built while tracing is a constant of the program (not a
    literal): its bytes tell the programs apart, at the line where it enters."""
    _table.cache_clear()
    _says_a_constant_differs(caplog, _table, "k", "# an array constant", "add")


@es.jit
def _pick(x, y, first):
    z = x + 1
    return z * (x if first else y)  # the input picked


@es.jit
def _late(x, axis):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y = jax.pure_callback(lambda a: a, shape, x)  # a function made in each trace
    return y.sum(axis)  # the axis


@pytest.mark.parametrize(
    "fn, calls, marker, ops",
    [
        (_pick, [(X, X, True), (X, X, False)], "# the input picked", "(mul)"),
        (_late, [(X[None], 0), (X[None], 1)], "# the axis", "(reduce_sum)"),
    ],
    ids=["which input", "a parameter, after a function-valued one"],
)
def test_operations_differ_by_their_inputs_and_parameters(
    caplog, fn, calls, marker, ops
):
    """An operation is told apart by which input of the program it reads, and by
    its parameters; a parameter that is a function (made anew by each trace, as
    a callback's lambda) by its name."""
    fn.cache_clear()
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        for args in calls:
            fn(*args)
    (line,) = _compile_lines(caplog)
    where = f"{HERE}:{_line(fn.fn, marker)} in {fn.fn.__name__} {ops}"
    assert f"; the programs first differ at {where}" in line
