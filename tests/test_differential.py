"""The one rule, checked on realistic Equinox programs: `es.jit(f)(*args)` returns
what `f(*args)` and `eqx.filter_jit(f)(*args)` return, the same values, leaf types
and tree, and traces no more often than `eqx.filter_jit`.

The programs live in `tests/programs.py`. Each is run three times on fresh copies
of the same calls: eagerly, under `eqx.filter_jit` and under `es.jit`."""

import functools
import gc
import types

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from programs import (
    EsWeights,
    FilterJitWeights,
    Holder,
    holder_loss,
    PlainWeights,
    Program,
    PROGRAMS,
    TABLE,
    TEMPERED,
)


def _params(aspect: str) -> list:
    del aspect  # no difference is kept on purpose, for results or for traces
    slow = [pytest.mark.slow]
    return [pytest.param(p, id=p.name, marks=slow if p.slow else ()) for p in PROGRAMS]


_WRAPS = {"eager": None, "filter_jit": eqx.filter_jit, "es.jit": es.jit}


@functools.cache
def _runs(program: Program) -> dict[str, types.SimpleNamespace | Exception]:
    """Each program runs once per wrapper, for both tests below."""
    out: dict[str, types.SimpleNamespace | Exception] = {}
    for name, wrap in _WRAPS.items():
        ns = program.make()
        fn = ns.f if wrap is None else wrap(ns.f)
        try:
            outs = [fn(*args, **kwargs) for args, kwargs in ns.calls]
        except Exception as e:  # re-raised by each test that needs this run
            out[name] = e.with_traceback(None)
        else:
            out[name] = types.SimpleNamespace(outs=outs, traces=ns.traces[0], fn=fn)
    return out


def _run(program: Program, name: str) -> types.SimpleNamespace:
    run = _runs(program)[name]
    if isinstance(run, Exception):
        raise run
    return run


def _kind(x) -> tuple:
    """What "the same leaf type" means: for an array its shape, dtype and weak type
    (a NumPy array is strongly typed); for any other leaf its Python type."""
    if isinstance(x, jax.Array):
        return ("array", x.shape, x.dtype, jax.typeof(x).weak_type)
    if isinstance(x, np.ndarray):
        return ("array", x.shape, x.dtype, False)
    return ("leaf", type(x))


def _value(x):
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def assert_same(expected, actual, *, exact_types: bool, what: str) -> None:
    """Same tree structure, same leaf kinds, same values. With `exact_types`, also
    the same Python class of every leaf (a NumPy output of `eqx.filter_jit` is a
    `jax.Array`, eagerly it stays NumPy: only the kinds are compared there)."""
    s_exp, s_act = jax.tree.structure(expected), jax.tree.structure(actual)
    assert s_exp == s_act, f"{what}: tree structure differs:\n {s_exp}\n {s_act}"
    for i, (e, a) in enumerate(zip(jax.tree.leaves(expected), jax.tree.leaves(actual))):
        assert _kind(e) == _kind(a), f"{what}: leaf {i}: {_kind(e)} != {_kind(a)}"
        if exact_types:
            assert type(e) is type(a), f"{what}: leaf {i}: {type(e)} != {type(a)}"
        if eqx.is_array(e):
            np.testing.assert_allclose(
                _value(a), _value(e), rtol=1e-5, atol=1e-6, err_msg=f"{what}: leaf {i}"
            )
        else:
            assert e == a or e is a, f"{what}: leaf {i}: {e!r} != {a!r}"


@pytest.mark.parametrize("program", _params("results"))
def test_results_match_eager_and_filter_jit(program: Program):
    eager, fj, ej = (_run(program, name) for name in _WRAPS)
    for i, (e, f, s) in enumerate(zip(eager.outs, fj.outs, ej.outs)):
        # The reference pair first: if this fails the program itself is unfit.
        assert_same(e, f, exact_types=False, what=f"call {i}: filter_jit vs eager")
        assert_same(f, s, exact_types=True, what=f"call {i}: es.jit vs filter_jit")
        assert_same(e, s, exact_types=False, what=f"call {i}: es.jit vs eager")


@pytest.mark.parametrize("program", _params("traces"))
def test_traces_no_more_than_filter_jit(program: Program):
    fj, ej = _run(program, "filter_jit"), _run(program, "es.jit")
    if program.fewer_ok:
        assert ej.traces <= fj.traces
    else:
        assert ej.traces == fj.traces
    assert ej.fn.cache_info().misses == ej.traces


# --- targeted checks ------------------------------------------------------------


def _nonnone_grads(weights_cls):
    m = weights_cls(jnp.array([0.5, -1.0, 2.0]))
    grads = eqx.filter_grad(holder_loss)(Holder(fn=m.f), jnp.array([1.0, 2.0, 3.0]))
    return [np.asarray(g) for g in jax.tree.leaves(grads)]


def test_bound_method_in_a_field_gets_gradients():
    """`Holder(fn=m.f)`: gradients reach `m.w` through an es.jit method as they
    do through an eqx.filter_jit method (a bound method of a module is a pytree)."""
    reference = _nonnone_grads(PlainWeights)
    assert len(reference) == 1
    np.testing.assert_allclose(
        _nonnone_grads(FilterJitWeights)[0], reference[0], rtol=1e-6
    )
    got = _nonnone_grads(EsWeights)
    assert len(got) == 1, f"gradient leaves under es.jit: {got}"
    np.testing.assert_allclose(got[0], reference[0], rtol=1e-6)


def test_bound_method_in_a_field_is_partitioned_like_an_argument():
    """New instances of the same shape behind `Holder(fn=m.f)`: one trace, as with
    an eqx.filter_jit method (whose bound method is a pytree)."""
    counts = {}
    for name, cls in [("filter_jit", FilterJitWeights), ("es.jit", EsWeights)]:
        traces = 0

        def f(holder, x):
            nonlocal traces
            traces += 1
            return holder.fn(x)

        g = es.jit(f)
        for i in range(3):
            g(Holder(fn=cls(jnp.full((3,), float(i))).f), jnp.ones(3))
        counts[name] = traces
    assert counts == {"filter_jit": 1, "es.jit": 1}


def test_default_arguments_are_bound_before_keying():
    """`f(x)`, `f(x, 2.0)` and `f(x, scale=2.0)` are one call."""
    traces = 0

    def f(x, scale=2.0):
        nonlocal traces
        traces += 1
        return x * scale

    g = es.jit(f)
    x = jnp.arange(3.0)
    for out in [g(x), g(x, 2.0), g(x, scale=2.0)]:
        np.testing.assert_array_equal(np.asarray(out), np.asarray(2.0 * x))
    assert traces == 1


@pytest.mark.parametrize("kind", ["eqx", "es"])
def test_numpy_output_is_new_on_every_call(kind):
    """A NumPy array returned by an es.jit method comes out of the compiled program
    (as under eqx.filter_jit): mutating one result cannot change the next."""
    m = TABLE[kind](jnp.zeros(3), 4)
    first = m.table_es()
    if isinstance(first, np.ndarray):
        first[:] = 99.0
    second = m.table_es()
    np.testing.assert_array_equal(np.asarray(second), np.arange(4, dtype=np.float32))
    assert isinstance(second, jax.Array), type(second)


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(jax.jit, id="jax.jit"),
        pytest.param(eqx.filter_jit, id="filter_jit"),
        pytest.param(es.jit, id="es.jit"),
    ],
)
def test_wrapping_twice_shares_one_cache(wrap):
    traces = 0

    def f(x):
        nonlocal traces
        traces += 1
        return 2.0 * x

    x = jnp.arange(3.0)
    wrap(f)(x)
    gc.collect()  # the first wrapper is gone: its cache lives while `f` does
    wrap(f)(x)
    assert traces == 1


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(eqx.filter_jit, id="filter_jit", marks=pytest.mark.slow),
        pytest.param(es.jit, id="es.jit"),
    ],
)
@pytest.mark.parametrize("kind", ["eqx", "es"])
def test_rewrapped_filter_grad_does_not_retrace(wrap, kind):
    traces = 0

    def loss(m, x):
        nonlocal traces
        traces += 1
        return jnp.sum(jnp.tanh(m.w @ x))

    m = TEMPERED[kind](jnp.ones((2, 3)))
    for i in range(3):
        wrap(eqx.filter_grad(loss))(m, jnp.full((3,), float(i)))
        gc.collect()  # the wrapper is gone: its cache is not
    assert traces == 1


def test_es_module_int_too_big_raises_naming_the_field():
    """An int that does not fit the dtype of a dynamic field raises at once."""

    class Counter(es.Module):
        count: int

    with pytest.raises((OverflowError, TypeError, ValueError), match="count"):
        Counter(2**40)
