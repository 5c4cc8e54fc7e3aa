"""Equinox's documentation examples, run as written (`eqx.Module`, `eqx.filter_jit`)
and ported (`es.Module`, `es.jit`): the port must give what the original gives.

The programs are in `tests/equinox_examples.py`, each written once over the base
class and the jit decorator, so the two versions differ in those two names only.
For each example the tests check:

- **values**: every array leaf of the results (losses, outputs, final models,
  optimiser states) is bitwise equal (`np.testing.assert_array_equal`): the two
  versions trace the same operations on the same inputs, so XLA is given the same
  computation; every non-array leaf compares `==` (functions: `is`);
- **leaf types**: for each leaf, at the same key path, its type, and for arrays its
  dtype, shape and weak type (and, in `parallelism`, its sharding);
- **tree structure**: `jax.tree.structure` of the original against that of the port
  with each of the port's `es.Module` classes mapped back to its `eqx.Module`
  counterpart (the class made by the same code over `eqx.Module`): the two treedefs
  must be equal, which compares the node types, the field names (key paths), the
  static fields' values and the position of every leaf. Without the mapping the
  treedefs differ only because the classes are different objects; comparing after
  the mapping makes everything else count;
- **traces**: each compiled function of the port is traced no more often than the
  original (a Python counter in each body).

Where the port differs by design, the test says so at the key path where it does,
and asserts the difference: every listed difference must occur, and nothing else
may differ. The design rule (docs/index.md, "The one rule"): a Python `int`/`float` in a
*dynamic* field of an `es.Module` is stored as a 0-d, strongly typed JAX array, so it
is a traced leaf, whereas in an `eqx.Module` it stays a Python number, a static leaf
under `eqx.filter_jit`; a Python `bool` stays a `bool` in both.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import equinox_examples as ex
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


# Whole training runs, each a few seconds: the full suite runs them.
pytestmark = pytest.mark.slow


# --- comparison helpers ---------------------------------------------------------


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, jax.Array):
        return (type(x), x.dtype, x.shape, x.weak_type)
    if isinstance(x, np.ndarray):
        return (type(x), x.dtype, x.shape)
    return (type(x),)


def _to_original(tree: Any, class_map: Mapping[type, type]) -> Any:
    """`tree` with every instance of a port class rebuilt, field by field, as an
    instance of the matching original class (no `__init__` runs: the fields are
    copied as they are, static ones included)."""

    def convert(x):
        if type(x) not in class_map:
            return x
        new = object.__new__(class_map[type(x)])
        for f in dataclasses.fields(x):
            object.__setattr__(new, f.name, _to_original(getattr(x, f.name), class_map))
        return new

    return jax.tree.map(convert, tree, is_leaf=lambda x: type(x) in class_map)


def _paths_and_leaves(tree: Any) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def _assert_leaf_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, (jax.Array, np.ndarray)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
    elif callable(a):
        assert a is b, where
    else:
        assert a == b, where


def assert_same_program_results(
    original: Any,
    port: Any,
    class_map: Mapping[type, type] = {},
    documented: Mapping[str, Callable[[Any, Any], None]] = {},
    *,
    sharding: bool = False,
) -> None:
    """The port's results against the original's: the same treedef once the port's
    classes are mapped to the original's, then, leaf by leaf at each key path, the
    same signature (type; dtype, shape, weak type) and the same value.

    `documented`: key path -> a check of a difference that is by design. At these
    paths the check runs instead of the comparison, and it must be needed: a
    documented path whose leaves agree fails the test (the difference is gone, so
    the claim that documents it is out of date)."""
    mapped = _to_original(port, class_map)
    # The mapping rebuilt the port's tree and lost nothing: the same key paths to
    # the same leaf objects (so no child of an `es.Module` outside its dataclass
    # fields went unseen).
    port_flat, mapped_flat = _paths_and_leaves(port), _paths_and_leaves(mapped)
    assert [p for p, _ in port_flat] == [p for p, _ in mapped_flat]
    assert all(a is b for (_, a), (_, b) in zip(port_flat, mapped_flat, strict=True))
    assert jax.tree.structure(mapped) == jax.tree.structure(original)
    pairs = zip(_paths_and_leaves(original), _paths_and_leaves(mapped), strict=True)
    seen = set()
    for (path, a), (path_b, b) in pairs:
        assert path == path_b
        if path in documented:
            assert _leaf_signature(a) != _leaf_signature(b), (
                f"{path}: the documented difference does not occur"
            )
            documented[path](a, b)
            seen.add(path)
            continue
        assert _leaf_signature(a) == _leaf_signature(b), path
        _assert_leaf_equal(a, b, path)
        if sharding and isinstance(a, jax.Array):
            assert a.sharding == b.sharding, path
    assert seen == set(documented), (
        f"documented paths not in the tree: {set(documented) - seen}"
    )


def python_number_vs_strong_array(dtype: Any) -> Callable[[Any, Any], None]:
    """The documented difference: a Python number in a dynamic field stays a Python
    number in an `eqx.Module` and is a 0-d strongly typed array in an `es.Module`,
    holding the same value."""

    def check(original_leaf: Any, port_leaf: Any) -> None:
        assert type(original_leaf) in (bool, int, float, complex)
        assert isinstance(port_leaf, jax.Array)
        assert port_leaf.shape == () and port_leaf.dtype == dtype
        assert not port_leaf.weak_type
        assert port_leaf.item() == original_leaf

    return check


def assert_traces_no_more(original: Mapping[str, int], port: Mapping[str, int]) -> None:
    assert set(port) == set(original)
    for name, n in original.items():
        assert port[name] <= n, (
            f"{name}: the port traced {port[name]} times, the original {n}"
        )


def assert_is_port(result: Mapping[str, Any], *names: str) -> None:
    """The port really ran `es.jit` (a wrapper with `cache_info`)."""
    for name in names:
        assert isinstance(result[name].cache_info(), es.CacheInfo), name


# --- train_rnn ------------------------------------------------------------------


@functools.cache
def _train_rnn(version: str, hidden_static: bool) -> dict[str, Any]:
    return ex.train_rnn(
        {"original": ex.ORIGINAL, "port": ex.PORT}[version], hidden_static=hidden_static
    )


def test_train_rnn_unchanged_port_raises_where_a_dynamic_int_is_a_shape():
    """Documented difference. The notebook declares `hidden_size: int` as a plain
    (dynamic) field and uses it as a shape, `jnp.zeros((self.hidden_size,))`. In an
    `eqx.Module` it stays a Python int, static under `eqx.filter_jit`; in an
    `es.Module` it is stored as an int32 array and traced (docs/index.md, "The one rule";
    docs/migrating/filter-jit.md: "declare the field static if it picks a
    branch"). So the unchanged port raises `es.TracedFieldError`, which names the
    field and the fix, and the port needs one line changed (the next test)."""
    with pytest.raises(
        es.TracedFieldError, match=r"hidden_size.*eqx\.field\(static=True\)"
    ):
        ex.train_rnn_port()

    # The model the port built (recorded on its way into the compiled step): the
    # field holds a strongly typed int32 array where the original holds the int.
    built = []

    def recording_jit(fn):
        compiled = es.jit(fn)

        def call(model, *args):
            built.append(model)
            return compiled(model, *args)

        return call

    with pytest.raises(es.TracedFieldError):
        ex.train_rnn(ex.Api("port", es.Module, recording_jit))
    hidden_size = built[0].hidden_size
    assert isinstance(hidden_size, jax.Array) and hidden_size.dtype == jnp.int32
    assert hidden_size.shape == () and not hidden_size.weak_type and hidden_size == 4
    assert type(_train_rnn("original", False)["initial_model"].hidden_size) is int


def test_train_rnn_with_hidden_size_static():
    """The notebook against the port with `hidden_size` declared
    `eqx.field(static=True)`: the same losses, accuracy, predictions and trained
    model, one trace each.

    The structures are compared between the port and the original with the same
    declaration (in the notebook's original, `hidden_size` is a Python-int *leaf*,
    in the port a static field, so the notebook's treedef has one leaf more); and
    the original with the declaration gives exactly what the notebook gives."""
    notebook = _train_rnn("original", False)
    original = _train_rnn("original", True)
    port = _train_rnn("port", True)
    assert_is_port(port, "make_step")
    assert issubclass(port["RNN"], es.Module) and not issubclass(
        original["RNN"], es.Module
    )

    class_map = {port["RNN"]: original["RNN"]}
    keys = (
        "losses",
        "final_accuracy",
        "pred_ys",
        "model",
        "opt_state",
        "initial_model",
    )
    results = lambda r: {k: r[k] for k in keys}  # noqa: E731
    assert_same_program_results(results(original), results(port), class_map)
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"make_step": 1}

    # The declaration changes nothing in what the original computes...
    for k in ("losses", "final_accuracy"):
        assert original[k] == notebook[k]
    np.testing.assert_array_equal(original["pred_ys"], notebook["pred_ys"])
    leaves = lambda r: [x for x in jax.tree.leaves(r["model"]) if eqx.is_array(x)]  # noqa: E731
    for a, b in zip(leaves(notebook), leaves(port), strict=True):
        np.testing.assert_array_equal(a, b)
    # ...and the notebook's treedef has `hidden_size` as a leaf, the port's not.
    notebook_paths = [p for p, _ in _paths_and_leaves(notebook["model"])]
    port_paths = [p for p, _ in _paths_and_leaves(port["model"])]
    assert [p for p in notebook_paths if p not in port_paths] == [".hidden_size"]
    assert notebook["model"].hidden_size == port["model"].hidden_size == 4


# --- frozen_layer ---------------------------------------------------------------


def test_frozen_layer():
    """No class of the user's own (`eqx.nn.MLP` only): the port changes only
    `eqx.filter_jit` to `es.jit`, so the treedefs are compared as they are."""
    original = ex.frozen_layer_original()
    port = ex.frozen_layer_port()
    assert_is_port(port, "make_step")
    keys = (
        "original_model",
        "model",
        "opt_state",
        "first_layer_after",
        "last_layer_after",
    )
    assert_same_program_results(
        {k: original[k] for k in keys}, {k: port[k] for k in keys}
    )
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"make_step": 1}
    # what the example is about: the first layer is frozen, the last one trains
    for r in (original, port):
        for a, b in zip(r["first_layer_before"], r["first_layer_after"], strict=True):
            np.testing.assert_array_equal(a, b)
        assert any(
            not np.array_equal(a, b)
            for a, b in zip(r["last_layer_before"], r["last_layer_after"], strict=True)
        )


# --- stateful -------------------------------------------------------------------


def test_stateful():
    """BatchNorm and SpectralNorm state through `eqx.nn.make_with_state`, training
    and `eqx.nn.inference_mode` + `eqx.Partial` evaluation of the user's `Model`."""
    original = ex.stateful_original()
    port = ex.stateful_port()
    assert_is_port(port, "make_step", "evaluate")
    class_map = {port["Model"]: original["Model"]}
    keys = (
        "initial_model", "initial_state", "model", "state", "opt_state",
        "inference_model", "pred_test_ys",
    )  # fmt: skip
    assert_same_program_results(
        {k: original[k] for k in keys}, {k: port[k] for k in keys}, class_map
    )
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"make_step": 1, "evaluate": 1}


# --- init_apply -----------------------------------------------------------------


def test_init_apply():
    """The notebook has no class of its own and compiles nothing: both versions
    are the same program and must agree exactly."""
    original = ex.init_apply_original()
    port = ex.init_apply_port()
    assert_same_program_results(original, port)


def test_init_apply_with_a_user_model():
    """The notebook's "insert your model here" filled in by the user's own class
    (`Model`: an MLP and a Python-float field `scale = 0.5`), `apply_fn` compiled.

    Documented difference, with a visible consequence: the notebook splits the
    model with `eqx.partition(model, eqx.is_inexact_array)` and treats the first
    part as the parameters. In the `eqx.Module`, `scale` is a Python float: not an
    inexact array, so it goes to `static` and stays 0.5. In the `es.Module` it is a
    float32 array, so it is a parameter: the "stochastic gradient descent" step
    `p + 1` moves it to 1.5 (docs/index.md, "The one rule": "A stored float is
    trained, and you are told first"; README, "What changes when you port": keep it
    out of the optimiser, or declare it static). So `y1` agrees and `y2` is 3 times
    the original's (1.5 / 0.5)."""
    original = ex.init_apply_user_model_original()
    port = ex.init_apply_user_model_port()
    assert_is_port(port, "apply_fn")
    class_map = {port["Model"]: original["Model"]}

    assert_same_program_results(
        original["model"],
        port["model"],
        class_map,
        {".scale": python_number_vs_strong_array(jnp.float32)},
    )
    # params: the original has no `scale` in it (None), the port has it, trained.
    assert original["params"].scale is None
    assert isinstance(port["params"].scale, jax.Array) and port["params"].scale == 1.5
    np.testing.assert_array_equal(original["y1"], port["y1"])
    # not the same computation (1.5 * v against 3 * (0.5 * v)): a tolerance
    np.testing.assert_allclose(port["y2"], 3 * original["y2"], rtol=1e-6)
    # the MLP's parameters, trained alike
    assert_same_program_results(
        {"mlp": original["params"].mlp}, {"mlp": port["params"].mlp}
    )
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"apply_fn": 1}


# --- serialisation --------------------------------------------------------------


def test_serialisation(tmp_path):
    """The notebook has no class of its own and compiles nothing: the same model,
    the same file, byte for byte."""
    original = ex.serialisation_original(tmp_dir=str(tmp_path))
    port = ex.serialisation_port(tmp_dir=str(tmp_path))
    assert original["file_bytes"] == port["file_bytes"]
    keys = ("model", "newmodel")
    assert_same_program_results(
        {k: original[k] for k in keys}, {k: port[k] for k in keys}
    )


def test_serialisation_with_a_user_model(tmp_path):
    """Save and load the user's own class (an MLP, a Python-float `scale` and a
    static `use_tanh`) into a skeleton built with another key and scale, then a
    compiled forward pass.

    Documented difference: `scale` is a Python float leaf in the original and a
    float32 array leaf in the port, before and after loading (the original gets
    its float back as a Python float, `default_deserialise_filter_spec`; the port
    gets a strongly typed float32 array). So the files differ in that one entry:
    `np.save` writes the Python float as a float64 `.npy`, the port's array as
    float32 (4 bytes fewer), and everything else is byte for byte the same."""
    original = ex.serialisation_user_model_original(tmp_dir=str(tmp_path))
    port = ex.serialisation_user_model_port(tmp_dir=str(tmp_path))
    assert_is_port(port, "forward")
    class_map = {port["Model"]: original["Model"]}
    documented = {"['model'].scale": python_number_vs_strong_array(jnp.float32)}
    documented["['newmodel'].scale"] = documented["['model'].scale"]
    keys = ("model", "newmodel", "y_before", "y_after")
    assert_same_program_results(
        {k: original[k] for k in keys},
        {k: port[k] for k in keys},
        class_map,
        documented,
    )
    np.testing.assert_array_equal(port["y_before"], port["y_after"])

    a, b = original["file_bytes"], port["file_bytes"]
    assert len(a) - len(b) == 4
    float64_npy = _npy_bytes(np.asarray(0.5))
    float32_npy = _npy_bytes(np.asarray(0.5, np.float32))
    assert a.replace(float64_npy, float32_npy) == b
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"forward": 1}


def _npy_bytes(x: np.ndarray) -> bytes:
    import io

    f = io.BytesIO()
    np.save(f, x)
    return f.getvalue()


# --- parallelism ----------------------------------------------------------------


def test_parallelism():
    """Data-parallel training with `eqx.filter_shard`, a mesh and donation
    (`donate="all"`, `"all-except-first"`), on a mesh of the one local CPU device:
    the same losses and model, with the same shardings."""
    original = ex.parallelism_original()
    port = ex.parallelism_port()
    assert_is_port(port, "train_step", "evaluate")
    # donated_deleted: for each step, which of its input buffers were deleted
    # (donated): the same in both versions.
    keys = (
        "initial_leaves", "model", "opt_state", "batch_losses", "train_loss",
        "donated_deleted",
    )  # fmt: skip
    assert_same_program_results(
        {k: original[k] for k in keys}, {k: port[k] for k in keys}, sharding=True
    )
    for leaf in jax.tree.leaves(port["model"]):
        if isinstance(leaf, jax.Array):
            assert leaf.sharding.is_equivalent_to(port["model_sharding"], leaf.ndim)
    assert_traces_no_more(original["traces"], port["traces"])
    assert port["traces"] == {"train_step": 1, "evaluate": 1}


# --- bert -----------------------------------------------------------------------


def _bert_class_map(original: dict, port: dict) -> dict[type, type]:
    o, p = vars(original["classes"]), vars(port["classes"])
    assert set(o) == set(p)
    for name in o:
        assert issubclass(p[name], es.Module) and not issubclass(o[name], es.Module)
    return {p[name]: o[name] for name in o}


_BERT_KEYS = (
    "initial_model", "model", "opt_state", "losses", "logits", "accuracy",
    "single_model", "jit_logits",
)  # fmt: skip


def test_bert():
    """The notebook's training and evaluation under `eqx.filter_pmap` (no
    `filter_jit` in it: the port changes the base class only), with a 1-layer,
    hidden-16 BERT on synthesized token ids, on one device; dropout is on, with
    keys split per example, so the keys must agree too. Then the trained model
    is evaluated under `filter_jit` / `es.jit`."""
    original = ex.bert_original()
    port = ex.bert_port()
    assert_is_port(port, "jit_eval_step")
    class_map = _bert_class_map(original, port)
    assert_same_program_results(
        {k: original[k] for k in _BERT_KEYS},
        {k: port[k] for k in _BERT_KEYS},
        class_map,
    )
    assert_traces_no_more(original["traces"], port["traces"])
    # `eqx.filter_pmap` traces twice on a first call (an `eval_shape` for the
    # output structure, then the pmap), in both versions.
    assert port["traces"] == original["traces"]
    assert port["traces"] == {"make_step": 2, "make_eval_step": 2, "jit_eval_step": 1}
