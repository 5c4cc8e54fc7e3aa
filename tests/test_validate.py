"""The checks every new field value goes through (`_module.py`): at
construction, in `with_static`/`with_dynamic` and in `es.edit`. Each error is
checked by its full message, so that the advice it gives is the right one."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, Int


class S(es.Module):
    v: Any = eqx.field(static=True)


def _edit_static(m: Any, **changes: Any) -> Any:
    with es.edit(m) as m2:
        for k, v in changes.items():
            setattr(m2, k, v)
    return m2


ROUTES: dict[str, Callable[[Any], Any]] = {
    "construction": lambda v: S(v),
    "with_static": lambda v: S(1).with_static(v=v),
    "es.with_static": lambda v: es.with_static(S(1), v=v),
    "es.edit": lambda v: _edit_static(S(1), v=v),
}

_ARRAY_FIX = (
    "Arrays are data, not program structure: make it a dynamic field (drop "
    "`static=True`), so that changing it never recompiles."
)
UNHASHABLE = {
    "jax array": (jnp.ones(2), f"ArrayImpl: {{keys}} {_ARRAY_FIX}"),
    "numpy array": (np.ones(2), f"ndarray: {{keys}} {_ARRAY_FIX}"),
    "list": ([1], "list: {keys} Store a tuple instead: `v=tuple(...)`."),
    "dict": (
        {"a": 1},
        "dict: {keys} Store a hashable mapping instead, e.g. `v=tuple(d.items())`.",
    ),
    "set": ({1}, "set: {keys} Store a frozenset instead: `v=frozenset(...)`."),
    "other": (
        bytearray(b"x"),
        "bytearray: {keys} Store a hashable value instead, or an array if it is data.",
    ),
}


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("kind", sorted(UNHASHABLE))
def test_an_unhashable_static_value_gets_advice_for_its_type(route, kind):
    value, advice = UNHASHABLE[kind]
    with pytest.raises(TypeError) as info:
        ROUTES[route](value)
    advice = advice.format(keys="a static field keys the compilation cache.")
    assert str(info.value) == f"Static field 'v' of `S` holds an unhashable {advice}"


class D(es.Module):
    a: Any
    b: Float[Array, "3"]
    c: Float[Array, "2"] | None = None
    d: Int[Array, ""] | Float[Array, "2 2"] | None = None


def _d() -> D:
    return D(1.0, jnp.ones(3))


@pytest.mark.parametrize(
    "value, want",
    [
        (3, (jnp.int32, False)),
        (1.5, (jnp.float32, False)),
        (1 + 2j, (jnp.complex64, False)),
    ],
)
def test_a_number_in_a_dynamic_field_is_stored_in_the_default_dtype(value, want):
    """Strongly typed, as an optimiser's update or a deserialised leaf is, so that
    a training step or a reloaded model keys as the original."""
    for m in (D(value, jnp.ones(3)), _d().with_dynamic(a=value)):
        assert isinstance(m.a, jnp.ndarray) and m.a.shape == ()
        assert (m.a.dtype, m.a.weak_type) == want
        assert m.a.item() == value


def test_a_bool_in_a_dynamic_field_stays_a_bool():
    """A flag picks a branch: it stays a Python bool, static under `es.jit` as
    under `eqx.filter_jit`, and `eqx.nn.inference_mode` can reach it."""
    for m in (D(True, jnp.ones(3)), _d().with_dynamic(a=True)):
        assert m.a is True


def test_numbers_inside_containers_are_stored_as_arrays_and_the_rest_is_kept():
    m = _d().with_dynamic(a=(1, [2.0, {"k": True}], "s", None))
    one, (two, inner), s, none = m.a
    assert type(m.a) is tuple and type(m.a[1]) is list and type(inner) is dict
    assert (one.dtype, two.dtype) == (jnp.int32, jnp.float32)
    assert (one.item(), two.item()) == (1, 2.0) and inner["k"] is True
    assert s == "s" and none is None


def test_a_container_without_numbers_is_kept_as_is():
    arrays = (jnp.ones(2), [jnp.zeros(1)], {"k": "s"})
    assert _d().with_dynamic(a=arrays).a is arrays


OVERFLOW = (
    "Field 'a' of `D` got the Python int 1099511627776, which does not fit in "
    "int32, JAX's default integer. Dynamic fields store numbers as arrays: pass a "
    "float, enable `jax_enable_x64`, or declare 'a' static with "
    "`eqx.field(static=True)`."
)


@pytest.mark.parametrize(
    "make",
    [
        lambda: D(2**40, jnp.ones(3)),
        lambda: _d().with_dynamic(a=2**40),
        lambda: _d().with_dynamic(a=(1, [2**40])),
        lambda: _edit_static(_d(), a={"k": 2**40}),
    ],
)
def test_an_int_too_large_names_the_field(make):
    with pytest.raises(OverflowError) as info:
        make()
    assert str(info.value) == OVERFLOW


ARR = "Array"  # as the user wrote it, not jaxtyping's `jaxlib._jax.Array`


@pytest.mark.parametrize(
    "name, value, ann, got",
    [
        ("b", jnp.ones(4), f"Float[{ARR}, '3']", "float32[4]"),
        ("b", jnp.ones(3, jnp.int32), f"Float[{ARR}, '3']", "int32[3]"),
        ("b", np.ones(4, np.float32), f"Float[{ARR}, '3']", "float32[4]"),
        ("b", "x", f"Float[{ARR}, '3']", "str"),
        ("c", jnp.ones(3), f"Float[{ARR}, '2'] | None", "float32[3]"),
        (
            "d",
            jnp.ones(2, jnp.int32),
            f"Int[{ARR}, ''] | Float[{ARR}, '2 2'] | None",
            "int32[2]",
        ),
    ],
)
def test_a_value_against_its_array_annotation(name, value, ann, got):
    """One check, the same at construction, on `with_dynamic` and on edit."""
    message = (
        f"Field {name!r} of `D` is annotated `{ann}`, but got {got}. "
        "Pass a value of that dtype and shape."
    )
    for update in (
        lambda: D(**{"a": 1.0, "b": jnp.ones(3), name: value}),
        lambda: _d().with_dynamic(**{name: value}),
        lambda: _edit_static(_d(), **{name: value}),
    ):
        with pytest.raises(TypeError) as info:
            update()
        assert str(info.value) == message


@pytest.mark.parametrize(
    "name, value",
    [
        ("c", jnp.ones(2)),
        ("c", None),
        ("d", jnp.array(3, jnp.int32)),
        ("d", jnp.ones((2, 2))),
        ("d", None),
    ],
)
def test_every_member_of_a_union_annotation_is_accepted(name, value):
    m = _d().with_dynamic(**{name: value})
    assert getattr(m, name) is value


def test_a_stacked_module_takes_values_of_the_stacked_layout():
    stacked = eqx.filter_vmap(lambda b: D(1.0, b))(jnp.ones((5, 3)))
    new = jnp.zeros((5, 3))
    assert stacked.with_dynamic(b=new).b is new
    for bad, got in [
        (jnp.zeros((4, 3)), "float32[4, 3]"),
        (jnp.zeros((5, 3), jnp.int32), "int32[5, 3]"),
    ]:
        with pytest.raises(TypeError) as info:
            stacked.with_dynamic(b=bad)
        assert str(info.value) == (
            "Field 'b' of `D` holds a stacked value float32[5, 3] (a module batched "
            "by `eqx.filter_vmap`), so the new value must have the same shape and "
            f"dtype; got {got}."
        )


def test_the_converter_runs_on_assigned_values_only_and_before_the_checks():
    calls = []

    def to_tuple(v):
        calls.append(v)
        return tuple(v)

    class C(es.Module):
        w: Any
        xs: tuple = eqx.field(static=True, converter=to_tuple)

    m = C(1.0, [1, 2])
    assert m.xs == (1, 2) and calls == [[1, 2]]
    m2 = m.with_static(xs=[3])  # a list: hashable only after the converter
    assert m2.xs == (3,) and calls == [[1, 2], [3]]
    m3 = m2.with_dynamic(w=2.0)
    assert m3.xs is m2.xs and calls == [[1, 2], [3]]


def test_check_init_runs_on_the_result():
    class Positive(es.Module):
        w: Any

        def __check_init__(self):
            if not self.w > 0:
                raise ValueError(f"w must be positive, got {self.w}")

    m = Positive(1.0)
    with pytest.raises(ValueError, match="^w must be positive, got -1.0$"):
        m.with_dynamic(w=-1.0)
    with pytest.raises(ValueError, match="^w must be positive, got -2.0$"):
        _edit_static(m, w=-2.0)
    assert m.with_dynamic(w=3.0).w == 3.0


# --- numbers stored in dynamic fields ----------------------------------------------


def test_results_follow_jax_enable_x64_as_eager_does():
    """A stored number keeps the dtype it was stored with (float32, or float64 if
    stored under x64); the compiled call computes what the eager call computes
    under the current jax_enable_x64."""

    class M(es.Module):
        dp: float

        @es.jit
        def __call__(self, x):
            return self.dp * x

    eager = M.__call__.__wrapped__
    m = M(dp=0.1)
    m(jnp.ones(()))
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        x = jnp.ones((), jnp.float64)
        got, want = m(x), eager(m, x)
        assert got.dtype == want.dtype == jnp.float64 and got.item() == want.item()
        fresh = M(dp=0.1)  # stored under x64: float64
        assert fresh.dp.dtype == jnp.float64
        got = fresh(x).item()
        assert got == eager(fresh, x).item()
        # float64 is emulated on a TPU: 0.1 is stored there within 2 ulp (a float32
        # 0.1 would be 1.5e-9 off); elsewhere it is exact.
        tpu = jax.default_backend() == "tpu"
        assert math.isclose(got, 0.1, rel_tol=1e-15 if tpu else 0, abs_tol=0)
    got = m(jnp.ones(()))
    assert got.dtype == eager(m, jnp.ones(())).dtype == jnp.float32


@dataclasses.dataclass
class _Options:  # not frozen: unhashable
    scale: float = 1.0


@pytest.mark.parametrize("value", [{1}, bytearray(b"x"), _Options()], ids=type)
def test_a_static_field_and_an_argument_get_the_same_fix_for_a_kind(value):
    """One table of fixes: an `es.Module` refusing a value in a static field at
    construction and `es.jit` refusing it as an argument say the same. (A list or
    a dict argument is a container, not a static value.)"""

    @es.jit
    def f(x, v):
        return x

    with pytest.raises(TypeError) as stored:
        S(v=value)
    with pytest.raises(TypeError) as passed:
        f(jnp.ones(2), value)
    fix = str(stored.value).split("Store ", 1)[1]
    assert str(passed.value).endswith(f"Pass {fix}")
