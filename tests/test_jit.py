"""The `es.jit` wrapper: the seed sequence, methods and functions, inheritance and
`super()`, the ways of applying it, calls (defaults, keywords), outputs that are
not arrays, pickling and copying, and its options.

Compiles are counted exactly: `cache_info().misses`, a Python side effect in the
traced body (it runs once per trace), and XLA compiles seen by JAX's own
monitoring events (`helpers.XlaCompiles`). Every class whose cache a test counts
is defined inside that test, so each test starts from an empty cache."""

import copy
import pickle
import textwrap
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import eager_seed, run_python, seed, XlaCompiles


# --- the seed sequence ---------------------------------------------------------------


def test_seed_sequence_compiles_three_times():
    s = seed()
    x = jnp.array(1.5)
    c = s.Child(dp=2.0, sp=False, dc=3.0, sc=False)
    steps = [
        lambda c: c,
        lambda c: c.with_static(sp=True),
        lambda c: c.with_static(sc=True),
        lambda c: c.with_dynamic(dp=3.0),
        lambda c: c.with_dynamic(dc=4.0),
    ]
    modules = []  # made first: a new stored number is an eager op, which compiles
    for step in steps:
        c = step(c)
        modules.append(c)
    compiles = XlaCompiles()
    outs, misses = [], []
    for c in modules:
        for _ in range(2):
            outs.append(c(x))
            misses.append(s.Child.__call__.cache_info().misses)
    assert compiles.count == 3 == s.Child.__call__.compile_info().compiles
    assert s.traces[0] == 3
    results = [float(o) for o in outs]
    assert all(o.dtype == jnp.float32 and o.shape == () for o in outs)
    assert results == [eager_seed(c, 1.5) for c in modules for _ in range(2)]
    assert results == [1.5, 1.5, 3.0, 3.0, 9.0, 9.0, 13.5, 13.5, 18.0, 18.0]
    assert misses == [1, 1, 2, 2, 3, 3, 3, 3, 3, 3]
    info = s.Child.__call__.cache_info()
    assert info == es.CacheInfo(hits=7, misses=3, maxsize=None, currsize=3)


def test_hundred_python_float_values_compile_once():
    s = seed()
    x = jnp.array(1.5, jnp.float32)
    c = s.Child(dp=0.0, sp=True, dc=1.0, sc=False)
    modules = [c.with_dynamic(dp=i / 7) for i in range(100)]
    compiles = XlaCompiles()
    for i, c in enumerate(modules):
        for _ in range(2):  # a new instance's first call, then a hit
            out = c(x)  # compared in NumPy: an eager `==` on arrays would compile
            assert float(out) == float(np.float32(i / 7) * np.float32(1.5))
    assert s.traces[0] == 1
    assert compiles.count == 1
    assert s.Child.__call__.cache_info() == es.CacheInfo(199, 1, None, 1)


# --- outputs that are not arrays ----------------------------------------------------


def test_output_tuple_with_python_int():
    @es.jit
    def f(x):
        return x * 2, x.shape[0]

    for n in (3, 4, 3, 4):  # the int depends on the shape: kept per shape
        out, size = f(jnp.ones(n))
        assert size == n and type(size) is int
        assert (out == 2).all() and out.shape == (n,)
    assert f.cache_info() == es.CacheInfo(2, 2, None, 2)


def test_output_module_keeps_static_fields():
    traces = [0]

    class M(es.Module):
        w: float
        name: str = eqx.field(static=True)
        act: Any

        @es.jit
        def step(self):
            traces[0] += 1
            return self.with_dynamic(w=self.w * 2)

    m = M(1.5, "m", jnp.tanh)
    m2 = m.step()
    assert type(m2) is M
    assert m2.name == "m" and m2.act is jnp.tanh
    assert float(m2.w) == 3.0
    assert float(m2.step().w) == 6.0
    assert m.w == 1.5


def test_output_of_static_values_and_none():
    class M(es.Module):
        w: float
        name: str = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return {"y": self.w * x, "name": self.name, "none": None}

    out = M(2.0, "a")(jnp.array(1.0))
    assert out == {"y": 2.0, "name": "a", "none": None}
    assert M(3.0, "b")(jnp.array(1.0)) == {"y": 3.0, "name": "b", "none": None}


# --- options ------------------------------------------------------------------------


# Under the jaxtyping import hook (pyproject's `--jaxtyping-packages`), beartype
# rejects a value of the wrong type before `es.jit`'s own check runs: its
# `TypeCheckError` is a `TypeError`, and names the parameter and its options too.


@pytest.mark.parametrize("donate", ["some", "None", True])
def test_invalid_donate_lists_the_options(donate):
    with pytest.raises((ValueError, TypeError), match="'all', 'all-except-first'"):
        es.jit(donate=donate)(lambda x: x)


@pytest.mark.parametrize("maxsize", [0, -1])
def test_invalid_maxsize_raises(maxsize):
    with pytest.raises(ValueError, match="`maxsize` must be None or a positive int"):
        es.jit(maxsize=maxsize)(lambda x: x)


def test_not_a_function_raises():
    with pytest.raises(TypeError, match="function|'fn'"):
        es.jit(3)  # pyright: ignore[reportArgumentType]


# --- modules inside containers; None fields ----------------------------------------


def test_modules_nested_in_containers_inside_self():
    traces = [0]

    class Layer(es.Module):
        w: float
        square: bool = eqx.field(static=True)

        def __call__(self, x):
            return self.w * (x * x if self.square else x)

    class Net(es.Module):
        layers: list
        pair: tuple
        table: dict
        extra: Layer | None

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            for layer in [*self.layers, *self.pair, *self.table.values()]:
                x = layer(x)
            return x if self.extra is None else self.extra(x)

    def net(ws, square=False, extra=None):
        layers = [Layer(w, square) for w in ws]
        return Net(layers[:2], (layers[2],), {"a": layers[3]}, extra)

    x = jnp.array(1.0)
    assert net([1.0, 2.0, 3.0, 4.0])(x) == 24.0
    assert net([2.0, 2.0, 2.0, 2.0])(x) == 16.0  # new values: reuse
    assert traces[0] == 1
    assert net([1.0, 1.0, 1.0, 2.0], square=True)(jnp.array(2.0)) == 2.0 * 2**16
    assert traces[0] == 2
    assert net([1.0, 1.0, 1.0, 1.0], extra=Layer(3.0, False))(x) == 3.0
    assert traces[0] == 3
    assert net([1.0, 1.0, 1.0, 1.0], extra=Layer(5.0, False))(x) == 5.0
    assert traces[0] == 3
    assert Net.__call__.cache_info().misses == 3


def test_modules_nested_in_containers_in_arguments():
    traces = [0]

    class Scale(es.Module):
        w: float
        neg: bool = eqx.field(static=True)

        def __call__(self, x):
            return -self.w * x if self.neg else self.w * x

    @es.jit
    def apply(x, seq, table, maybe):
        traces[0] += 1
        for m in [*seq, *table.values()]:
            x = m(x)
        return x if maybe is None else maybe(x)

    x = jnp.array(1.0)
    assert apply(x, [Scale(2.0, False)], {"k": Scale(3.0, False)}, None) == 6.0
    assert apply(x, [Scale(4.0, False)], {"k": Scale(5.0, False)}, None) == 20.0
    assert traces[0] == 1
    assert apply(x, (Scale(4.0, False),), {"k": Scale(5.0, False)}, None) == 20.0
    assert traces[0] == 2  # list -> tuple: new structure
    assert apply(x, [Scale(2.0, True)], {"k": Scale(3.0, False)}, None) == -6.0
    assert traces[0] == 3
    ones = ([Scale(1.0, False)], {"k": Scale(1.0, False)})
    assert apply(x, *ones, Scale(7.0, True)) == -7.0  # None -> a module
    assert traces[0] == 4
    assert apply(x, *ones, Scale(8.0, True)) == -8.0
    assert traces[0] == 4


def test_equinox_layers_keep_filter_jit_rules_for_their_python_scalars():
    """`eqx.nn.Dropout.inference` is a Python bool that picks a branch: static."""

    class Net(es.Module):
        w: jax.Array
        drop: eqx.nn.Dropout

        @es.jit
        def __call__(self, x, key):
            return self.drop(self.w * x, key=key)

    net = Net(jnp.ones(4), eqx.nn.Dropout(0.5))
    key = jax.random.key(0)
    trained = net(jnp.ones(4), key)
    assert set(np.unique(np.asarray(trained))) <= {0.0, 2.0}
    frozen = eqx.nn.inference_mode(net)
    np.testing.assert_array_equal(np.asarray(frozen(jnp.ones(4), key)), np.ones(4))
    assert Net.__call__.cache_info().misses == 2  # one per `inference` value


# --- calls -------------------------------------------------------------------------


def test_a_positional_call_after_a_keyword_only_call():
    """Keyword and positional forms of one call are one key."""

    class M(es.Module):
        w: jax.Array
        b: bool = eqx.field(static=True)

    def body(m, x):
        return m.w * x if m.b else x

    f = es.jit(body)
    m, x = M(w=jnp.full(3, 2.0), b=True), jnp.ones(3)
    assert np.array_equal(f(m=m, x=x), body(m, x))
    assert np.array_equal(f(m, x), body(m, x))
    off = M(w=jnp.full(3, 2.0), b=False)
    assert np.array_equal(f(off, x), body(off, x))
    assert f.cache_info().misses == 2


@pytest.mark.parametrize("first_has_enc", [False, True])
def test_an_optional_submodule_whichever_instance_comes_first(first_has_enc):
    class Enc(es.Module):
        act: str = eqx.field(static=True)

    def body(self, x):
        y = self.w * x
        return jnp.tanh(y) if self.enc is not None and self.enc.act == "tanh" else y

    class M(es.Module):
        w: jax.Array
        enc: Enc | None
        f = es.jit(body)

    with_enc = M(w=jnp.full((), 2.0), enc=Enc(act="tanh"))
    without = M(w=jnp.full((), 2.0), enc=None)
    order = [with_enc, without] if first_has_enc else [without, with_enc]
    x = jnp.ones(())
    for m in order * 2:
        assert m.f(x) == body(m, x)


# --- pickling and copying ----------------------------------------------------------


class Scaler(es.Module):
    w: jax.Array
    square: bool = eqx.field(static=True)

    @es.jit
    def f(self, x):
        return self.w * (x**2 if self.square else x)

    @es.jit
    def __call__(self, x):
        return self.f(x)


def test_bound_methods_and_wrappers_pickle_and_copy():
    m, x = Scaler(jnp.full(3, 2.0), square=True), jnp.arange(3.0)
    for bound in (m.f, m.__call__):
        again = pickle.loads(pickle.dumps(bound))
        np.testing.assert_array_equal(again(x), bound(x))
    for wrapper in (Scaler.f, Scaler.__call__):
        assert pickle.loads(pickle.dumps(wrapper)) is wrapper
        assert copy.copy(wrapper) is wrapper and copy.deepcopy(wrapper) is wrapper
    np.testing.assert_array_equal(copy.deepcopy(m).f(x), m.f(x))


def test_an_es_module_class_defined_in_main_pickles_with_cloudpickle(tmp_path):
    pytest.importorskip("cloudpickle")
    script = textwrap.dedent(
        """
        import cloudpickle, pickle
        import equinox as eqx, jax.numpy as jnp, eqx_static as es

        class M(es.Module):
            w: float
            flag: bool = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.w * x if self.flag else x

        m = M(2.0, True)
        m(jnp.ones(2))
        again = pickle.loads(cloudpickle.dumps(m))
        assert (again(jnp.ones(2)) == 2.0).all()
        print("OK")
        """
    )
    out = run_python(code=script, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr


# --- outputs that are not arrays ---------------------------------------------------


def test_a_static_output_follows_jax_enable_x64():
    """A static output is whatever the trace for the current settings produced
    (`jax.jit` keys its traces on `jax_enable_x64`)."""

    @es.jit
    def dtype_name(x):
        return jnp.asarray(1.0).dtype.name, x

    x = jnp.ones(())
    assert dtype_name(x)[0] == "float32"
    with jax.enable_x64(True):
        assert dtype_name(x)[0] == "float64"
    assert dtype_name(x)[0] == "float32"


# --- options -----------------------------------------------------------------------


def test_jit_rejects_a_non_callable_with_its_own_message():
    with pytest.raises(TypeError) as info:
        es.jit(staticmethod(3))  # pyright: ignore[reportArgumentType]
    assert str(info.value) == "`es.jit` takes a function or method, got int."


@pytest.fixture
def _no_runtime_typechecks(monkeypatch):
    """The suite runs the package under jaxtyping's import hook (`addopts`):
    switch it off to reach the wrapper's own messages."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


@pytest.mark.usefixtures("_no_runtime_typechecks")
@pytest.mark.parametrize("donate", ["some", "None", None, True])
def test_jit_rejects_an_unknown_donate_with_its_own_message(donate):
    with pytest.raises(ValueError) as info:
        es.jit(donate=donate)(lambda x: x)
    assert str(info.value) == (
        "`es.jit(donate=...)` must be one of 'none', 'all', 'all-except-first', "
        f"'warn', 'warn-except-first'; got {donate!r}."
    )


@pytest.mark.usefixtures("_no_runtime_typechecks")
@pytest.mark.parametrize("name", ["maxsize", "max_compiles", "warn_after"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_jit_rejects_a_bad_count_with_its_own_message(name, value):
    with pytest.raises(ValueError) as info:
        es.jit(**{name: value})(lambda x: x)
    counts = "compiled entries" if name == "maxsize" else "XLA compiles"
    assert str(info.value) == (
        f"`{name}` must be None or a positive int, got {value!r}: "
        f"`es.jit({name}=...)` counts {counts}."
    )


def test_an_unknown_jit_option_is_named():
    with pytest.raises(TypeError) as info:
        es.jit(lambda x: x, static_argnums=0, donate_argnums=1)
    assert str(info.value) == (
        "`es.jit` got unexpected keyword arguments 'donate_argnums', "
        "'static_argnums'; it takes `donate`, `maxsize`, `max_compiles` and "
        "`warn_after`."
    )


@pytest.mark.parametrize("name", ["maxsize", "max_compiles", "warn_after"])
def test_jit_accepts_good_counts(name):
    for value in (None, 1, 5):
        f = es.jit(**{name: value})(lambda x: x + 1)
        assert f(jnp.array(1.0, jnp.float32)) == 2.0


# --- inheritance -------------------------------------------------------------------


def test_parent_method_uses_subclass_overrides_and_fields():
    s = seed()

    class Tripled(s.Child):
        extra: float

        def g(self, x):
            return 3.0 * x + self.extra

    x = jnp.array(2.0)
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    t = Tripled(dp=2.0, sp=True, dc=3.0, sc=True, extra=1.0)
    assert float(c(x)) == 12.0
    assert float(t(x)) == 14.0
    assert float(t.with_dynamic(extra=5.0)(x)) == 22.0
    assert s.traces[0] == 2
    assert s.Parent.__call__.cache_info().misses == 2


def test_super_inside_decorated_methods():
    traces = {"A": 0, "B": 0}

    class A(es.Module):
        a: float

        @es.jit
        def __call__(self, x):
            traces["A"] += 1
            return self.a * x

        @es.jit
        def predict(self, x):
            return self.a + x

    class B(A):
        b: float
        neg: bool = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            traces["B"] += 1
            out = super().__call__(x) + self.b * x
            return -out if self.neg else out

        @es.jit
        def predict(self, x):
            return super().predict(x) * self.b

    x = jnp.array(2.0)
    assert float(A(3.0)(x)) == 6.0
    assert float(B(3.0, 5.0, False)(x)) == 16.0
    assert float(B(1.0, 1.0, False)(x)) == 4.0
    assert float(B(3.0, 5.0, True)(x)) == -16.0
    assert traces["B"] == 2
    assert B.__call__.cache_info().misses == 2
    assert float(B(3.0, 5.0, False).predict(x)) == 25.0
    assert float(A(3.0).predict(x)) == 5.0


def test_super_from_an_undecorated_override():
    class A(es.Module):
        a: float

        @es.jit
        def __call__(self, x):
            return self.a * x

    class B(A):
        def __call__(self, x):
            return super().__call__(x) + 1

    assert float(B(3.0)(jnp.array(2.0))) == 7.0
    assert A.__call__.cache_info().misses == 1


def test_subclass_overrides_a_decorated_method():
    counts = {"A": 0, "B": 0, "C": 0}

    class A(es.Module):
        a: float

        @es.jit
        def __call__(self, x):
            counts["A"] += 1
            return self.a * x

        @es.jit
        def predict(self, x):
            counts["A"] += 1
            return self.a * x

    class B(A):  # decorated override
        @es.jit
        def __call__(self, x):
            counts["B"] += 1
            return self.a + x

        @es.jit
        def predict(self, x):
            counts["B"] += 1
            return self.a + x

    class C(A):  # plain override: runs eagerly, every call
        def __call__(self, x):
            counts["C"] += 1
            return self.a - x

        def predict(self, x):
            counts["C"] += 1
            return self.a - x

    x = jnp.array(2.0)
    for _ in range(2):
        assert float(A(3.0)(x)) == 6.0 and float(A(3.0).predict(x)) == 6.0
        assert float(B(3.0)(x)) == 5.0 and float(B(3.0).predict(x)) == 5.0
        assert float(C(3.0)(x)) == 1.0 and float(C(3.0).predict(x)) == 1.0
    assert counts == {"A": 2, "B": 2, "C": 4}
    assert A.__call__.cache_info().misses == 1
    assert B.__call__.cache_info().misses == 1
    assert A.predict.cache_info().misses == 1


# --- ways of applying es.jit -------------------------------------------------------


def test_non_dunder_method():
    traces = [0]

    class M(es.Module):
        w: float
        shift: bool = eqx.field(static=True)

        @es.jit
        def predict(self, x):
            traces[0] += 1
            return self.w * x + (1.0 if self.shift else 0.0)

    x = jnp.array(2.0)
    assert float(M(3.0, False).predict(x)) == 6.0
    assert float(M(4.0, False).predict(x)) == 8.0
    assert float(M(4.0, True).predict(x)) == 9.0
    assert float(M.predict(M(4.0, True), x)) == 9.0  # unbound, from the class
    assert traces[0] == 2
    assert M.predict.cache_info().misses == 2


def test_keyword_arguments():
    class M(es.Module):
        w: float

        @es.jit
        def predict(self, x, *, bias=0.0, square=False):
            y = x * x if square else x
            return self.w * y + bias

        @es.jit
        def __call__(self, x, y=None):
            return self.w * x if y is None else self.w * x + y

    m, x = M(2.0), jnp.array(3.0)
    assert float(m.predict(x)) == 6.0
    assert float(m.predict(x=x)) == 6.0
    assert float(m.predict(x, bias=1.0)) == 7.0
    assert float(m.predict(x, bias=jnp.array(2.0))) == 8.0
    assert float(m.predict(x, square=True)) == 18.0
    assert float(m(x, y=jnp.array(1.0))) == 7.0
    assert float(m(x=x)) == 6.0
    assert float(m(x)) == 6.0
    before = M.predict.cache_info().misses
    assert float(m.predict(x, bias=jnp.array(5.0))) == 11.0  # traced: reuse
    assert M.predict.cache_info().misses == before


def test_keyword_order_does_not_matter():
    @es.jit
    def f(x, a, b):
        return x * a - b

    x = jnp.array(2.0)
    assert float(f(x, a=jnp.array(3.0), b=jnp.array(1.0))) == 5.0
    assert float(f(x, b=jnp.array(1.0), a=jnp.array(3.0))) == 5.0
    assert f.cache_info() == es.CacheInfo(1, 1, None, 1)


def test_plain_function():
    traces = [0]

    @es.jit
    def f(m, x):
        traces[0] += 1
        return m(x) * 2

    s = seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.0)
    assert float(f(c, x)) == 12.0
    assert float(f(c.with_dynamic(dp=1.0), x)) == 6.0
    assert float(f(c.with_static(sc=False), x)) == 4.0
    assert float(f(m=c, x=x)) == 12.0  # bound to positions: the first call's key
    assert traces[0] == 2
    assert f.__name__ == "f" and f.__wrapped__ is not None


def test_staticmethod_under_jit():
    """`@es.jit` over `@staticmethod`."""
    traces = [0]

    class M(es.Module):
        w: float

        @es.jit
        @staticmethod
        def scale(x, k):
            traces[0] += 1
            return x * k

        def __call__(self, x):
            return self.scale(x, self.w)

    x = jnp.array(2.0)
    assert float(M.scale(x, 3)) == 6.0
    assert float(M(3.0).scale(x, 3)) == 6.0
    assert float(M(3.0)(x)) == 6.0  # k=3.0, a Python float: static, a new entry
    assert traces[0] == 2
    assert M.scale.cache_info().misses == 2
    assert M(3.0).scale.cache_info().misses == 2


def test_staticmethod_over_jit():
    """`@staticmethod` over `@es.jit`."""
    traces = [0]

    class M(es.Module):
        w: float

        @staticmethod
        @es.jit
        def scale(x, k):
            traces[0] += 1
            return x * k

    x = jnp.array(2.0)
    assert float(M.scale(x, 3)) == 6.0
    assert float(M(3.0).scale(x, 3)) == 6.0
    assert float(M.scale(x, 4)) == 8.0
    assert traces[0] == 2
    assert M.scale.cache_info().misses == 2


def test_staticmethod_taking_a_module():
    class M(es.Module):
        w: float
        neg: bool = eqx.field(static=True)

        @es.jit
        @staticmethod
        def apply(m, x):
            return -m.w * x if m.neg else m.w * x

    x = jnp.array(2.0)
    assert float(M.apply(M(3.0, False), x)) == 6.0
    assert float(M.apply(M(4.0, False), x)) == 8.0
    assert float(M(4.0, True).apply(M(4.0, True), x)) == -8.0
    assert M.apply.cache_info().misses == 2


def test_decorator_with_arguments_and_without():
    @es.jit()
    def f(x):
        return x + 1

    @es.jit(maxsize=4)
    def g(x):
        return x + 2

    assert float(f(jnp.array(1.0))) == 2.0
    assert float(g(jnp.array(1.0))) == 3.0
    assert g.cache_info().maxsize == 4


def test_numpy_result_matches_eager_for_a_batch():
    s = seed()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(16).astype(np.float32)
    c = s.Child(dp=1.25, sp=True, dc=-0.5, sc=True)
    out = np.asarray(c(jnp.asarray(xs)))
    expected = np.float32(1.25) * (np.float32(-0.5) * xs)
    np.testing.assert_array_equal(out, expected)
