"""`es.jit` (DESIGN §2.4) under JAX transforms, with inheritance, and in every way
it can be applied: methods, `__call__`, static methods, plain functions, keywords.

Values are compared with the same arithmetic done eagerly, and traces are counted
with a Python side effect in the traced body.
"""

from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import seed


_seed = seed


# --- transforms ---------------------------------------------------------------------


def test_jax_grad_reaches_python_float_fields():
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    grads = jax.grad(lambda m: m(x))(c)
    assert type(grads) is s.Child
    assert grads.sp is True and grads.sc is True
    assert float(grads.dp) == 3.0 * 1.5  # d(dp * dc * x)/d dp
    assert float(grads.dc) == 2.0 * 1.5
    traces = s.traces[0]
    grads = jax.grad(lambda m: m(x))(c.with_dynamic(dp=5.0, dc=7.0))
    assert float(grads.dp) == 7.0 * 1.5 and float(grads.dc) == 5.0 * 1.5
    assert s.traces[0] == traces  # new values of a traced field: no new trace


def test_jax_grad_with_respect_to_the_argument():
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    dx = jax.grad(lambda x: c(x) ** 2)(jnp.array(1.5))
    assert float(dx) == pytest.approx(2 * 9.0 * 6.0)


def test_filter_grad_reaches_array_fields():
    s = _seed()
    c = s.Child(dp=jnp.array(2.0), sp=True, dc=jnp.array(3.0), sc=True)
    grads = eqx.filter_grad(lambda m, x: m(x))(c, jnp.array(1.5))
    assert float(grads.dp) == 4.5 and float(grads.dc) == 3.0


def test_filter_grad_differentiates_stored_numbers_as_eager_does():
    """A Python float in a dynamic field of an `es.Module` is stored as an array, so
    `eqx.filter_grad` differentiates it, eagerly and under `es.jit` alike."""
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=jnp.array(3.0), sc=True)
    compiled = eqx.filter_grad(lambda m, x: m(x))(c, jnp.array(1.5))
    eager = eqx.filter_grad(s.Child.__call__.__wrapped__)(c, jnp.array(1.5))
    assert float(compiled.dp) == float(eager.dp) == 4.5
    assert float(compiled.dc) == float(eager.dc) == 3.0


def test_value_and_grad_inside_jax_jit():
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)

    @jax.jit
    def loss(m, x):
        return jax.value_and_grad(lambda m: m(x) ** 2)(m)

    value, grads = loss(c, jnp.array(1.0))
    assert float(value) == 36.0
    assert float(grads.dp) == 2 * 6.0 * 3.0 and float(grads.dc) == 2 * 6.0 * 2.0


def _stack(modules: list) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *modules)


@pytest.mark.parametrize("vmap", [jax.vmap, eqx.filter_vmap])
def test_vmap_over_stacked_modules(vmap):
    s = _seed()
    cs = [s.Child(dp=float(i), sp=True, dc=float(i + 1), sc=True) for i in range(4)]
    xs = jnp.arange(4.0) + 0.5
    out = vmap(lambda m, x: m(x))(_stack(cs), xs)
    expected = [float(c(x)) for c, x in zip(cs, xs)]
    assert out.shape == (4,)
    assert out.tolist() == expected == [i * (i + 1) * (i + 0.5) for i in range(4)]


def test_vmap_over_the_argument_only():
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=False)
    xs = jnp.arange(5.0)
    assert (jax.vmap(c)(xs) == 2.0 * xs).all()
    assert (eqx.filter_vmap(c.__call__)(xs) == 2.0 * xs).all()


def test_outer_jax_jit():
    s = _seed()
    outer_traces = [0]

    @jax.jit
    def outer(m, x):
        outer_traces[0] += 1
        return m(x) + 1

    x = jnp.array(1.5)
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    assert float(outer(c, x)) == 10.0
    traces = s.traces[0]
    assert float(outer(c.with_dynamic(dp=3.0, dc=4.0), x)) == 19.0
    assert outer_traces[0] == 1 and s.traces[0] == traces
    assert float(outer(c.with_static(sc=False), x)) == 4.0
    assert outer_traces[0] == 2
    assert float(c(x)) == 9.0  # the decorated method alone still agrees


def test_outer_filter_jit():
    s = _seed()
    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    out = eqx.filter_jit(lambda m, x: m(x) * 2)(c, jnp.array(1.5))
    assert float(out) == 18.0


def test_decorated_method_calls_another():
    traces = {"outer": 0, "inner": 0}

    class M(es.Module):
        w: float
        square: bool = eqx.field(static=True)

        @es.jit
        def inner(self, x):
            traces["inner"] += 1
            return self.w * (x * x if self.square else x)

        @es.jit
        def __call__(self, x):
            traces["outer"] += 1
            return self.inner(x) + self.w

    x = jnp.array(3.0)
    assert M(2.0, False)(x) == 8.0
    assert M(5.0, False)(x) == 20.0
    assert M(2.0, True)(x) == 20.0
    assert M(2.0, True).inner(x) == 18.0
    assert traces["outer"] == 2
    assert M.__call__.cache_info().misses == 2
    assert M.inner.cache_info().misses >= 2


def test_decorated_function_takes_a_decorated_module():
    s = _seed()

    @es.jit
    def twice(m, x):
        return m(m(x))

    c = s.Child(dp=2.0, sp=True, dc=3.0, sc=True)
    assert float(twice(c, jnp.array(1.0))) == 36.0
    assert float(twice(c.with_dynamic(dp=1.0), jnp.array(1.0))) == 9.0
    assert twice.cache_info() == es.CacheInfo(1, 1, None, 1)


# --- inheritance --------------------------------------------------------------------


def test_parent_method_uses_subclass_overrides_and_fields():
    s = _seed()

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


# --- ways of applying es.jit --------------------------------------------------------


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

    s = _seed()
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
    s = _seed()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(16).astype(np.float32)
    c = s.Child(dp=1.25, sp=True, dc=-0.5, sc=True)
    out = np.asarray(c(jnp.asarray(xs)))
    expected = np.float32(1.25) * (np.float32(-0.5) * xs)
    np.testing.assert_array_equal(out, expected)
