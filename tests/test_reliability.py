"""Reliability (issue 12): typed keys at every depth of a static value, nesting as
deep as `eqx.filter_jit` takes, pickling, exact statistics, and what the cache
keeps alive. Results are compared with the eager call."""

import copy
import dataclasses
import gc
import pickle
import subprocess
import sys
import textwrap
import typing
import weakref
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


# --- typed keys at every depth ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: Any


class Inner(eqx.Module):
    n: Any = eqx.field(static=True)


class Pair(typing.NamedTuple):
    a: Any
    b: Any


class Holder(es.Module):
    cfg: Any = eqx.field(static=True)

    @es.jit
    def as_array(self):
        return jnp.asarray(_first(self.cfg))

    @es.jit
    def reciprocal(self, x):
        return x / _first(self.cfg)


def _first(cfg: Any) -> Any:
    if isinstance(cfg, Cfg):
        return cfg.scale
    if isinstance(cfg, Inner):
        return cfg.n
    if isinstance(cfg, frozenset):
        return next(iter(cfg))
    while isinstance(cfg, tuple):
        cfg = cfg[0]
    return cfg


WRAPS = {
    "dataclass": Cfg,
    "module": Inner,
    "named tuple": lambda v: Pair(v, 0),
    "tuple": lambda v: (v,),
    "nested tuple": lambda v: ((v,),),
    "frozenset": lambda v: frozenset([v]),
}


@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_one_true_and_one_point_zero_differ_inside_a_static_value(wrap):
    make = WRAPS[wrap]
    got = [Holder(make(v)).as_array().dtype for v in (1, True, 1.0)]
    eager = [Holder.as_array.fn(Holder(make(v))).dtype for v in (1, True, 1.0)]
    assert got == eager == [jnp.int32, jnp.bool_, jnp.float32]


@pytest.mark.parametrize("wrap", ["dataclass", "module", "tuple", "named tuple"])
def test_minus_zero_and_nan_inside_a_static_value(wrap):
    make = WRAPS[wrap]
    x = jnp.ones(())
    assert float(Holder(make(0.0)).reciprocal(x)) == np.inf
    assert float(Holder(make(-0.0)).reciprocal(x)) == -np.inf  # not the +0.0 entry
    before = Holder.reciprocal.cache_info().misses
    for _ in range(2):  # nan equals itself: one entry, then hits
        assert np.isnan(float(Holder(make(float("nan"))).reciprocal(x * 0)))
    assert Holder.reciprocal.cache_info().misses == before + 1


class Tagged(tuple):
    """A tuple subclass with its own equality: the unit takes part in it."""

    unit: str

    def __new__(cls, values: tuple, unit: str):
        self = super().__new__(cls, values)
        self.unit = unit
        return self

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tagged)
            and tuple(self) == tuple(other)
            and self.unit == other.unit
        )

    def __hash__(self) -> int:
        return hash((tuple(self), self.unit))


class Distance(es.Module):
    d: Tagged = eqx.field(static=True)

    @es.jit
    def metres(self, x):
        return x * sum(self.d) * (1000.0 if self.d.unit == "km" else 1.0)


def test_a_tuple_subclass_is_compared_by_its_own_eq():
    x = jnp.ones(())
    assert float(Distance(Tagged((1, 1), "m")).metres(x)) == 2.0
    assert float(Distance(Tagged((1, 1), "km")).metres(x)) == 2000.0


# --- depth --------------------------------------------------------------------------


class Node(es.Module):
    w: jax.Array
    child: Any
    k: int = eqx.field(static=True)


def _total(m: Any) -> Any:
    s = 0.0
    while m is not None:
        s = s + m.w * m.k
        m = m.child
    return s


@pytest.mark.parametrize("depth", [450, 900])
def test_modules_nested_as_deep_as_filter_jit_takes(depth):
    m = None
    for i in range(depth):
        m = Node(jnp.ones(()), m, i % 3)
    want = float(eqx.filter_jit(_total)(m))
    assert float(es.jit(_total)(m)) == want == float(_total(m))


def test_nested_lists_and_static_tuples_900_deep():
    x: Any = jnp.ones(())
    for _ in range(900):
        x = [x]

    def unwrap(v):
        while isinstance(v, list):
            v = v[0]
        return 2 * v

    assert float(es.jit(unwrap)(x)) == float(eqx.filter_jit(unwrap)(x)) == 2.0
    t: Any = (1,)
    for _ in range(900):
        t = (t, 1.0)
    assert float(Holder(t).as_array()) == 1.0


# --- pickling and copying -----------------------------------------------------------


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
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr


# --- statistics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.grad(lambda y: f(y).sum())(x),
        lambda f, x: jax.vmap(f)(x[None]),
        lambda f, x: jax.jvp(f, (x,), (x,)),
    ],
    ids=["grad", "vmap", "jvp"],
)
def test_the_first_call_under_an_eager_transform_is_a_miss(transform):
    @es.jit
    def f(x):
        return jnp.sin(x)

    transform(f, jnp.ones(3))
    assert f.cache_info().misses == 1 and f.cache_info().hits == 0
    transform(f, jnp.ones(3))
    info = f.cache_info()
    assert info.hits + info.misses == 2


def test_currsize_never_exceeds_maxsize():
    class Shapes(es.Module):
        k: int = eqx.field(static=True)

        @es.jit(maxsize=2)
        def __call__(self, x):
            return x * self.k

    for k in range(3):
        for n in range(1, 4):  # three shapes per entry
            Shapes(k)(jnp.ones(n))
            assert Shapes.__call__.cache_info().currsize <= 2


# --- what the cache keeps alive -----------------------------------------------------


class SelfReferring(es.Module):
    w: jax.Array
    fn: Any = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x


def _self_referring() -> SelfReferring:
    box: list = []
    m = SelfReferring(jnp.ones(2), fn=lambda: box[0])
    box.append(m)
    return m


def test_a_module_referring_to_itself_is_freed_by_cache_clear():
    """Its key holds its static `fn`, which holds the module: the per-instance memo
    keeps it until `cache_clear()` (or the memo's bound), which frees it."""
    m = _self_referring()
    m(jnp.ones(2))
    m(jnp.ones(2))
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is not None  # the documented exception: a key refers back
    SelfReferring.__call__.cache_clear()
    gc.collect()
    assert ref() is None


def test_a_large_static_tuple_argument_is_keyed_once_per_object(monkeypatch):
    """A lookup table passed as a plain argument: its key is made on the first
    call and reused while the same tuple object is passed again."""
    from eqx_static import _key

    table = tuple(range(1000))
    calls = [0]
    walk = _key.node

    def counting(*args: Any) -> Any:
        calls[0] += 1
        return walk(*args)

    monkeypatch.setattr(_key, "node", counting)

    @es.jit
    def f(x, t):
        return x + t[3]

    assert float(f(jnp.ones(()), table)) == 4.0
    first = calls[0]
    assert first > 1000  # walked element by element once
    assert float(f(jnp.ones(()), table)) == 4.0
    assert calls[0] - first == 1  # the tuple itself only
    assert float(f(jnp.ones(()), tuple(range(1000)))) == 4.0  # another object
    assert f.cache_info().misses == 1


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


def test_unhashable_wrapper_attributes_compare_by_value():
    """Equinox keeps `eqx.module_update_wrapper`'s attributes in the structure and
    compares them with `==` (equinox 0.13.3 copies a function's `__annotations__`
    dict onto `eqx.filter_grad(f)`): two equal dicts are one entry."""

    class Wrapped(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return self.w * x

    def wrapped(annotations: dict) -> Wrapped:
        m = Wrapped(jnp.ones(2))
        object.__setattr__(m, "__annotations__", annotations)
        return m

    traces = [0]

    @es.jit
    def f(m, x):
        traces[0] += 1
        return m(x)

    f(wrapped({"x": int}), jnp.ones(2))
    f(wrapped({"x": int}), jnp.ones(2))  # an equal dict: no retrace
    assert traces[0] == 1
    f(wrapped({"x": float}), jnp.ones(2))  # a different one: a new entry
    assert traces[0] == 2
