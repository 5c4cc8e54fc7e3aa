"""`es.jit` (DESIGN §2.4, §5): the compile key, the cache and its introspection,
explanations, errors, lifetime, threads, AOT, outputs and options.

Transforms, inheritance and the ways of decorating live in `test_jit_transforms.py`.

Compiles are counted exactly, three ways where it matters: `cache_info().misses`,
a Python side effect in the traced body (it runs once per trace), and XLA backend
compiles seen through `jax.monitoring`. Every class whose cache a test counts is
defined inside that test, so each test starts from an empty cache.
"""

import concurrent.futures
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import weakref
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import seed


# `jax._src.dispatch.BACKEND_COMPILE_EVENT` in jax 0.10; recorded by
# `pxla._cached_compilation` around every XLA backend compile (cache hits of JAX's
# own persistent compilation cache included, which is off in the tests).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture
def backend_compiles():
    """The `fun_name` of every XLA backend compile while the test runs."""
    names: list[str] = []

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT:
            names.append(kwargs.get("fun_name", "?"))

    def probe(a):
        return a * 3 + 1

    a = jnp.ones(7, jnp.int32)
    jax.monitoring.register_event_duration_secs_listener(listener)
    # The listener must see a compile, or counting zero of them proves nothing.
    jax.jit(probe)(a)
    assert names == ["jit(probe)"], names
    yield names
    jax.monitoring.unregister_event_duration_listener(listener)


@pytest.fixture
def explanations(caplog):
    """The messages logged on `eqx_static` at INFO and above while the test runs."""
    caplog.set_level(logging.INFO, logger="eqx_static")

    def messages() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "eqx_static" and r.levelno >= logging.INFO
        ]

    return messages


_seed = seed


def _eager(c: Any, x: float) -> float:
    """The seed's arithmetic, done in Python on Python floats."""
    g = c.dc * x if c.sc else x
    return c.dp * g if c.sp else g


# --- the seed sequence (§5) ---------------------------------------------------------


def test_seed_sequence_compiles_three_times(backend_compiles):
    s = _seed()
    x = jnp.array(1.5)
    c = s.Child(dp=2.0, sp=False, dc=3.0, sc=False)
    steps = [
        lambda c: c,
        lambda c: c.with_static(sp=True),
        lambda c: c.with_static(sc=True),
        lambda c: c.with_dynamic(dp=3.0),
        lambda c: c.with_dynamic(dc=4.0),
    ]
    start = len(backend_compiles)
    misses, results = [], []
    for step in steps:
        c = step(c)
        for _ in range(2):
            out = c(x)
            assert out.dtype == jnp.float32 and out.shape == ()
            assert float(out) == _eager(c, 1.5)
            results.append(float(out))
            misses.append(s.Child.__call__.cache_info().misses)
    assert results == [1.5, 1.5, 3.0, 3.0, 9.0, 9.0, 13.5, 13.5, 18.0, 18.0]
    assert misses == [1, 1, 2, 2, 3, 3, 3, 3, 3, 3]
    assert s.traces[0] == 3
    # Eager arithmetic on the stored 0-d arrays (`_eager`) compiles small programs
    # of its own: count the method's.
    compiles = [c for c in backend_compiles[start:] if c == "jit(__call__)"]
    assert len(compiles) == 3, backend_compiles[start:]
    info = s.Child.__call__.cache_info()
    assert info == es.CacheInfo(hits=7, misses=3, maxsize=None, currsize=3)


def test_hundred_python_float_values_compile_once(backend_compiles):
    s = _seed()
    x = jnp.array(1.5, jnp.float32)
    c = s.Child(dp=0.0, sp=True, dc=1.0, sc=False)
    start = len(backend_compiles)
    for i in range(100):
        c = c.with_dynamic(dp=i / 7)
        for _ in range(2):  # a new instance's first call, then its memoised key
            out = c(x)  # compared in NumPy: an eager `==` on arrays would compile
            assert float(out) == float(np.float32(i / 7) * np.float32(1.5))
    assert s.traces[0] == 1
    assert len(backend_compiles) - start == 1, backend_compiles[start:]
    assert s.Child.__call__.cache_info() == es.CacheInfo(199, 1, None, 1)


# --- the key ------------------------------------------------------------------------


def test_static_values_are_keyed_by_type_and_value():
    traces = [0]

    class S(es.Module):
        n: Any = eqx.field(static=True)

        @es.jit
        def __call__(self):
            traces[0] += 1
            return jnp.asarray(self.n)

    outs = [S(n)() for n in (1, True, 1.0, 1, True, 1.0)]
    assert [o.dtype for o in outs] == [jnp.int32, jnp.bool_, jnp.float32] * 2
    assert [o.item() for o in outs] == [1, True, 1.0] * 2
    assert [type(o.item()) for o in outs[:3]] == [int, bool, float]
    assert traces[0] == 3
    assert S.__call__.cache_info() == es.CacheInfo(3, 3, None, 3)


def test_static_tuples_are_keyed_by_element_types():
    class S(es.Module):
        n: tuple = eqx.field(static=True)

        @es.jit
        def __call__(self):
            return jnp.asarray(self.n[0])

    assert [S(n)().dtype for n in ((1,), (True,), (1.0,))] == [
        jnp.int32,
        jnp.bool_,
        jnp.float32,
    ]
    assert S.__call__.cache_info().misses == 3


class _Cfg(NamedTuple):
    n: Any


def test_static_namedtuples_are_keyed_by_element_types():
    """A config `NamedTuple` in a static field is common; `Cfg(1) == Cfg(True)`."""

    class S(es.Module):
        cfg: _Cfg = eqx.field(static=True)

        @es.jit
        def __call__(self):
            return jnp.asarray(self.cfg.n)

    assert S(_Cfg(1))().dtype == jnp.int32
    assert S(_Cfg(True))().dtype == jnp.bool_
    assert S(_Cfg(1.0))().dtype == jnp.float32
    assert S.__call__.cache_info().misses == 3


def test_negative_zero_is_its_own_static_value():
    class S(es.Module):
        z: float = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.z

    x = jnp.array(1.0)
    assert not jnp.signbit(S(0.0)(x))
    assert jnp.signbit(S(-0.0)(x))
    assert S.__call__.cache_info().misses == 2


def test_concrete_class_is_part_of_the_key():
    s = _seed()

    class Doubled(s.Child):
        def g(self, x):
            return 2.0 * x

    class Same(s.Child):  # no override at all: still another class
        pass

    x = jnp.array(1.5)
    kw = dict(dp=2.0, sp=True, dc=3.0, sc=True)
    assert s.Child(**kw)(x) == 9.0
    assert Doubled(**kw)(x) == 6.0
    assert Same(**kw)(x) == 9.0
    assert s.Child(**kw)(x) == 9.0
    assert Doubled(**kw)(x) == 6.0
    assert s.traces[0] == 3
    assert s.Parent.__call__.cache_info() == es.CacheInfo(2, 3, None, 3)


def test_tree_structure_is_part_of_the_key():
    traces = [0]

    class T(es.Module):
        ws: tuple
        bias: jax.Array | None

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            out = x * sum(self.ws)
            return out if self.bias is None else out + self.bias

    x = jnp.array(2.0)
    assert T((1.0, 2.0), None)(x) == 6.0
    assert T((3.0, 4.0), None)(x) == 14.0  # same structure: reuse
    assert traces[0] == 1
    assert T((1.0, 2.0, 3.0), None)(x) == 12.0
    assert traces[0] == 2
    assert T((1.0, 2.0), jnp.array(1.0))(x) == 7.0
    assert traces[0] == 3
    assert T((1.0, 2.0), None)(x) == 6.0
    assert traces[0] == 3
    assert T.__call__.cache_info().misses == 3


def test_shape_and_dtype_of_a_field_are_part_of_the_key():
    traces = [0]

    class W(es.Module):
        w: jax.Array

        @es.jit
        def __call__(self):
            traces[0] += 1
            return self.w * 2

    assert (W(jnp.ones(3))() == 2).all()
    assert (W(jnp.zeros(3))() == 0).all()
    assert traces[0] == 1
    assert W(jnp.ones(4))().shape == (4,)
    assert traces[0] == 2
    out = W(jnp.ones(3, jnp.float16))()
    assert out.dtype == jnp.float16
    assert traces[0] == 3
    assert W(jnp.ones(3, jnp.float32))().dtype == jnp.float32
    assert W(jnp.ones(4))().shape == (4,)
    assert traces[0] == 3
    assert W.__call__.cache_info() == es.CacheInfo(3, 3, None, 3)


def test_weak_type_of_a_field_is_part_of_the_key():
    traces = [0]

    class W(es.Module):
        w: Any

        @es.jit
        def __call__(self):
            traces[0] += 1
            return self.w * 2

    # `jnp.asarray(2.0)` is weakly typed; a Python 2.0 is stored strongly typed.
    weak, strong = W(jnp.asarray(2.0)), W(jnp.array(2.0, jnp.float32))
    assert jax.typeof(weak()).weak_type
    assert jax.typeof(weak()).weak_type
    assert not jax.typeof(strong()).weak_type
    assert not jax.typeof(W(5.0)()).weak_type  # a stored number: strong
    assert traces[0] == 2
    assert W.__call__.cache_info().misses == 2
    assert float(W(5.0)()) == 10.0 and float(strong()) == 4.0


def test_sharding_is_part_of_the_key(tmp_path):
    """Eight simulated CPU devices need a fresh process: XLA reads the flag once.

    JAX traces once per aval and compiles once per input layout, so a new sharding
    need not retrace: it is a hit that compiled, counted by `compile_info()` and
    explained."""
    script = textwrap.dedent(
        """
        import logging
        import jax, jax.numpy as jnp, numpy as np, eqx_static as es
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        assert len(jax.devices()) == 8
        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("eqx_static").addHandler(handler)
        logging.getLogger("eqx_static").setLevel(logging.INFO)
        compiles = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **kw: compiles.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )

        class W(es.Module):
            w: jax.Array

            @es.jit
            def __call__(self, x):
                return self.w * x

        mesh = Mesh(np.array(jax.devices()), ("i",))
        split = NamedSharding(mesh, P("i"))
        whole = NamedSharding(mesh, P())
        x = jnp.array(2.0)
        a = W(jax.device_put(jnp.arange(8.0), split))
        b = W(jax.device_put(jnp.arange(8.0), whole))
        c = W(jax.device_put(jnp.ones(8), split))
        del compiles[:]
        for m in (a, c, b, a, b):
            out = m(x)
            assert out.sharding.is_equivalent_to(m.w.sharding, 1), out.sharding
            np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(m.w))
        print("compiles", len(compiles))
        print("info", tuple(W.__call__.cache_info()))
        print("xla", W.__call__.compile_info().compiles)
        print("lines", lines)
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,  # not the repository: import the package as installed
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "compiles 2\n" in out, out  # once per layout
    assert "info (4, 1, None, 2)\n" in out, out  # one trace, two entries
    assert "xla 2\n" in out, out  # ...and counted as such
    assert "sharding" in out.split("lines", 1)[1], out  # ...and explained


# --- arguments that are not modules: eqx.filter_jit's rules -------------------------


def _compare_with_filter_jit(calls: list[tuple]) -> tuple[list[int], list[int]]:
    """Trace counts after each call, under `es.jit` and under `eqx.filter_jit`."""
    ours, theirs = [0], [0]

    @es.jit
    def f(*args):
        ours[0] += 1
        return jnp.zeros(())

    @eqx.filter_jit
    def g(*args):
        theirs[0] += 1
        return jnp.zeros(())

    a, b = [], []
    for args in calls:
        f(*args)
        g(*args)
        a.append(ours[0])
        b.append(theirs[0])
    return a, b


def test_non_module_arguments_follow_filter_jit():
    fn1, fn2 = jnp.sin, jnp.cos
    calls = [
        (jnp.ones(3),),
        (jnp.zeros(3),),  # array values are traced
        (np.ones(3, np.float32),),  # a NumPy array: traced too
        (jnp.ones(4),),  # new shape
        (2.5,),  # a Python float outside a module is static...
        (2.5,),
        (3.5,),  # ...so a new value recompiles
        ("relu",),
        ("relu",),
        ("tanh",),
        (fn1,),
        (fn1,),
        (fn2,),
        ((1.0, jnp.ones(2)),),
        ((2.0, jnp.zeros(2)),),
        ([1.0, jnp.ones(2)],),
        (None,),
        ({"a": jnp.ones(2), "b": 3},),
        ({"a": jnp.zeros(2), "b": 3},),
    ]
    ours, theirs = _compare_with_filter_jit(calls)
    assert ours == theirs
    assert ours[-1] == 13


def test_python_float_argument_recompiles_per_value_and_is_a_python_float():
    seen = []

    @es.jit
    def f(x, scale):
        seen.append(type(scale))
        return x * scale

    x = jnp.ones(2)
    assert (f(x, 2.0) == 2).all() and (f(x, 2.0) == 2).all()
    assert (f(x, 3.0) == 3).all()
    assert seen == [float, float]
    assert f.cache_info() == es.CacheInfo(1, 2, None, 2)


def test_static_arguments_are_keyed_by_type_and_value():
    """Stricter than `eqx.filter_jit`, which lets `1`, `True` and `1.0` share."""

    @es.jit
    def f(n):
        return jnp.asarray(n)

    assert [f(n).dtype for n in (1, True, 1.0)] == [jnp.int32, jnp.bool_, jnp.float32]
    assert f.cache_info().misses == 3


def test_string_and_function_arguments_are_static():
    @es.jit
    def f(x, act, fn):
        assert isinstance(act, str)
        return fn(x) if act == "fn" else x

    x = jnp.array([0.5, 1.0])
    assert (f(x, "fn", jnp.sin) == jnp.sin(x)).all()
    assert (f(x, "fn", jnp.cos) == jnp.cos(x)).all()
    assert (f(x, "id", jnp.cos) == x).all()
    assert (f(x, "fn", jnp.sin) == jnp.sin(x)).all()
    assert f.cache_info() == es.CacheInfo(1, 3, None, 3)


# --- cache_info / cache_clear / maxsize ---------------------------------------------


def test_cache_info_is_reachable_from_class_and_instance():
    class M(es.Module):
        w: float

        @es.jit
        def __call__(self, x):
            return self.w * x

        @es.jit
        def predict(self, x):
            return self.w + x

    m, x = M(2.0), jnp.array(1.0)
    assert m(x) == 2.0 and m(x) == 2.0
    assert m.predict(x) == 3.0
    assert M.__call__.cache_info() == es.CacheInfo(1, 1, None, 1)
    assert m.__call__.cache_info() == es.CacheInfo(1, 1, None, 1)
    assert isinstance(M.__call__.cache_info(), es.CacheInfo)
    assert M.predict.cache_info() == es.CacheInfo(0, 1, None, 1)
    assert m.predict.cache_info() == es.CacheInfo(0, 1, None, 1)


def test_cache_info_fields_follow_lru_cache():
    info = es.CacheInfo(hits=1, misses=2, maxsize=3, currsize=4)
    assert tuple(info) == (1, 2, 3, 4)
    assert info._fields == ("hits", "misses", "maxsize", "currsize")


def test_cache_clear_drops_entries_and_statistics():
    s = _seed()
    c, x = s.Child(dp=2.0, sp=True, dc=3.0, sc=True), jnp.array(1.0)
    c(x), c(x), c.with_static(sc=False)(x)
    assert s.Child.__call__.cache_info() == es.CacheInfo(1, 2, None, 2)
    s.Child.__call__.cache_clear()
    assert s.Child.__call__.cache_info() == es.CacheInfo(0, 0, None, 0)
    assert c(x) == 6.0  # compiles again
    assert s.traces[0] == 3
    assert c.__call__.cache_info() == es.CacheInfo(0, 1, None, 1)
    c.__call__.cache_clear()  # from the instance too
    assert s.Child.__call__.cache_info() == es.CacheInfo(0, 0, None, 0)


def test_cache_clear_from_a_bound_method():
    class M(es.Module):
        w: float

        @es.jit
        def predict(self, x):
            return self.w * x

    m = M(2.0)
    assert m.predict(jnp.array(2.0)) == 4.0
    m.predict.cache_clear()
    assert M.predict.cache_info() == es.CacheInfo(0, 0, None, 0)


def test_maxsize_evicts_the_least_recently_used_entry():
    traces = [0]

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit(maxsize=2)
        def __call__(self, x):
            traces[0] += 1
            return self.w * x + self.k

    x = jnp.array(1.0)
    a, b, c = M(1.0, 0), M(1.0, 10), M(1.0, 20)
    assert a(x) == 1.0 and b(x) == 11.0 and a(x) == 1.0
    assert traces[0] == 2
    assert c(x) == 21.0  # evicts b, the least recently used
    assert traces[0] == 3
    assert M.__call__.cache_info() == es.CacheInfo(1, 3, 2, 2)
    assert a(x) == 1.0  # a survived: a hit, and now the most recent
    assert traces[0] == 3
    assert b(x) == 11.0  # b was evicted: a miss, which evicts c
    assert traces[0] == 4
    assert a(x) == 1.0
    assert traces[0] == 4
    assert c(x) == 21.0
    assert traces[0] == 5
    assert M.__call__.cache_info() == es.CacheInfo(3, 5, 2, 2)


def test_maxsize_counts_shapes_as_entries():
    traces = [0]

    @es.jit(maxsize=1)
    def f(x):
        traces[0] += 1
        return x + 1

    assert f(jnp.ones(2)).shape == (2,)
    assert f(jnp.ones(3)).shape == (3,)
    assert f(jnp.ones(2)).shape == (2,)
    assert traces[0] == 3
    assert f.cache_info() == es.CacheInfo(0, 3, 1, 1)


# --- explanations -------------------------------------------------------------------


class Parent(es.Module):
    """DESIGN §2's classes at module level, so log lines carry their plain names."""

    dp: float
    sp: bool = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.dp * self.g(x) if self.sp else self.g(x)

    def g(self, x):
        raise NotImplementedError


class Child(Parent):
    dc: float
    sc: bool = eqx.field(static=True)

    def g(self, x):
        return self.dc * x if self.sc else x


class OtherChild(Parent):
    dc: float
    sc: bool = eqx.field(static=True)

    def g(self, x):
        return -x


@pytest.fixture
def seed_log(explanations):
    Parent.__call__.cache_clear()
    yield explanations
    Parent.__call__.cache_clear()


def test_explanation_static_field_changed(seed_log):
    c, x = Child(dp=2.0, sp=False, dc=3.0, sc=False), jnp.array(1.0)
    c(x), c(x)
    assert seed_log() == []  # the first miss says nothing; hits say nothing
    c = c.with_static(sp=True)
    c(x), c(x)
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): static field 'sp' changed False -> True"
    ]
    c.with_dynamic(dp=5.0, dc=1.0)(x)
    assert len(seed_log()) == 1


def test_explanation_argument_shape(seed_log):
    c = Child(dp=2.0, sp=False, dc=3.0, sc=False)
    c(jnp.ones(3))
    c(jnp.ones(4))
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): argument x shape (3,) -> (4,)"
    ]


def test_explanation_class(seed_log):
    x = jnp.array(1.0)
    Child(dp=2.0, sp=False, dc=3.0, sc=False)(x)
    assert OtherChild(dp=2.0, sp=False, dc=3.0, sc=False)(x) == -1.0
    assert seed_log() == [
        "OtherChild.__call__: compiling (1 cached): class Child -> OtherChild"
    ]


def test_explanation_picks_the_closest_entry_and_counts_entries(seed_log):
    x = jnp.array(1.0)
    c = Child(dp=2.0, sp=False, dc=3.0, sc=False)
    c(x)
    c.with_static(sp=True)(x)
    c.with_static(sp=True, sc=True)(x)  # closest: sp=True, sc=False
    assert seed_log() == [
        "Child.__call__: compiling (1 cached): static field 'sp' changed False -> True",
        "Child.__call__: compiling (2 cached): static field 'sc' changed False -> True",
    ]


def test_explanation_field_dtype_and_weak_type(explanations):
    class W(es.Module):
        w: Any

        @es.jit
        def __call__(self):
            return self.w * 2

    W(jnp.asarray(2.0))()  # weakly typed
    W(2.0)()  # a stored number: float32, strongly typed
    W(jnp.array(2.0, jnp.float16))()
    lines = explanations()
    assert len(lines) == 2
    assert "W.__call__: compiling (1 cached): " in lines[0]
    assert "field 'w' weak type True -> False" in lines[0]
    assert "field 'w' dtype float32 -> float16" in lines[1]


def test_explanation_nested_static_field(explanations):
    class Enc(es.Module):
        act: str = eqx.field(static=True)

    class Model(es.Module):
        enc: Enc

        @es.jit
        def __call__(self, x):
            return jnp.tanh(x) if self.enc.act == "tanh" else x

    x = jnp.array(1.0)
    Model(Enc("id"))(x)
    Model(Enc("tanh"))(x)
    (line,) = explanations()
    assert "static field 'enc.act' changed 'id' -> 'tanh'" in line


def test_no_explanation_below_info(caplog):
    caplog.set_level(logging.WARNING, logger="eqx_static")
    s = _seed()
    c, x = s.Child(dp=2.0, sp=False, dc=3.0, sc=False), jnp.array(1.0)
    c(x)
    c.with_static(sp=True)(x)
    assert [r for r in caplog.records if r.name == "eqx_static"] == []
    assert s.Child.__call__.cache_info().misses == 2


# --- traced fields in Python control flow -------------------------------------------


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
    """DESIGN §1's own example of a static: "an int that sets a loop length"."""

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


def test_a_failed_trace_is_a_miss_that_holds_no_entry():
    """Every call is booked once (issue 12): a trace that raised is a miss, and
    compiled nothing, so `currsize` does not count it."""

    class Gate(es.Module):
        dp: float

        @es.jit
        def __call__(self, x):
            return x if self.dp > 0 else -x

    for _ in range(2):
        with pytest.raises(es.TracedFieldError):
            Gate(1.0)(jnp.array(1.0))
    assert Gate.__call__.cache_info() == es.CacheInfo(0, 2, None, 0)


def test_traced_argument_keeps_jax_error():
    """Not a field: nothing to declare static, so JAX's own error is kept."""

    @es.jit
    def f(x):
        return x if x > 0 else -x

    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        f(jnp.array(1.0))
    assert not isinstance(info.value, es.TracedFieldError)


# --- lifetime -----------------------------------------------------------------------


def test_cache_keeps_no_module_alive():
    class M(es.Module):
        w: float
        a: jax.Array

        @es.jit
        def __call__(self, x):
            return self.w * x + self.a

        @es.jit
        def predict(self, x):
            return self.w * x

    @es.jit
    def f(m, x):
        return m.a * x

    @es.jit
    def g(ms, x):
        return ms[0].a * x

    m, x = M(2.0, jnp.ones(3)), jnp.ones(3)
    for _ in range(3):  # a first call, then calls on the memoised key
        m(x), m.predict(x), f(m, x), g([m], x)
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None


def test_cache_keeps_no_traced_array_alive():
    class M(es.Module):
        a: jax.Array

        @es.jit
        def __call__(self, x):
            return self.a * x

    a, x = jnp.ones(3), jnp.full(3, 2.0)
    m = M(a)
    assert (m(x) == 2).all() and (m(x) == 2).all()
    refs = [weakref.ref(a), weakref.ref(x)]
    del a, x, m
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_module_closed_over_by_an_outer_jit_is_still_usable():
    """Calls inside `jax.jit` must not leave tracers in the per-instance memo."""

    class M(es.Module):
        w: float

        @es.jit
        def __call__(self, x):
            return self.w * x

    m = M(2.0)  # a Python float: the memo puts it on the device on a second call
    x = jnp.array(1.0)
    assert float(jax.jit(lambda x: m(x) + m(x))(x)) == 4.0
    assert float(m(x)) == 2.0
    assert float(m(x)) == 2.0


def test_mutable_container_in_a_field_is_read_on_every_call():
    """A frozen module may hold a list; mutating it in place is seen, as under
    `eqx.filter_jit`, so a module holding one must not be memoised."""

    class M(es.Module):
        ws: list

        @es.jit
        def __call__(self, x):
            return sum(self.ws) * x

    m, x = M([1.0, 2.0]), jnp.array(1.0)  # stored as a list of 0-d arrays
    assert float(m(x)) == 3.0 and float(m(x)) == 3.0
    m.ws[0] = jnp.float32(10.0)  # same structure and avals: a hit, new value seen
    assert float(m(x)) == 12.0
    m.ws.append(jnp.float32(5.0))  # new structure: a miss
    assert float(m(x)) == 17.0
    assert M.__call__.cache_info().misses == 2
    m.ws[0] = 1.0  # a Python float, put in place by hand: static, as in filter_jit
    assert float(m(x)) == 8.0
    assert M.__call__.cache_info().misses == 3


# --- threads ------------------------------------------------------------------------


def test_threads_with_mixed_keys_get_correct_results():
    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.w + self.k

    def job(i: int) -> bool:
        k, n, w = i % 4, 2 + i % 3, float(i)
        out = M(w, k)(jnp.arange(n, dtype=jnp.float32))
        return out.shape == (n,) and bool((out == np.arange(n) * w + k).all())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(job, range(96)))
    assert M.__call__.cache_info().currsize == 12


def test_threads_compiling_the_same_new_key_at_once():
    """Eight threads meet at a barrier and call with one new key together."""

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return x * self.w + self.k

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a loaded machine would
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for k in range(24):
                barrier = threading.Barrier(8)

                def job(i: int, k: int = k, barrier=barrier) -> float:
                    m, x = M(float(i), k), jnp.ones(())
                    barrier.wait()
                    return float(m(x))

                assert list(pool.map(job, range(8))) == [i + k for i in range(8)]
    finally:
        sys.setswitchinterval(interval)
    assert M.__call__.cache_info().currsize == 24


# --- ahead of time ------------------------------------------------------------------


def test_lower_from_the_class():
    s = _seed()
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
        lowered.compile()(x, x)


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


def test_donate_all():
    class M(es.Module):
        w: float

    @es.jit(donate="all")
    def f(m, x):
        return x * m.w

    m = M(2.0)
    for _ in range(3):
        x = jnp.ones(3)
        assert (f(m, x) == 2).all()


def test_donate_all_except_first_keeps_self():
    class M(es.Module):
        w: jax.Array

        @es.jit(donate="all-except-first")
        def __call__(self, x):
            return x * self.w

    m = M(jnp.arange(3.0))
    for _ in range(3):
        assert (m(jnp.ones(3)) == jnp.arange(3.0)).all()
    assert not m.w.is_deleted()


@pytest.mark.parametrize("donate", ["all", "warn"])
def test_donate_all_donates_the_buffers_of_self(donate):
    """As under `eqx.filter_jit`: a number stored in an `es.Module` is an array, so
    `donate="all"` donates it with the rest of `self`."""

    class M(es.Module):
        w: Any

        @es.jit(donate=donate)
        def __call__(self, x):
            return x * self.w, self.w * 2

    m = M(3.0)
    y, w2 = m(jnp.ones(3))
    assert (y == 3).all() and w2 == 6.0
    assert m.w.is_deleted()


def test_donate_all_except_first_keeps_the_first_argument_by_keyword():
    class M(es.Module):
        w: Any

    @es.jit(donate="all-except-first")
    def f(m, x):
        return x * m.w

    m, x = M(jnp.ones(3)), jnp.ones(3)
    f(m=m, x=x)  # bound to positions first: `m` is the first argument
    assert not m.w.is_deleted() and x.is_deleted()


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


@pytest.mark.parametrize("maxsize", [1.5, "2"])
def test_maxsize_of_the_wrong_type_raises(maxsize):
    with pytest.raises((ValueError, TypeError), match="maxsize"):
        es.jit(maxsize=maxsize)(lambda x: x)


def test_not_a_function_raises():
    with pytest.raises(TypeError, match="function|'fn'"):
        es.jit(3)  # pyright: ignore[reportArgumentType]


def test_unhashable_static_value_in_a_plain_equinox_module():
    """A plain `eqx.Module` may hold a list in a static field (lineax operators
    do): it keys by `==`, as Equinox's tree structure compares it, and as under
    `eqx.filter_jit`. (An `es.Module` refuses it at construction.)"""

    class P(eqx.Module):
        w: float
        xs: list = eqx.field(static=True)

    traces = [0]

    def body(m, x):
        traces[0] += 1
        return x * m.w * len(m.xs)

    f, g = es.jit(body), eqx.filter_jit(body)
    x = jnp.ones(2)
    for xs in ([1, 2], [1, 2], [1.0, 2.0], [1, 2, 3]):
        p = P(2.0, xs)
        np.testing.assert_array_equal(f(p, x), g(p, x))
        np.testing.assert_array_equal(f(p, x), body(p, x))
    # `[1, 2] == [1.0, 2.0]`: one key, as in filter_jit; `[1, 2, 3]` is another.
    assert f.cache_info() == es.CacheInfo(6, 2, None, 2)
    # The key holds the list itself, as JAX's tree structure does: changed in
    # place, it still equals itself, so the cached program runs, as under
    # `eqx.filter_jit`. Frozen means frozen (README, "Guarantees").
    p.xs.append(4)
    np.testing.assert_array_equal(f(p, x), g(p, x))


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
