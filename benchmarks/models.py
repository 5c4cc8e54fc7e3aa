"""The models every benchmark group uses, built through the public API only.

- `make_seed`: the seed's `Parent`/`Child` (the README's), fresh classes each time
  (a cold cache), and `EqxChild`, the same fields on a plain `eqx.Module`;
- `WorkaroundChild`: the seed's own workaround (a frozen dataclass that builds a
  `jax.jit` over a static method on every call);
- `wide`: n array fields `f0..f{n-1}` (one field per array) and a static `flag`;
- `nested`: `f0`, a static `flag` and a tuple `rest` of the other n-1 arrays;
- `modules`: a tuple of n small modules (`w`, a static `k`);
- `statics`: one array `w` and n static int fields `s0..s{n-1}`;
- `Net`: an `eqx.nn.MLP` inside an `es.Module`, for the training step;
- `chain`: modules each holding the next (`recursion_limit` for deep ones);
- what users write: `kwonly` (Equinox's `__call__(self, x, *, key=None)`), `modal`
  (static `train` and `mode`, keys of one class in turn), `eqx_mlp` and
  `eqx_sequential` (Equinox's layers as it ships them), `tagged_modules` (a static
  `tag` no program reads: a miss that reuses a program).

Each call model comes as an `es.Module` whose `__call__` is wrapped by `es.jit`
(or a given wrapper) and as an equivalent plain `eqx.Module` whose `__call__` is
the same undecorated body, for `jax.jit(lambda m, x: m(x))`. A body reads at most
16 of the leaves (evenly spaced): all leaves are still arguments (flattened, keyed
and checked on every call by both wrappers), but the executable gets only those
read (`jax.jit`'s `keep_unused=False`); a body reading all 10,000 leaves takes
XLA's CPU compiler over a minute. Equinox's own layers (`eqx_mlp`,
`eqx_sequential`) run every layer, as users call them: a body that skipped some
would let JAX prune them and measure a floor no user sees.
"""

import dataclasses
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


READS = 16  # leaves a call body reads at most


def arrays(n: int, shape: tuple[int, ...] = (4,)) -> list[jax.Array]:
    """`n` distinct small float32 arrays, placed in one batched transfer."""
    return jax.device_put([np.full(shape, i, np.float32) for i in range(n)])


def x_input() -> jax.Array:
    return jnp.ones((4,), jnp.float32)


def tree_copy(m: Any) -> Any:
    """A new instance with the same leaves, as `jax.tree.map` makes it."""
    return jax.tree.map(lambda a: a, m)


def zero_update_maker(m: Any) -> Callable[[], Any]:
    """`() -> eqx.apply_updates(m, zeros)` under `jax.jit`: a new instance with new
    arrays, as an optimiser step makes it."""
    zeros = jax.tree.map(jnp.zeros_like, eqx.filter(m, eqx.is_array))
    apply = jax.jit(eqx.apply_updates)
    jax.block_until_ready(apply(m, zeros))
    return lambda: apply(m, zeros)


# ----------------------------------------------------------------------------------
# The seed: the README's classes and sequence


def make_seed(
    counter: list[int] | None = None, wrap: Callable = es.jit
) -> tuple[type, type]:
    """Fresh `Parent`/`Child` classes (a cold cache); `counter[0]` counts traces."""
    counter = counter if counter is not None else [0]

    class Parent(es.Module):
        dp: float
        sp: bool = eqx.field(static=True)

        @wrap
        def __call__(self, x):
            counter[0] += 1
            return self.dp * self.g(x) if self.sp else self.g(x)

        def g(self, x):
            raise NotImplementedError

    class Child(Parent):
        dc: float
        sc: bool = eqx.field(static=True)

        def g(self, x):
            return self.dc * x if self.sc else x

    return Parent, Child


class EqxChild(eqx.Module):
    """The seed's `Child` as a plain `eqx.Module` holding what `es.Module` stores
    (0-d weakly typed arrays for `dp` and `dc`)."""

    dp: jax.Array
    dc: jax.Array
    sp: bool = eqx.field(static=True)
    sc: bool = eqx.field(static=True)

    def __call__(self, x):
        y = self.dc * x if self.sc else x
        return self.dp * y if self.sp else y


def seed_pair() -> tuple[Any, EqxChild, jax.Array]:
    _, child_cls = make_seed()
    m = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    p = EqxChild(jnp.asarray(2.0), jnp.asarray(3.0), True, True)
    return m, p, jnp.array(1.5)


@dataclasses.dataclass(frozen=True)
class WorkaroundParent:
    """The seed's workaround: a frozen dataclass that builds a `jax.jit` over a
    static method on every call and passes its dynamic fields as a dict."""

    dp: float
    sp: bool
    STATIC: ClassVar[tuple[str, ...]] = ("sp",)

    def __call__(self, x):
        cls = type(self)
        static = {k: getattr(self, k) for k in cls.STATIC}
        dynamic = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in static
        }
        return jax.jit(cls.f, static_argnames=cls.STATIC)(dynamic, x, **static)

    @staticmethod
    def f(d, x, *, sp):
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class WorkaroundChild(WorkaroundParent):
    dc: float
    sc: bool
    STATIC: ClassVar[tuple[str, ...]] = ("sp", "sc")

    @staticmethod
    def f(d, x, *, sp, sc):
        y = d["dc"] * x if sc else x
        return d["dp"] * y if sp else y


# ----------------------------------------------------------------------------------
# Call models at n leaves: (es.Module instance, equivalent eqx.Module instance)


def _spaced(names: list[str]) -> list[str]:
    return names[:: max(1, len(names) // READS)][:READS]


def _class(name: str, base: type, ns: dict[str, Any]) -> type:
    return type(name, (base,), {"__module__": __name__, **ns})


def wide(n: int, wrap: Callable | None = es.jit) -> tuple[Any, Any]:
    """n array fields and a static `flag` (not read); `m(x)` adds 16 of them to x."""
    names = [f"f{i}" for i in range(n)]
    read = _spaced(names)

    def body(self, x):
        for k in read:
            x = x + getattr(self, k)
        return x

    ann = {**dict.fromkeys(names, jax.Array), "flag": bool}
    flag = eqx.field(static=True)
    es_ns: dict[str, Any] = {"__annotations__": ann, "flag": flag}
    if wrap is not None:
        es_ns["__call__"] = wrap(body)
    es_cls = _class(f"Wide{n}", es.Module, es_ns)
    eqx_cls = _class(
        f"EqxWide{n}",
        eqx.Module,
        {"__annotations__": ann, "flag": eqx.field(static=True), "__call__": body},
    )
    values = {**dict(zip(names, arrays(n), strict=True)), "flag": False}
    return es_cls(**values), eqx_cls(**values)


def plain_wide(n: int) -> Any:
    """A plain frozen dataclass with `wide(n)`'s fields."""
    names = [f"f{i}" for i in range(n)]
    ann = [*((k, jax.Array) for k in names), ("flag", bool)]
    cls = dataclasses.make_dataclass(f"PlainWide{n}", ann, frozen=True)
    return cls(**dict(zip(names, arrays(n), strict=True)), flag=False)


class Layer(es.Module):
    w: jax.Array
    k: int = eqx.field(static=True)


class EqxLayer(eqx.Module):
    w: jax.Array
    k: int = eqx.field(static=True)


def modules(n: int) -> tuple[Any, Any]:
    """A tuple of n nested modules (each `w` and a static `k`); `m(x)` adds 16 `w`s."""
    idx = list(range(n))[:: max(1, n // READS)][:READS]

    def body(self, x):
        for i in idx:
            x = x + self.layers[i].w
        return x

    leaves = arrays(n)
    es_cls = _class(
        f"Modules{n}",
        es.Module,
        {"__annotations__": {"layers": tuple}, "__call__": es.jit(body)},
    )
    eqx_cls = _class(
        f"EqxModules{n}",
        eqx.Module,
        {"__annotations__": {"layers": tuple}, "__call__": body},
    )
    return (
        es_cls(tuple(Layer(w, i) for i, w in enumerate(leaves))),
        eqx_cls(tuple(EqxLayer(w, i) for i, w in enumerate(leaves))),
    )


def statics(n: int) -> tuple[Any, Any]:
    """One array `w` and n static ints `s0..s{n-1}`; `m(x)` reads 16 of them."""
    names = [f"s{i}" for i in range(n)]
    read = _spaced(names)

    def body(self, x):
        return self.w * x + sum(getattr(self, k) for k in read)

    ann = {"w": jax.Array, **dict.fromkeys(names, int)}
    fields = {k: eqx.field(static=True) for k in names}
    es_cls = _class(
        f"Statics{n}",
        es.Module,
        {"__annotations__": ann, **fields, "__call__": es.jit(body)},
    )
    fields = {k: eqx.field(static=True) for k in names}
    eqx_cls = _class(
        f"EqxStatics{n}",
        eqx.Module,
        {"__annotations__": ann, **fields, "__call__": body},
    )
    values = {"w": arrays(1)[0], **{k: i for i, k in enumerate(names)}}
    return es_cls(**values), eqx_cls(**values)


class StaticTable(es.Module):
    """A module holding a big static tuple (a lookup table baked into the program)."""

    w: jax.Array
    table: tuple = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x + len(self.table)


class EqxStaticTable(eqx.Module):
    w: jax.Array
    table: tuple = eqx.field(static=True)

    def __call__(self, x):
        return self.w * x + len(self.table)


# ----------------------------------------------------------------------------------
# Update models


class Nested(es.Module):
    """n array leaves: one field `f0`, the others in a tuple; one static flag."""

    f0: jax.Array
    rest: tuple[jax.Array, ...]
    flag: bool = eqx.field(static=True)


@dataclasses.dataclass(frozen=True)
class PlainNested:
    f0: jax.Array
    rest: tuple[jax.Array, ...]
    flag: bool


def nested(n: int) -> tuple[Nested, PlainNested]:
    leaves = arrays(n)
    return (
        Nested(f0=leaves[0], rest=tuple(leaves[1:]), flag=False),
        PlainNested(f0=leaves[0], rest=tuple(leaves[1:]), flag=False),
    )


class Stack(es.Module):
    layers: tuple[Layer, ...]


def stack(n: int) -> Stack:
    return Stack(tuple(Layer(w, i) for i, w in enumerate(arrays(n))))


# ----------------------------------------------------------------------------------
# Training


class Net(es.Module):
    """An `eqx.nn.MLP` inside an `es.Module`; `net(x)` maps a batch."""

    mlp: eqx.nn.MLP

    def __call__(self, x):
        return jax.vmap(self.mlp)(x)


def make_net(seed: int = 0, width: int = 32, depth: int = 3) -> Net:
    mlp = eqx.nn.MLP(8, 1, width_size=width, depth=depth, key=jax.random.key(seed))
    return Net(mlp=mlp)


class Link(es.Module):
    """One module of a chain: its own array, a static `k`, the next link."""

    w: jax.Array
    child: Any
    k: int = eqx.field(static=True)


class EqxLink(eqx.Module):
    w: jax.Array
    child: Any
    k: int = eqx.field(static=True)


def chain(depth: int) -> tuple[Any, Any]:
    """Modules nested `depth` deep; `m(x)` adds the outermost 16 `w`s."""

    def body(self, x):
        link = self.head
        for _ in range(min(READS, depth)):
            x, link = x + link.w, link.child
        return x

    def build(link_cls: type) -> Any:
        link = None
        for i, w in enumerate(arrays(depth)):
            link = link_cls(w, link, i)
        return link

    es_cls = _class(
        f"Chain{depth}",
        es.Module,
        {"__annotations__": {"head": Link}, "__call__": es.jit(body)},
    )
    eqx_cls = _class(
        f"EqxChain{depth}",
        eqx.Module,
        {"__annotations__": {"head": EqxLink}, "__call__": body},
    )
    return es_cls(build(Link)), eqx_cls(build(EqxLink))


def mlp(leaves: int) -> tuple[Any, Any]:
    """An MLP of `leaves // 2` `eqx.nn.Linear` layers (a weight and a bias each, its
    sizes static) inside a module; `m(x)` applies the first 8 layers."""

    def body(self, x):
        for layer in self.layers[: READS // 2]:
            x = jnp.tanh(layer(x))
        return x

    keys = jax.random.split(jax.random.key(0), leaves // 2)
    layers = tuple(eqx.nn.Linear(4, 4, key=k) for k in keys)
    ann = {"__annotations__": {"layers": tuple}}
    es_cls = _class(f"Mlp{leaves}", es.Module, {**ann, "__call__": es.jit(body)})
    eqx_cls = _class(f"EqxMlp{leaves}", eqx.Module, {**ann, "__call__": body})
    return es_cls(layers), eqx_cls(layers)


# ----------------------------------------------------------------------------------
# What users write: Equinox's own signature, keys in turn, Equinox's layers


@contextmanager
def recursion_limit(depth: int) -> Iterator[None]:
    """Room for a chain `depth` deep: Equinox's construction, `jax.tree.map` and
    JAX's flatten recurse once (or more) per link."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * depth))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def kwonly() -> tuple[Any, Any]:
    """Equinox's own `__call__(self, x, *, key=None)`: `w * x + b`, and with `key=`
    dropout at a static `rate` (as `eqx.nn.Dropout` in training)."""

    def body(self, x, *, key=None):
        y = self.w * x + self.b
        if key is not None:
            keep = jax.random.bernoulli(key, 1.0 - self.rate, y.shape)
            y = jnp.where(keep, y / (1.0 - self.rate), 0.0)
        return y

    ann = {"w": jax.Array, "b": jax.Array, "rate": float}
    es_cls = _class(
        "KwOnly",
        es.Module,
        {
            "__annotations__": ann,
            "rate": eqx.field(static=True),
            "__call__": es.jit(body),
        },
    )
    eqx_cls = _class(
        "EqxKwOnly",
        eqx.Module,
        {"__annotations__": ann, "rate": eqx.field(static=True), "__call__": body},
    )
    w, b = arrays(2)
    return es_cls(w=w, b=b, rate=0.1), eqx_cls(w=w, b=b, rate=0.1)


def modal() -> tuple[type, type]:
    """Classes with a static `train` flag and a static `mode` int, both in the
    program (each (train, mode) is its own key and its own program): an `es.Module`
    and the equivalent `eqx.Module`."""

    def body(self, x):
        y = self.w * x + self.mode
        return jnp.tanh(y) if self.train else y

    ann = {"w": jax.Array, "train": bool, "mode": int}

    def ns(call: Callable) -> dict[str, Any]:
        static = {"train": eqx.field(static=True), "mode": eqx.field(static=True)}
        return {"__annotations__": ann, **static, "__call__": call}

    return (
        _class("Modal", es.Module, ns(es.jit(body))),
        _class("EqxModal", eqx.Module, ns(body)),
    )


def _as_shipped(make: Callable[[], Any]) -> Any:
    """What `make()` builds with Equinox's own constructors, built abstractly
    (`eqx.filter_eval_shape`: its random initialisation compiles a dozen XLA
    programs, seconds on 2 cores), its arrays then filled from numpy: the same
    classes, fields and shapes, other numbers."""
    leaves, treedef = jax.tree.flatten(eqx.filter_eval_shape(make))
    rng = np.random.default_rng(0)
    shaped = [isinstance(a, jax.ShapeDtypeStruct) for a in leaves]
    values = jax.device_put(
        [
            rng.uniform(-0.5, 0.5, a.shape).astype(a.dtype) if is_array else None
            for a, is_array in zip(leaves, shaped)
        ]
    )
    return jax.tree.unflatten(
        treedef,
        [v if is_array else a for a, v, is_array in zip(leaves, values, shaped)],
    )


def eqx_mlp(width: int, depth: int) -> eqx.nn.MLP:
    """`eqx.nn.MLP` as Equinox ships it, 4 → width × depth → 4 (`depth + 1`
    `Linear` layers; ReLU, its activations are fields: non-array leaves)."""
    return _as_shipped(lambda: eqx.nn.MLP(4, 4, width, depth, key=jax.random.key(0)))


def eqx_sequential(width: int) -> eqx.nn.Sequential:
    """`eqx.nn.Sequential` of 3 `eqx.nn.Linear` and 2 `eqx.nn.Lambda(jax.nn.relu)`:
    4 → width → width → 4."""

    def make() -> eqx.nn.Sequential:
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        return eqx.nn.Sequential(
            [
                eqx.nn.Linear(4, width, key=k1),
                eqx.nn.Lambda(jax.nn.relu),
                eqx.nn.Linear(width, width, key=k2),
                eqx.nn.Lambda(jax.nn.relu),
                eqx.nn.Linear(width, 4, key=k3),
            ]
        )

    return _as_shipped(make)


def tagged_modules(n: int, wrap: Callable = es.jit) -> tuple[Any, Any]:
    """`modules(n)` with a static `tag` the body never reads: a new `tag` is a new
    key whose program is the one compiled already."""
    idx = list(range(n))[:: max(1, n // READS)][:READS]

    def body(self, x):
        for i in idx:
            x = x + self.layers[i].w
        return x

    ann = {"layers": tuple, "tag": int}
    es_cls = _class(
        f"Tagged{n}",
        es.Module,
        {"__annotations__": ann, "tag": eqx.field(static=True), "__call__": wrap(body)},
    )
    eqx_cls = _class(
        f"EqxTagged{n}",
        eqx.Module,
        {"__annotations__": ann, "tag": eqx.field(static=True), "__call__": body},
    )
    leaves = arrays(n)
    return (
        es_cls(tuple(Layer(w, i) for i, w in enumerate(leaves)), 0),
        eqx_cls(tuple(EqxLayer(w, i) for i, w in enumerate(leaves)), 0),
    )
