"""`es.edit`: mutable-looking edits that produce a validated, frozen module, copy on
write; a failed block leaves the original untouched and its copy unusable."""

import abc
import copy
import dataclasses
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import Bomb
from jaxtyping import Array, Float


class Encoder(es.Module):
    scale: float
    act: str = eqx.field(static=True)


class Model(es.Module):
    dp: float
    encoder: Encoder
    decoder: Encoder
    layers: list
    blocks: list
    heads: dict
    pair: tuple
    sp: bool = eqx.field(static=True)


def _model() -> Model:
    return Model(
        dp=2.0,
        encoder=Encoder(1.0, "relu"),
        decoder=Encoder(2.0, "relu"),
        layers=[Encoder(3.0, "relu"), Encoder(4.0, "relu")],
        blocks=[[Encoder(5.0, "a"), Encoder(6.0, "b")], [Encoder(7.0, "c")]],
        heads={"x": Encoder(8.0, "relu"), "n": 9.0},
        pair=(Encoder(10.0, "relu"), 11.0),
        sp=False,
    )


def _snapshot(m: eqx.Module) -> dict:
    return dict(m.__dict__)


def _assert_untouched(m: eqx.Module, snapshot: dict) -> None:
    assert m.__dict__.keys() == snapshot.keys()
    for k, v in snapshot.items():
        assert m.__dict__[k] is v, k


# --- the basic contract --------------------------------------------------------------


def test_edit_both_kinds_returns_frozen_validated_module():
    c = _model()
    before = _snapshot(c)
    with es.edit(c) as c2:
        c2.sp = True
        c2.dp = 3.0
    assert type(c2) is Model and c2 is not c
    assert (c2.sp, c2.dp) == (True, 3.0)
    _assert_untouched(c, before)
    for name in ("encoder", "decoder", "layers", "blocks", "heads", "pair"):
        assert getattr(c2, name) is getattr(c, name), name
    with pytest.raises(
        dataclasses.FrozenInstanceError, match="cannot assign to field 'dp'"
    ):
        c2.dp = 4.0  # pyright: ignore[reportAttributeAccessIssue]


def test_nested_modules_are_editable_copies():
    c = _model()
    before, encoder_before = _snapshot(c), _snapshot(c.encoder)
    with es.edit(c) as c2:
        c2.encoder.scale = 0.5
        c2.encoder.act = "tanh"
    assert (c2.encoder.scale, c2.encoder.act) == (0.5, "tanh")
    assert type(c2.encoder) is Encoder and c2.encoder is not c.encoder
    _assert_untouched(c, before)
    _assert_untouched(c.encoder, encoder_before)
    assert c2.decoder is c.decoder and c2.layers is c.layers and c2.dp is c.dp
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        c2.encoder.scale = 1.0  # pyright: ignore[reportAttributeAccessIssue]


def test_lists_of_modules_are_editable():
    c = _model()
    with es.edit(c) as c2:
        c2.layers[1].scale = 40.0
    assert c2.layers[1].scale == 40.0 and c.layers[1].scale == 4.0
    assert type(c2.layers) is list and c2.layers is not c.layers
    assert c2.layers[0] is c.layers[0]
    assert c2.blocks is c.blocks and c2.encoder is c.encoder
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        c2.layers[1].scale = 0.0  # pyright: ignore[reportAttributeAccessIssue]


def test_nested_lists_dicts_and_tuples_of_modules():
    c = _model()
    with es.edit(c) as c2:
        c2.blocks[0][1].scale = 60.0
        c2.heads["x"].act = "gelu"
        c2.pair[0].scale = 100.0
    assert c2.blocks[0][1].scale == 60.0 and c.blocks[0][1].scale == 6.0
    assert c2.blocks[0][0] is c.blocks[0][0]
    assert c2.blocks[1] is c.blocks[1]  # an unchanged inner list is shared too
    assert c2.heads["x"].act == "gelu" and c.heads["x"].act == "relu"
    assert c2.heads["n"] is c.heads["n"]
    assert type(c2.pair) is tuple and c2.pair[0].scale == 100.0
    assert c2.pair[1] is c.pair[1] and c.pair[0].scale == 10.0


def test_unchanged_nested_containers_are_shared():
    c = _model()
    with es.edit(c) as c2:
        c2.dp = 0.0
    for name in ("encoder", "decoder", "layers", "blocks", "heads", "pair"):
        assert getattr(c2, name) is getattr(c, name), name


def test_edit_that_changes_nothing_shares_every_field():
    c = _model()
    with es.edit(c) as c2:
        c2.encoder.scale = c.encoder.scale  # the same object: no change
    _assert_untouched(c2, _snapshot(c))


def test_whole_nested_values_can_be_replaced():
    c = _model()
    new_encoder = Encoder(-1.0, "id")
    with es.edit(c) as c2:
        c2.encoder = new_encoder
        c2.layers = [*c2.layers, Encoder(0.0, "id")]
        c2.layers[0].scale = 30.0
    assert c2.encoder is new_encoder
    assert [la.scale for la in c2.layers] == [30.0, 4.0, 0.0]
    assert [la.scale for la in c.layers] == [3.0, 4.0]


def test_result_is_an_ordinary_pytree():
    c = _model()
    with es.edit(c) as c2:
        c2.encoder.scale = 0.5
    leaves = jax.tree_util.tree_leaves(c2)
    assert leaves[:2] == [2.0, 0.5]
    assert jax.tree_util.tree_structure(c2) == jax.tree_util.tree_structure(c)


def test_plain_equinox_module_custom_init_and_abstract_base():
    class AbstractBlock(eqx.Module):
        width: eqx.AbstractVar[int]

        @abc.abstractmethod
        def size(self) -> int: ...

    class Block(AbstractBlock):
        w: float
        width: int = eqx.field(static=True)

        def __init__(self, width: int):
            self.width = width
            self.w = float(width)

        def size(self) -> int:
            return self.width

    b = Block(3)
    with es.edit(b) as b2:
        b2.width = 5
        b2.w = 0.5
    assert type(b2) is Block and (b2.size(), b2.w) == (5, 0.5)
    assert (b.size(), b.w) == (3, 3.0)


# --- errors --------------------------------------------------------------------------


def test_exception_in_block_leaves_original_untouched():
    c = _model()
    before, encoder_before = _snapshot(c), _snapshot(c.encoder)
    with pytest.raises(RuntimeError, match="user error"), es.edit(c) as c2:
        c2.dp = 3.0
        c2.encoder.scale = 0.5
        c2.layers[0].scale = 0.0
        raise RuntimeError("user error")
    _assert_untouched(c, before)
    _assert_untouched(c.encoder, encoder_before)
    assert c.layers[0].scale == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        c2.dp = 4.0  # pyright: ignore[reportAttributeAccessIssue]
    # Nothing was produced: every use of the half-edited copy says so.
    defunct = "copy made by an `es.edit` block that raised"
    uses = [
        lambda: c2.encoder,
        lambda: c2.dp,  # a field with a value in the original
        lambda: jax.tree.leaves(c2),  # Equinox's flatten
        lambda: c2.with_dynamic(dp=1.0),
        lambda: repr(c2),
    ]
    for use in uses:
        with pytest.raises(RuntimeError, match=defunct):
            use()


def test_a_failed_edit_of_a_plain_equinox_module_is_unusable_too():
    class Plain(eqx.Module):
        w: float

    p = Plain(1.0)
    with pytest.raises(RuntimeError, match="user error"), es.edit(p) as p2:
        p2.w = 2.0
        raise RuntimeError("user error")
    assert p.w == 1.0
    with pytest.raises(RuntimeError, match="copy made by an `es.edit` block"):
        jax.tree.leaves(p2)


def test_edit_copies_plain_lists_and_dicts_so_the_original_is_untouched():
    class Holder(es.Module):
        ws: list
        names: dict

    h = Holder([jnp.ones(2)], {"a": 1.0})
    with es.edit(h) as h2:
        h2.ws[0] = jnp.zeros(2)
        h2.names["a"] = 5.0
    assert float(h.ws[0][0]) == 1.0 and h.names == {"a": 1.0}
    assert float(h2.ws[0][0]) == 0.0 and h2.names == {"a": 5.0}
    with es.edit(h) as h3:
        pass
    assert h3.ws is h.ws and h3.names is h.names  # unchanged: shared again


def test_assigning_a_non_field_raises():
    c = _model()
    with (
        pytest.raises(
            dataclasses.FrozenInstanceError, match="cannot assign to field 'typo'"
        ),
        es.edit(c) as c2,
    ):
        c2.typo = 1.0  # pyright: ignore[reportAttributeAccessIssue]
    with (
        pytest.raises(
            dataclasses.FrozenInstanceError, match="cannot assign to field 'scal'"
        ),
        es.edit(c) as c3,
    ):
        c3.encoder.scal = 1.0  # pyright: ignore[reportAttributeAccessIssue]
    assert "typo" not in c.__dict__ and "scal" not in c.encoder.__dict__


def test_cannot_enter_twice():
    c = _model()
    editor = es.edit(c)
    with editor as c2:
        c2.dp = 1.0
    with pytest.raises(RuntimeError, match="cannot be entered twice"), editor:
        pass


def test_edit_rejects_non_modules():
    # Our own check, or (under the jaxtyping import hook) beartype's on `module`.
    with pytest.raises(TypeError, match=r"`es.edit` takes an `eqx.Module`|'module'"):
        es.edit({"a": 1})  # pyright: ignore[reportArgumentType]


class Checked(es.Module):
    w: Float[Array, "3"]
    n: int = eqx.field(static=True, converter=int)
    names: tuple = eqx.field(static=True, default=())
    limit: float = 10.0

    def __check_init__(self):
        if self.n > self.limit:
            raise ValueError(f"n must be at most limit, got {self.n} > {self.limit}")


class Holder(es.Module):
    checked: Checked
    items: list


def _holder() -> Holder:
    return Holder(Checked(jnp.zeros(3), 1), [Checked(jnp.zeros(3), 2)])


def test_converter_runs_on_exit():
    h = _holder()
    with es.edit(h) as h2:
        h2.checked.n = 4.7
    assert h2.checked.n == 4 and type(h2.checked.n) is int


@pytest.mark.parametrize(
    ("assign", "exc", "match"),
    [
        (
            lambda h: setattr(h.checked, "names", ["a"]),
            TypeError,
            r"'names' of `Checked` holds an unhashable list",
        ),
        (
            lambda h: setattr(h.checked, "w", jnp.zeros(4)),
            TypeError,
            r"'w' of `Checked` is annotated .*float32\[4\]",
        ),
        (
            lambda h: setattr(h.checked, "w", jnp.zeros(3, jnp.int32)),
            TypeError,
            r"is annotated .*int32\[3\]",
        ),
        (lambda h: setattr(h.checked, "n", 11), ValueError, "n must be at most limit"),
        (
            lambda h: setattr(h.checked, "limit", 0.5),
            ValueError,
            "n must be at most limit",
        ),
        (lambda h: setattr(h.items[0], "n", 20), ValueError, "n must be at most limit"),
        (
            lambda h: setattr(h.checked, "n", "many"),
            ValueError,
            "invalid literal for int",
        ),
    ],
    ids=[
        "unhashable",
        "shape",
        "dtype",
        "check-init",
        "check-init-other-field",
        "in-list",
        "converter",
    ],
)
def test_validation_failure_on_exit(assign, exc, match):
    h = _holder()
    before, checked_before = _snapshot(h), _snapshot(h.checked)
    with pytest.raises(exc, match=match), es.edit(h) as h2:
        assign(h2)
    _assert_untouched(h, before)
    _assert_untouched(h.checked, checked_before)
    assert h.items[0].n == 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        h2.checked = h.checked  # pyright: ignore[reportAttributeAccessIssue]


def test_a_check_init_that_reads_an_unread_field_leaves_it_shared():
    """Leaving the block checks the copy; a `__check_init__` that reads a field the
    block never read gets the original's value, not a copy of it."""

    class Outer(es.Module):
        inner: Encoder
        n: int = eqx.field(static=True)

        def __check_init__(self):
            assert self.inner.act == "relu"

    o = Outer(Encoder(1.0, "relu"), 1)
    with es.edit(o) as o2:
        o2.n = 2
    assert o2.n == 2 and o2.inner is o.inner


def test_without_equinox_s_set_of_initialising_modules_an_edit_cannot_assign(
    monkeypatch,
):
    """What degrades without `equinox._module._module._currently_initialising`, as
    docs/guarantees.md says: an `es.edit` block raises Equinox's
    `FrozenInstanceError` at its first assignment and leaves the original
    untouched; `with_static` and `with_dynamic` still work."""
    monkeypatch.setattr(_jax, "_initialising", None)
    c = _model()
    before = _snapshot(c)
    with pytest.raises(
        dataclasses.FrozenInstanceError, match="cannot assign to field 'dp'"
    ):
        with es.edit(c) as c2:
            c2.dp = 3.0
    _assert_untouched(c, before)
    assert float(c.with_dynamic(dp=3.0).dp) == 3.0 and c.with_static(sp=True).sp


def test_outer_check_init_sees_nested_change():
    class Outer(es.Module):
        inner: Checked
        cap: int = eqx.field(static=True)

        def __check_init__(self):
            if self.inner.n > self.cap:
                raise ValueError("inner.n exceeds cap")

    o = Outer(Checked(jnp.zeros(3), 1), 2)
    with pytest.raises(ValueError, match="inner.n exceeds cap"), es.edit(o) as o2:
        o2.inner.n = 3
    assert o.inner.n == 1


# --- no whole-tree flatten -----------------------------------------------------------


class Big(es.Module):
    layers: list
    bomb: Bomb
    n: int = eqx.field(static=True)


def test_edit_does_not_flatten_the_tree(monkeypatch):
    big = Big([Encoder(float(i), "relu") for i in range(500)], Bomb(), 1)
    monkeypatch.setattr(Bomb, "armed", True)
    with pytest.raises(AssertionError, match="flattened"):
        jax.tree_util.tree_leaves(big)  # the bomb is live
    with es.edit(big) as big2:
        big2.n = 2
        big2.layers[250].scale = -1.0
    assert big2.n == 2 and big2.layers[250].scale == -1.0
    assert big2.bomb is big.bomb and big2.layers[249] is big.layers[249]


def test_assigning_an_unknown_field_names_the_closest_one():
    class Small(es.Module):
        dp: float
        sp: bool = eqx.field(static=True)

    small = Small(1.0, False)
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"no field 'dq'. Did you mean 'dp'\?"
    ):
        with es.edit(small) as s2:
            s2.dq = 2.0  # pyright: ignore[reportAttributeAccessIssue]
    assert "dq" not in vars(small)


def test_edit_never_shares_a_mutable_object_with_the_original():
    """A list inside a tuple, a list inside a dict, a list in a tuple in a tuple:
    editing them in place changes the copy only."""

    class Holder(es.Module):
        pair: tuple
        table: dict

    h = Holder(pair=([1.0, 2.0], (3.0, [4.0])), table={"a": [5.0]})
    before = jax.tree.map(lambda x: x, h)
    with es.edit(h) as h2:
        h2.pair[0][0] = 99.0
        h2.pair[1][1][0] = 77.0
        h2.table["a"].append(6.0)
    assert jax.tree.all(jax.tree.map(lambda a, b: a is b, h, before))
    assert [float(v) for v in h2.pair[0]] == [99.0, 2.0]
    assert float(h2.pair[1][1][0]) == 77.0 and len(h2.table["a"]) == 2
    # Numbers put in place are stored as arrays, as assigned ones are.
    for v in (h2.pair[0][0], h2.pair[1][1][0], h2.table["a"][1]):
        assert isinstance(v, jax.Array) and v.dtype == jnp.float32


def test_edit_shares_a_tuple_that_holds_nothing_mutable():
    class Holder(es.Module):
        pair: tuple
        other: float

    h = Holder(pair=(1.0, (2.0, 3.0)), other=0.0)
    with es.edit(h) as h2:
        h2.other = 1.0
    assert h2.pair is h.pair


# --- copy on write ------------------------------------------------------------------


class _Leaf(es.Module):
    w: Any
    k: int = eqx.field(static=True)


class _Stack(es.Module):
    layers: tuple
    extra: list
    head: _Leaf


def _stack(n: int = 5) -> _Stack:
    return _Stack(
        layers=tuple(_Leaf(float(i), i) for i in range(n)),
        extra=[_Leaf(10.0, 0), [1.0, _Leaf(11.0, 1)]],
        head=_Leaf(20.0, 2),
    )


def test_edit_copies_only_what_is_read(monkeypatch):
    """Entering copies nothing; reading `m2.layers[3]` copies that one layer."""
    from eqx_static import _update as _edit

    made = []
    copy_module = _edit._copy_module
    monkeypatch.setattr(
        _edit, "_copy_module", lambda obj, c: made.append(obj) or copy_module(obj, c)
    )
    s = _stack(1000)
    with es.edit(s) as s2:
        assert made == [s]  # the root only
        s2.layers[3].w = 5.0
        assert s2.layers[3] is s2.layers[3]  # one copy, handed out again
    assert made == [s, s.layers[3]]
    assert float(s2.layers[3].w) == 5.0 and float(s.layers[3].w) == 3.0
    assert all(a is b for a, b in zip(s2.layers[:3], s.layers[:3]))
    assert s2.extra is s.extra and s2.head is s.head  # never read: shared


def test_edit_through_iteration_slices_lists_and_tree_maps():
    s = _stack()
    with es.edit(s) as s2:
        for layer in s2.layers[1:3]:  # a slice hands out copies too
            layer.w = -1.0
        for layer in s2.layers:
            assert isinstance(layer, _Leaf)
        s2.extra[1][1].w = 12.0  # a module in a list in a list
        popped = s2.extra.pop(0)
        popped.w = 99.0  # a copy: the original is not touched
        assert len(jax.tree.leaves(s2)) == len(jax.tree.leaves(s)) - 1
    assert [float(x.w) for x in s2.layers] == [0.0, -1.0, -1.0, 3.0, 4.0]
    assert float(s2.extra[0][1].w) == 12.0 and len(s2.extra) == 1
    assert float(s.extra[0].w) == 10.0 and float(s.extra[1][1].w) == 11.0
    assert type(s2.layers) is tuple and type(s2.extra) is list
    assert [float(x.w) for x in s.layers] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_an_edit_that_reads_but_changes_nothing_shares_everything():
    s = _stack()
    with es.edit(s) as s2:
        _ = [layer.w for layer in s2.layers]
        _ = s2.extra[1][1].w
    # Unchanged: the result shares the original's objects, as `with_dynamic` does.
    assert s2.layers is s.layers and s2.extra is s.extra and s2.head is s.head


# --- lists and dicts at depth: copied, restored, never shared ------------------------


class _Deep(es.Module):
    nested: Any
    layers: Any
    table: Any


def _deep() -> _Deep:
    return _Deep(
        nested=((jnp.zeros(1), [jnp.ones(1)]),),
        layers=[[jnp.zeros(1)], [jnp.ones(1)]],
        table={"a": jnp.zeros(1)},
    )


def test_a_list_inside_a_tuple_inside_a_tuple_is_not_shared():
    m = _deep()
    before = m.nested[0][1][0]
    new = jnp.full(1, 5.0)
    with es.edit(m) as m2:
        m2.nested[0][1][0] = new
    assert m.nested[0][1][0] is before  # the original is untouched
    assert m2.nested[0][1][0] is new


def test_a_nested_list_grown_in_place_is_kept_and_the_original_untouched():
    m = _deep()
    extra = [jnp.full(1, 2.0)]
    with es.edit(m) as m2:
        m2.layers.append(extra)
    assert len(m.layers) == 2
    assert len(m2.layers) == 3 and m2.layers[2][0] is extra[0]
    assert m2.layers[0][0] is m.layers[0][0]


def test_a_dict_key_renamed_in_place_is_kept():
    m = _deep()
    with es.edit(m) as m2:
        value = m2.table.pop("a")
        m2.table["b"] = value
    assert list(m2.table) == ["b"] and m2.table["b"] is m.table["a"]
    assert list(m.table) == ["a"]


def test_unchanged_containers_are_the_originals():
    m = _deep()
    with es.edit(m) as m2:
        m2.table["a"] = jnp.full(1, 3.0)
    assert m2.nested is m.nested and m2.layers is m.layers
    assert m2.table is not m.table and float(m2.table["a"][0]) == 3.0


def test_a_discarded_copy_names_its_class_and_nested_copies_theirs():
    class Inner(es.Module):
        scale: Any

    class Outer(es.Module):
        inner: Inner
        w: Any

    m = Outer(Inner(1.0), 2.0)
    with pytest.raises(KeyError, match="user error"), es.edit(m) as m2:
        inner = m2.inner
        inner.scale = 3.0
        raise KeyError("user error")
    for use, cls in [(lambda: m2.w, Outer), (lambda: inner.scale, Inner)]:
        with pytest.raises(RuntimeError) as info:
            use()
        assert str(info.value) == (
            f"This `{cls.__qualname__}` is the copy made by an `es.edit` block that "
            "raised: it was discarded, and any use of it is an error. The module you "
            "edited is unchanged; edit it again."
        )


def test_entering_twice_says_so():
    class M(es.Module):
        w: Any

    editor = es.edit(M(1.0))
    with editor:
        pass
    with pytest.raises(RuntimeError) as info, editor:
        pass
    assert str(info.value) == "An `es.edit` context cannot be entered twice."


@pytest.mark.parametrize("base", [es.Module, eqx.Module])
def test_a_field_left_unset_by_init_is_edited_as_it_was_made(base):
    """An `es.Module` sets a default that its `__init__` left unset, as a
    dataclass's `__init__` would; a plain `eqx.Module` leaves it unset, and an
    edit keeps it so."""

    class M(base):
        w: Any
        b: Any = None

        def __init__(self, w):
            self.w = w  # `b` is left unset

    m = M(jnp.float32(1.0))
    with es.edit(m) as m2:
        m2.w = jnp.float32(2.0)
    assert float(m2.w) == 2.0 and m2.b is None
    assert ("b" in vars(m2)) == (base is es.Module) == ("b" in vars(m))


def test_an_edit_of_a_stacked_module_takes_stacked_values():
    class Layer(es.Module):
        w: Float[Array, "3"]

    stacked = eqx.filter_vmap(Layer)(jnp.ones((4, 3)))
    new = jnp.zeros((4, 3))
    with es.edit(stacked) as s2:
        s2.w = new
    assert s2.w is new
    with pytest.raises(TypeError, match=r"holds a stacked value float32\[4, 3\]"):
        with es.edit(stacked) as s3:
            s3.w = jnp.zeros((5, 3))


# --- edits in place ----------------------------------------------------------------


def test_edit_in_place_on_a_list_or_dict_field_leaves_the_original_alone():
    """In-place edits of a plain list or dict field inside es.edit change only the copy."""

    class M(es.Module):
        ws: list
        names: dict
        flag: bool = eqx.field(static=True)

    c = M(ws=[jnp.zeros(2), jnp.zeros(2)], names={"a": 1.0}, flag=False)
    with es.edit(c) as c2:
        c2.ws[0] = jnp.ones(2)
        c2.names["a"] = 5.0
    assert c2.ws is not c.ws and c2.names is not c.names
    assert np.array_equal(c.ws[0], jnp.zeros(2)) and c.names == {"a": 1.0}
    assert np.array_equal(c2.ws[0], jnp.ones(2)) and c2.names == {"a": 5.0}


def test_a_failed_edit_leaves_no_usable_module():
    """When es.edit fails validation on exit, the yielded copy cannot be used."""

    class M(es.Module):
        w: float
        k: int = eqx.field(static=True)

        def __check_init__(self):
            if self.k < 0:
                raise ValueError("k must be >= 0")

        @es.jit
        def f(self, x):
            return x * self.w * self.k

    c, x = M(w=1.0, k=1), jnp.ones(())
    with pytest.raises(ValueError, match="k must be >= 0"):
        with es.edit(c) as c2:
            c2.k = -5
    defunct = "copy made by an `es.edit` block that raised"
    with pytest.raises(RuntimeError, match=defunct):
        c2.k  # noqa: B018
    with pytest.raises(RuntimeError, match=defunct):
        c2.f(x)
    with pytest.raises(TypeError, match="unhashable"):
        with es.edit(c) as c3:
            c3.k = [1, 2]  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(RuntimeError, match=defunct):
        c3.k  # noqa: B018
    assert c.k == 1 and c.f(x) == 1.0


# --- what the edit hands out: the assigned value, the copies, plain containers -----


class _Converted(es.Module):
    items: tuple = eqx.field(converter=tuple)
    inner: Encoder


def test_a_field_assigned_before_it_is_read_reads_back_as_assigned_and_converted():
    m = _Converted([Encoder(1.0, "a")], Encoder(2.0, "b"))
    items, inner = [Encoder(3.0, "c")], Encoder(4.0, "d")
    with es.edit(m) as m2:
        m2.items, m2.inner = items, inner  # neither read yet
        assert m2.items is items and m2.inner is inner  # a mutable object's rules
    expected = dataclasses.replace(m, items=items, inner=inner)
    assert type(m2.items) is tuple and m2.items == expected.items
    assert m2.inner is inner and _same(m2, expected)


def _same(a: Any, b: Any) -> bool:
    """The same pytree: same structure, equal leaves (a number stored as an array
    equals the number)."""
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    same_leaves = all(np.array_equal(x, y) for x, y in leaves)
    return jax.tree.structure(a) == jax.tree.structure(b) and same_leaves


class _Two(es.Module):
    a: Any
    b: Any


def _two() -> _Two:
    return _Two((_Leaf(1.0, 1), _Leaf(2.0, 2)), [_Leaf(3.0, 3), [_Leaf(4.0, 4)]])


def test_a_copied_tuple_or_list_assigned_to_another_field_comes_out_plain():
    m = _two()
    with es.edit(m) as m2:
        m2.a[1].w = 5.0
        m2.a, m2.b = m2.b, {"t": m2.a}
    expected = eqx.tree_at(lambda t: t.a[1].w, m, 5.0)
    expected = dataclasses.replace(expected, a=m.b, b={"t": expected.a})
    assert type(m2.a) is list and type(m2.a[1]) is list
    assert type(m2.b["t"]) is tuple and _same(m2, expected)
    assert m2.a[0] is m.b[0] and m2.b["t"][0] is m.a[0]  # unchanged: shared


# Every way a list or tuple hands out its items, each giving the items in order.
_READS = {
    "iter": lambda xs: list(iter(xs)),
    "reversed": lambda xs: list(reversed(xs))[::-1],
    "slice": lambda xs: xs[::-1][::-1],
    "enumerate": lambda xs: [x for _, x in enumerate(xs)],
    "list": list,
    "tuple": tuple,
    "sorted": lambda xs: sorted(xs, key=lambda x: getattr(x, "k", 9)),
    "unpack": lambda xs: [*xs],
    "unpack-assign": lambda xs: (lambda a, b: [a, b])(*xs),
    "add": lambda xs: xs + (() if isinstance(xs, tuple) else []),
    "radd": lambda xs: (() if isinstance(xs, tuple) else []) + xs,
    "mul": lambda xs: xs * 1,
    "rmul": lambda xs: 1 * xs,
    "copy": lambda xs: xs.copy() if isinstance(xs, list) else xs[:],
    "index": lambda xs: [xs[i] for i in range(-len(xs), 0)],
}


@pytest.mark.parametrize("field", ["a", "b"])
@pytest.mark.parametrize("read", _READS.values(), ids=_READS.keys())
def test_every_read_of_a_copied_tuple_or_list_hands_out_the_copies(field, read):
    m = _two()
    with es.edit(m) as m2:
        items = read(getattr(m2, field))
        assert len(items) == 2
        leaf = items[0]
        leaf.w = 7.0  # a copy: assignable, and the edit's
    expected = eqx.tree_at(lambda t: getattr(t, field)[0].w, m, 7.0)
    assert _same(m2, expected) and float(getattr(m, field)[0].w) != 7.0


@pytest.mark.parametrize("field", ["a", "b"])
def test_comparisons_of_a_copied_tuple_or_list_see_the_copies(field):
    m = _two()
    with es.edit(m) as m2:
        xs = getattr(m2, field)
        xs[0].w = 7.0
        assert xs[0] in xs and xs.index(xs[1]) == 1 and xs.count(xs[0]) == 1
        assert xs != getattr(m, field) and not xs == getattr(m, field)
        same = tuple(xs) if isinstance(xs, tuple) else list(xs)
        assert xs == same and not xs != same
        assert "7.0" in repr(xs)


@pytest.mark.parametrize("field", ["a", "b"])
def test_copying_a_copied_tuple_or_list_copies_the_copies(field):
    m = _two()
    with es.edit(m) as m2:
        xs = getattr(m2, field)
        xs[0].w = 7.0
        shallow, deep = copy.copy(xs), copy.deepcopy(xs)
        assert shallow == xs and shallow[0] is xs[0] and type(shallow) in (tuple, list)
        assert float(deep[0].w) == 7.0 and deep[0] is not xs[0]
