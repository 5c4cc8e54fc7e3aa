"""Host callbacks decide whether two keys may share one program.

The module text of a program does not hold the Python function a callback calls,
so two keys whose programs print the same may still behave differently. A program
is shared only when each callback is on an allow-list, never by comparing values:
the identical function object (both keys then call the same Python; Equinox's
`error_if` stages one per set of messages); a callback's `in_tree` is
compared by type and value, as the key is. Anything else that runs Python on the
host (`jax.debug.print`, a closure made in each trace) makes a program unshareable.
Every result is compared with the eager call; compiles are counted by the library
and by JAX's own monitoring events (`XlaCompiles`).
"""

import dataclasses
import functools
import os
import unittest.mock
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import opaque_host_callbacks, XlaCompiles
from jax.experimental import io_callback


SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


def _lowered(f, *args, **options):
    """The lowering of `jax.jit(f, **options)` for `args` (`ones(3)` if none)."""
    traced = jax.jit(f, **options).trace(*(args or (jnp.ones(3),)))
    return _jax.lowering_of(traced.lower())


def _digest(lowering):
    """`_sharing.digest` of a lowering's module."""
    from eqx_static._sharing import digest

    return digest(lowering.stablehlo())


def _compiled(f, *args):
    """The executable of `jax.jit(f)` for `args` (`ones(3)` if none)."""
    lowered = jax.jit(f).trace(*(args or (jnp.ones(3),))).lower()
    lowered.compile()
    return _jax.executable_of(_jax.lowering_of(lowered))


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


@pytest.mark.sharing
def test_error_if_programs_share_across_an_unread_static_field():
    """`eqx.error_if` stages one callback object per set of messages: equal
    messages are the identical callback, so keys that differ in an unread static field share one
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


_twice = jax.jit(lambda y: jax.pure_callback(_scale_host, SCALAR, y))


@pytest.mark.sharing
def test_a_check_and_an_inner_function_called_twice_still_share(opaque):
    """JAX lowers an inner `jax.jit` called twice once (so does `eqx.error_if`'s
    own, for equal messages): its callbacks are read once, as the lowering holds
    them, and keys that differ in an unread static field share one program."""

    class M(es.Module):
        tag: str = eqx.field(static=True)  # never read

        @es.jit
        def f(self, x):
            y = _twice(x) + _twice(x * 2)
            return eqx.error_if(eqx.error_if(y, y > 30.0, "big"), x > 10.0, "big")

    x = jnp.float32(1.5)
    compiles = XlaCompiles()
    assert [float(M(tag).f(x)) for tag in "abc"] == [9.0, 9.0, 9.0]
    assert compiles.of("f") == M.f.compile_info().compiles == 1
    with pytest.raises(eqx.EquinoxRuntimeError, match="big"):
        M("d").f(jnp.float32(11.0))


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


@pytest.mark.sharing
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


# --- what a callback holds can change after the second key is traced -------------
# Each case: the keys "train" and "eval" trace callbacks that look alike when both
# are traced; then the "eval" callback's state changes (the way each idiom keeps
# state), and "eval" must run its own callback, as eagerly and under filter_jit.


def _by_attribute(scale: float) -> tuple[Any, Any]:
    def cb(y):
        return np.asarray(y * cb.scale, np.float32)  # pyright: ignore[reportFunctionMemberAccess]

    cb.scale = scale  # pyright: ignore[reportFunctionMemberAccess]

    def change(v: float) -> None:
        cb.scale = v  # pyright: ignore[reportFunctionMemberAccess]

    return cb, change


def _by_default(scale: float) -> tuple[Any, Any]:
    def cb(y, k=scale):
        return np.asarray(y * k, np.float32)

    def change(v: float) -> None:
        cb.__defaults__ = (v,)

    return cb, change


def _by_keyword_default(scale: float) -> tuple[Any, Any]:
    def cb(y, *, k=scale):
        return np.asarray(y * k, np.float32)

    def change(v: float) -> None:
        cb.__kwdefaults__["k"] = v  # pyright: ignore[reportOptionalSubscript]

    return cb, change


def _times_k(y, k):
    return np.asarray(y * k, np.float32)


def _by_partial(scale: float) -> tuple[Any, Any]:
    cb = functools.partial(_times_k, k=scale)

    def change(v: float) -> None:
        cb.keywords["k"] = v

    return cb, change


def _by_code(scale: float) -> tuple[Any, Any]:
    def cb(y):
        return np.asarray(y * 1.0, np.float32)

    def half(y):
        return np.asarray(y * 0.5, np.float32)

    def change(v: float) -> None:
        cb.__code__ = half.__code__

    return cb, change


@dataclasses.dataclass(frozen=True)
class _Scaler:
    """A frozen dataclass whose state lives outside its fields (set in
    `__post_init__`, the usual way to cache in one)."""

    name: str

    def __post_init__(self):
        object.__setattr__(self, "state", {"scale": 1.0})

    def __call__(self, y):
        return np.asarray(y * self.state["scale"], np.float32)


def _by_frozen_dataclass(scale: float) -> tuple[Any, Any]:
    cb = _Scaler("scaler")

    def change(v: float) -> None:
        cb.state["scale"] = v

    return cb, change


@pytest.mark.parametrize(
    "make",
    [_by_attribute, _by_default, _by_keyword_default, _by_partial, _by_code,
     _by_frozen_dataclass],
    ids=["function attribute", "defaults", "keyword defaults", "partial keywords",
         "code", "frozen dataclass state"],
)  # fmt: skip
def test_a_callback_changed_after_sharing_runs_as_changed(make):
    callbacks = {mode: make(1.0) for mode in ("train", "eval")}

    def body(x, mode):
        return jax.pure_callback(callbacks[mode][0], SCALAR, x)

    f, g = es.jit(body), eqx.filter_jit(body)
    x = jnp.float32(1.0)
    for mode in ("train", "eval"):
        f(x, mode)
        g(x, mode)
    callbacks["eval"][1](0.5)  # the eval callback now halves
    got = [float(f(x, mode)) for mode in ("train", "eval")]
    assert got == [float(g(x, mode)) for mode in ("train", "eval")] == [1.0, 0.5]
    assert f.compile_info().compiles == 2  # never shared


def _unused_callback(x):
    jax.pure_callback(_scale_host, SCALAR, x)  # its result unused: JAX drops it


def _sharding_callback(x):
    jax.debug.inspect_array_sharding(x, callback=lambda s: None)  # runs lowering


@pytest.mark.parametrize(
    "beside", [_unused_callback, _sharding_callback], ids=["unused", "inspect"]
)
def test_a_debug_print_is_never_shared(capfd, beside):
    """`jax.debug.print` is its own primitive, with no `callback` parameter: a
    program holding one is unshareable, also beside a callback equation that adds
    no host callback (an unused `pure_callback`, `inspect_array_sharding`), which a
    count of callback equations against host callbacks would take for it."""

    class M(es.Module):
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            beside(x)
            jax.debug.print(self.tag + " {}", x)
            return x * 2

    x = jnp.float32(1.0)
    for tag in ("train", "eval"):
        M(tag).f(x)
    jax.effects_barrier()
    assert capfd.readouterr().out.split() == ["train", "1.0", "eval", "1.0"]
    assert M.f.compile_info().compiles == 2


def _first_key_type(d):
    """1 for a bool key, 2 for an int, 3 for a float, 13 for a negative zero."""
    (k,) = d
    code = {bool: 1, int: 2, float: 3}[type(k)]
    return np.asarray(code + 10 * (type(k) is float and np.signbit(k)), np.float32)


def test_a_dict_keyed_by_a_static_value_is_compared_by_type_and_value():
    """`{self.k: x}` as a callback's argument: `1`, `True` and `1.0` are three keys
    of its `in_tree`, and so are `0.0` and `-0.0`: the callback gets its own dict."""

    class M(es.Module):
        k: Any = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return jax.pure_callback(_first_key_type, SCALAR, {self.k: x})

    x = jnp.float32(1.0)
    got = [float(M(k).f(x)) for k in (1, True, 1.0, 0.0, -0.0)]
    assert got == [float(_first_key_type({k: 1.0})) for k in (1, True, 1.0, 0.0, -0.0)]
    assert got == [2.0, 1.0, 3.0, 3.0, 13.0]


# --- the nets under the rules --------------------------------------------------------


@pytest.mark.sharing
def test_a_jax_that_compiles_an_installed_program_turns_sharing_off(monkeypatch):
    """The self-check: if installing an executable does nothing (a JAX that no
    longer runs what is set on a lowering), JAX compiles the shared program: one
    warning, sharing off for the process, and every compile still booked."""

    monkeypatch.setattr(_jax, "SHARING", True)  # restored after the test
    monkeypatch.setattr(_jax, "set_executable", lambda lowering, executable: None)

    @es.jit
    def f(x, tag):
        return x * 2

    x = jnp.float32(1.5)
    compiles = XlaCompiles()
    assert float(f(x, "a")) == 3.0
    with pytest.warns(RuntimeWarning, match="stops sharing programs between keys"):
        assert float(f(x, "b")) == 3.0
    assert float(f(x, "c")) == 3.0  # each key its own program now, no new warning
    assert f.compile_info().compiles == compiles.of("f") == 3


def test_with_sharing_off_every_key_compiles(monkeypatch):
    """Sharing off (a JAX without what it needs, or the self-check tripped): no
    program is fingerprinted, so each key compiles its own."""

    monkeypatch.setattr(_jax, "SHARING", False)
    _two_keys_of_one_program_compile_twice()


def test_a_text_that_cannot_be_made_canonical_is_never_shared(monkeypatch):
    """A module whose text `digest` cannot canonicalise (None) has no fingerprint:
    two keys whose programs would share then compile one each."""
    from eqx_static import _sharing

    monkeypatch.setattr(_sharing, "digest", lambda module: None)
    later = _sharing.fingerprint(_lowered(lambda x: x * 2), ())
    assert later is None or later() is None  # None: sharing off (the public path)
    _two_keys_of_one_program_compile_twice()


def _two_keys_of_one_program_compile_twice():
    """Two keys (an unread static `tag`) whose programs would share: each compiles,
    by the books and by JAX's monitoring events, and gives the eager result."""

    @es.jit
    def f(x, tag):
        return x * 2

    x = jnp.float32(1.5)
    compiles = XlaCompiles()
    assert [float(f(x, tag)) for tag in "ab"] == [3.0, 3.0]
    assert f.compile_info().compiles == compiles.of("f") == 2


def test_an_ordered_effect_is_never_shared():
    """An ordered `io_callback` of one identical function: its effect is an
    ordering between calls, not a value: not on the list, so each key compiles."""

    @es.jit
    def f(x, tag):
        return io_callback(_host, SCALAR, x, ordered=True)

    x = jnp.float32(1.5)
    assert [float(f(x, tag)) for tag in "ab"] == [3.0, 3.0]
    assert f.compile_info().compiles == 2


@pytest.mark.sharing
def test_a_compile_argument_unknown_to_the_list_makes_a_program_unshareable(
    monkeypatch,
):
    from eqx_static._sharing import fingerprint

    lowering = _lowered(lambda x: x * 2)
    assert fingerprint(lowering, ()) is not None
    known = _jax.compile_arguments
    monkeypatch.setattr(
        _jax, "compile_arguments", lambda lo: {**known(lo), "new_in_jax": 1}
    )
    assert fingerprint(lowering, ()) is None
    # A shape-polymorphism state that does not say what it holds: not comparable.
    unread = {**known(lowering), "shape_poly_state": object()}
    monkeypatch.setattr(_jax, "compile_arguments", lambda lo: unread)
    assert fingerprint(lowering, ()) is None


@pytest.mark.sharing
def test_the_fingerprint_holds_the_compile_arguments():
    """Donation is a compile argument: two lowerings that differ in it have other
    fingerprints' arguments, whatever their texts."""
    from eqx_static._sharing import fingerprint

    def arguments(**options):
        later = fingerprint(_lowered(lambda x: x * 2, **options), ())
        fp = None if later is None else later()
        assert fp is not None
        return dict(fp.arguments)

    assert arguments()["donated_invars"] == (False,)
    assert arguments(donate_argnums=0)["donated_invars"] == (True,)


def test_callbacks_of_the_same_code_over_other_globals_are_two_callbacks():
    """Two functions made from one code object, each over its own globals (what
    `scale` means differs): not the identical function, so not shared."""
    source = "def host(y):\n    return np.asarray(y * scale, np.float32)\n"
    hosts = {}
    for name, scale in (("a", 2.0), ("b", 3.0)):
        namespace = {"np": np, "scale": scale}
        exec(source, namespace)
        hosts[name] = namespace["host"]
    assert hosts["a"].__code__.co_code == hosts["b"].__code__.co_code

    @es.jit
    def f(x, name):
        return jax.pure_callback(hosts[name], SCALAR, x)

    x = jnp.float32(1.0)
    assert [float(f(x, name)) for name in "ab"] == [2.0, 3.0]
    assert f.compile_info().compiles == 2


# --- a property: whatever the callbacks hold and whatever changes afterwards ------

_KINDS = {
    "attribute": _by_attribute,
    "default": _by_default,
    "keyword default": _by_keyword_default,
    "partial": _by_partial,
    "code": _by_code,
    "frozen dataclass": _by_frozen_dataclass,
    "shared function": lambda scale: (_scale_host, lambda v: None),
}


def _run(callbacks: dict, x: Any, mode: str, via: str) -> Any:
    cb = callbacks[mode][0]
    if via == "dict":  # the value reaches the callback inside a dict keyed by mode
        return jax.pure_callback(lambda d: cb(d[mode]), SCALAR, {mode: x})
    return jax.pure_callback(cb, SCALAR, x)


@pytest.mark.slow
@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    kinds=st.tuples(st.sampled_from(sorted(_KINDS)), st.integers(2, 3)).map(
        lambda t: [t[0]] * t[1]  # keys of one kind: their programs look alike
    )
    | st.lists(st.sampled_from(sorted(_KINDS)), min_size=2, max_size=4),
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.sampled_from([0.5, 2.0])),
        min_size=3,
        max_size=10,
    ),
    via=st.sampled_from(["argument", "dict"]),
)
def test_every_result_equals_the_eager_one_whatever_changes(kinds, steps, via):
    """Random keys over callbacks of every kind, each called once, then changed
    (or not) and called again, in any order, checked with `EQX_STATIC_CHECK_SHARING` on: every
    es.jit result equals the eager result. (The callback is called in Python for
    that: an eager `jax.pure_callback` goes through JAX's own cache, which keys a
    callback by `==`, and gave an earlier example's frozen dataclass here.)"""
    modes = [f"m{i}" for i in range(len(kinds))]
    callbacks = {m: _KINDS[k](1.0) for m, k in zip(modes, kinds)}
    f = es.jit(lambda x, mode: _run(callbacks, x, mode, via))
    x = jnp.float32(3.0)
    with unittest.mock.patch.dict(os.environ, {"EQX_STATIC_CHECK_SHARING": "1"}):
        for change, i, value in [(False, i, 1.0) for i in range(len(modes))] + steps:
            mode = modes[i % len(modes)]
            if change:
                callbacks[mode][1](value)
            want = float(callbacks[mode][0](np.float32(3.0)))
            assert float(f(x, mode)) == want


def test_the_program_s_name_is_not_part_of_it():
    """A module is named after the function traced: the same body under two names
    is one program (one function's keys all have its name; the rule must not rest
    on that)."""

    def double(x):
        return jnp.sin(x) * 2

    def twice(x):
        return jnp.sin(x) * 2

    assert b"double" in _lowered(double).stablehlo().operation.get_asm(binary=True)
    assert _digest(_lowered(double)) == _digest(_lowered(twice))


def test_a_function_emitted_twice_under_two_names_is_one_program():
    """JAX may emit one function twice under two names (jax#40312: it happens after
    some trace histories): each private function is named by what it computes, so
    the two modules are one program, on every process whatever it traced before.
    A constant changed inside one of them is another program."""

    def module_text(lowering):
        return lowering.stablehlo().operation.get_asm(binary=True)

    def make():
        return jax.jit(lambda x: jnp.sin(x) * 2)

    one, two = make(), make()

    once = _lowered(lambda x: one(x) + one(x * 3))
    twice = _lowered(lambda x: one(x) + two(x * 3))  # the same body, a second name
    assert module_text(once) != module_text(twice)
    assert _digest(once) == _digest(twice)
    assert _digest(_lowered(lambda x: one(x) + two(x * 4))) != _digest(twice)
    assert _digest(_lowered(lambda x: two(x) + one(x * 3))) == _digest(twice)
    # every reference is renamed, not only the last one in a function
    assert _digest(_lowered(lambda x: one(x) + two(x * 3) + two(x * 5))) == _digest(
        _lowered(lambda x: one(x) + one(x * 3) + two(x * 5))
    )


@pytest.fixture
def embedded() -> Iterator[None]:
    """Constants written into the program, as large as they are (jax 0.12.1 passes
    those over `jax_embedded_constants_max_bytes` as arguments instead)."""
    option = "jax_embedded_constants_max_bytes"
    old = getattr(jax.config, option, None)
    if old is not None:
        jax.config.update(option, 1 << 30)
    try:
        yield
    finally:
        if old is not None:
            jax.config.update(option, old)


@pytest.mark.parametrize(
    "dtype", ["float32", "bfloat16", "int8", "uint32", "bool", "complex64"]
)
@pytest.mark.parametrize("where", ["top", "cond", "while"])
def test_a_large_constant_is_hashed_whole_of_every_dtype_and_place(
    dtype, where, embedded
):
    """A large constant is hashed from its bytes, not printed: one element changed
    (first, middle, last) is another program, in any dtype, also inside a `cond`
    branch or a loop's body; equal values are one program."""
    rng = np.random.default_rng(0)
    base = (rng.random(300) * 100).astype(np.float32).astype(dtype)
    if dtype == "bool":
        base = rng.random(300) > 0.5

    def lowered(c):
        c = jnp.asarray(c)

        def step(i, y):
            return y * jnp.real(c).astype(y.dtype)

        def body(x):
            if where == "cond":
                return jax.lax.cond(x[0] > 0, lambda y: step(0, y), jnp.sin, x)
            if where == "while":
                return jax.lax.fori_loop(0, x.shape[0], step, x)
            return x + jnp.real(c).astype(x.dtype)

        return _lowered(body, jnp.ones(300))

    first = _digest(lowered(base))
    assert first is not None and _digest(lowered(base.copy())) == first
    for i in (0, 150, 299):
        other = base.copy()
        other[i] = not other[i] if dtype == "bool" else other[i] + 1
        assert _digest(lowered(other)) != first, i


def test_a_constant_the_walk_does_not_find_is_printed_in_full(monkeypatch):
    """An elided constant the walk does not account for (one inside another
    attribute): the function is printed in full, as the walk's digest would not
    pin it."""
    from eqx_static import _sharing

    c = jnp.asarray(np.arange(100, dtype=np.float32))
    module = _lowered(lambda x: x + c, jnp.ones(100)).stablehlo()  # kept: owns op
    op = module.body.operations[0]
    full = op.operation.get_asm(**_sharing._ASM, assume_verified=True)
    assert _sharing._text(op.operation) != full  # elided, with its digest
    monkeypatch.setattr(_jax, "large_constants", lambda op, limit: [])
    assert _sharing._text(op.operation) == full


def test_the_structure_masks_every_constant_large_or_splat_and_keeps_the_rest():
    """`structure` (which the storm warning and "only in a constant" compare) is
    the same for programs that differ only in a constant's values, a large one
    (elided as it is printed) or one that is a splat in one of them; not for
    another operation, or a constant of another shape."""
    from eqx_static._sharing import structure

    def of(c, op=jnp.add):
        return structure(_lowered(lambda x: op(x, c), jnp.ones(1000)).stablehlo())

    rng = np.random.default_rng(0)
    random = [jnp.asarray(rng.random(1000, np.float32)) for _ in range(2)]
    splat = jnp.full(1000, 2.0, jnp.float32)
    assert of(random[0]) == of(random[1]) == of(splat) == of(jnp.float32(3.0) + splat)
    assert of(random[0]) != of(random[0], jnp.multiply)
    assert of(random[0]) != of(jnp.asarray(rng.random(1, np.float32)))


class _Parsed:
    """A lowering whose module is written by hand, in a form JAX does not emit."""

    def __init__(self, text: str):
        from jaxlib.mlir import ir

        context = _lowered(jnp.sin).stablehlo().context
        context.allow_unregistered_dialects = True
        self.module = ir.Module.parse(text, context)

    def stablehlo(self):
        return self.module


_CALLS = """
func.func public @main(%x: tensor<f32>) -> tensor<f32> {{
  %y = func.call @a(%x) : (tensor<f32>) -> tensor<f32>
  return %y : tensor<f32>
}}
func.func private @a(%x: tensor<f32>) -> tensor<f32> {{
  %y = func.call @{a_calls}(%x) : (tensor<f32>) -> tensor<f32>
  return %y : tensor<f32>
}}
func.func private @b(%x: tensor<f32>) -> tensor<f32> {{
  %y = func.call @{b_calls}(%x) : (tensor<f32>) -> tensor<f32>
  return %y : tensor<f32>
}}
func.func private @c(%x: tensor<f32>) -> tensor<f32> {{
  return %x : tensor<f32>
}}
"""


def test_functions_that_call_each_other_are_never_shared():
    """XLA runs no recursion, so JAX emits none: a module whose functions call each
    other in a cycle is of a form this library does not know, and its program is
    not shared. The same module without the cycle is."""
    text = "module {" + _CALLS.format(a_calls="b", b_calls="a") + "}"
    assert _digest(_Parsed(text)) is None
    acyclic = "module {" + _CALLS.format(a_calls="b", b_calls="c") + "}"
    assert _digest(_Parsed(acyclic)) is not None


def test_a_top_level_operation_without_a_name_is_never_shared():
    """Every top-level operation JAX emits has a symbol name; one without is
    unknown, and its program is not shared."""
    acyclic = _CALLS.format(a_calls="b", b_calls="c")
    assert _digest(_Parsed("module {" + acyclic + "}")) is not None
    unnamed = '"unknown.op"() : () -> ()'
    assert _digest(_Parsed("module {" + acyclic + unnamed + "}")) is None


# --- checking the sharing (EQX_STATIC_CHECK_SHARING) ------------------------------


class _Unread(es.Module):
    w: jax.Array
    tag: str = eqx.field(static=True)  # never read

    @es.jit
    def f(self, x):
        return jnp.sin(self.w * x) + 1.0


def test_checking_the_sharing_compiles_each_shared_key_and_agrees():
    """With the check on, a key that reuses a program is also compiled for itself
    (a compile JAX makes, booked) and the two executables agree; the result is the
    eager one, and the budget counts only the program's own compile."""
    x = jnp.float32(0.5)
    ms = [_Unread(jnp.float32(2.0), t) for t in "ab"]
    want = [float(jnp.sin(m.w * x) + 1.0) for m in ms]
    compiles = XlaCompiles()
    with unittest.mock.patch.dict(os.environ, {"EQX_STATIC_CHECK_SHARING": "1"}):
        got = [float(m.f(x)) for m in ms]
    assert got == want
    assert compiles.of("f") == 2  # the program, and the second key's own check
    assert _Unread.f.cache_info().misses == 2


@pytest.mark.sharing
def test_checking_the_sharing_raises_naming_both_keys_when_the_code_differs():
    """Should a shared program compile to other code for the key that reuses it,
    the check raises and names what differs between the two keys."""

    texts = _jax.compiled_texts
    seen = []

    def other_code_the_second_time(executable):
        seen.append(executable)
        out = texts(executable)
        return out if len(seen) == 1 else [t.replace("sine", "cosine") for t in out]

    class M(es.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return jnp.sin(self.w * x)

    x = jnp.float32(0.5)
    M(jnp.float32(2.0), "a").f(x)
    with (
        unittest.mock.patch.dict(os.environ, {"EQX_STATIC_CHECK_SHARING": "1"}),
        unittest.mock.patch.object(_jax, "compiled_texts", other_code_the_second_time),
        pytest.raises(RuntimeError, match=r"EQX_STATIC_CHECK_SHARING.*tag"),
    ):
        M(jnp.float32(2.0), "b").f(x)
    assert len(seen) == 2


def test_the_check_compares_code_not_names_or_source_lines():
    """Two compiles of one computation written on other lines, under other names,
    are the same code; another computation is not."""
    from eqx_static._sharing import same_compiled

    def first(x):
        return jnp.sin(x) * 2 + x

    def second(x):  # the parameters' names are in the code: one function's keys
        z = jnp.sin(x) * 2
        return z + x

    assert same_compiled(_compiled(first), _compiled(second))
    assert not same_compiled(_compiled(first), _compiled(lambda x: jnp.cos(x) * 2 + x))


def test_the_check_sees_every_constant_of_any_size():
    """XLA prints a constant of more than 10 elements as `{...}` by default: the
    check prints each in full, so a difference in one element of 64 is other code."""
    from eqx_static._sharing import same_compiled

    a = np.random.RandomState(0).randn(64).astype(np.float32)
    b = a.copy()
    b[40] += 1.0
    x = jnp.ones(64)
    assert same_compiled(_compiled(lambda y: y * a, x), _compiled(lambda y: y * a, x))
    assert not same_compiled(
        _compiled(lambda y: y * a, x), _compiled(lambda y: y * b, x)
    )


@pytest.mark.sharing
def test_a_forced_mis_share_in_a_large_constant_is_caught_by_the_check():
    """Were two keys whose programs differ only in a 64-element constant taken for
    one program, the check compiles the second for itself and raises."""
    table = {
        t: np.random.RandomState(seed).randn(64).astype(np.float32)
        for seed, t in enumerate("ab")
    }

    class M(es.Module):
        tag: str = eqx.field(static=True)

        @es.jit
        def f(self, x):
            return x * table[self.tag]

    x = jnp.ones(64)
    digest = lambda lowering: b"one digest for every program"  # noqa: E731
    with unittest.mock.patch("eqx_static._sharing.digest", digest):
        M("a").f(x)
        with (
            unittest.mock.patch.dict(os.environ, {"EQX_STATIC_CHECK_SHARING": "1"}),
            pytest.raises(RuntimeError) as e,
        ):
            M("b").f(x)
    said = str(e.value)
    assert "<locals>.M.f: EQX_STATIC_CHECK_SHARING: this call's program (" in said
    assert "field 'tag' changed 'a' -> 'b', from the key of compile 1) compiles" in said
    assert said.endswith(
        f"than compile 1, whose executable it would have run. Please "
        f"report this with your JAX version ({jax.__version__})."
    )


def test_the_check_tells_operands_apart_by_position():
    """Names are numbered in the order they appear, not dropped: `x - y` and
    `y - x` are other code."""
    from eqx_static._sharing import same_compiled

    def compiled(f):
        return _compiled(f, jnp.ones(3), jnp.ones(3))

    assert same_compiled(compiled(lambda x, y: x - y), compiled(lambda x, y: x - y))
    assert not same_compiled(compiled(lambda x, y: x - y), compiled(lambda x, y: y - x))


def test_one_program_needs_the_same_text_arguments_and_callbacks():
    """Each part of a fingerprint must agree; arguments that cannot be compared
    mean not the same."""
    from eqx_static._sharing import Fingerprint, same_program

    token = jax.tree.structure(((1.0,), {}))
    base = Fingerprint(b"text", (("backend", "cpu"),), ((_host, token),))
    assert same_program(base, base._replace())
    others = [
        base._replace(digest=b"other text"),
        base._replace(arguments=(("backend", "gpu"),)),
        base._replace(callbacks=()),  # a callback fewer
        base._replace(callbacks=((_other_host, token),)),  # another function
        base._replace(callbacks=((_host, jax.tree.structure(((1.0, 2.0), {}))),)),
    ]
    for other in others:
        assert not same_program(base, other) and not same_program(other, base)

    def undecidable():  # `==` of two arrays has no single truth value
        return base._replace(arguments=(("backend", np.ones(2)),))

    assert not same_program(undecidable(), undecidable())


def _host(y):
    return np.asarray(y * 2, np.float32)


def _other_host(y):
    return np.asarray(y * 2, np.float32)  # the same code: another function


def test_names_inside_string_literals_are_left_as_written():
    """A symbol is renamed where it is a reference, never inside a string on its
    line; a bare `@` is not a symbol."""
    from eqx_static._sharing import _renamed

    def renamed(text: bytes) -> bytes:
        return _renamed(text, lambda ref: b"@H" if ref == b"g" else None)

    text = b'k = "a @g b"\ncall @g(%0) @other\nx @ y @@g\ns = "q"\n"t" @g\n@g'
    want = b'k = "a @g b"\ncall @H(%0) @other\nx @ y @@H\ns = "q"\n"t" @H\n@H'
    assert renamed(text) == want


# --- what a TPU's lowering holds: opaque host callbacks ---------------------------


@pytest.fixture
def opaque(monkeypatch):
    opaque_host_callbacks(monkeypatch)


@pytest.mark.sharing
def test_error_if_programs_share_where_host_callbacks_are_opaque(opaque):
    """Read from the jaxpr, Equinox's identical callbacks still let keys that differ
    in an unread static field share one program, and the check still raises at
    the call."""
    test_error_if_programs_share_across_an_unread_static_field()


@pytest.mark.sharing
def test_callbacks_are_told_apart_where_host_callbacks_are_opaque(opaque, capfd):
    """The identical function shares; a new closure per key, another function over
    the same code, or a print beside a callback JAX drops, does not."""
    test_the_identical_callback_is_shared()
    test_a_factory_callback_made_for_each_key_is_not_shared()
    test_callbacks_of_the_same_code_over_other_globals_are_two_callbacks()
    test_a_debug_print_is_never_shared(capfd, _unused_callback)
    test_callbacks_in_another_order_are_another_program()


def _plus_one(y):
    return np.asarray(y + 1, np.float32)


@pytest.mark.sharing
def test_callbacks_in_another_order_are_another_program():
    """Two keys whose programs print the same and hold the same two callbacks, in
    the other order: the callbacks are compared position by position, so each key
    runs its own (as a count of each function would not)."""

    def swapped(x, flip):
        first, second = (_plus_one, _host) if flip else (_host, _plus_one)
        return jax.pure_callback(first, SCALAR, x) - jax.pure_callback(
            second, SCALAR, 3 * x
        )

    f = es.jit(swapped)
    x = jnp.float32(1.0)
    got = [float(f(x, flip)) for flip in (False, True)]
    assert got == [float(swapped(x, flip)) for flip in (False, True)]
    assert f.compile_info().compiles == 2


@pytest.mark.sharing
def test_a_function_s_only_program_is_fingerprinted_once_a_second_may_share_it(
    monkeypatch,
):
    """The first program compiles without its module's digest (no other program
    can be the same); the first call of a second key computes both, and shares."""
    from eqx_static import _sharing

    digests = []
    digest = _sharing.digest
    monkeypatch.setattr(_sharing, "digest", lambda m: digests.append(1) or digest(m))

    @es.jit
    def f(x, tag):
        return x * 2

    x = jnp.float32(1.5)
    assert float(f(x, "a")) == 3.0 and digests == []
    assert float(f(x, "b")) == 3.0 and len(digests) == 2
    assert f.compile_info()[:2] == (1, 1)


@pytest.mark.sharing
def test_keys_of_one_program_called_first_together_compile_it_once():
    """Eight threads make the first calls of eight keys of one program at once: one
    compiles it alone, and the others wait for it, and share it."""
    import concurrent.futures
    import threading

    @es.jit
    def f(x, tag):
        return x * 2

    x, barrier = jnp.float32(1.5), threading.Barrier(8)
    compiles = XlaCompiles()

    def first(tag: int) -> float:
        barrier.wait()
        return float(f(x, tag))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(first, range(8))) == [3.0] * 8
    assert f.compile_info()[:2] == (1, 1) and compiles.of("f") == 1
    assert f.cache_info().misses == 8
