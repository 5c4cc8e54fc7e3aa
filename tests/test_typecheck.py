"""Type-checked fields and methods (jaxtyping): construction, updates, edits, and
compiled methods checked while tracing only."""

from typing import Literal

import beartype
import equinox as eqx
import eqx_static as es
import jax.numpy as jnp
import jaxtyping
import pytest
from jaxtyping import Array, Float, Int, jaxtyped


class Layer(es.Module, typecheck=True):
    w: Float[Array, "n m"]
    b: Float[Array, " m"]
    act: Literal["relu", "tanh"] = eqx.field(static=True)
    depth: int = eqx.field(static=True, default=1)


def _layer(n: int = 2, m: int = 3) -> Layer:
    return Layer(jnp.ones((n, m)), jnp.zeros(m), "relu")


DISAGREE = r"Fields 'w' and 'b' of `Layer` disagree on dimension 'm'"


def test_consistent_construction_and_updates_pass():
    layer = _layer()
    assert layer.with_dynamic(b=jnp.ones(3)).b.shape == (3,)
    assert layer.with_static(act="tanh").act == "tanh"
    both = layer.with_dynamic(w=jnp.ones((5, 4)), b=jnp.ones(4))
    assert both.w.shape == (5, 4)


def test_dimension_clash_on_construction_names_both_fields_and_the_dimension():
    with pytest.raises(TypeError, match=DISAGREE) as info:
        Layer(jnp.ones((2, 3)), jnp.zeros(4), "relu")
    assert "m=3" in str(info.value) and "m=4" in str(info.value)


def test_dimension_clash_on_with_dynamic_leaves_the_original():
    layer = _layer()
    with pytest.raises(TypeError, match=DISAGREE):
        layer.with_dynamic(b=jnp.zeros(5))
    with pytest.raises(TypeError, match=DISAGREE):
        es.with_dynamic(layer, w=jnp.zeros((2, 7)))
    assert layer.b.shape == (3,) and layer.w.shape == (2, 3)


def test_dimension_clash_on_edit_exit():
    layer = _layer()
    with pytest.raises(TypeError, match=DISAGREE):
        with es.edit(layer) as l2:
            l2.w = jnp.ones((2, 4))
    assert layer.w.shape == (2, 3)


def test_dtype_mismatch_names_the_field():
    with pytest.raises(TypeError, match=r"(?i)field 'b' of `Layer`"):
        _layer().with_dynamic(b=jnp.zeros(3, jnp.int32))


@pytest.mark.parametrize(
    ("change", "field"), [({"act": "gelu"}, "act"), ({"depth": 1.5}, "depth")]
)
def test_static_field_annotations_are_checked(change, field):
    layer = _layer()
    with pytest.raises(TypeError, match=rf"field '{field}' of `Layer`"):
        layer.with_static(**change)
    with pytest.raises(TypeError, match=rf"field '{field}' of `Layer`"):
        Layer(layer.w, layer.b, **{"act": "relu", **change})


def test_unchecked_classes_are_not_checked():
    class Loose(es.Module):
        w: Float[Array, "n m"]
        b: Float[Array, " m"]

    loose = Loose(jnp.ones((2, 3)), jnp.zeros(4))  # no cross-field check asked for
    assert loose.with_dynamic(b=jnp.zeros(5)).b.shape == (5,)


def test_typecheck_option_is_inherited_and_can_be_switched_off():
    class Deeper(Layer):
        pass

    class Off(Layer, typecheck=False):
        pass

    with pytest.raises(TypeError, match="disagree on dimension 'm'"):
        Deeper(jnp.ones((2, 3)), jnp.zeros(4), "relu")
    assert Off(jnp.ones((2, 3)), jnp.zeros(4), "relu").b.shape == (4,)


def test_bad_typecheck_option():
    # Our own check, or (under the jaxtyping import hook) beartype's on `typecheck`.
    with pytest.raises(
        TypeError, match=r"`typecheck=` on `\S*Bad` takes True|'typecheck'"
    ):

        class Bad(es.Module, typecheck="yes"):  # pyright: ignore[reportArgumentType]
            x: float


def test_class_decorated_with_jaxtyped_is_checked_on_updates():
    @jaxtyped(typechecker=beartype.beartype)
    class Decorated(es.Module):
        w: Float[Array, "n m"]
        b: Float[Array, " m"]

    d = Decorated(jnp.ones((2, 3)), jnp.zeros(3))
    with pytest.raises(jaxtyping.TypeCheckError):
        Decorated(jnp.ones((2, 3)), jnp.zeros(4))  # jaxtyping's own check
    with pytest.raises(TypeError, match="disagree on dimension 'm'"):
        d.with_dynamic(b=jnp.zeros(4))


def test_the_check_costs_annotated_fields_not_leaves(monkeypatch):
    """Updates check the module's annotated fields; no flatten of the leaves."""
    import jax.tree_util as jtu

    class Big(es.Module, typecheck=True):
        w: Float[Array, " n"]
        rest: list

    big = Big(jnp.ones(3), [jnp.ones(()) for _ in range(500)])

    def boom(*args, **kwargs):
        raise AssertionError("flattened")

    monkeypatch.setattr(jtu, "tree_flatten", boom)
    monkeypatch.setattr(jtu, "tree_leaves", boom)
    assert big.with_dynamic(w=jnp.zeros(3)).rest is big.rest


# ----------------------------------------------------------------------------------
# Methods: `@es.jit` above `@jaxtyped(...)`.


_checked_calls = [0]  # runs of the checked body of `Affine.__call__`


class Affine(es.Module):
    w: Float[Array, "n m"]

    @es.jit
    @jaxtyped(typechecker=beartype.beartype)
    def __call__(self, x: Float[Array, " m"]) -> Float[Array, " n"]:
        _checked_calls[0] += 1
        return self.w @ x

    @es.jit
    @jaxtyped(typechecker=beartype.beartype)
    def count(self, x: Int[Array, " k"]) -> Int[Array, ""]:
        return x.sum()


def test_method_check_runs_while_tracing():
    a = Affine(jnp.ones((2, 3)))
    assert a(jnp.ones(3)).shape == (2,)
    with pytest.raises(jaxtyping.TypeCheckError):
        a(jnp.ones((3, 1)))  # wrong rank: caught on the first call with this shape
    with pytest.raises(jaxtyping.TypeCheckError):
        a.count(jnp.ones(3))  # wrong dtype


def test_cache_hit_runs_no_check():
    """The check wraps the body, so it runs exactly when the body runs: once per
    trace. A hit runs neither."""
    a = Affine(jnp.ones((2, 7)))  # a shape no other test uses: a new trace
    start = _checked_calls[0]
    a(jnp.ones(7))
    assert _checked_calls[0] == start + 1
    for _ in range(5):
        a(jnp.ones(7))
        a.with_dynamic(w=jnp.zeros((2, 7)))(2 * jnp.ones(7))
    assert _checked_calls[0] == start + 1


def test_jaxtyped_above_es_jit_fails_at_decoration_with_the_right_order():
    """`eqx.filter_jit` fails here too, with a bare AttributeError; this one says
    the order to use, and `getattr` with a default still works on a wrapper."""
    assert getattr(es.jit(lambda x: x), "__globals__", None) is None
    with pytest.raises(AttributeError, match=r"`@jaxtyped` must go below `@es.jit`"):

        class Wrong(es.Module):
            w: Float[Array, "n m"]

            @jaxtyped(typechecker=beartype.beartype)
            @es.jit
            def f(self, x: Float[Array, " m"]) -> Float[Array, " n"]:
                return self.w @ x


def test_dimension_clash_message_gives_each_field_its_own_shape():
    """Each field's size and shape are its own, not the other field's."""
    with pytest.raises(TypeError) as info:
        Layer(jnp.ones((2, 3)), jnp.zeros(4), "relu")
    assert str(info.value) == (
        "Fields 'w' and 'b' of `Layer` disagree on dimension 'm': 'w' has m=3 "
        "(shape (2, 3)), 'b' has m=4 (shape (4,)). Give them matching shapes."
    )
    with pytest.raises(TypeError) as info:
        _layer(2, 5).with_dynamic(b=jnp.zeros(7))
    assert str(info.value) == (
        "Fields 'w' and 'b' of `Layer` disagree on dimension 'm': 'w' has m=5 "
        "(shape (2, 5)), 'b' has m=7 (shape (7,)). Give them matching shapes."
    )
