"""Host callbacks decide whether two keys may share one program.

The module text of a program does not hold the Python function a callback calls,
so two keys whose programs print the same may still behave differently. A program
is shared only when each callback is on an allow-list, never by comparing values:
the identical function object (both keys then call the same Python), or one of
Equinox's `error_if` callbacks over equal messages; a callback's `in_tree` is
compared by type and value, as the key is. Anything else that runs Python on the
host (`jax.debug.print`, a closure made in each trace) makes a program unshareable.
Every result is compared with the eager call; compiles are counted by the library
and by JAX's own monitoring events (`XlaCompiles`).
"""

from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import XlaCompiles
from jax.experimental import io_callback


SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


# --- callbacks that must not share a program ---------------------------------------


def _nan_counter():
    """A counter of the NaNs it has seen, its state in a closure cell."""
    count = 0

    def seen(y):
        nonlocal count
        count += int(np.isnan(y).sum())
        return np.asarray(count, np.float32)

    return seen


def _counting(counters: dict[str, Any]):
    def count(x, mode):
        return jax.pure_callback(counters[mode], SCALAR, x)

    return count


def test_a_nan_counter_per_mode_counts_its_own_nans():
    """A factory-made counter for "train" and one for "eval": both cells hold 0
    when the second key compiles, and "train"'s is rebound afterwards. Each mode
    counts its own NaNs, as eagerly."""
    eager = _counting({"train": _nan_counter(), "eval": _nan_counter()})
    f = es.jit(_counting({"train": _nan_counter(), "eval": _nan_counter()}))
    ok, nan = jnp.float32(1.0), jnp.float32(jnp.nan)
    calls = [(ok, "train"), (ok, "eval"), (nan, "train"), (nan, "train"), (ok, "eval")]
    got = [float(f(x, mode)) for x, mode in calls]
    want = [float(eager(x, mode)) for x, mode in calls]
    assert got == want == [0.0, 0.0, 1.0, 2.0, 0.0]
    assert f.compile_info().compiles == 2


def _scaler(scale: float):
    """A callback over a scale, and a setter that rebinds it."""

    def apply(y):
        return np.asarray(y * scale, np.float32)

    def set_scale(v: float) -> None:
        nonlocal scale
        scale = v

    return apply, set_scale


def test_a_scale_rebound_by_its_setter_is_the_scale_the_callback_uses():
    """Two scalers made with the same scale compile one after the other; then the
    second's setter rebinds its scale. Its key must run its own callback."""
    ops = {"a": _scaler(2.0), "b": _scaler(2.0)}

    @es.jit
    def f(x, name):
        return jax.pure_callback(ops[name][0], SCALAR, x)

    def eager(x, name):
        return jax.pure_callback(ops[name][0], SCALAR, x)

    x = jnp.float32(1.5)
    assert float(f(x, "a")) == float(eager(x, "a")) == 3.0
    assert float(f(x, "b")) == float(eager(x, "b")) == 3.0
    ops["b"][1](5.0)
    assert float(f(x, "b")) == float(eager(x, "b")) == 7.5
    assert float(f(x, "a")) == float(eager(x, "a")) == 3.0
    assert f.compile_info().compiles == 2


class _Sink:
    """A mutable accumulator whose `==` and hash go by its name only."""

    def __init__(self, name: str):
        self.name = name
        self.total = 0.0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Sink) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def add(self, y):
        self.total += float(y)
        return np.asarray(self.total, np.float32)


def _adding(sinks: dict[str, _Sink]):
    def add(x, which):
        return io_callback(sinks[which].add, SCALAR, x)

    return add


def test_writes_land_in_the_object_whose_method_was_called():
    """`io_callback(obj.add)` over two distinct sinks of the same name: equal by
    their own `__eq__`, but mutable, so not the same object: each key writes to
    its own sink, as eagerly."""
    eager_sinks = {"a": _Sink("log"), "b": _Sink("log")}
    sinks = {"a": _Sink("log"), "b": _Sink("log")}
    eager, f = _adding(eager_sinks), es.jit(_adding(sinks))
    calls = [(1.0, "a"), (10.0, "b"), (100.0, "b"), (1000.0, "a")]
    got = [float(f(jnp.float32(v), which)) for v, which in calls]
    want = [float(eager(jnp.float32(v), which)) for v, which in calls]
    assert got == want == [1.0, 10.0, 110.0, 1001.0]
    assert sinks["a"].total == eager_sinks["a"].total == 1001.0
    assert sinks["b"].total == eager_sinks["b"].total == 110.0
    assert f.compile_info().compiles == 2


class _Cfg(eqx.Module):
    """A plain Equinox module with a static float: passed to a callback, the static
    value travels in the callback's `in_tree`."""

    w: jax.Array
    k: float = eqx.field(static=True)


def _host_k(cfg: _Cfg, y):
    return np.asarray(cfg.k * np.ones_like(y), np.float32)


def _k_through_callback(cfg: _Cfg, x):
    return jax.pure_callback(_host_k, SCALAR, cfg, x)


def test_a_callback_sees_the_sign_of_its_own_static_zero():
    """The callback function is one object; only the static `k` in its argument
    tree differs, `0.0` then `-0.0`. Compared by type and value (by bits), they are
    two callbacks: the second sees `-0.0`, as eagerly."""
    f = es.jit(_k_through_callback)
    x = jnp.float32(1.0)
    for k in (0.0, -0.0):
        cfg = _Cfg(jnp.float32(2.0), k)
        # Eagerly, the host function itself: an eager `jax.pure_callback` runs
        # through JAX's own cache, keyed with `==`, and would give back `0.0`.
        got, want = f(cfg, x), _host_k(cfg, np.float32(1.0))
        assert np.signbit(got) == np.signbit(want) == np.signbit(k)
        assert float(got) == float(want) == 0.0
    assert f.cache_info().misses == 2
    assert f.compile_info().compiles == 2


# --- callbacks that must still share ------------------------------------------------


def test_error_if_programs_share_across_an_unread_static_field():
    """`eqx.error_if`'s callback closes over the messages only: equal messages are
    the same callback, so keys that differ in an unread static field share one
    program, and the check still fires."""

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)  # never read

        @es.jit
        def f(self, x):
            return eqx.error_if(self.w * x, x > 10.0, "too big")

        def eager(self, x):
            return eqx.error_if(self.w * x, x > 10.0, "too big")

    ms = [M(jnp.float32(2.0), tag) for tag in "abc"]
    x = jnp.float32(1.5)
    want = [float(m.eager(x)) for m in ms]  # before counting: eager code compiles
    compiles = XlaCompiles()
    got = [float(m.f(x)) for m in ms]
    assert got == want == [3.0, 3.0, 3.0]
    assert compiles.of("f") == M.f.compile_info().compiles == 1
    assert M.f.cache_info().misses == 3
    with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
        ms[2].f(jnp.float32(11.0))


def _fixed_scaler(k: float):
    """A callback over a parameter no function rebinds."""

    def apply(y):
        return np.asarray(y * k, np.float32)

    return apply


def test_a_factory_callback_made_for_each_key_is_not_shared():
    """Each key makes its own closure over an equal parameter: a new object, so not
    the same callback (nothing proves the cell is never rebound): one program per
    key, with the eager results."""

    @es.jit
    def f(x, tag):
        return jax.pure_callback(_fixed_scaler(2.0), SCALAR, x)

    def eager(x, tag):
        return jax.pure_callback(_fixed_scaler(2.0), SCALAR, x)

    x = jnp.float32(1.5)
    want = [float(eager(x, tag)) for tag in "abc"]
    compiles = XlaCompiles()
    got = [float(f(x, tag)) for tag in "abc"]
    assert got == want == [3.0, 3.0, 3.0]
    assert compiles.of("f") == f.compile_info().compiles == 3
    assert f.cache_info().misses == 3


def _scale_host(y):
    return np.asarray(y * 2.0, np.float32)


def test_the_identical_callback_is_shared():
    """A callback that is the same function object for every key (a function at
    module level): both keys call the same Python, so one program serves both."""

    @es.jit
    def f(x, tag):
        return jax.pure_callback(_scale_host, SCALAR, x)

    x = jnp.float32(1.5)
    compiles = XlaCompiles()
    assert [float(f(x, tag)) for tag in "abc"] == [3.0, 3.0, 3.0]
    assert compiles.of("f") == f.compile_info().compiles == 1
    assert f.cache_info().misses == 3
