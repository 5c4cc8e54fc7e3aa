"""Realistic Equinox programs for the differential suite (`test_differential.py`).

Each `Program` builds, on every call of `make()`, a *fresh* function `f` (so no
wrapper's cache is shared with another run) with a trace counter in its body, and a
list of calls `(args, kwargs)` that vary the input the way a user does: the same
call again, new values of dynamic data, a new static value, a new shape.

Classes come in two versions where it matters: a plain `eqx.Module` and an
`es.Module` (made by one class factory over the base class).
"""

import dataclasses
import types
from collections.abc import Callable

import diffrax
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax


BASES = {"eqx": eqx.Module, "es": es.Module}


@dataclasses.dataclass(frozen=True)
class Program:
    """`make()` returns a namespace with `f`, `traces` (a one-item list) and `calls`."""

    name: str
    make: Callable[[], types.SimpleNamespace]
    # es.jit may trace fewer times than eqx.filter_jit (default arguments are bound).
    fewer_ok: bool = False
    slow: bool = False  # the heaviest; the fast suite keeps one of each kind


def _ns(f: Callable, traces: list[int], calls: list[tuple[tuple, dict]]):
    return types.SimpleNamespace(f=f, traces=traces, calls=calls)


def _keys(n: int, seed: int = 0) -> jax.Array:
    return jr.split(jr.PRNGKey(seed), n)


def _normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jr.normal(jr.PRNGKey(seed), shape)


# --- 1, 2. MLP training steps with optax ------------------------------------


def regressor_cls(base: type) -> type:
    class Regressor(base):
        mlp: eqx.nn.MLP
        scale: float = 1.0  # a hyperparameter in a dynamic field

        def __call__(self, x):
            return self.scale * self.mlp(x)

    return Regressor


REGRESSOR = {k: regressor_cls(b) for k, b in BASES.items()}


def train_program(optim: optax.GradientTransformation, model_kind: str) -> Callable:
    def make():
        traces = [0]

        def step(model, opt_state, x, y, clip):
            traces[0] += 1

            def loss(m):
                return jnp.mean((jax.vmap(m)(x) - y) ** 2)

            value, grads = eqx.filter_value_and_grad(loss)(model)
            if clip:  # a Python bool argument: static under eqx.filter_jit
                grads = jax.tree.map(lambda g: jnp.clip(g, -0.1, 0.1), grads)
            params = eqx.filter(model, eqx.is_array)
            # optax's bias correction mixes a Python float with an int32 count.
            with jax.numpy_dtype_promotion("standard"):
                updates, opt_state = optim.update(grads, opt_state, params)
            return eqx.apply_updates(model, updates), opt_state, value

        def model(seed):
            mlp = eqx.nn.MLP(3, 2, 8, 2, key=jr.PRNGKey(seed))
            return mlp if model_kind == "mlp" else REGRESSOR[model_kind](mlp, 0.5)

        def args(seed, batch, clip):
            m = model(seed)
            s = optim.init(eqx.filter(m, eqx.is_array))
            return (
                m,
                s,
                _normal(seed + 10, (batch, 3)),
                _normal(seed + 20, (batch, 2)),
                clip,
            )

        calls = [
            (args(0, 4, False), {}),
            (args(0, 4, False), {}),  # same again: hit
            (args(1, 4, False), {}),  # new weights and data: hit
            (args(1, 4, True), {}),  # new static flag: trace
            (args(2, 6, False), {}),  # new batch size: trace
        ]
        return _ns(step, traces, calls)

    return make


# --- 3. an ensemble stacked by eqx.filter_vmap over a constructor ------------


def member_cls(base: type) -> type:
    class Member(base):
        w: jax.Array
        scale: float

        def __call__(self, x):
            return self.scale * jnp.tanh(self.w @ x)

    return Member


MEMBER = {k: member_cls(b) for k, b in BASES.items()}


def ensemble_program(kind: str) -> Callable:
    cls = MEMBER[kind]

    def build(n, scale, seed=0):
        return eqx.filter_vmap(lambda k: cls(jr.normal(k, (3, 3)), scale))(
            _keys(n, seed)
        )

    def make():
        traces = [0]

        def f(ensemble, x):
            traces[0] += 1
            return eqx.filter_vmap(lambda m: m(x))(ensemble)

        calls = [
            ((build(4, 0.5), _normal(1, (3,))), {}),
            ((build(4, 0.5), _normal(1, (3,))), {}),
            ((build(4, 0.5, seed=3), _normal(2, (3,))), {}),  # new values
            ((build(4, 0.25), _normal(2, (3,))), {}),  # new scale (static iff eqx)
            ((build(6, 0.5), _normal(2, (3,))), {}),  # new ensemble size
        ]
        return _ns(f, traces, calls)

    return make


# --- 4. lax.scan over stacked layers -----------------------------------------


def layer_cls(base: type) -> type:
    class Layer(base):
        linear: eqx.nn.Linear
        residual_scale: float

        def __call__(self, x):
            return x + self.residual_scale * jnp.tanh(self.linear(x))

    return Layer


LAYER = {k: layer_cls(b) for k, b in BASES.items()}


def scan_program(kind: str) -> Callable:
    cls = LAYER[kind]

    def build(depth, scale, seed=0):
        make_layer = lambda k: cls(eqx.nn.Linear(4, 4, key=k), scale)  # noqa: E731
        return eqx.filter_vmap(make_layer)(_keys(depth, seed))

    def make():
        traces = [0]

        def f(layers, x):
            traces[0] += 1
            dynamic, static = eqx.partition(layers, eqx.is_array)

            def body(h, d):
                return eqx.combine(d, static)(h), None

            h, _ = jax.lax.scan(body, x, dynamic)
            return h

        calls = [
            ((build(3, 0.5), _normal(1, (4,))), {}),
            ((build(3, 0.5), _normal(1, (4,))), {}),
            ((build(3, 0.5, seed=5), _normal(2, (4,))), {}),
            ((build(3, 0.25), _normal(2, (4,))), {}),  # static iff eqx
            ((build(5, 0.5), _normal(2, (4,))), {}),  # deeper stack
        ]
        return _ns(f, traces, calls)

    return make


# --- 5. diffrax-style options with Python bools ------------------------------


def options_cls(base: type) -> type:
    # diffrax's own `SaveAt` leaves its bools undeclared (plain eqx.Module: static
    # under filter_jit as non-array leaves); an es.Module must declare them.
    static = base is es.Module

    class SaveOpts(base):
        t0: bool = eqx.field(default=False, static=static)
        t1: bool = eqx.field(default=False, static=static)
        steps: bool = eqx.field(default=False, static=static)

    return SaveOpts


SAVE_OPTS = {k: options_cls(b) for k, b in BASES.items()}


def options_program(kind: str) -> Callable:
    cls = SAVE_OPTS[kind]

    def make():
        traces = [0]

        def solve(y0, rate, saveat):
            traces[0] += 1
            out, y, ys = {}, y0, []
            if saveat.t0:
                out["t0"] = y0
            for _ in range(4):  # explicit Euler, dt = 0.25
                y = y - 0.25 * rate * y
                ys.append(y)
            if saveat.steps:
                out["steps"] = jnp.stack(ys)
            if saveat.t1:
                out["t1"] = y
            return out

        y0 = _normal(1, (2,))
        calls = [
            ((y0, jnp.array(1.0), cls(t1=True)), {}),
            ((y0, jnp.array(1.0), cls(t1=True)), {}),
            ((_normal(2, (2,)), jnp.array(0.5), cls(t1=True)), {}),
            ((y0, jnp.array(1.0), cls(t0=True, steps=True)), {}),
            ((_normal(2, (5,)), jnp.array(1.0), cls(t1=True)), {}),
        ]
        return _ns(solve, traces, calls)

    return make


def diffrax_program() -> Callable:
    def make():
        traces = [0]

        def solve(y0, rate, saveat):
            traces[0] += 1
            term = diffrax.ODETerm(lambda t, y, args: -args * y)
            sol = diffrax.diffeqsolve(
                term, diffrax.Euler(), 0.0, 1.0, 0.25, y0, args=rate, saveat=saveat
            )
            return sol.ys

        y0 = _normal(1, (2,))
        calls = [
            ((y0, jnp.array(1.0), diffrax.SaveAt(t1=True)), {}),
            ((_normal(2, (2,)), jnp.array(0.5), diffrax.SaveAt(t1=True)), {}),
            ((y0, jnp.array(1.0), diffrax.SaveAt(t0=True, t1=True)), {}),
        ]
        return _ns(solve, traces, calls)

    return make


# --- 6. BatchNorm with eqx.nn.State -------------------------------------------


def bn_net_cls(base: type) -> type:
    class BNNet(base):
        linear: eqx.nn.Linear
        bn: eqx.nn.BatchNorm

        def __init__(self, key):
            self.linear = eqx.nn.Linear(3, 4, key=key)
            self.bn = eqx.nn.BatchNorm(4, axis_name="batch", mode="batch")

        def __call__(self, x, state):
            h, state = self.bn(self.linear(x), state)
            return jax.nn.relu(h), state

    return BNNet


BN_NET = {k: bn_net_cls(b) for k, b in BASES.items()}


def batchnorm_program(kind: str) -> Callable:
    def make():
        traces = [0]

        def f(model, state, x):
            traces[0] += 1
            vmapped = jax.vmap(
                model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
            )
            return vmapped(x, state)

        def args(seed, batch, inference=False):
            model, state = eqx.nn.make_with_state(BN_NET[kind])(jr.PRNGKey(seed))
            if inference:
                model = eqx.nn.inference_mode(model)
            return (model, state, _normal(seed + 10, (batch, 3)))

        calls = [
            (args(0, 5), {}),
            (args(0, 5), {}),
            (args(1, 5), {}),
            (args(0, 5, inference=True), {}),
            (args(0, 7), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 7. Dropout, inference_mode, and a user subclass of Dropout --------------


class MyDropout(eqx.nn.Dropout):
    """A user's subclass of an Equinox layer: not Equinox's own class any more."""

    def __call__(self, x, *, key=None, inference=None):
        return 2.0 * super().__call__(x, key=key, inference=inference)


def drop_net_cls(base: type) -> type:
    class DropNet(base):
        linear: eqx.nn.Linear
        drop: eqx.nn.Dropout

        def __call__(self, x, key):
            return self.drop(self.linear(x), key=key)

    return DropNet


DROP_NET = {k: drop_net_cls(b) for k, b in BASES.items()}


def dropout_program(kind: str, dropout_cls: type) -> Callable:
    def make():
        traces = [0]

        def f(model, x, key):
            traces[0] += 1
            return model(x, key)

        def model(seed, p=0.5, inference=False):
            m = DROP_NET[kind](
                eqx.nn.Linear(3, 8, key=jr.PRNGKey(seed)), dropout_cls(p)
            )
            return eqx.nn.inference_mode(m) if inference else m

        x = _normal(1, (3,))
        calls = [
            ((model(0), x, jr.PRNGKey(7)), {}),
            ((model(0), x, jr.PRNGKey(7)), {}),
            ((model(1), _normal(2, (3,)), jr.PRNGKey(8)), {}),
            ((model(0, inference=True), x, jr.PRNGKey(7)), {}),
            ((model(0, p=0.25), x, jr.PRNGKey(7)), {}),  # p: static under filter_jit
        ]
        return _ns(f, traces, calls)

    return make


# --- 8. a custom __init__ that leaves a defaulted field unset ----------------


def scaled_cls(base: type) -> type:
    class Scaled(base):
        w: jax.Array
        scale: float = 1.0

        def __init__(self, w):
            self.w = w

    return Scaled


SCALED = {k: scaled_cls(b) for k, b in BASES.items()}


def custom_init_program(kind: str) -> Callable:
    cls = SCALED[kind]

    def make():
        traces = [0]

        def f(m, x):
            traces[0] += 1
            return m.scale * (m.w @ x), m.scale

        calls = [
            ((cls(_normal(0, (2, 3))), _normal(1, (3,))), {}),
            ((cls(_normal(0, (2, 3))), _normal(1, (3,))), {}),
            ((cls(_normal(2, (2, 3))), _normal(3, (3,))), {}),
            (
                (
                    es.with_dynamic(cls(_normal(0, (2, 3))), scale=2.0),
                    _normal(1, (3,)),
                ),
                {},
            ),
            ((cls(_normal(0, (4, 5))), _normal(1, (5,))), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 9. a bound method held in a field ----------------------------------------


class EsWeights(es.Module):
    w: jax.Array

    @es.jit
    def f(self, x):
        return jnp.sum(jnp.tanh(self.w * x))


class FilterJitWeights(eqx.Module):
    w: jax.Array

    @eqx.filter_jit
    def f(self, x):
        return jnp.sum(jnp.tanh(self.w * x))


class PlainWeights(eqx.Module):
    w: jax.Array

    def f(self, x):
        return jnp.sum(jnp.tanh(self.w * x))


# How the method `f` is compiled: es.jit, eqx.filter_jit, or not at all.
WEIGHTS = {
    "es_method": EsWeights,
    "filter_jit_method": FilterJitWeights,
    "plain_method": PlainWeights,
}


class Holder(eqx.Module):
    fn: Callable


def holder_loss(holder, x):
    return holder.fn(x)


def bound_method_program(method: str) -> Callable:
    def make():
        traces = [0]

        def f(holder, x):
            traces[0] += 1
            return eqx.filter_grad(holder_loss)(holder, x)

        def holder(seed):
            return Holder(fn=WEIGHTS[method](_normal(seed, (3,))).f)

        calls = [
            ((holder(0), _normal(1, (3,))), {}),
            ((holder(0), _normal(1, (3,))), {}),
            ((holder(2), _normal(3, (3,))), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 10. a method returning a NumPy array -------------------------------------


def table_cls(base: type) -> type:
    class Table(base):
        w: jax.Array
        n: int = eqx.field(static=True)

        def table(self):
            return np.arange(self.n, dtype=np.float32)

        @es.jit
        def table_es(self):
            return np.arange(self.n, dtype=np.float32)

    return Table


TABLE = {k: table_cls(b) for k, b in BASES.items()}


def numpy_program(kind: str) -> Callable:
    cls = TABLE[kind]

    def make():
        traces = [0]

        def f(m):
            traces[0] += 1
            return m.table(), jnp.sum(m.w)

        calls = [
            ((cls(_normal(0, (3,)), 4),), {}),
            ((cls(_normal(0, (3,)), 4),), {}),
            ((cls(_normal(1, (3,)), 4),), {}),
            ((cls(_normal(1, (3,)), 6),), {}),
            ((cls(_normal(1, (5,)), 4),), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 11. default arguments ------------------------------------------------------


def defaults_program() -> Callable:
    def make():
        traces = [0]

        def f(x, scale=2.0):
            traces[0] += 1
            return x * scale

        x = _normal(0, (3,))
        calls = [
            ((x,), {}),
            ((x, 2.0), {}),
            ((x,), {"scale": 2.0}),
            ((_normal(1, (3,)),), {}),
            ((x, 3.0), {}),  # a new static value
            ((_normal(1, (4,)),), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 12. a method returning a module ------------------------------------------


def affine_cls(base: type) -> type:
    class Affine(base):
        w: jax.Array
        b: jax.Array
        gain: float
        act: str = eqx.field(static=True)

        def scaled(self, s):
            return dataclasses.replace(self, w=self.w * s)

    return Affine


AFFINE = {k: affine_cls(b) for k, b in BASES.items()}


def returns_module_program(kind: str) -> Callable:
    cls = AFFINE[kind]

    def make():
        traces = [0]

        def f(m, s):
            traces[0] += 1
            return m.scaled(s)

        def m(seed, act="tanh", n=3):
            return cls(_normal(seed, (n, n)), _normal(seed + 1, (n,)), 1.5, act)

        calls = [
            ((m(0), jnp.array(2.0)), {}),
            ((m(0), jnp.array(2.0)), {}),
            ((m(1), jnp.array(3.0)), {}),
            ((m(1, act="relu"), jnp.array(3.0)), {}),
            ((m(1, n=4), jnp.array(3.0)), {}),
        ]
        return _ns(f, traces, calls)

    return make


# --- 13. eqx.filter_grad w.r.t. a module with a float hyperparameter ----------


def tempered_cls(base: type) -> type:
    class Tempered(base):
        w: jax.Array
        temperature: float = 2.0

    return Tempered


TEMPERED = {k: tempered_cls(b) for k, b in BASES.items()}


def grad_program(kind: str) -> Callable:
    cls = TEMPERED[kind]

    def make():
        traces = [0]

        def loss(m, x):
            traces[0] += 1
            return jnp.sum(jnp.tanh(m.w @ x / m.temperature))

        calls = [
            ((cls(_normal(0, (2, 3))), _normal(1, (3,))), {}),
            ((cls(_normal(0, (2, 3))), _normal(1, (3,))), {}),
            ((cls(_normal(2, (2, 3))), _normal(3, (3,))), {}),
            ((cls(_normal(2, (2, 3)), 4.0), _normal(3, (3,))), {}),
            ((cls(_normal(2, (4, 5))), _normal(3, (5,))), {}),
        ]
        # The function under test is `eqx.filter_grad(loss)`, itself a pytree.
        return _ns(eqx.filter_grad(loss), traces, calls)

    return make


# --- 14. an int >= 2**31 in a plain eqx.Module field the method never reads ---


class Config(eqx.Module):
    w: jax.Array
    seed: int = 2**40  # never read by the program; static under eqx.filter_jit


def big_int_program() -> Callable:
    def make():
        traces = [0]

        def f(cfg, x):
            traces[0] += 1
            return cfg.w * x

        calls = [
            ((Config(_normal(0, (3,))), _normal(1, (3,))), {}),
            ((Config(_normal(0, (3,))), _normal(1, (3,))), {}),
            ((Config(_normal(2, (3,)), 2**41), _normal(1, (3,))), {}),
            ((Config(_normal(2, (4,))), _normal(1, (4,))), {}),
        ]
        return _ns(f, traces, calls)

    return make


PROGRAMS: list[Program] = [
    Program("mlp_adam", train_program(optax.adam(1e-2), "mlp"), slow=True),
    Program("regressor_sgd_eqx", train_program(optax.sgd(1e-2), "eqx"), slow=True),
    Program("regressor_sgd_es", train_program(optax.sgd(1e-2), "es"), slow=True),
    Program("regressor_adam_es", train_program(optax.adam(1e-2), "es"), slow=True),
    Program("ensemble_eqx", ensemble_program("eqx"), slow=True),
    Program("ensemble_es", ensemble_program("es"), slow=True),
    Program("scan_layers_eqx", scan_program("eqx"), slow=True),
    Program("scan_layers_es", scan_program("es"), slow=True),
    Program("save_options_eqx", options_program("eqx")),
    Program("save_options_es", options_program("es")),
    Program("diffrax_saveat", diffrax_program(), slow=True),
    Program("batchnorm_eqx", batchnorm_program("eqx"), slow=True),
    Program("batchnorm_es", batchnorm_program("es"), slow=True),
    Program("dropout_eqx", dropout_program("eqx", eqx.nn.Dropout), slow=True),
    Program("dropout_es", dropout_program("es", eqx.nn.Dropout), slow=True),
    Program("dropout_subclass_eqx", dropout_program("eqx", MyDropout), slow=True),
    Program("dropout_subclass_es", dropout_program("es", MyDropout)),
    Program("custom_init_eqx", custom_init_program("eqx")),
    Program("custom_init_es", custom_init_program("es")),
    Program("bound_method_es_jit", bound_method_program("es_method")),
    Program("bound_method_filter_jit", bound_method_program("filter_jit_method")),
    Program("bound_method_plain", bound_method_program("plain_method")),
    Program("returns_numpy_eqx", numpy_program("eqx")),
    Program("returns_numpy_es", numpy_program("es")),
    Program("default_arguments", defaults_program(), fewer_ok=True),
    Program("returns_module_eqx", returns_module_program("eqx")),
    Program("returns_module_es", returns_module_program("es")),
    Program("filter_grad_temperature_eqx", grad_program("eqx"), slow=True),
    Program("filter_grad_temperature_es", grad_program("es")),
    Program("big_int_unread", big_int_program()),
]


def by_name(name: str) -> Program:
    return next(p for p in PROGRAMS if p.name == name)
