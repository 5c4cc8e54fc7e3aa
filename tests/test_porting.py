"""Porting an Equinox model: what a user meets when `eqx.Module` becomes `es.Module`.

A Python `bool` stays a `bool` (a flag that picks a branch, reachable by
`eqx.nn.inference_mode`); a number becomes an array, so a float meant as a
constant would be trained: the user is told once, at construction, before any
training step, with the one-line fix for each intent; a field annotated `float`
stores a float even when given an int; a module stacked by `eqx.filter_vmap`
refuses an update of the wrong shape; and every message that gives advice gives
the fix for the kind of value at hand."""

import inspect
import logging
import re
import warnings

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest


def _trainable_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "eqx_static" and r.levelno == logging.WARNING
    ]


# --- a bool flag, toggled by `eqx.nn.inference_mode` ---------------------------------


def _dropout_pair() -> tuple[type, type]:
    def body(self, x, key):
        if self.inference:  # a Python bool: picks the branch at trace time
            return self.scale * x
        keep = jax.random.bernoulli(key, 0.5, x.shape)
        return self.scale * jnp.where(keep, x / 0.5, 0.0)

    class EqxDrop(eqx.Module):
        scale: jax.Array
        inference: bool = False
        __call__ = body

    class EsDrop(es.Module):
        scale: jax.Array
        inference: bool = False
        __call__ = es.jit(body)

    return EqxDrop, EsDrop


def test_a_bool_flag_ports_as_written_and_inference_mode_reaches_it():
    eqx_cls, es_cls = _dropout_pair()
    x, key = jnp.arange(1.0, 5.0), jax.random.key(0)
    original, ported = eqx_cls(jnp.float32(2.0)), es_cls(jnp.float32(2.0))
    assert ported.inference is False
    call = eqx.filter_jit(lambda m, x, k: m(x, k))
    for flip in (False, True):
        a = eqx.nn.inference_mode(original, flip)
        b = eqx.nn.inference_mode(ported, flip)
        assert b.inference is flip
        want, got = call(a, x, key), b(x, key)
        np.testing.assert_array_equal(got, want)  # bitwise
        assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)
    assert es_cls.__call__.cache_info().misses == 2  # a flag picks a program
    assert es_cls.__call__.compile_info().compiles == 2


def test_with_static_takes_a_bool_leaf_held_in_a_dynamic_field():
    """`eqx.nn.Dropout.inference` is a dynamic field holding a Python bool, which
    `es.jit` keys statically, as `eqx.filter_jit` does: `with_static` takes it."""

    class Net(es.Module):
        drop: eqx.nn.Dropout
        w: jax.Array

    net = Net(eqx.nn.Dropout(0.5), jnp.ones(2))
    quiet = net.with_static(**{"drop.inference": True})
    assert quiet.drop.inference is True and net.drop.inference is False
    assert quiet.w is net.w
    with pytest.raises(TypeError) as info:
        net.with_static(**{"drop.inference": jnp.array(True)})
    assert str(info.value) == (
        "`with_static` got 'drop.inference': the dynamic field 'inference' of "
        "`Dropout` holds a Python bool, which `es.jit` keys statically, and "
        "`with_static` replaces it with another such value; got an array. To store "
        "data there, use `with_dynamic`."
    )


# --- a float meant as a constant -----------------------------------------------------


def _vae(annotation: object, field: object = 0.5) -> type:
    class VAE(es.Module):
        w: jax.Array
        beta: annotation = field  # pyright: ignore[reportInvalidTypeForm]

        def loss(self, x):
            return jnp.sum((self.w * x) ** 2) + self.beta * jnp.sum(self.w**2)

    return VAE


def test_a_float_that_would_be_trained_is_announced_once_before_training(caplog):
    """The VAE port: `beta: float = 0.5` becomes an array, and the standard loop
    trains it. The user learns it at construction, with the fix for each intent."""
    vae = _vae(float)
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        model = vae(jnp.ones(3))
        vae(jnp.ones(3))  # once per field
        model.with_dynamic(beta=0.7)
    (message,) = _trainable_warnings(caplog)
    assert message == (
        "`_vae.<locals>.VAE` stores Python floats as arrays in fields not annotated "
        "as arrays, where an `eqx.Module` keeps them as constants: 'beta' (0.5).\n"
        "As data, `eqx.filter_grad` differentiates them, an optimiser trains them, "
        "and results may change: traced, not folded into the compiled program, a "
        "value can round differently (by an ulp, or more after many iterations). Say "
        "what each field is, as for 'beta':\n"
        "- a constant: `beta: float = eqx.field(static=True)`;\n"
        "- changes but must not be trained: pass it as an argument, or keep it out "
        "of the optimiser;\n"
        "- a parameter: `beta: jax.Array`, which also silences this warning."
    )
    # What it warns of: the standard loop moves it.
    optim = optax.sgd(0.1)
    state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    grads = eqx.filter_grad(lambda m: m.loss(jnp.ones(3)))(model)
    updates, state = optim.update(grads, state)
    assert float(eqx.apply_updates(model, updates).beta) != 0.5


def test_every_float_of_a_class_is_named_in_one_warning_once(caplog):
    """A van der Pol controller ported as written: four floats, one warning that
    names them all (not a paragraph each), once for the class; a field that gets
    a float only later is named then, once."""

    class VanDerPol(es.Module):
        mu: float
        k: float
        gain: complex
        w: jax.Array
        bias: float | None = None

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        m = VanDerPol(1.0, 0.5, 2j, jnp.ones(2))
        VanDerPol(2.0, 0.5, 1j, jnp.ones(2))
        m = m.with_dynamic(mu=3.0, k=0.1)
        first = _trainable_warnings(caplog)
        m.with_dynamic(bias=0.25)
        m.with_dynamic(bias=0.5)
    (message,) = first
    head, why, *fixes = message.split("\n")
    assert head == (
        f"`{VanDerPol.__qualname__}` stores Python numbers as arrays in fields not "
        "annotated as arrays, where an `eqx.Module` keeps them as constants: 'mu' "
        "(1.0), 'k' (0.5), 'gain' (2j)."
    )
    assert why.startswith("As data, `eqx.filter_grad` differentiates them, an ")
    assert "results may change" in why and why.endswith("as for 'mu':")
    assert fixes[0] == "- a constant: `mu: float = eqx.field(static=True)`;"
    assert fixes[2].startswith("- a parameter: `mu: jax.Array`")
    later = _trainable_warnings(caplog)[1:]
    assert [w.split("\n")[0].split(": ")[1] for w in later] == ["'bias' (0.25)."]


@pytest.mark.parametrize(
    "annotation, field",
    [
        (jax.Array, 0.5),  # says: a parameter
        (float, eqx.field(static=True, default=0.5)),  # says: a constant
    ],
    ids=["array annotation", "static"],
)
def test_a_class_that_says_what_the_field_is_gets_no_warning(caplog, annotation, field):
    vae = _vae(annotation, field)
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        model = vae(jnp.ones(3))
    assert _trainable_warnings(caplog) == []
    if annotation is float:  # static: not a leaf, so the loop leaves it alone
        grads = eqx.filter_grad(lambda m: m.loss(jnp.ones(3)))(model)
        assert len(jax.tree.leaves(grads)) == 1 and model.beta == 0.5


def test_a_container_annotated_with_arrays_gets_no_warning(caplog):
    """`tuple[jax.Array, ...]` says the floats in it are parameters; a container
    annotation that does not say array still warns, naming the field."""

    class Offsets(es.Module):
        offsets: tuple[jax.Array, ...]
        table: dict[str, jax.Array] | None
        other: tuple[float, ...]

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        m = Offsets((1.0, 2.0), {"a": 3.0}, (4.0,))
    (message,) = _trainable_warnings(caplog)
    assert message.split("\n")[0].endswith("keeps them as constants: 'other' (4.0).")
    assert m.offsets[0].dtype == jnp.float32


def test_an_int_or_a_bool_is_not_announced(caplog):
    class Counter(es.Module):
        step: int = 0  # an int is never trained (`eqx.is_inexact_array`)
        flag: bool = False

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        Counter()
    assert _trainable_warnings(caplog) == []


def test_a_float_annotation_stores_a_float_given_an_int():
    class Scaled(es.Module):
        s: float
        n: int

        def value(self, x):
            return self.s * x

    m = Scaled(1, 2)
    assert (m.s.dtype, m.n.dtype) == (jnp.float32, jnp.int32)
    grads = eqx.filter_grad(lambda m: m.value(jnp.float32(3.0)))(m)
    assert float(grads.s) == 3.0  # in the gradients, as a float is
    assert m.with_dynamic(s=2).s.dtype == jnp.float32


# --- stacked modules ----------------------------------------------------------------


class _Member(es.Module):
    w: jax.Array
    temperature: float


def _ensemble() -> _Member:
    @eqx.filter_vmap
    def make(key):
        return _Member(jax.random.normal(key, (3,)), 1.0)

    return make(jax.random.split(jax.random.key(0), 4))


def test_an_update_of_a_stacked_module_must_keep_the_stacked_shape():
    ensemble = _ensemble()
    assert ensemble.temperature.shape == (4,)
    message = (
        "Field 'temperature' of `_Member` holds a stacked value float32[4] (a module "
        "batched by `eqx.filter_vmap`), so the new value must have the same shape "
        "and dtype; got float32[]."
    )
    with pytest.raises(TypeError) as info:
        ensemble.with_dynamic(temperature=2.0)
    assert str(info.value) == message
    with pytest.raises(TypeError) as info:
        with es.edit(ensemble) as e:
            e.temperature = 2.0
    assert str(info.value) == message
    hot = ensemble.with_dynamic(temperature=jnp.full(4, 2.0))
    assert hot.temperature.shape == (4,)


# --- advice that fits the cause ------------------------------------------------------


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")  # Equinox's
@pytest.mark.parametrize(
    "value, fix",
    [
        (jnp.array(3), "`n=int(n)`"),
        (np.float32(2.0), None),  # a NumPy scalar is hashable: accepted
        (jnp.ones(3), "make it a dynamic field (drop `static=True`)"),
    ],
    ids=["0-d array", "numpy scalar", "array"],
)
def test_a_static_field_given_an_array_is_told_the_fix_for_that_array(value, fix):
    class Shaped(es.Module):
        n: int = eqx.field(static=True)

    if fix is None:
        assert Shaped(value).n == value
        return
    with pytest.raises(TypeError) as info:
        Shaped(value)
    assert str(info.value).startswith("Static field 'n' of `")
    assert fix in str(info.value)


def test_the_storm_warning_for_a_python_float_left_in_a_dynamic_field(caplog):
    """`eqx.tree_at` writes a Python float as given: a non-array leaf, static as
    under `eqx.filter_jit`. The advice is to store an array there."""

    class Scale(es.Module):
        s: jax.Array

        @es.jit(warn_after=3)
        def __call__(self, x):
            return self.s * x

    m = Scale(jnp.float32(1.0))
    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(4):
            eqx.tree_at(lambda m: m.s, m, float(i))(jnp.float32(1.0))
    (message,) = _trainable_warnings(caplog)
    message = re.sub(r"\(\d+\.\d\d s spent", "(… s spent", message)
    line = inspect.getsourcelines(Scale.__call__.fn)[1] + 2  # its `return`
    assert message.endswith(
        "'s' changed every time (… s spent compiling). The programs differ only in "
        f"their constants (at test_porting.py:{line} in __call__ (mul)): 's' is only "
        "used as a value. 's' is a Python value in a dynamic field (as `eqx.tree_at` "
        "leaves one): store an array there instead (`jnp.asarray(v)`, or "
        "`with_dynamic`), and it is traced, with no compile per value."
    )


def test_a_custom_init_reads_back_the_number_it_assigned():
    """The upstream vision transformer's `__init__` assigns `self.patch_size` and
    then builds a layer from it: the number it reads back is the number it wrote
    (stored as an array only when `__init__` has finished, as Equinox runs
    converters), so Equinox's `Linear` gets an int for its static sizes."""

    class PatchEmbedding(es.Module):
        linear: eqx.nn.Linear
        patch_size: int  # not declared static: data, once `__init__` is done

        def __init__(self, input_channels, output_shape, patch_size, key):
            self.patch_size = patch_size
            self.linear = eqx.nn.Linear(
                self.patch_size**2 * input_channels, output_shape, key=key
            )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Equinox warns of an array set as static
        m = PatchEmbedding(3, 8, 4, jax.random.key(0))
    assert m.linear.in_features == 48 and type(m.linear.in_features) is int
    assert isinstance(m.patch_size, jax.Array) and int(m.patch_size) == 4


def test_the_storm_advice_for_a_float_in_a_plain_module_works_for_it(caplog):
    """A sweep over a solver's tolerance, optimistix's `Newton` (a plain
    `eqx.Module`, whose floats `with_dynamic` keeps as they are): the advice names
    what works for such a module, `eqx.tree_at` with an array, or an argument."""
    optx = pytest.importorskip("optimistix")

    @es.jit
    def solve(solver, y0):
        return optx.root_find(lambda y, args: y**2 - 2.0, solver, y0).value

    with caplog.at_level(logging.WARNING, logger="eqx_static"):
        for i in range(9):
            solve(optx.Newton(rtol=10.0 ** -(i + 3), atol=1e-6), jnp.float32(1.0))
    (warning,) = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    ]
    assert "'solver.rtol' changed every time" in warning
    assert "a field of a plain `eqx.Module`" in warning
    assert "`eqx.tree_at(lambda m: m.rtol, m, jnp.asarray(v))`" in warning
    assert "with_dynamic`), and" not in warning


def test_the_vision_transformer_s_patch_embedding_ports_with_one_line():
    """Equinox's vision transformer example: its `PatchEmbedding` uses `patch_size`
    as a size. Ported as written, the first call names it; with it declared static,
    the port gives the results of the upstream class under `eqx.filter_jit`."""

    def patches(self, x):
        c, h, w = x.shape
        p = self.patch_size
        x = x.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)
        return jax.vmap(self.linear)(x.reshape(-1, c * p * p))

    def init(self, input_channels, output_shape, patch_size, key):
        self.patch_size = patch_size
        self.linear = eqx.nn.Linear(
            patch_size**2 * input_channels, output_shape, key=key
        )

    class Upstream(eqx.Module):
        linear: eqx.nn.Linear
        patch_size: int
        __init__ = init
        __call__ = patches

    class AsWritten(es.Module):
        linear: eqx.nn.Linear
        patch_size: int
        __init__ = init
        __call__ = es.jit(patches)

    class Ported(es.Module):
        linear: eqx.nn.Linear
        patch_size: int = eqx.field(static=True)
        __init__ = init
        __call__ = es.jit(patches)

    key, x = jax.random.key(0), jax.random.normal(jax.random.key(1), (3, 8, 8))
    with pytest.raises(es.TracedFieldError, match="`patch_size: int = eqx.field"):
        AsWritten(3, 8, 4, key)(x)
    want = eqx.filter_jit(Upstream.__call__)(Upstream(3, 8, 4, key), x)
    np.testing.assert_array_equal(Ported(3, 8, 4, key)(x), want)
