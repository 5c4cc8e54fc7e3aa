"""`es.Module`: a drop-in `eqx.Module` with checked static fields, numbers stored as
arrays, defaults set, and what Equinox's training loops, serialisation and
`eqx.tree_at` see."""

import abc
import contextlib
import dataclasses
import io

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import XlaCompiles


class Parent(es.Module):
    dp: float
    sp: bool = eqx.field(static=True)

    def g(self, x):
        raise NotImplementedError


class Child(Parent):
    dc: float
    sc: bool = eqx.field(static=True)

    def g(self, x):
        return self.dc * x if self.sc else x


def _child() -> Child:
    return Child(dp=2.0, sp=False, dc=3.0, sc=False)


# --- an eqx.Module, drop-in ---------------------------------------------------------


def test_is_an_equinox_module_and_pytree():
    c = _child()
    assert isinstance(c, eqx.Module)
    assert jax.tree_util.tree_leaves(c) == [2.0, 3.0]  # static fields are not leaves
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        c.dp = 5.0  # pyright: ignore[reportAttributeAccessIssue]


def test_equinox_tools_keep_working():
    c = _child()
    moved = eqx.tree_at(lambda m: m.dc, c, 7.0)
    assert type(moved) is Child and moved.dc == 7.0 and c.dc == 3.0

    @eqx.filter_jit
    def call(m, x):
        return m.g(x) * m.dp

    assert call(c.with_static(sc=True), jnp.array(1.0)) == 6.0

    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, c.with_dynamic(dp=jnp.array(4.0)))
    buffer.seek(0)
    like = c.with_dynamic(dp=jnp.array(0.0))
    loaded = eqx.tree_deserialise_leaves(buffer, like)
    assert loaded.dp == 4.0 and loaded.sp is False


# --- static fields must be hashable at construction ---------------------------------


def _array_static_warning(value: object) -> contextlib.AbstractContextManager:
    """Equinox itself warns (an error under `filterwarnings=error`) before our check."""
    if isinstance(value, jax.Array | np.ndarray):
        return pytest.warns(UserWarning, match="JAX array is being set as static")
    return contextlib.nullcontext()


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ([1, 2], r"Store a tuple instead: `sp=tuple\(...\)`"),
        ({"a": 1}, "Store a hashable mapping instead"),
        ({1, 2}, r"Store a frozenset instead"),
        (jnp.zeros(2), r"make it a dynamic field \(drop `static=True`\)"),
        (np.zeros(2), r"make it a dynamic field \(drop `static=True`\)"),
    ],
    ids=["list", "dict", "set", "jax-array", "numpy-array"],
)
def test_unhashable_static_at_construction(value, fix):
    kind = type(value).__name__
    with (
        _array_static_warning(value),
        pytest.raises(
            TypeError, match=f"Static field 'sp' of `Child` holds an unhashable {kind}"
        ) as info,
    ):
        Child(dp=2.0, sp=value, dc=3.0, sc=False)
    assert info.match(fix)


def test_unhashable_static_other_types_get_generic_fix():
    with pytest.raises(
        TypeError,
        match="a static field keys the compilation cache. Store a hashable value",
    ):
        Child(dp=2.0, sp=(1, [2]), dc=3.0, sc=False)  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize("value", [True, 3, "relu", None, (1, 2), frozenset({1})])
def test_hashable_static_values_accepted(value):
    c = Child(dp=2.0, sp=value, dc=3.0, sc=False)
    assert c.sp is value


def test_user_check_init_and_hash_check_both_run():
    calls = []

    class Checked(es.Module):
        x: float
        tag: object = eqx.field(static=True)

        def __check_init__(self):
            calls.append(self.x)
            if self.x < 0:
                raise ValueError("x must be non-negative")

    Checked(1.0, "a")
    assert calls == [1.0]
    with pytest.raises(ValueError, match="x must be non-negative"):
        Checked(-1.0, "a")
    with pytest.raises(
        TypeError, match="'tag' of `.*Checked` holds an unhashable list"
    ):
        Checked(2.0, ["a"])


# --- custom __init__, abstract hierarchies ------------------------------------------


class WithInit(es.Module):
    scale: float
    n: int = eqx.field(static=True)
    inits = [0]  # a class attribute, not a field: counts `__init__` calls

    def __init__(self, width: int):
        WithInit.inits[0] += 1
        self.scale = 1.0 / width
        self.n = width


def test_custom_init():
    m = WithInit(4)
    assert (m.scale, m.n) == (0.25, 4)
    before = WithInit.inits[0]
    m2 = m.with_static(n=8).with_dynamic(scale=0.5)
    assert WithInit.inits[0] == before  # updates do not re-run `__init__`
    assert type(m2) is WithInit and (m2.scale, m2.n) == (0.5, 8)
    assert (m.scale, m.n) == (0.25, 4)
    with pytest.raises(TypeError, match="Store a tuple instead"):
        m.with_static(n=[8])


class AbstractLayer(es.Module):
    scale: eqx.AbstractVar[float]
    act: eqx.AbstractVar[str]

    @abc.abstractmethod
    def apply(self, x): ...

    def __check_init__(self):
        if self.scale < 0:
            raise ValueError("scale must be non-negative")


class Layer(AbstractLayer):
    scale: float
    act: str = eqx.field(static=True)

    def apply(self, x):
        return self.scale * x


def test_abstract_base_hierarchy():
    with pytest.raises(TypeError, match="abstract"):
        AbstractLayer()  # pyright: ignore[reportAbstractUsage,reportCallIssue]
    layer = Layer(2.0, "relu")
    assert layer.apply(3.0) == 6.0
    tanh = layer.with_static(act="tanh")
    assert type(tanh) is Layer and tanh.act == "tanh" and tanh.scale is layer.scale
    assert layer.with_dynamic(scale=4.0).apply(1.0) == 4.0
    with pytest.raises(ValueError, match="scale must be non-negative"):
        layer.with_dynamic(scale=-1.0)  # the base's `__check_init__` runs
    with pytest.raises(TypeError, match="is a static field of `Layer`"):
        layer.with_dynamic(act="tanh")  # the kind comes from the concrete class


def test_module_holding_modules_in_a_list():
    class Stack(es.Module):
        layers: list
        depth: int = eqx.field(static=True)

    s = Stack([Layer(1.0, "relu"), Layer(2.0, "relu")], 2)
    s2 = s.with_static(**{"layers.1.act": "tanh", "depth": 3})
    assert [la.act for la in s2.layers] == ["relu", "tanh"] and s2.depth == 3
    assert s2.layers[0] is s.layers[0] and s.layers[1].act == "relu"


# --- methods and functions ----------------------------------------------------------


def test_method_function_and_unbound_forms_agree():
    c = _child()
    by_method = c.with_static(sp=True)
    by_function = es.with_static(c, sp=True)
    unbound = Child.with_static(c, sp=True)
    for m in (by_method, by_function, unbound):
        assert type(m) is Child and m.sp is True and m.dp is c.dp
    assert c.with_dynamic(dc=5.0).dc == es.with_dynamic(c, dc=5.0).dc == 5.0


def test_functions_accept_any_equinox_module():
    class Plain(eqx.Module):
        w: float
        act: str = eqx.field(static=True)

    p = Plain(1.0, "relu")
    assert not hasattr(p, "with_static")
    p2 = es.with_dynamic(es.with_static(p, act="tanh"), w=2.0)
    assert type(p2) is Plain and (p2.w, p2.act) == (2.0, "tanh")
    assert (p.w, p.act) == (1.0, "relu")
    with pytest.raises(TypeError, match="holds an unhashable list"):
        es.with_static(p, act=["tanh"])


@pytest.mark.parametrize("helper", [es.with_static, es.with_dynamic])
def test_functions_reject_non_modules(helper):
    @dataclasses.dataclass(frozen=True)
    class NotAModule:
        a: int

    # Our own check, or (under the jaxtyping import hook) beartype's on `module`.
    with pytest.raises(
        TypeError, match=r"takes an `eqx.Module`, got NotAModule|'module'"
    ):
        helper(NotAModule(1), a=2)


def test_a_field_named_module_can_be_updated():
    class Holder(es.Module):
        module: float

    h = Holder(1.0)
    assert h.with_dynamic(module=2.0).module == 2.0
    assert es.with_dynamic(h, module=3.0).module == 3.0


# --- the library's own argument checks ------------------------------------------------
#
# Under the jaxtyping import hook, beartype rejects a wrongly-typed argument before
# the library's check runs. These inputs satisfy the annotations (a `Mock` with a
# module `spec` is an instance of the module class to `isinstance`; a staticmethod
# is callable), or switch jaxtyping's run-time checks off, so that the message seen
# is the library's own.


class _Spec(es.Module):
    a: float


@pytest.mark.parametrize(
    "helper, name",
    [(es.with_static, "with_static"), (es.with_dynamic, "with_dynamic")],
)
def test_update_functions_reject_a_non_module_with_their_own_message(helper, name):
    from unittest import mock

    fake = mock.NonCallableMock(spec=_Spec)
    assert isinstance(fake, _Spec)  # what an annotation check looks at
    with pytest.raises(TypeError) as info:
        helper(fake, a=2.0)
    assert str(info.value) == f"`{name}` takes an `eqx.Module`, got NonCallableMock."


def test_edit_rejects_a_non_module_with_its_own_message():
    from unittest import mock

    with pytest.raises(TypeError) as info:
        es.edit(mock.NonCallableMock(spec=_Spec))
    assert str(info.value) == (
        "`es.edit` takes an `eqx.Module`, got <class 'unittest.mock.NonCallableMock'>."
    )


# --- drop-in: what an Equinox training loop, serialisation and `tree_at` see --------


class Decayed(es.Module):
    w: jax.Array
    decay: float


def test_the_adam_loop_over_a_float_field_compiles_once():
    """optax's adam gives a field back strongly typed, and its moments too: a
    stored number is strongly typed already, so every step is the same key."""
    import optax

    model = Decayed(jnp.ones(3), 0.9)
    optimiser = optax.adam(1e-2)
    state = optimiser.init(eqx.filter(model, eqx.is_array))
    traces = [0]

    @es.jit
    def step(model, state, x):
        traces[0] += 1
        grads = eqx.filter_grad(lambda m: jnp.sum(m.w * x * m.decay))(model)
        with jax.numpy_dtype_promotion("standard"):  # optax's count
            updates, state = optimiser.update(grads, state)
        return eqx.apply_updates(model, updates), state

    x = jnp.ones(3)
    for _ in range(5):
        model, state = step(model, state, x)
    assert traces[0] == 1 and step.compile_info().compiles == 1
    assert float(model.decay) != 0.9  # a dynamic field is data: it trained


def test_serialisation_round_trips_exactly(tmp_path):
    """A reloaded module is the same module: the same dtypes (no weak type lost),
    the same repr, the same key (no new trace), the same result for a bfloat16
    input."""

    class Scaled(es.Module):
        scale: float
        flag: bool = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return self.scale * x

    m = Scaled(0.75, True)
    path = tmp_path / "m.eqx"
    eqx.tree_serialise_leaves(path, m)
    back = eqx.tree_deserialise_leaves(path, Scaled(0.0, True))
    assert repr(back) == repr(m) and repr(m).endswith("Scaled(scale=0.75, flag=True)")
    assert jax.typeof(back.scale) == jax.typeof(m.scale)
    x = jnp.ones(2, jnp.bfloat16)
    with jax.numpy_dtype_promotion("standard"):
        assert m(x).dtype == back(x).dtype == jnp.float32  # a float32 field
    assert Scaled.__call__.cache_info().misses == 1


def test_tree_at_writes_a_number_as_given():
    """`eqx.tree_at` builds the module without `__init__`: a Python float it writes
    stays a Python float, static under `es.jit` as under `eqx.filter_jit`. Where the
    one rule stops, `with_dynamic` stores it."""
    m = Decayed(jnp.ones(3), 0.9)
    edited = eqx.tree_at(lambda t: t.decay, m, 0.5)
    assert type(edited.decay) is float
    assert isinstance(es.with_dynamic(m, decay=0.5).decay, jax.Array)


@pytest.mark.parametrize("base", [es.Module, eqx.Module])
def test_a_default_left_unset_by_init_compiles_once_in_a_training_loop(base):
    """Equinox's flatten gives the same structure before and after a
    `jax.tree.map`, `eqx.apply_updates` or optax step; so does the key."""
    import optax

    class Net(base):
        w: jax.Array
        decay: float = 0.5
        act: str = eqx.field(static=True, default="tanh")

        def __init__(self, w):
            self.w = w  # `decay` and `act` are left to their defaults

        def __call__(self, x):
            return getattr(jnp, self.act)(self.w * x) * self.decay

    traces = [0]

    @es.jit
    def loss(net, x):
        traces[0] += 1
        return jnp.sum(net(x))

    net, x = Net(jnp.ones(3)), jnp.ones(3)
    compiles = XlaCompiles()
    optimiser = optax.sgd(0.1)
    state = optimiser.init(eqx.filter(net, eqx.is_array))
    for _ in range(3):
        loss(net, x)
        grads = eqx.filter_grad(loss)(net, x)
        updates, state = optimiser.update(grads, state)
        net = eqx.apply_updates(net, updates)
        net = jax.tree.map(lambda a: a, net)
    # One key: the top-level program compiled once; the eager `filter_grad`
    # compiles its own transformed programs (forward and backward), once each.
    assert loss.compile_info().compiles == compiles.of("loss") == 3
    assert loss.compile_info().programs == 1
    assert loss.cache_info().misses == 2
    if base is es.Module:  # the default is stored, as an array: it is trained
        assert isinstance(net.decay, jax.Array) and float(net.decay) != 0.5
        assert "decay" in vars(Net(jnp.ones(3)))
    else:  # a plain module keeps Equinox's rule: read through the class
        assert net.decay == 0.5 and "decay" not in vars(Net(jnp.ones(3)))


def test_a_field_read_through_a_subclass_attribute_is_left_as_equinox_leaves_it():
    """Equinox reads a field that `__init__` left unset through the class, so a
    subclass's class attribute or a property is what is read. Only a plain default
    that is itself what is read is stored. (Regression: Equinox's
    `test_class_attribute_of_static_field_with_abstract_property`, where storing the
    dataclass default put the property object itself in the tree.)"""

    class AbstractBase(es.Module):
        config: list[str] = eqx.field(static=True)

        @property
        @abc.abstractmethod
        def config(self):  # noqa: F811  (as in Equinox's test)
            pass

    class Concrete(AbstractBase):
        config = ["a", "b"]  # pyright: ignore[reportAssignmentType]

        def __init__(self):
            pass

    def f(m):
        return len(m.config)

    m = Concrete()
    assert "config" not in vars(m) and m.config == ["a", "b"]
    assert f(m) == eqx.filter_jit(f)(m) == es.jit(f)(m) == 2

    class Net(es.Module):
        w: jax.Array
        decay: float = 0.5

        def __init__(self):
            self.w = jnp.ones(2)

    class Slower(Net):
        decay = 0.25  # pyright: ignore[reportAssignmentType]

    assert isinstance(vars(Net())["decay"], jax.Array)  # its own plain default
    assert "decay" not in vars(Slower()) and Slower().decay == 0.25


# --- repr --------------------------------------------------------------------------


class Shown(es.Module):
    dp: float
    sp: bool = eqx.field(static=True)


def test_repr_shows_stored_numbers_as_numbers():
    c = Shown(dp=2.0, sp=False)
    assert isinstance(c.dp, jax.Array) and c.dp.shape == ()
    assert repr(c) == "Shown(dp=2.0, sp=False)"
