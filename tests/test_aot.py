"""Ahead-of-time compilation: `lower(...)` from the function, the class or an
instance, `.compile()`, and the compiled callable, which takes the arguments that
`lower` took. Lowering books no call."""

import eqx_static as es
import jax
import jax.numpy as jnp
import pytest
from helpers import seed


# --- lowering and compiling ahead of time ------------------------------------------


def test_lower_from_the_class():
    s = seed()
    c, x = s.Child(dp=2.0, sp=True, dc=3.0, sc=True), jnp.array(1.0)
    lowered = s.Child.__call__.lower(c, x)
    assert isinstance(lowered, es.Lowered)
    assert "multiply" in lowered.as_text()
    compiled = lowered.compile()
    assert isinstance(compiled, es.Compiled)
    assert compiled(c, x) == c(x) == 6.0  # the wrapper's own arguments
    assert c.__call__.lower(x).compile()(x) == 6.0  # from an instance: `c` bound


def test_lower_from_a_bound_method():
    class M(es.Module):
        w: float

        @es.jit
        def predict(self, x):
            return self.w * x

    m, x = M(2.0), jnp.ones(3)
    lowered = m.predict.lower(x)
    assert isinstance(lowered, es.Lowered)
    assert "multiply" in lowered.as_text()
    assert (lowered.compile()(x) == 2.0).all()  # `m` is bound, as in `m.predict`
    assert (M.predict.lower(m, x).compile()(m, x) == 2.0).all()
    with pytest.raises(TypeError, match="lowered for other static values"):
        lowered.compile()((x, x))  # another tree structure
    with pytest.raises(TypeError, match=r"predict\(\) takes 2 positional arguments"):
        lowered.compile()(x, x)  # as the method itself says


def test_lower_books_no_call_and_erases_no_hits():
    """lower() is not a call: it books nothing, and the calls around it keep
    their counts. Nor does its trace let a later call compile behind the miss
    path: each new shape is a miss, and compiles once."""

    @es.jit
    def f(x):
        return 2 * x

    f(jnp.ones(3))
    for n in (4, 5, 6):
        f.lower(jnp.ones(n))
    for _ in range(3):
        f(jnp.ones(3))
    assert f.cache_info() == es.CacheInfo(3, 1, None, 1)
    f(jnp.ones(4))
    assert f.cache_info() == es.CacheInfo(3, 2, None, 2)
    assert f.compile_info().compiles == 2


def test_text_and_costs_are_jax_own_at_each_stage():
    """`as_text()` and `cost_analysis()` of the lowered and of the compiled call
    are JAX's, as `jax.jit(f).lower(...)` gives them."""

    def f(x):
        return jnp.sin(x) * 2

    x = jnp.ones(3)
    ours, theirs = es.jit(f).lower(x), jax.jit(f).lower(x)
    assert "sine" in ours.as_text() and "sine" in theirs.as_text()
    compiled = ours.compile()
    assert compiled.as_text() != ours.as_text()  # the compiled module, not the lowered
    assert "sine" in compiled.as_text()
    for a, b in [(ours, theirs), (compiled, theirs.compile())]:
        assert type(a.cost_analysis()) is type(b.cost_analysis())
