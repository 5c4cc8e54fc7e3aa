"""`with_static` / `with_dynamic`, as methods and as functions: new instances that
share what did not change, dotted paths, checks, and a cost that does not grow
with the size of the rest of the tree."""

import time
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import eqx_static as es
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import pytest
from helpers import Bomb
from jaxtyping import Array, Float, Int


class Inner(es.Module):
    scale: float
    act: str = eqx.field(static=True)


class Point(NamedTuple):
    x: float
    y: float


class Outer(es.Module):
    bias: float
    inner: Inner
    other: Inner
    layers: list
    pair: tuple
    point: Point
    table: dict
    shape: tuple[int, ...] = eqx.field(static=True)
    name: str = eqx.field(static=True)


def _outer() -> Outer:
    return Outer(
        bias=0.5,
        inner=Inner(1.0, "relu"),
        other=Inner(2.0, "relu"),
        layers=[Inner(3.0, "relu"), Inner(4.0, "tanh"), Inner(5.0, "relu")],
        pair=(Inner(6.0, "relu"), 7.0),
        point=Point(8.0, 9.0),
        table={"a": Inner(10.0, "relu"), "b": 11.0},
        shape=(2, 3),
        name="outer",
    )


Update = Callable[..., Any]
STATIC_FORMS: list[Update] = [
    lambda m, **kw: m.with_static(**kw),
    lambda m, **kw: es.with_static(m, **kw),
]
DYNAMIC_FORMS: list[Update] = [
    lambda m, **kw: m.with_dynamic(**kw),
    lambda m, **kw: es.with_dynamic(m, **kw),
]
FORM_IDS = ["method", "function"]


def _fields(m: eqx.Module) -> dict[str, Any]:
    return dict(m.__dict__)


def _assert_shares_all_but(new: eqx.Module, old: eqx.Module, changed: set[str]):
    for name, value in _fields(old).items():
        if name not in changed:
            assert getattr(new, name) is value, name


# --- the basic contract --------------------------------------------------------------


@pytest.mark.parametrize("update", STATIC_FORMS, ids=FORM_IDS)
def test_with_static_new_instance_original_unchanged_rest_shared(update):
    m = _outer()
    before = _fields(m)
    m2 = update(m, name="renamed")
    assert type(m2) is Outer and m2 is not m
    assert m2.name == "renamed"
    assert _fields(m) == before and all(m.__dict__[k] is v for k, v in before.items())
    _assert_shares_all_but(m2, m, {"name"})


@pytest.mark.parametrize("update", DYNAMIC_FORMS, ids=FORM_IDS)
def test_with_dynamic_new_instance_original_unchanged_rest_shared(update):
    m = _outer()
    before = _fields(m)
    new_inner = Inner(-1.0, "gelu")
    m2 = update(m, bias=1.5, inner=new_inner)
    assert type(m2) is Outer and m2 is not m
    assert m2.bias == 1.5 and m2.inner is new_inner
    assert all(m.__dict__[k] is v for k, v in before.items())
    _assert_shares_all_but(m2, m, {"bias", "inner"})


def test_dotted_path_into_nested_module():
    m = _outer()
    m2 = m.with_dynamic(**{"inner.scale": 1.5})
    assert m2.inner.scale == 1.5 and m.inner.scale == 1.0
    assert m2.inner is not m.inner and type(m2.inner) is Inner
    assert m2.inner.act is m.inner.act
    _assert_shares_all_but(m2, m, {"inner"})

    m3 = m.with_static(**{"inner.act": "gelu", "other.act": "tanh", "name": "x"})
    assert (m3.inner.act, m3.other.act, m3.name) == ("gelu", "tanh", "x")
    assert m3.inner.scale is m.inner.scale and m3.other.scale is m.other.scale


def test_several_paths_into_one_nested_module_make_one_copy():
    m = _outer()
    m2 = es.with_dynamic(m, **{"inner.scale": 1.5, "bias": 0.0})
    m3 = es.with_static(m2, **{"inner.act": "gelu"})
    assert (m3.inner.scale, m3.inner.act, m3.bias) == (1.5, "gelu", 0.0)
    assert m3.layers is m.layers


def test_list_elements():
    m = _outer()
    w = 30.0
    m2 = m.with_dynamic(**{"layers.0.scale": w})
    assert type(m2.layers) is list and m2.layers is not m.layers
    assert _is_stored_number(m2.layers[0].scale, w) and m.layers[0].scale == 3.0
    assert m2.layers[1] is m.layers[1] and m2.layers[2] is m.layers[2]
    _assert_shares_all_but(m2, m, {"layers"})

    replacement = Inner(0.0, "id")
    m3 = m.with_dynamic(**{"layers.-1": replacement, "layers.1.scale": 40.0})
    assert m3.layers[2] is replacement and m3.layers[1].scale == 40.0
    assert m3.layers[0] is m.layers[0]
    assert m.with_static(**{"layers.1.act": "relu"}).layers[1].act == "relu"


def test_tuple_namedtuple_and_dict_elements():
    m = _outer()
    m2 = m.with_dynamic(**{"pair.0.scale": 60.0, "pair.1": 70.0})
    assert type(m2.pair) is tuple and m2.pair[0].scale == 60.0 and m2.pair[1] == 70.0
    assert m.pair[0].scale == 6.0 and m.pair[1] == 7.0

    m3 = m.with_dynamic(**{"point.y": 90.0})
    assert type(m3.point) is Point and m3.point == Point(8.0, 90.0)
    assert m.with_dynamic(**{"point.0": 80.0}).point == Point(80.0, 9.0)

    m4 = m.with_dynamic(**{"table.a.scale": 100.0, "table.b": 110.0})
    assert type(m4.table) is dict and m4.table["a"].scale == 100.0
    assert m4.table["b"] == 110.0 and m.table["b"] == 11.0


def test_element_of_static_tuple():
    m = _outer()
    m2 = m.with_static(**{"shape.1": 5})
    assert m2.shape == (2, 5) and m.shape == (2, 3)
    with pytest.raises(TypeError, match="'shape' of `Outer` holds an unhashable tuple"):
        m.with_static(**{"shape.1": [5]})


def test_plain_equinox_modules_nested():
    class PlainInner(eqx.Module):
        w: float
        act: str = eqx.field(static=True)

    class PlainOuter(eqx.Module):
        blocks: list

    p = PlainOuter([PlainInner(1.0, "relu"), PlainInner(2.0, "relu")])
    p2 = es.with_static(
        es.with_dynamic(p, **{"blocks.1.w": 3.0}), **{"blocks.1.act": "x"}
    )
    assert (p2.blocks[1].w, p2.blocks[1].act) == (3.0, "x")
    assert p2.blocks[0] is p.blocks[0] and p.blocks[1].w == 2.0


# --- converters, __check_init__, hashability, jaxtyping -----------------------------


def test_converters_applied_to_new_values_only():
    calls = []

    def to_array(x):
        calls.append(x)
        return jnp.asarray(x, dtype=jnp.float32)

    class Conv(es.Module):
        w: jax.Array = eqx.field(converter=to_array)
        b: float
        n: int = eqx.field(static=True, converter=int)

    c = Conv(1.0, 2.0, 3.5)  # pyright: ignore[reportArgumentType]
    assert c.n == 3 and isinstance(c.w, jax.Array)
    calls.clear()
    c2 = c.with_dynamic(w=[4.0, 5.0])
    assert isinstance(c2.w, jax.Array) and c2.w.shape == (2,) and calls == [[4.0, 5.0]]
    c3 = c.with_dynamic(b=6.0)  # the converter of `w` does not run again
    assert calls == [[4.0, 5.0]] and c3.w is c.w
    assert c.with_static(n=7.9).n == 7


def test_converter_raising_leaves_original_untouched():
    class Conv(es.Module):
        n: int = eqx.field(static=True, converter=int)

    c = Conv(1)
    with pytest.raises(ValueError, match="invalid literal for int"):
        c.with_static(n="seven")
    assert c.n == 1


class Bounded(es.Module):
    lo: float
    hi: float
    inner: Inner
    label: str = eqx.field(static=True)

    def __check_init__(self):
        if not self.lo <= self.inner.scale <= self.hi:
            raise ValueError(f"need lo <= inner.scale <= hi, got {self.lo}, {self.hi}")


def test_check_init_runs_on_result():
    b = Bounded(0.0, 1.0, Inner(0.5, "relu"), "b")
    assert b.with_dynamic(hi=2.0).hi == 2.0
    with pytest.raises(ValueError, match="need lo <= inner.scale <= hi"):
        b.with_dynamic(lo=0.75)
    # a change deep inside runs the outer class's check too
    with pytest.raises(ValueError, match="need lo <= inner.scale <= hi"):
        es.with_dynamic(b, **{"inner.scale": 1.5})
    assert (b.lo, b.hi, b.inner.scale) == (0.0, 1.0, 0.5)


def test_check_init_of_nested_module_runs():
    class Positive(es.Module):
        v: float

        def __check_init__(self):
            if self.v <= 0:
                raise ValueError("v must be positive")

    class Holder(es.Module):
        items: list

    h = Holder([Positive(1.0), Positive(2.0)])
    with pytest.raises(ValueError, match="v must be positive"):
        h.with_dynamic(**{"items.1.v": -1.0})
    assert h.items[1].v == 2.0


@pytest.mark.parametrize("update", STATIC_FORMS, ids=FORM_IDS)
@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (["a", "b"], r"Store a tuple instead: `name=tuple\(...\)`"),
        (jnp.zeros(2), r"make it a dynamic field \(drop `static=True`\)"),
        ({"a": 1}, "Store a hashable mapping instead"),
    ],
    ids=["list", "jax-array", "dict"],
)
def test_with_static_checks_hashable(update, value, fix):
    m = _outer()
    kind = type(value).__name__
    with pytest.raises(
        TypeError, match=f"'name' of `Outer` holds an unhashable {kind}"
    ) as info:
        update(m, name=value)
    assert info.match(fix)
    assert m.name == "outer"


class Typed(es.Module):
    w: Float[Array, "3"]
    idx: Int[Array, "2"]
    maybe: Float[Array, "3"] | None
    maybe_old_style: typing.Optional[Float[Array, "3"]]  # noqa: UP045
    untyped: Any


def _typed() -> Typed:
    return Typed(jnp.zeros(3), jnp.zeros(2, jnp.int32), None, None, 1)


@pytest.mark.parametrize("field", ["w", "maybe", "maybe_old_style"])
@pytest.mark.parametrize(
    ("bad", "got"),
    [
        (jnp.zeros(4), r"float32\[4\]"),
        (jnp.zeros(3, jnp.int32), r"int32\[3\]"),
        (jnp.zeros((1, 3)), r"float32\[1, 3\]"),
        (1.0, "float"),
    ],
    ids=["shape", "dtype", "rank", "not-an-array"],
)
def test_jaxtyping_annotation_checked(field, bad, got):
    t = _typed()
    with pytest.raises(
        TypeError,
        match=f"Field '{field}' of `Typed` is annotated `Float.*but got {got}",
    ):
        t.with_dynamic(**{field: bad})
    assert getattr(t, field) is not bad


def test_jaxtyping_annotation_accepts_matching_values():
    t = _typed()
    ones = jnp.ones(3)
    t2 = t.with_dynamic(w=ones, idx=jnp.arange(2), maybe=ones, maybe_old_style=ones)
    assert t2.w is ones and t2.maybe is ones and t2.maybe_old_style is ones
    assert t2.with_dynamic(maybe=None, maybe_old_style=None).maybe is None
    assert t.with_dynamic(untyped=[1, 2]).untyped == [1, 2]  # no annotation to check
    with pytest.raises(TypeError, match=r"Field 'idx' .* annotated `Int.*float32\[2\]"):
        t.with_dynamic(idx=jnp.zeros(2))


def test_jaxtyping_annotation_checked_through_a_path():
    class Holder(es.Module):
        typed: list

    h = Holder([_typed()])
    with pytest.raises(TypeError, match=r"Field 'w' of `Typed` .* float32\[4\]"):
        h.with_dynamic(**{"typed.0.w": jnp.zeros(4)})


def test_jaxtyping_checked_when_another_annotation_cannot_be_resolved():
    # `get_type_hints` fails on the whole class when one annotation names something
    # that does not exist at run time (typically an import under TYPE_CHECKING); the
    # other string annotations (as under `from __future__ import annotations`) must
    # still be resolved and checked.
    class Partly(es.Module):
        w: "Float[Array, '3']"
        ghost: "NameThatDoesNotExist"  # noqa: F821  # pyright: ignore[reportUndefinedVariable]

    p = Partly(jnp.zeros(3), None)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"Field 'w' of `.*Partly` .* float32\[4\]"):
        p.with_dynamic(w=jnp.zeros(4))
    assert p.with_dynamic(ghost=1).ghost == 1


def test_invalid_second_change_leaves_nothing_half_changed():
    m = _outer()
    with pytest.raises(TypeError, match="holds an unhashable list"):
        m.with_static(**{"inner.act": "gelu", "name": ["x"]})
    assert m.inner.act == "relu" and m.name == "outer"


# --- error paths ---------------------------------------------------------------------


class Child(es.Module):
    dp: float
    sp: bool = eqx.field(static=True)
    dc: float = 0.0
    sc: bool = eqx.field(static=True, default=False)


@pytest.mark.parametrize(
    "update",
    [*STATIC_FORMS, *DYNAMIC_FORMS],
    ids=["s-method", "s-fn", "d-method", "d-fn"],
)
def test_unknown_name_lists_fields_and_closest_match(update):
    """The suggestion and the list are the fields the called helper takes."""
    c = Child(1.0, True)
    helper = "with_static" if update in STATIC_FORMS else "with_dynamic"
    typo, close, names = (
        ("sq", "sp", "'sp', 'sc'")
        if helper == "with_static"
        else ("dq", "dp", "'dp', 'dc'")
    )
    with pytest.raises(AttributeError) as info:
        update(c, **{typo: False})
    assert str(info.value) == (
        f"`Child` has no field {typo!r}. Did you mean {close!r}? The fields "
        f"`{helper}` takes are: {names}."
    )


def test_a_typo_is_matched_only_against_fields_the_helper_takes():
    c = Child(1.0, True)
    with pytest.raises(AttributeError, match="Did you mean 'dp'"):
        c.with_dynamic(pd=2.0)  # not 'sp', which `with_dynamic` refuses


def test_unknown_name_without_close_match():
    c = Child(1.0, True)
    with pytest.raises(
        AttributeError, match=r"has no field 'zzzzzz'\. The fields `with_dynamic` takes"
    ):
        c.with_dynamic(zzzzzz=1.0)


def test_unknown_name_in_nested_path_names_the_nested_class():
    m = _outer()
    with pytest.raises(
        AttributeError, match="`Inner` has no field 'scal'. Did you mean 'scale'?"
    ):
        m.with_dynamic(**{"inner.scal": 1.0})


@pytest.mark.parametrize("update", STATIC_FORMS, ids=FORM_IDS)
def test_with_static_on_dynamic_field_names_with_dynamic(update):
    c = Child(1.0, True)
    with pytest.raises(
        TypeError,
        match=r"`with_static` got 'dp', but 'dp' is a dynamic field of `Child` \(holding an array, traced by `es.jit`\). Use `with_dynamic\(dp=...\)`",
    ):
        update(c, dp=2.0)


@pytest.mark.parametrize("update", DYNAMIC_FORMS, ids=FORM_IDS)
def test_with_dynamic_on_static_field_names_with_static(update):
    c = Child(1.0, True)
    with pytest.raises(
        TypeError,
        match=r"`with_dynamic` got 'sp', but 'sp' is a static field of `Child` \(declared `eqx.field\(static=True\)`\). Use `with_static\(sp=...\)`",
    ):
        update(c, sp=False)


def test_wrong_kind_through_a_path_suggests_dict_syntax():
    m = _outer()
    with pytest.raises(
        TypeError, match=r"Use `with_static\(\*\*\{'inner.act': ...\}\)`"
    ):
        m.with_dynamic(**{"inner.act": "gelu"})
    with pytest.raises(
        TypeError, match=r"Use `with_dynamic\(\*\*\{'layers.0.scale': ...\}\)`"
    ):
        m.with_static(**{"layers.0.scale": 1.0})


def test_wrong_kind_for_container_element():
    m = _outer()
    with pytest.raises(
        TypeError,
        match="'layers.0', which lies inside a dynamic field. Use `with_dynamic`",
    ):
        m.with_static(**{"layers.0": Inner(0.0, "x")})
    with pytest.raises(
        TypeError,
        match="'shape.0', which lies inside a static field. Use `with_static`",
    ):
        m.with_dynamic(**{"shape.0": 1})


@pytest.mark.parametrize(
    ("path", "exc", "match"),
    [
        (
            "layers.3.scale",
            IndexError,
            r"'3' at 'layers.3' is not a valid index into a list of length 3",
        ),
        ("layers.-4", IndexError, r"'-4' at 'layers.-4' is not a valid index"),
        (
            "layers.first.scale",
            IndexError,
            r"'first' at 'layers.first' is not a valid index",
        ),
        ("pair.2", IndexError, r"not a valid index into a tuple of length 2"),
        ("point.z", IndexError, r"not a valid index into a Point of length 2"),
        (
            "bias.value",
            TypeError,
            r"Cannot follow path segment 'value' at 'bias': the value there is a "
            r"float32\[\] array",
        ),
        ("inner.scale.x", TypeError, r"segment 'x' at 'inner.scale'"),
        ("table.c", KeyError, r"No key 'c' at 'table.c'; the keys are \['a', 'b'\]"),
        ("", AttributeError, r"has no field ''"),
        ("inner.", AttributeError, r"`Inner` has no field ''"),
    ],
)
def test_bad_path_segment(path, exc, match):
    m = _outer()
    with pytest.raises(exc, match=match):
        m.with_dynamic(**{path: 1.0})


@pytest.mark.parametrize(
    "changes",
    [
        {"inner": Inner(0.0, "x"), "inner.scale": 1.0},
        {"inner.scale": 1.0, "inner": Inner(0.0, "x")},
        {"layers.0": Inner(0.0, "x"), "layers.0.scale": 1.0},
        {"layers.0.scale": 1.0, "layers.0": Inner(0.0, "x")},
    ],
    ids=["whole-first", "part-first", "element-whole-first", "element-part-first"],
)
def test_conflicting_paths(changes):
    m = _outer()
    whole, part = sorted(changes, key=len)
    with pytest.raises(
        ValueError, match=f"Conflicting updates: '{part}' changes inside '{whole}'"
    ):
        m.with_dynamic(**changes)


@pytest.mark.parametrize(
    "changes",
    [{"layers.0": 1.0, "layers.-3": 2.0}, {"point.x": 1.0, "point.0": 2.0}],
    ids=["negative-index", "namedtuple-name"],
)
def test_two_segments_naming_the_same_item_conflict(changes):
    m = _outer()
    with pytest.raises(ValueError, match="both name the same item of"):
        m.with_dynamic(**changes)


# --- no whole-tree flatten -----------------------------------------------------------


class Leaf(es.Module):
    w: float
    act: str = eqx.field(static=True)


class Big(es.Module):
    layers: list
    bomb: Bomb
    bias: float
    n: int = eqx.field(static=True)


@pytest.fixture
def big_armed(monkeypatch):
    """A module with 2000 leaves and a bomb; the flatten functions count their calls."""
    big = Big([Leaf(float(i), "relu") for i in range(2000)], Bomb(), 0.0, 1)
    calls = []
    for name in (
        "tree_flatten",
        "tree_leaves",
        "tree_map",
        "tree_flatten_with_path",
        "tree_structure",
    ):
        original = getattr(jax.tree_util, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(jax.tree_util, name, counted)
    monkeypatch.setattr(Bomb, "armed", True)
    return big, calls


def test_the_bomb_and_the_counters_work(big_armed):
    big, calls = big_armed
    with pytest.raises(AssertionError, match="the whole tree was flattened"):
        eqx.tree_at(lambda m: m.bias, big, 1.0)
    assert calls  # `eqx.tree_at` goes through the instrumented functions


@pytest.mark.parametrize(
    ("update", "changes"),
    [
        (lambda m, **kw: m.with_dynamic(**kw), {"bias": 1.0}),
        (lambda m, **kw: es.with_dynamic(m, **kw), {"layers.1000.w": -1.0}),
        (lambda m, **kw: m.with_static(**kw), {"n": 2, "layers.1999.act": "tanh"}),
        (lambda m, **kw: es.with_static(m, **kw), {"layers.-1.act": "tanh"}),
    ],
    ids=["method-field", "function-path", "method-static", "function-static"],
)
def test_update_does_not_flatten_the_tree(big_armed, update, changes):
    big, calls = big_armed
    new = update(big, **changes)
    assert calls == []
    assert new.bomb is big.bomb
    assert new.layers[0] is big.layers[0] and new.layers[1998] is big.layers[1998]


# --- property: random sequences of updates against a reference model ---------------


class HLeaf(es.Module):
    w: float
    tag: str = eqx.field(static=True)


class HRoot(es.Module):
    a: float
    x: Float[Array, "2"]
    leaf: HLeaf
    layers: list
    pair: tuple[int, int] = eqx.field(static=True)
    n: int = eqx.field(static=True)


DYNAMIC_PATHS = ["a", "x", "leaf.w", "layers.0.w", "layers.1.w"]
STATIC_PATHS = ["n", "pair.0", "pair.1", "leaf.tag", "layers.0.tag", "layers.1.tag"]
SUBTREES = ["leaf", "layers", "layers.0", "layers.1", "pair"]
ARRAYS = [jnp.full(2, i, jnp.float32) for i in range(4)]


def _is_stored_number(got: Any, number: float) -> bool:
    """A Python number in a dynamic field is stored as a 0-d array of JAX's
    default dtype for its kind."""
    default = {bool: jnp.bool_, int: jnp.int32, float: jnp.float32}[type(number)]
    return (
        isinstance(got, jax.Array)
        and got.shape == ()
        and got.dtype == default
        and not got.weak_type
        and got.item() == number
    )


def _same(got: Any, expected: Any) -> bool:
    if type(expected) is float and isinstance(got, jax.Array):
        return _is_stored_number(got, expected)
    return got is expected


def _get(obj: Any, path: str) -> Any:
    for seg in path.split("."):
        obj = obj[int(seg)] if isinstance(obj, list | tuple) else getattr(obj, seg)
    return obj


def _value(data: st.DataObject, path: str) -> Any:
    if path == "x":
        return data.draw(st.sampled_from(ARRAYS))
    if path.endswith(".w") or path == "a":
        return data.draw(st.floats(allow_nan=False, width=32))
    if path.endswith(".tag"):
        return data.draw(st.text(max_size=3))
    return data.draw(st.integers(-3, 3))


def _edit(m: HRoot, changes: dict[str, Any]) -> HRoot:
    with es.edit(m) as m2:
        for path, value in changes.items():
            if path.startswith("pair."):
                pair = list(m2.pair)
                pair[int(path[-1])] = value
                m2.pair = tuple(pair)  # pyright: ignore[reportAttributeAccessIssue]
            else:
                *parents, last = path.split(".")
                setattr(_get(m2, ".".join(parents)) if parents else m2, last, value)
    return m2


def _apply(m: HRoot, op: str, changes: dict[str, Any]) -> HRoot:
    if op == "static":
        return m.with_static(**changes)
    if op == "dynamic":
        return es.with_dynamic(m, **changes)
    return _edit(m, changes)


@pytest.mark.slow
@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(data=st.data())
def test_random_update_sequences_match_reference(data):
    m = HRoot(
        1.0, ARRAYS[0], HLeaf(2.0, "l"), [HLeaf(3.0, "a"), HLeaf(4.0, "b")], (1, 2), 0
    )
    ref = {p: _get(m, p) for p in DYNAMIC_PATHS + STATIC_PATHS}
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        op = data.draw(st.sampled_from(["static", "dynamic", "edit"]), label="op")
        pool = {"static": STATIC_PATHS, "dynamic": DYNAMIC_PATHS}.get(
            op, DYNAMIC_PATHS + STATIC_PATHS
        )
        paths = data.draw(
            st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True)
        )
        changes = {p: _value(data, p) for p in paths}

        old, old_ref = m, dict(ref)
        m = _apply(m, op, changes)
        ref.update(changes)

        assert type(m) is HRoot and m is not old
        for path, expected in ref.items():  # named paths changed, every other shared
            assert _same(_get(m, path), expected), path
        for path, expected in old_ref.items():  # the original is untouched
            assert _same(_get(old, path), expected), path
        ref = {p: _get(m, p) for p in ref}  # stored numbers: the arrays made
        for sub in SUBTREES:  # untouched subtrees are shared, not copied
            if not any(p == sub or p.startswith(sub + ".") for p in changes):
                assert _get(m, sub) is _get(old, sub), sub


@pytest.mark.parametrize("helper", [es.with_static, es.with_dynamic])
def test_no_changes_still_returns_a_new_instance(helper):
    class Small(es.Module):
        dp: float
        sp: bool = eqx.field(static=True)

    small = Small(1.0, False)
    copy = helper(small)
    assert copy is not small and type(copy) is Small
    assert copy.dp is small.dp and copy.sp is small.sp


def test_updates_drop_cached_property_values_of_the_old_instance():
    import functools

    class C(es.Module):
        a: float
        flag: bool = eqx.field(static=True)

        @functools.cached_property
        def doubled(self) -> float:
            return 2 * self.a if self.flag else 3 * self.a

    c = C(1.0, True)
    assert c.doubled == 2.0
    assert c.with_static(flag=False).doubled == 3.0
    assert c.with_dynamic(a=2.0).doubled == 4.0
    with es.edit(c) as c2:
        c2.flag = False
    assert c2.doubled == 3.0


# --- containers on a dotted path: exact messages and container types kept ------------


class _Tag:
    """A dict key whose `str` is shared with another key."""

    def __init__(self, n: int):
        self.n = n

    def __str__(self) -> str:
        return "t"

    def __repr__(self) -> str:
        return f"_Tag({self.n})"

    def __lt__(self, other: "_Tag") -> bool:  # pytree dict keys are sorted
        return self.n < other.n


class _MyList(list):
    pass


class _Holder(es.Module):
    layers: list
    nested: Any
    table: dict
    by_id: dict
    ordered: Any
    mine: Any
    shape: tuple = eqx.field(static=True)


def _holder() -> _Holder:
    import collections

    return _Holder(
        layers=[jnp.zeros(1), jnp.ones(1)],
        nested=[(jnp.zeros(1), jnp.ones(1)), [jnp.zeros(2)]],
        table={"a": jnp.zeros(1)},
        by_id={0: jnp.zeros(1), 1: jnp.ones(1)},
        ordered=collections.OrderedDict(a=jnp.zeros(1), b=jnp.ones(1)),
        mine=_MyList([jnp.zeros(1), jnp.ones(1)]),
        shape=((1, 2), (3,)),
    )


@pytest.mark.parametrize(
    "changes, where, first, second",
    [
        ({"layers.0": 1.0, "layers.-2": 2.0}, "layers", "0", "-2"),
        ({"layers.-1": 1.0, "layers.1": 2.0}, "layers", "-1", "1"),
        ({"nested.0.1": 1.0, "nested.0.-1": 2.0}, "nested.0", "1", "-1"),
    ],
)
def test_two_segments_naming_one_item_are_refused_by_name(
    changes, where, first, second
):
    with pytest.raises(ValueError) as info:
        _holder().with_dynamic(**changes)
    assert str(info.value) == (
        f"Conflicting updates: segments {first!r} and {second!r} both name the same "
        f"item of {where!r}. Name each item once."
    )


def test_a_conflict_of_a_whole_and_a_part_is_refused_by_name():
    with pytest.raises(ValueError) as info:
        _holder().with_dynamic(**{"nested.0": (1.0, 2.0), "nested.0.1": 3.0})
    assert str(info.value) == (
        "Conflicting updates: 'nested.0.1' changes inside 'nested.0', which is also "
        "replaced as a whole. Name either the whole value or the parts inside it."
    )


def test_items_of_nested_containers_take_the_kind_of_their_field():
    h = _holder()
    new = jnp.full(1, 7.0)
    h2 = h.with_dynamic(**{"nested.0.1": new, "nested.1.0": new})
    assert h2.nested[0][1] is new and h2.nested[1][0] is new
    assert type(h2.nested[0]) is tuple and type(h2.nested[1]) is list
    assert h2.nested[0][0] is h.nested[0][0]
    with pytest.raises(TypeError) as info:
        h.with_static(**{"nested.0.1": new})
    assert str(info.value) == (
        "`with_static` got 'nested.0.1', which lies inside a dynamic field. Use "
        "`with_dynamic` for it instead (or `es.edit`, which takes both kinds)."
    )
    with pytest.raises(TypeError) as info:
        h.with_dynamic(**{"shape.0.1": 5})
    assert str(info.value) == (
        "`with_dynamic` got 'shape.0.1', which lies inside a static field. Use "
        "`with_static` for it instead (or `es.edit`, which takes both kinds)."
    )
    assert h.with_static(**{"shape.0.1": 5}).shape == ((1, 5), (3,))


def test_container_types_are_kept_on_a_path():
    import collections

    h = _holder()
    new = jnp.full(1, 7.0)
    h2 = h.with_dynamic(**{"ordered.b": new, "mine.0": new, "table.a": new})
    assert type(h2.ordered) is collections.OrderedDict
    assert list(h2.ordered) == ["a", "b"] and h2.ordered["b"] is new
    assert type(h2.mine) is _MyList and h2.mine[0] is new
    assert h2.mine[1] is h.mine[1]
    assert type(h2.table) is dict and h2.table == {"a": new}
    assert type(h2.layers) is list and h2.layers is h.layers


def test_dict_keys_are_found_by_their_string():
    h = _holder()
    new = jnp.full(1, 7.0)
    h2 = h.with_dynamic(**{"by_id.0": new})
    assert h2.by_id[0] is new and list(h2.by_id) == [0, 1]
    assert h2.by_id[1] is h.by_id[1]
    assert h2.with_dynamic(**{"table.a": new}).table["a"] is new
    tags = {_Tag(1): jnp.zeros(1), _Tag(2): jnp.ones(1)}
    with pytest.raises(KeyError) as info:
        h.with_dynamic(by_id=tags).with_dynamic(**{"by_id.t": new})
    assert info.value.args[0] == (
        "Path segment 't' at 'by_id.t' names several keys: [_Tag(1), _Tag(2)]."
    )
    with pytest.raises(KeyError) as info:
        h.with_dynamic(**{"by_id.5": new})
    assert info.value.args[0] == "No key '5' at 'by_id.5'; the keys are [0, 1]."


def test_a_conflict_names_the_value_replaced_as_a_whole():
    with pytest.raises(ValueError) as info:
        _holder().with_dynamic(**{"nested": (), "nested.0.1": 3.0})
    assert str(info.value) == (
        "Conflicting updates: 'nested.0.1' changes inside 'nested', which is also "
        "replaced as a whole. Name either the whole value or the parts inside it."
    )


class _Leafy(es.Module):
    w: Any
    odd: Any
    name: str = eqx.field(static=True)


@pytest.mark.parametrize(
    "path, value, what",
    [
        ("name.x", "with_static", "a str"),
        ("odd.x", "with_dynamic", "a SimpleNamespace"),
        ("w.x", "with_dynamic", "a float32[2] array"),
    ],
)
def test_a_path_through_a_leaf_names_what_is_there(path, value, what):
    import types

    m = _Leafy(jnp.ones(2), types.SimpleNamespace(shape=(2,)), "n")
    with pytest.raises(TypeError) as info:
        getattr(m, value)(**{path: 1})
    head = path.split(".")[0]
    assert str(info.value) == (
        f"Cannot follow path segment 'x' at {head!r}: the value there is {what}, "
        "not a module, list, tuple or dict."
    )


class _Conv(es.Module):
    xs: tuple = eqx.field(static=True, converter=tuple)


class _HoldsConv(es.Module):
    inner: _Conv
    w: Any


def test_a_nested_field_named_on_a_path_goes_through_its_converter():
    m = _HoldsConv(_Conv([1]), 1.0)
    m2 = m.with_static(**{"inner.xs": [2, 3]})  # a list: hashable once converted
    assert m2.inner.xs == (2, 3) and type(m2.inner.xs) is tuple
    assert m2.w is m.w and m.inner.xs == (1,)


def test_the_wrong_helper_for_a_field_names_the_right_one():
    h = _HoldsConv(_Conv([1]), 1.0)
    with pytest.raises(TypeError) as info:
        h.with_static(w=2.0)
    assert str(info.value) == (
        "`with_static` got 'w', but 'w' is a dynamic field of `_HoldsConv` (holding "
        "an array, traced by `es.jit`). Use `with_dynamic(w=...)` instead (or "
        "`es.edit`, which takes both kinds)."
    )
    with pytest.raises(TypeError) as info:
        h.with_dynamic(**{"inner.xs": (2,)})
    assert str(info.value) == (
        "`with_dynamic` got 'inner.xs', but 'xs' is a static field of `_Conv` "
        "(declared `eqx.field(static=True)`). Use `with_static(**{'inner.xs': ...})` "
        "instead (or `es.edit`, which takes both kinds)."
    )


def test_a_container_that_contains_itself_is_refused_at_once_naming_the_field():
    class M(es.Module):
        w: Any

    m = M([1.0])
    cyclic: list = [1.0]
    cyclic.append(cyclic)
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        m.with_dynamic(w=cyclic)
    assert time.perf_counter() - start < 2.0  # not after a walk to the limit
    assert str(info.value) == (
        "Field 'w' of `test_a_container_that_contains_itself_is_refused_at_once_"
        "naming_the_field.<locals>.M` got a value that contains itself: w[1] is the "
        "value again. A module's fields are a tree; break the cycle before storing it."
    )


def test_the_updates_are_methods_of_es_module_read_as_plain_bound_methods():
    """`with_static`/`with_dynamic` are defined on `es.Module`; read off an instance
    they are plain bound methods, not Equinox `BoundMethod`s (pytrees of the
    module's leaves, which would double the cost of `m.with_dynamic(...)`)."""
    assert {"with_static", "with_dynamic"} <= vars(es.Module).keys()
    m = _holder()
    for method in (m.with_static, m.with_dynamic):
        assert method.__self__ is m and method.__func__ in vars(es.Module).values()
        leaves = jax.tree.leaves(method)
        assert len(leaves) == 1 and leaves[0] is method
