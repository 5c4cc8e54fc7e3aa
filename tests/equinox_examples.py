"""Equinox's documentation examples (equinox v0.13.8, `docs/examples/*.ipynb`),
each in two versions: the original and its port to `eqx_static`.

Each example is written **once**, as a function of `api`, and run twice:

- `api=ORIGINAL`: the user's own classes subclass `eqx.Module` and the user's
  compiled functions use `eqx.filter_jit`: the notebook's program;
- `api=PORT`: the same code with `es.Module` and `es.jit`.

Writing the body once makes "the port is the notebook's code with two names
replaced" true by construction: nothing else can differ between the two. The
`<example>_original()` / `<example>_port()` functions at the bottom are the two
plain programs. Only the user's own classes are rebased; Equinox's layers
(`eqx.nn.*`) and optax's objects are used as they are in both versions.

Shrinking, the same in both versions (the notebooks' own code is otherwise kept):

- tiny sizes and a few steps; no plotting, printing, tqdm or downloads;
- deterministic randomness: the notebooks' `np.random.permutation` /
  `np.random.normal` (global NumPy state) become a `np.random.default_rng(seed)`
  generator, so both versions see the same batches;
- JAX's strict dtype promotion (the test suite's setting) rejects a few of the
  notebooks' mixed-dtype expressions (optax's adam multiplies a Python float by an
  int32 count; `jnp.arange` ints into float weights; a bool compared with a float).
  Exactly those lines run under `jax.numpy_dtype_promotion("standard")`, in both
  versions, inside and outside compiled code alike;
- `train_rnn`, `bert`: the optimiser state is initialised on
  `eqx.filter(model, eqx.is_inexact_array)` (as in the stateful and parallelism
  notebooks): optax 0.2.8 rejects the notebooks' `optim.init(model)` for a model
  with a non-array leaf, in both versions;
- `bert`: a 1-layer, hidden-16, vocabulary-50 model (the notebook's tiny BERT has
  2 layers of hidden size 128; one layer halves the XLA compile of the training
  step, which is most of this example's time) on synthesized token ids, 3 steps
  of batch 2 and length 8 (no tokenizer, dataset or checkpoint download); `jax.device_put_replicated` (removed
  from JAX) becomes a stack of the array leaves over the local devices;
- `parallelism`: on the one local CPU device (a mesh of 1 device) instead of the
  notebook's 8 forced CPU devices (`jax_num_cpu_devices` cannot be set once the
  backend is up, as it is in a test process).

Every compiled (or pmapped) function body bumps a Python counter, `traces[name]`,
so each result says how often each function was traced.

Examples that compile nothing and define no class of their own (`init_apply`,
`serialisation`) have a second, extended version (`*_user_model`) in which the
notebook's "insert your model here" is a user-defined class and the forward pass is
compiled, so that the port has something to change. `bert`'s notebook uses
`eqx.filter_pmap` only; after training, the trained model is also evaluated under
`filter_jit`.
"""

import collections
import dataclasses
import functools
import json
import math
import os
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jrandom
import jax.sharding as jshard
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class Api:
    name: str
    Module: type
    filter_jit: Callable


ORIGINAL = Api("original", eqx.Module, eqx.filter_jit)
PORT = Api("port", es.Module, es.jit)


def _standard_promotion():
    return jax.numpy_dtype_promotion("standard")


# --- train_rnn ----------------------------------------------------------------


def train_rnn(
    api: Api,
    *,
    hidden_static: bool = False,
    dataset_size=64,
    batch_size=8,
    learning_rate=3e-3,
    steps=4,
    hidden_size=4,
    depth=1,
    seed=5678,
) -> dict[str, Any]:
    """`hidden_static=False` is the notebook (`hidden_size: int`, a bare field:
    `eqx.field(static=False)` is the same declaration); `True` declares the field
    `eqx.field(static=True)`, the one-line change an `es.Module` needs for a field
    that is a shape."""
    traces = collections.Counter()
    rng = np.random.default_rng(seed)

    def dataloader(arrays, batch_size):
        dataset_size = arrays[0].shape[0]
        assert all(array.shape[0] == dataset_size for array in arrays)
        indices = np.arange(dataset_size)
        while True:
            perm = rng.permutation(indices)
            start = 0
            end = batch_size
            while end <= dataset_size:
                batch_perm = perm[start:end]
                yield tuple(array[batch_perm] for array in arrays)
                start = end
                end = start + batch_size

    def get_data(dataset_size, *, key):
        t = jnp.linspace(0, 2 * math.pi, 16)
        offset = jrandom.uniform(key, (dataset_size, 1), minval=0, maxval=2 * math.pi)
        x1 = jnp.sin(t + offset) / (1 + t)
        x2 = jnp.cos(t + offset) / (1 + t)
        y = jnp.ones((dataset_size, 1))

        half_dataset_size = dataset_size // 2
        x1 = x1.at[:half_dataset_size].multiply(-1)
        y = y.at[:half_dataset_size].set(0)
        x = jnp.stack([x1, x2], axis=-1)

        return x, y

    class RNN(api.Module):
        hidden_size: int = eqx.field(static=hidden_static)
        cell: eqx.Module
        linear: eqx.nn.Linear
        bias: jax.Array

        def __init__(self, in_size, out_size, hidden_size, *, key):
            ckey, lkey = jrandom.split(key)
            self.hidden_size = hidden_size
            self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
            self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
            self.bias = jnp.zeros(out_size)

        def __call__(self, input):
            hidden = jnp.zeros((self.hidden_size,))

            def f(carry, inp):
                return self.cell(inp, carry), None

            out, _ = lax.scan(f, hidden, input)
            # sigmoid because we're performing binary classification
            return jax.nn.sigmoid(self.linear(out) + self.bias)

    data_key, model_key = jrandom.split(jrandom.PRNGKey(seed), 2)
    with jax.numpy_rank_promotion("allow"):  # `t + offset`: (16,) + (n, 1)
        xs, ys = get_data(dataset_size, key=data_key)
    iter_data = dataloader((xs, ys), batch_size)

    model = RNN(in_size=2, out_size=1, hidden_size=hidden_size, key=model_key)
    initial_model = model

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        # Trains with respect to binary cross-entropy
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    @api.filter_jit
    def make_step(model, x, y, opt_state):
        traces["make_step"] += 1
        loss, grads = compute_loss(model, x, y)
        with _standard_promotion():  # optax's adam: a Python float times an int32
            updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state

    optim = optax.adam(learning_rate)
    # The notebook's `optim.init(model)` no longer runs with optax >= 0.2.6 (its
    # state gets an array for the Python-int leaf `hidden_size`, the gradients a
    # None): initialise on the trainable arrays, as the other notebooks do.
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    losses = []
    for step, (x, y) in zip(range(steps), iter_data):  # noqa: B007
        loss, model, opt_state = make_step(model, x, y, opt_state)
        loss = loss.item()
        losses.append(loss)

    pred_ys = jax.vmap(model)(xs)
    with _standard_promotion():  # a bool compared with a float
        num_correct = jnp.sum((pred_ys > 0.5) == ys)
    final_accuracy = (num_correct / dataset_size).item()
    return dict(
        RNN=RNN,
        initial_model=initial_model,
        losses=losses,
        model=model,
        opt_state=opt_state,
        pred_ys=pred_ys,
        final_accuracy=final_accuracy,
        traces=traces,
        make_step=make_step,
    )


# --- frozen_layer -------------------------------------------------------------


def frozen_layer(
    api: Api,
    *,
    dataset_size=64,
    batch_size=16,
    learning_rate=3e-3,
    steps=6,
    width_size=8,
    depth=1,
    seed=5678,
) -> dict[str, Any]:
    traces = collections.Counter()

    # Toy data
    def get_data(dataset_size, *, key):
        x = jrandom.normal(key, (dataset_size, 1))
        y = 5 * x - 2
        return x, y

    # Toy dataloader
    def dataloader(arrays, batch_size, *, key):
        dataset_size = arrays[0].shape[0]
        assert all(array.shape[0] == dataset_size for array in arrays)
        indices = jnp.arange(dataset_size)
        while True:
            perm = jrandom.permutation(key, indices)
            (key,) = jrandom.split(key, 1)
            start = 0
            end = batch_size
            while end < dataset_size:
                batch_perm = perm[start:end]
                yield tuple(array[batch_perm] for array in arrays)
                start = end
                end = start + batch_size

    data_key, loader_key, model_key = jrandom.split(jrandom.PRNGKey(seed), 3)
    data = get_data(dataset_size, key=data_key)
    data_iter = dataloader(data, batch_size, key=loader_key)

    # Step 1
    model = eqx.nn.MLP(
        in_size=1, out_size=1, width_size=width_size, depth=depth, key=model_key
    )

    # Step 2
    filter_spec = jtu.tree_map(lambda _: False, model)
    filter_spec = eqx.tree_at(
        lambda tree: (tree.layers[-1].weight, tree.layers[-1].bias),
        filter_spec,
        replace=(True, True),
    )

    # Step 3
    @api.filter_jit
    def make_step(model, x, y, opt_state):
        traces["make_step"] += 1

        @eqx.filter_grad
        def loss(diff_model, static_model, x, y):
            model = eqx.combine(diff_model, static_model)
            pred_y = jax.vmap(model)(x)
            return jnp.mean((y - pred_y) ** 2)

        diff_model, static_model = eqx.partition(model, filter_spec)
        grads = loss(diff_model, static_model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return model, opt_state

    original_model = model
    optim = optax.sgd(learning_rate)
    opt_state = optim.init(model)
    for step, (x, y) in zip(range(steps), data_iter):  # noqa: B007
        model, opt_state = make_step(model, x, y, opt_state)
    return dict(
        original_model=original_model,
        model=model,
        opt_state=opt_state,
        first_layer_before=jtu.tree_leaves(original_model.layers[0]),
        first_layer_after=jtu.tree_leaves(model.layers[0]),
        last_layer_before=jtu.tree_leaves(original_model.layers[-1]),
        last_layer_after=jtu.tree_leaves(model.layers[-1]),
        traces=traces,
        make_step=make_step,
    )


# --- stateful -----------------------------------------------------------------


def stateful(
    api: Api, *, dataset_size=10, learning_rate=3e-4, steps=3, seed=5678
) -> dict[str, Any]:
    traces = collections.Counter()

    # This model is just a weird mish-mash of stateful and non-stateful layers for
    # demonstration purposes, it isn't doing any clever.
    class Model(api.Module):
        norm1: eqx.nn.BatchNorm
        spectral_linear: eqx.nn.SpectralNorm[eqx.nn.Linear]
        norm2: eqx.nn.BatchNorm
        linear1: eqx.nn.Linear
        linear2: eqx.nn.Linear

        def __init__(self, key):
            key1, key2, key3, key4 = jrandom.split(key, 4)
            self.norm1 = eqx.nn.BatchNorm(input_size=3, axis_name="batch")
            self.spectral_linear = eqx.nn.SpectralNorm(
                layer=eqx.nn.Linear(in_features=3, out_features=32, key=key1),
                weight_name="weight",
                key=key2,
            )
            self.norm2 = eqx.nn.BatchNorm(input_size=32, axis_name="batch")
            self.linear1 = eqx.nn.Linear(in_features=32, out_features=32, key=key3)
            self.linear2 = eqx.nn.Linear(in_features=32, out_features=3, key=key4)

        def __call__(self, x, state):
            x, state = self.norm1(x, state)
            x, state = self.spectral_linear(x, state)
            x = jax.nn.relu(x)
            x, state = self.norm2(x, state)
            x = self.linear1(x)
            x = jax.nn.relu(x)
            x = self.linear2(x)
            return x, state

    def compute_loss(model, state, xs, ys):
        batch_model = jax.vmap(
            model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
        )
        pred_ys, state = batch_model(xs, state)
        loss = jnp.mean((pred_ys - ys) ** 2)
        return loss, state

    @api.filter_jit
    def make_step(model, state, opt_state, xs, ys):
        traces["make_step"] += 1
        grads, state = eqx.filter_grad(compute_loss, has_aux=True)(model, state, xs, ys)
        with _standard_promotion():  # optax's adam: a Python float times an int32
            updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return model, state, opt_state

    key = jrandom.PRNGKey(seed)
    mkey, xkey, xkey2 = jrandom.split(key, 3)

    with warnings.catch_warnings():
        # BatchNorm warns that its `mode` defaults to "ema" (the test suite turns
        # warnings into errors); the notebook leaves it unspecified.
        warnings.filterwarnings("ignore", message="When `eqx.nn.BatchNorm")
        model, state = eqx.nn.make_with_state(Model)(mkey)
    initial_model, initial_state = model, state

    xs = jrandom.normal(xkey, (dataset_size, 3))
    ys = jnp.sin(xs) + 1
    optim = optax.adam(learning_rate)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))

    for _ in range(steps):
        # Full-batch gradient descent in this simple example.
        model, state, opt_state = make_step(model, state, opt_state, xs, ys)

    inference_model = eqx.nn.inference_mode(model)
    inference_model = eqx.Partial(inference_model, state=state)

    @api.filter_jit
    def evaluate(model, xs):
        traces["evaluate"] += 1
        # discard state
        out, _ = jax.vmap(model)(xs)
        return out

    test_dataset_size = 5
    test_xs = jrandom.normal(xkey2, (test_dataset_size, 3))
    pred_test_ys = evaluate(inference_model, test_xs)
    return dict(
        Model=Model,
        initial_model=initial_model,
        initial_state=initial_state,
        model=model,
        state=state,
        opt_state=opt_state,
        inference_model=inference_model,
        pred_test_ys=pred_test_ys,
        traces=traces,
        make_step=make_step,
        evaluate=evaluate,
    )


# --- init_apply ---------------------------------------------------------------


def init_apply(api: Api, *, in_size=2, seed=5678) -> dict[str, Any]:
    """The notebook: no class of the user's own and nothing compiled, so the two
    versions are the same program (a check that nothing global changed)."""

    def make_mlp(in_size, out_size, width_size, depth, *, key):
        mlp = eqx.nn.MLP(
            in_size, out_size, width_size, depth, key=key
        )  # insert your model here
        params, static = eqx.partition(mlp, eqx.is_inexact_array)

        def init_fn():
            return params

        def apply_fn(_params, x):
            model = eqx.combine(_params, static)
            return model(x)

        return init_fn, apply_fn

    key = jrandom.PRNGKey(seed)
    init_fn, apply_fn = make_mlp(
        in_size=in_size, out_size=1, width_size=8, depth=1, key=key
    )
    x = jnp.arange(in_size)  # sample data
    params = init_fn()
    with _standard_promotion():  # int32 data into float32 weights
        y1 = apply_fn(params, x)
    params = jtu.tree_map(lambda p: p + 1, params)  # "stochastic gradient descent"
    with _standard_promotion():
        y2 = apply_fn(params, x)
    assert y1 != y2
    return dict(params=params, y1=y1, y2=y2)


def init_apply_user_model(api: Api, *, in_size=2, seed=5678) -> dict[str, Any]:
    """The notebook with its "insert your model here" filled in by a class of the
    user's own (a scaled MLP) and `apply_fn` compiled."""
    traces = collections.Counter()

    class Model(api.Module):
        mlp: eqx.nn.MLP
        scale: float

        def __init__(self, in_size, out_size, width_size, depth, *, key):
            self.mlp = eqx.nn.MLP(in_size, out_size, width_size, depth, key=key)
            self.scale = 0.5

        def __call__(self, x):
            return self.scale * self.mlp(x)

    def make_mlp(in_size, out_size, width_size, depth, *, key):
        mlp = Model(
            in_size, out_size, width_size, depth, key=key
        )  # insert your model here
        params, static = eqx.partition(mlp, eqx.is_inexact_array)

        def init_fn():
            return params

        @api.filter_jit
        def apply_fn(_params, x):
            traces["apply_fn"] += 1
            model = eqx.combine(_params, static)
            return model(x)

        return init_fn, apply_fn, mlp

    key = jrandom.PRNGKey(seed)
    init_fn, apply_fn, model = make_mlp(
        in_size=in_size, out_size=1, width_size=8, depth=1, key=key
    )
    x = jnp.arange(in_size)  # sample data
    params = init_fn()
    with _standard_promotion():  # int32 data into float32 weights
        y1 = apply_fn(params, x)
    params = jtu.tree_map(lambda p: p + 1, params)  # "stochastic gradient descent"
    with _standard_promotion():
        y2 = apply_fn(params, x)
    assert y1 != y2
    return dict(
        Model=Model, model=model, params=params, y1=y1, y2=y2, traces=traces,
        apply_fn=apply_fn,
    )  # fmt: skip


# --- serialisation ------------------------------------------------------------


def serialisation(api: Api, *, tmp_dir: str) -> dict[str, Any]:
    """The notebook: no class of the user's own and nothing compiled."""

    def make(*, key, size, width, depth, use_tanh=False):
        if use_tanh:
            activation = jnp.tanh
        else:
            activation = jax.nn.relu
        # (This is not meant to be a realistically useful model.)
        return eqx.nn.MLP(
            in_size=size,
            out_size=1,
            width_size=width,
            depth=depth,
            activation=activation,
            key=key,
        )

    hyperparameters = {"size": 5, "width": 10, "depth": 3, "use_tanh": True}
    model = make(key=jrandom.PRNGKey(0), **hyperparameters)

    def save(filename, hyperparams, model):
        with open(filename, "wb") as f:
            hyperparam_str = json.dumps(hyperparams)
            f.write((hyperparam_str + "\n").encode())
            eqx.tree_serialise_leaves(f, model)

    filename = os.path.join(tmp_dir, f"model_{api.name}.eqx")
    save(filename, hyperparameters, model)

    def load(filename):
        with open(filename, "rb") as f:
            hyperparams = json.loads(f.readline().decode())
            model = make(key=jrandom.PRNGKey(0), **hyperparams)
            return eqx.tree_deserialise_leaves(f, model)

    newmodel = load(filename)

    # Check that it's loaded correctly:
    assert model.layers[1].weight[2, 2] == newmodel.layers[1].weight[2, 2]
    with open(filename, "rb") as f:
        file_bytes = f.read()
    return dict(model=model, newmodel=newmodel, file_bytes=file_bytes)


def serialisation_user_model(api: Api, *, tmp_dir: str) -> dict[str, Any]:
    """The notebook with `make` building a class of the user's own (an MLP with a
    Python-float `scale` field) from a perturbed key, so that loading really
    overwrites every leaf, and a compiled forward pass before and after."""
    traces = collections.Counter()

    class Model(api.Module):
        mlp: eqx.nn.MLP
        scale: float
        use_tanh: bool = eqx.field(static=True)

        def __call__(self, x):
            return self.scale * self.mlp(x)

    def make(*, key, size, width, depth, use_tanh=False, scale=1.0):
        if use_tanh:
            activation = jnp.tanh
        else:
            activation = jax.nn.relu
        mlp = eqx.nn.MLP(
            in_size=size,
            out_size=1,
            width_size=width,
            depth=depth,
            activation=activation,
            key=key,
        )
        return Model(mlp, scale, use_tanh)

    @api.filter_jit
    def forward(model, x):
        traces["forward"] += 1
        return jax.vmap(model)(x)

    hyperparameters = {"size": 5, "width": 10, "depth": 3, "use_tanh": True}
    model = make(key=jrandom.PRNGKey(0), scale=0.5, **hyperparameters)

    def save(filename, hyperparams, model):
        with open(filename, "wb") as f:
            hyperparam_str = json.dumps(hyperparams)
            f.write((hyperparam_str + "\n").encode())
            eqx.tree_serialise_leaves(f, model)

    filename = os.path.join(tmp_dir, f"user_model_{api.name}.eqx")
    save(filename, hyperparameters, model)

    def load(filename):
        with open(filename, "rb") as f:
            hyperparams = json.loads(f.readline().decode())
            # a different key and scale: the loaded leaves must overwrite them
            model = make(key=jrandom.PRNGKey(1), scale=2.0, **hyperparams)
            return eqx.tree_deserialise_leaves(f, model)

    newmodel = load(filename)
    assert model.mlp.layers[1].weight[2, 2] == newmodel.mlp.layers[1].weight[2, 2]
    x = jrandom.normal(jrandom.PRNGKey(2), (4, 5))
    y_before = forward(model, x)
    y_after = forward(newmodel, x)
    with open(filename, "rb") as f:
        file_bytes = f.read()
    return dict(
        Model=Model, model=model, newmodel=newmodel, y_before=y_before,
        y_after=y_after, file_bytes=file_bytes, traces=traces, forward=forward,
    )  # fmt: skip


# --- parallelism --------------------------------------------------------------


def parallelism(
    api: Api,
    *,
    dataset_size=16,
    channel_size=4,
    hidden_size=8,
    depth=1,
    learning_rate=3e-4,
    num_steps=4,
    batch_size=4,
    seed=0,
) -> dict[str, Any]:
    """On the local devices (one CPU device in the test suite): a mesh of
    `len(jax.devices())` devices."""
    traces = collections.Counter()
    rng = np.random.default_rng(seed)

    # Generate some synthetic data
    xs = rng.normal(size=(dataset_size, channel_size))
    ys = np.sin(xs)

    model = eqx.nn.MLP(
        channel_size, channel_size, hidden_size, depth, key=jrandom.PRNGKey(6789)
    )
    initial_leaves = [np.asarray(x) for x in jax.tree.leaves(model)]
    optim = optax.adam(learning_rate)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))

    # Loss function for a batch of data
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return jnp.mean((y - pred_y) ** 2)

    def train_dataloader(arrays, batch_size):
        dataset_size = arrays[0].shape[0]
        assert all(array.shape[0] == dataset_size for array in arrays)
        indices = np.arange(dataset_size)
        while True:
            perm = rng.permutation(indices)
            start = 0
            end = batch_size
            while end <= dataset_size:
                batch_perm = perm[start:end]
                yield tuple(array[batch_perm] for array in arrays)
                start = end
                end = start + batch_size

    num_devices = len(jax.devices())
    mesh = jax.make_mesh(
        (num_devices,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    data_sharding = jshard.NamedSharding(mesh, jshard.PartitionSpec("batch"))
    model_sharding = jshard.NamedSharding(mesh, jshard.PartitionSpec())

    @api.filter_jit(donate="all")
    def train_step(model, opt_state, x, y):
        traces["train_step"] += 1
        model, opt_state = eqx.filter_shard((model, opt_state), model_sharding)
        x, y = eqx.filter_shard((x, y), data_sharding)
        grads = eqx.filter_grad(compute_loss)(model, x, y)
        with _standard_promotion():  # optax's adam: a Python float times an int32
            updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return eqx.filter_shard((model, opt_state), model_sharding)

    model, opt_state = eqx.filter_shard((model, opt_state), model_sharding)
    donated = []  # what each step was given, to see which buffers were donated
    for step, (x, y) in zip(  # noqa: B007
        range(1, num_steps + 1), train_dataloader((xs, ys), batch_size)
    ):
        x, y = eqx.filter_shard((x, y), data_sharding)
        donated.append((model, opt_state, x, y))
        model, opt_state = train_step(model, opt_state, x, y)
    donated_deleted = [
        [leaf.is_deleted() for leaf in jax.tree.leaves(args) if eqx.is_array(leaf)]
        for args in donated
    ]
    del donated

    def eval_dataloader(arrays, batch_size):
        dataset_size = arrays[0].shape[0]
        assert all(array.shape[0] == dataset_size for array in arrays)
        start = 0
        end = batch_size
        while start < dataset_size:
            yield tuple(array[start:end] for array in arrays)
            start = end
            end = start + batch_size

    @api.filter_jit(donate="all-except-first")
    def evaluate(model, x, y):
        traces["evaluate"] += 1
        model = eqx.filter_shard(model, model_sharding)
        x, y = eqx.filter_shard((x, y), data_sharding)
        return compute_loss(model, x, y)

    loss = 0
    num_batches = 0
    batch_losses = []
    for x, y in eval_dataloader((xs, ys), batch_size):
        batch_loss = evaluate(model, x, y).item()
        batch_losses.append(batch_loss)
        loss = loss + batch_loss
        num_batches = num_batches + 1
    return dict(
        initial_leaves=initial_leaves,
        model=model,
        opt_state=opt_state,
        batch_losses=batch_losses,
        train_loss=loss / num_batches,
        donated_deleted=donated_deleted,
        model_sharding=model_sharding,
        traces=traces,
        train_step=train_step,
        evaluate=evaluate,
    )


# --- bert ---------------------------------------------------------------------


def bert_classes(api: Api) -> types.SimpleNamespace:
    """The notebook's classes, verbatim but for the base class."""

    class EmbedderBlock(api.Module):
        """BERT embedder."""

        token_embedder: eqx.nn.Embedding
        segment_embedder: eqx.nn.Embedding
        position_embedder: eqx.nn.Embedding
        layernorm: eqx.nn.LayerNorm
        dropout: eqx.nn.Dropout

        def __init__(
            self,
            vocab_size: int,
            max_length: int,
            type_vocab_size: int,
            embedding_size: int,
            hidden_size: int,
            dropout_rate: float,
            key: jax.random.PRNGKey,
        ):
            token_key, segment_key, position_key = jax.random.split(key, 3)

            self.token_embedder = eqx.nn.Embedding(
                num_embeddings=vocab_size, embedding_size=embedding_size, key=token_key
            )
            self.segment_embedder = eqx.nn.Embedding(
                num_embeddings=type_vocab_size,
                embedding_size=embedding_size,
                key=segment_key,
            )
            self.position_embedder = eqx.nn.Embedding(
                num_embeddings=max_length,
                embedding_size=embedding_size,
                key=position_key,
            )
            self.layernorm = eqx.nn.LayerNorm(shape=hidden_size)
            self.dropout = eqx.nn.Dropout(dropout_rate)

        def __call__(
            self,
            token_ids: Int[Array, " seq_len"],
            position_ids: Int[Array, " seq_len"],
            segment_ids: Int[Array, " seq_len"],
            enable_dropout: bool = False,
            key: "jax.random.PRNGKey | None" = None,
        ) -> Float[Array, "seq_len hidden_size"]:
            tokens = jax.vmap(self.token_embedder)(token_ids)
            segments = jax.vmap(self.segment_embedder)(segment_ids)
            positions = jax.vmap(self.position_embedder)(position_ids)
            embedded_inputs = tokens + segments + positions
            embedded_inputs = jax.vmap(self.layernorm)(embedded_inputs)
            embedded_inputs = self.dropout(
                embedded_inputs, inference=not enable_dropout, key=key
            )
            return embedded_inputs

    class FeedForwardBlock(api.Module):
        """A single transformer feed forward block."""

        mlp: eqx.nn.Linear
        output: eqx.nn.Linear
        layernorm: eqx.nn.LayerNorm
        dropout: eqx.nn.Dropout

        def __init__(
            self,
            hidden_size: int,
            intermediate_size: int,
            dropout_rate: float,
            key: jax.random.PRNGKey,
        ):
            mlp_key, output_key = jax.random.split(key)
            self.mlp = eqx.nn.Linear(
                in_features=hidden_size, out_features=intermediate_size, key=mlp_key
            )
            self.output = eqx.nn.Linear(
                in_features=intermediate_size, out_features=hidden_size, key=output_key
            )

            self.layernorm = eqx.nn.LayerNorm(shape=hidden_size)
            self.dropout = eqx.nn.Dropout(dropout_rate)

        def __call__(
            self,
            inputs: Float[Array, " hidden_size"],
            enable_dropout: bool = True,
            key: "jax.random.PRNGKey | None" = None,
        ) -> Float[Array, " hidden_size"]:
            # Feed-forward.
            hidden = self.mlp(inputs)
            hidden = jax.nn.gelu(hidden)

            # Project back to input size.
            output = self.output(hidden)
            output = self.dropout(output, inference=not enable_dropout, key=key)

            # Residual and layer norm.
            output += inputs
            output = self.layernorm(output)

            return output

    class AttentionBlock(api.Module):
        """A single transformer attention block."""

        attention: eqx.nn.MultiheadAttention
        layernorm: eqx.nn.LayerNorm
        dropout: eqx.nn.Dropout
        num_heads: int = eqx.field(static=True)

        def __init__(
            self,
            hidden_size: int,
            num_heads: int,
            dropout_rate: float,
            attention_dropout_rate: float,
            key: jax.random.PRNGKey,
        ):
            self.num_heads = num_heads
            self.attention = eqx.nn.MultiheadAttention(
                num_heads=num_heads,
                query_size=hidden_size,
                use_query_bias=True,
                use_key_bias=True,
                use_value_bias=True,
                use_output_bias=True,
                dropout_p=attention_dropout_rate,
                key=key,
            )
            self.layernorm = eqx.nn.LayerNorm(shape=hidden_size)
            self.dropout = eqx.nn.Dropout(dropout_rate)

        def __call__(
            self,
            inputs: Float[Array, "seq_len hidden_size"],
            mask: Int[Array, " seq_len"] | None,
            enable_dropout: bool = False,
            key: "jax.random.PRNGKey" = None,
        ) -> Float[Array, "seq_len hidden_size"]:
            if mask is not None:
                mask = self.make_self_attention_mask(mask)
            attention_key, dropout_key = (
                (None, None) if key is None else jax.random.split(key)
            )

            attention_output = self.attention(
                query=inputs,
                key_=inputs,
                value=inputs,
                mask=mask,
                inference=not enable_dropout,
                key=attention_key,
            )

            result = attention_output
            result = self.dropout(result, inference=not enable_dropout, key=dropout_key)
            result = result + inputs
            result = jax.vmap(self.layernorm)(result)
            return result

        def make_self_attention_mask(
            self, mask: Int[Array, " seq_len"]
        ) -> Float[Array, "num_heads seq_len seq_len"]:
            """Create self-attention mask from sequence-level mask."""
            mask = jnp.multiply(
                jnp.expand_dims(mask, axis=-1), jnp.expand_dims(mask, axis=-2)
            )
            mask = jnp.expand_dims(mask, axis=-3)
            mask = jnp.repeat(mask, repeats=self.num_heads, axis=-3)
            return mask.astype(jnp.float32)

    class TransformerLayer(api.Module):
        """A single transformer layer."""

        attention_block: AttentionBlock
        ff_block: FeedForwardBlock

        def __init__(
            self,
            hidden_size: int,
            intermediate_size: int,
            num_heads: int,
            dropout_rate: float,
            attention_dropout_rate: float,
            key: jax.random.PRNGKey,
        ):
            attention_key, ff_key = jax.random.split(key)

            self.attention_block = AttentionBlock(
                hidden_size=hidden_size,
                num_heads=num_heads,
                dropout_rate=dropout_rate,
                attention_dropout_rate=attention_dropout_rate,
                key=attention_key,
            )
            self.ff_block = FeedForwardBlock(
                hidden_size=hidden_size,
                intermediate_size=intermediate_size,
                dropout_rate=dropout_rate,
                key=ff_key,
            )

        def __call__(
            self,
            inputs: Float[Array, "seq_len hidden_size"],
            mask: Int[Array, " seq_len"] | None = None,
            *,
            enable_dropout: bool = False,
            key: "jax.random.PRNGKey | None" = None,
        ) -> Float[Array, "seq_len hidden_size"]:
            attn_key, ff_key = (None, None) if key is None else jax.random.split(key)
            attention_output = self.attention_block(
                inputs, mask, enable_dropout=enable_dropout, key=attn_key
            )
            seq_len = inputs.shape[0]
            ff_keys = None if ff_key is None else jax.random.split(ff_key, num=seq_len)
            output = jax.vmap(self.ff_block, in_axes=(0, None, 0))(
                attention_output, enable_dropout, ff_keys
            )
            return output

    class Encoder(api.Module):
        """Full BERT encoder."""

        embedder_block: EmbedderBlock
        layers: list[TransformerLayer]
        pooler: eqx.nn.Linear

        def __init__(
            self,
            vocab_size: int,
            max_length: int,
            type_vocab_size: int,
            embedding_size: int,
            hidden_size: int,
            intermediate_size: int,
            num_layers: int,
            num_heads: int,
            dropout_rate: float,
            attention_dropout_rate: float,
            key: jax.random.PRNGKey,
        ):
            embedder_key, layer_key, pooler_key = jax.random.split(key, num=3)
            self.embedder_block = EmbedderBlock(
                vocab_size=vocab_size,
                max_length=max_length,
                type_vocab_size=type_vocab_size,
                embedding_size=embedding_size,
                hidden_size=hidden_size,
                dropout_rate=dropout_rate,
                key=embedder_key,
            )

            layer_keys = jax.random.split(layer_key, num=num_layers)
            self.layers = []
            for layer_key in layer_keys:
                self.layers.append(
                    TransformerLayer(
                        hidden_size=hidden_size,
                        intermediate_size=intermediate_size,
                        num_heads=num_heads,
                        dropout_rate=dropout_rate,
                        attention_dropout_rate=attention_dropout_rate,
                        key=layer_key,
                    )
                )

            self.pooler = eqx.nn.Linear(
                in_features=hidden_size, out_features=hidden_size, key=pooler_key
            )

        def __call__(
            self,
            token_ids: Int[Array, " seq_len"],
            position_ids: Int[Array, " seq_len"],
            segment_ids: Int[Array, " seq_len"],
            *,
            enable_dropout: bool = False,
            key: "jax.random.PRNGKey | None" = None,
        ) -> dict[str, Array]:
            emb_key, l_key = (None, None) if key is None else jax.random.split(key)

            embeddings = self.embedder_block(
                token_ids=token_ids,
                position_ids=position_ids,
                segment_ids=segment_ids,
                enable_dropout=enable_dropout,
                key=emb_key,
            )

            # We assume that all 0-values should be masked out.
            mask = jnp.asarray(token_ids != 0, dtype=jnp.int32)

            x = embeddings
            layer_outputs = []
            for layer in self.layers:
                cl_key, l_key = (
                    (None, None) if l_key is None else jax.random.split(l_key)
                )
                x = layer(x, mask, enable_dropout=enable_dropout, key=cl_key)
                layer_outputs.append(x)

            # BERT pooling.
            # The first token in the last layer is the embedding of the "[CLS]" token.
            first_token_last_layer = x[..., 0, :]
            pooled = self.pooler(first_token_last_layer)
            pooled = jnp.tanh(pooled)

            return {"embeddings": embeddings, "layers": layer_outputs, "pooled": pooled}

    class BertClassifier(api.Module):
        """BERT classifier."""

        encoder: Encoder
        classifier_head: eqx.nn.Linear
        dropout: eqx.nn.Dropout

        def __init__(self, config: Mapping, num_classes: int, key: jax.random.PRNGKey):
            encoder_key, head_key = jax.random.split(key)

            self.encoder = Encoder(
                vocab_size=config["vocab_size"],
                max_length=config["max_position_embeddings"],
                type_vocab_size=config["type_vocab_size"],
                embedding_size=config["hidden_size"],
                hidden_size=config["hidden_size"],
                intermediate_size=config["intermediate_size"],
                num_layers=config["num_hidden_layers"],
                num_heads=config["num_attention_heads"],
                dropout_rate=config["hidden_dropout_prob"],
                attention_dropout_rate=config["attention_probs_dropout_prob"],
                key=encoder_key,
            )
            self.classifier_head = eqx.nn.Linear(
                in_features=config["hidden_size"],
                out_features=num_classes,
                key=head_key,
            )
            self.dropout = eqx.nn.Dropout(config["hidden_dropout_prob"])

        def __call__(
            self,
            inputs: dict[str, Int[Array, " seq_len"]],
            enable_dropout: bool = True,
            key: jax.random.PRNGKey = None,
        ) -> Float[Array, " num_classes"]:
            seq_len = inputs["token_ids"].shape[-1]
            position_ids = jnp.arange(seq_len)

            e_key, d_key = (None, None) if key is None else jax.random.split(key)

            pooled_output = self.encoder(
                token_ids=inputs["token_ids"],
                segment_ids=inputs["segment_ids"],
                position_ids=position_ids,
                enable_dropout=enable_dropout,
                key=e_key,
            )["pooled"]
            pooled_output = self.dropout(
                pooled_output, inference=not enable_dropout, key=d_key
            )

            return self.classifier_head(pooled_output)

    return types.SimpleNamespace(
        EmbedderBlock=EmbedderBlock,
        FeedForwardBlock=FeedForwardBlock,
        AttentionBlock=AttentionBlock,
        TransformerLayer=TransformerLayer,
        Encoder=Encoder,
        BertClassifier=BertClassifier,
    )


# Tiny-BERT config, shrunk further.
BERT_CONFIG = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "hidden_act": "gelu",
    "intermediate_size": 32,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 8,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}


def _bert_batches(*, n_batches, batch_size, seq_len, vocab_size, seed):
    """Synthetic stand-ins for the tokenized SST-2 batches: token 1 plays "[CLS]",
    0 is padding (masked out by the encoder), two segments, binary labels. Made in
    NumPy (like the notebook's dataset, which comes from the host), so that no
    eager JAX operation has to be compiled for them."""
    rng = np.random.default_rng(seed)
    positions = np.arange(seq_len)[None, :]
    batches = []
    for _ in range(n_batches):
        token_ids = rng.integers(2, vocab_size, (batch_size, seq_len), dtype=np.int32)
        lengths = rng.integers(seq_len // 2, seq_len + 1, (batch_size, 1))
        token_ids = np.where(positions < lengths, token_ids, 0)
        token_ids[:, 0] = 1
        token_type_ids = np.where(positions < lengths // 2, 0, 1).astype(np.int32)
        token_type_ids = np.where(token_ids == 0, 0, token_type_ids)
        label = rng.integers(0, 2, (batch_size,), dtype=np.int32)
        batches.append(
            {
                "input_ids": jnp.asarray(token_ids),
                "token_type_ids": jnp.asarray(token_type_ids),
                "label": jnp.asarray(label),
            }
        )
    return batches


def _replicate(tree, devices, axis_name):
    """`jax.device_put_replicated` (removed from JAX 0.10), in-lined as chex and
    flax do: each array leaf stacked once per device (on the host), sharded over
    the devices. The mesh axis is named as the `pmap`'s axis: `jax.pmap`'s outputs
    are sharded over a mesh with that axis name, and an input sharded over a
    differently named mesh would make the second step compile again (in both
    versions alike)."""
    mesh = jax.sharding.Mesh(np.array(devices), (axis_name,))
    sharding = jshard.NamedSharding(mesh, jshard.PartitionSpec(axis_name))
    return jax.tree.map(
        lambda x: (
            jax.device_put(np.stack([np.asarray(x)] * len(devices)), sharding)
            if eqx.is_array(x)
            else x
        ),
        tree,
    )


def _unreplicate(tree):
    """One device's copy of each array leaf (the first), through the host."""
    return jax.tree.map(
        lambda x: jax.device_put(np.asarray(x)[0]) if eqx.is_array(x) else x, tree
    )


def bert(
    api: Api,
    *,
    steps=3,
    batch_size=2,
    seq_len=8,
    learning_rate=1e-3,
    seed=5678,
) -> dict[str, Any]:
    """The notebook's `eqx.filter_pmap` training and evaluation on the local
    devices (one CPU device in the test suite); then the trained model (one
    device's copy) is evaluated under `api.filter_jit` too: the notebook has no
    `filter_jit`, and this gives the port's `es.jit` the BERT to compile. (A whole
    training step under `filter_jit` would be one more XLA compile of the training
    step per version, the slowest part of this test, for what `train_rnn`,
    `stateful` and `parallelism` already check: training steps under `es.jit`.)"""
    traces = collections.Counter()
    classes = bert_classes(api)
    bert_config = BERT_CONFIG

    key = jax.random.PRNGKey(seed)
    model_key, train_key = jax.random.split(key)
    classifier = classes.BertClassifier(
        config=bert_config, num_classes=2, key=model_key
    )
    initial_model = classifier
    # (The notebook loads a pretrained checkpoint here: skipped, no download.)

    train_batches = _bert_batches(
        n_batches=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        vocab_size=bert_config["vocab_size"],
        seed=seed + 1,
    )
    validation_batches = _bert_batches(
        n_batches=1,
        batch_size=batch_size,
        seq_len=seq_len,
        vocab_size=bert_config["vocab_size"],
        seed=seed + 2,
    )

    @eqx.filter_value_and_grad
    def compute_loss(classifier, inputs, key):
        batch_size = inputs["token_ids"].shape[0]
        batched_keys = jax.random.split(key, num=batch_size)
        logits = jax.vmap(classifier, in_axes=(0, None, 0))(inputs, True, batched_keys)
        return jnp.mean(
            optax.softmax_cross_entropy_with_integer_labels(
                logits=logits, labels=inputs["label"]
            )
        )

    def make_step(model, inputs, opt_state, key, tx):
        traces["make_step"] += 1
        key, new_key = jax.random.split(key)
        loss, grads = compute_loss(model, inputs, key)
        grads = jax.lax.pmean(grads, axis_name="devices")

        with _standard_promotion():  # optax's adam: a Python float times an int32
            updates, opt_state = tx.update(grads, opt_state, model)
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state, new_key

    def make_eval_step(model, inputs):
        traces["make_eval_step"] += 1
        return jax.vmap(functools.partial(model, enable_dropout=False))(inputs)

    tx = optax.adam(learning_rate=learning_rate)
    tx = optax.chain(optax.clip_by_global_norm(1.0), tx)
    # The notebook's `tx.init(classifier_chkpt)`: on the trainable arrays, as for
    # `train_rnn` (the Python floats of `eqx.nn.Dropout` break optax's update).
    opt_state = tx.init(eqx.filter(classifier, eqx.is_inexact_array))

    num_devices = jax.device_count()
    assert batch_size % num_devices == 0, (
        "The batch size must be a multiple of the number of devices."
    )
    p_make_eval_step = eqx.filter_pmap(make_eval_step)
    p_make_step = eqx.filter_pmap(
        functools.partial(make_step, tx=tx), axis_name="devices"
    )

    # Replicate across devices.
    devices = jax.local_devices()
    opt_state = _replicate(opt_state, devices, "devices")
    model = _replicate(classifier, devices, "devices")
    train_key = _replicate(train_key, devices, "devices")

    def split(x):  # einops.rearrange(x, "(b1 b2) ... -> b1 b2 ...", b1=num_devices)
        return x.reshape(num_devices, -1, *x.shape[1:])

    losses = []
    for batch in train_batches:
        token_ids, token_type_ids = batch["input_ids"], batch["token_type_ids"]
        label = batch["label"]
        inputs = {
            "token_ids": split(token_ids),
            "segment_ids": split(token_type_ids),
            "label": split(label),
        }
        loss, model, opt_state, train_key = p_make_step(
            model, inputs, opt_state, train_key
        )
        losses.append(np.sum(loss).item())

    outputs = []
    logits = []
    for batch in validation_batches:
        token_ids, token_type_ids = batch["input_ids"], batch["token_type_ids"]
        label = batch["label"]
        inputs = {"token_ids": split(token_ids), "segment_ids": split(token_type_ids)}
        output = p_make_eval_step(model, inputs)
        logits.append(output)
        output = map(float, np.argmax(output.reshape(-1, 2), axis=-1) == label)
        outputs.extend(output)
    accuracy = 100 * np.sum(outputs) / len(outputs)

    # The trained model, one device's copy, evaluated under `api.filter_jit`.
    single_model = _unreplicate(model)

    @api.filter_jit
    def jit_eval_step(model, inputs):
        traces["jit_eval_step"] += 1
        return jax.vmap(functools.partial(model, enable_dropout=False))(inputs)

    jit_logits = []
    for batch in validation_batches:
        inputs = {
            "token_ids": batch["input_ids"],
            "segment_ids": batch["token_type_ids"],
        }
        jit_logits.append(jit_eval_step(single_model, inputs))
    return dict(
        single_model=single_model,
        jit_logits=jit_logits,
        jit_eval_step=jit_eval_step,
        classes=classes,
        initial_model=initial_model,
        model=model,
        opt_state=opt_state,
        losses=losses,
        logits=logits,
        accuracy=accuracy,
        traces=traces,
        make_step=p_make_step,
        make_eval_step=p_make_eval_step,
    )


# --- the two versions of each program, as plain functions ----------------------

train_rnn_original = functools.partial(train_rnn, ORIGINAL)
train_rnn_port = functools.partial(train_rnn, PORT)
frozen_layer_original = functools.partial(frozen_layer, ORIGINAL)
frozen_layer_port = functools.partial(frozen_layer, PORT)
stateful_original = functools.partial(stateful, ORIGINAL)
stateful_port = functools.partial(stateful, PORT)
init_apply_original = functools.partial(init_apply, ORIGINAL)
init_apply_port = functools.partial(init_apply, PORT)
init_apply_user_model_original = functools.partial(init_apply_user_model, ORIGINAL)
init_apply_user_model_port = functools.partial(init_apply_user_model, PORT)
serialisation_original = functools.partial(serialisation, ORIGINAL)
serialisation_port = functools.partial(serialisation, PORT)
serialisation_user_model_original = functools.partial(
    serialisation_user_model, ORIGINAL
)
serialisation_user_model_port = functools.partial(serialisation_user_model, PORT)
parallelism_original = functools.partial(parallelism, ORIGINAL)
parallelism_port = functools.partial(parallelism, PORT)
bert_original = functools.partial(bert, ORIGINAL)
bert_port = functools.partial(bert, PORT)
