"""Cache-hit calls (the first performance targets).

Every speed figure has a fresh-instance row (a new module on every call, as a
training loop makes them) beside the same-instance row, for each model: the seed's
`Child`; Equinox's own `__call__(self, x, *, key=None)`, called `m(x)` and
`m(x, key=k)`; one module of 10 / 100 / 1,000 / 10,000 array fields; MLPs of 10 /
100 / 1,000 leaves (`eqx.nn.Linear` layers); 100 and 1,000 nested modules; 100
static fields; chains of modules 50, 100, 200 and 1,000 deep; `eqx.nn.MLP` (depth
2 and 8) and `eqx.nn.Sequential` (`Linear` and `Lambda(jax.nn.relu)`) as Equinox
ships them, called through `es.jit(lambda m, x: m(x))`, every layer run. Against:

- raw `jax.jit(lambda m, x: m(x))` on an equivalent plain `eqx.Module`, also fresh
  in the fresh rows (`jax.jit(lambda m, x, key=None: m(x, key=key))` for the
  keyword-only signature; for Equinox's layers, which raw `jax.jit` refuses, the
  arrays taken out by `eqx.filter` before each call, and, shown, once) (target:
  fresh <= 1.0x for every model; <= 0.6x for models of 50 submodules or more and
  the chains);
- the floor: `jax.jit` called on the leaves already in a flat list built from a
  fresh copy, what any wrapper pays at least (targets: fresh <= the floor + 2 us
  for a model of at most 10 leaves in its top module, plus 1 us per submodule;
  shown, not judged, for the wide modules of 100 leaves and more, whose target is
  the ratio to raw `jax.jit`; same <= the floor + 1.5 us for every model);
- `eqx.filter_jit` on the seed (target: es.jit >= 5x faster, fresh);
- keys of one class called in turn, fresh (a train and an eval instance; 4 values
  of a static field), against the same pattern with one key (target: <= 1.1x);
- keys of one class in use at once (4, 20, 100, 1,000), a fresh instance of the
  next each call, against one key over as many instances, and one key called with
  one of 20 others between its calls, against it alone (target: <= 1.1x);
  `python benchmarks/bench_call.py keys` runs these rows alone;
- a plain function of a dict of 10 / 100 arrays, a new dict each call, against
  `jax.jit` of the same function (target: <= 1.0x);
- `maxsize=N` against the default wrapper, fresh, 100 leaves (within 1.2x);
- a jaxtyped method against the same unchecked method;
- a 10^6-element static tuple: a call on a new instance and as a plain-function
  argument (no target).
"""

import itertools
import statistics
import sys
from collections.abc import Callable
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models
from eqx_static._key import key_and_leaves


GROUP = "call"
TITLE = "cache-hit call"


def _raw() -> Callable[[Any, Any], Any]:
    return jax.jit(lambda m, x: m(x))


def _fj() -> Callable[[Any, Any], Any]:
    return eqx.filter_jit(lambda m, x: m(x))


def _variants(m: Any, p: Any, x: jax.Array) -> dict[str, h.Variant]:
    """es.jit on `m`, raw jax.jit on `p`, each fresh and same; and the floor: the
    leaves of a fresh copy of `p`, already flat, through one `jax.jit`."""
    raw = _raw()
    treedef = jax.tree.structure(p)
    flat = jax.jit(lambda leaves, x: jax.tree.unflatten(treedef, leaves)(x))
    return {
        "floor": h.fresh(
            lambda a: flat(a, x), lambda: jax.tree.leaves(models.tree_copy(p))
        ),
        "es.jit fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(m)),
        "es.jit same": h.same(lambda a: a(x), m),
        "jax.jit fresh": h.fresh(lambda a: raw(a, x), lambda: models.tree_copy(p)),
        "jax.jit same": h.same(lambda a: raw(a, x), p),
    }


def _kwonly_variants(
    m: Any, p: Any, x: jax.Array, key: jax.Array | None
) -> dict[str, h.Variant]:
    """`_variants` for Equinox's own `__call__(self, x, *, key=None)`, called `m(x)`
    or `m(x, key=key)`; raw: `jax.jit(lambda m, x, key=None: m(x, key=key))`."""
    raw = jax.jit(lambda m, x, key=None: m(x, key=key))
    treedef = jax.tree.structure(p)
    flat = jax.jit(
        lambda leaves, x, key: jax.tree.unflatten(treedef, leaves)(x, key=key)
    )

    def leaves() -> list[jax.Array]:
        return jax.tree.leaves(models.tree_copy(p))

    if key is None:
        v = {
            "floor": h.fresh(lambda a: flat(a, x, None), leaves),
            "es.jit fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(m)),
            "es.jit same": h.same(lambda a: a(x), m),
            "jax.jit fresh": h.fresh(lambda a: raw(a, x), lambda: models.tree_copy(p)),
            "jax.jit same": h.same(lambda a: raw(a, x), p),
        }
    else:
        v = {
            "floor": h.fresh(lambda a: flat(a, x, key), leaves),
            "es.jit fresh": h.fresh(
                lambda a: a(x, key=key), lambda: models.tree_copy(m)
            ),
            "es.jit same": h.same(lambda a: a(x, key=key), m),
            "jax.jit fresh": h.fresh(
                lambda a: raw(a, x, key=key), lambda: models.tree_copy(p)
            ),
            "jax.jit same": h.same(lambda a: raw(a, x, key=key), p),
        }
    return v


def _eqx_nn_variants(model: Any, x: jax.Array) -> dict[str, h.Variant]:
    """`_variants` for a layer of `eqx.nn` as Equinox ships it, called through
    `es.jit(lambda m, x: m(x))`. Raw `jax.jit(lambda m, x: m(x))` refuses it (its
    activations, `jax.nn.relu`, are leaves and no arrays), so the raw baseline is
    the form `jax.jit` users write (as in the training rows): the arrays taken out
    before each call (`eqx.filter(m, eqx.is_array)`) and passed through `jax.jit`,
    the static part, partitioned once, closed over and put back with `eqx.combine`
    in the body; also with the arrays taken out once (a new copy of them each fresh
    call, as a loop that keeps only the parameters). The floor: the array leaves,
    flat."""
    ours = es.jit(lambda m, x: m(x))
    p, static = eqx.partition(model, eqx.is_array)
    raw = jax.jit(lambda p, x: eqx.combine(p, static)(x))
    treedef = jax.tree.structure(p)
    flat = jax.jit(
        lambda leaves, x: eqx.combine(jax.tree.unflatten(treedef, leaves), static)(x)
    )

    def partitioned(a: Any) -> Any:
        return raw(eqx.filter(a, eqx.is_array), x)

    return {
        "floor": h.fresh(
            lambda a: flat(a, x), lambda: jax.tree.leaves(models.tree_copy(p))
        ),
        "es.jit fresh": h.fresh(lambda a: ours(a, x), lambda: models.tree_copy(model)),
        "es.jit same": h.same(lambda a: ours(a, x), model),
        "jax.jit fresh": h.fresh(partitioned, lambda: models.tree_copy(model)),
        "jax.jit same": h.same(partitioned, model),
        "jax.jit once fresh": h.fresh(lambda a: raw(a, x), lambda: models.tree_copy(p)),
        "jax.jit once same": h.same(lambda a: raw(a, x), p),
    }


def _rows(
    rep: h.Report, key: str, label: str, t: dict[str, float], submodules: int,
    top_leaves: int, raw_name: str = "jax.jit",
) -> None:  # fmt: skip
    fresh = ("<=", 0.6 if submodules >= 50 else 1.0)
    for inst, target in (("fresh", fresh), ("same", None)):
        rep.compare_row(
            GROUP, f"call.{key}.{inst}", f"{label}: es.jit / {raw_name}",
            t, f"es.jit {inst}", f"jax.jit {inst}", inst, target, readme=True,
        )  # fmt: skip
    rep.compare_row(
        GROUP, f"call.{key}.floor",
        f"{label}: the floor (jax.jit on the leaves, flat) / {raw_name}",
        t, "floor", "jax.jit fresh", "fresh", readme=True,
    )  # fmt: skip
    rep.margin_row(
        GROUP, f"call.{key}.fresh_margin", f"{label}: es.jit − the floor",
        t, "es.jit fresh", "floor", "fresh",
        2.0 + submodules if top_leaves <= 10 else None,
    )  # fmt: skip
    rep.margin_row(
        GROUP, f"call.{key}.same_margin", f"{label}: es.jit − the floor",
        t, "es.jit same", "floor", "same", 1.5,
    )  # fmt: skip


# key, label, model builder, submodules (a chain link, a layer, a nested module),
# array leaves held by the top module itself
MODELS: list[tuple[str, str, Callable[[], tuple[Any, Any]], int, int]] = [
    ("leaves10", "10 array fields", lambda: models.wide(10), 0, 10),
    ("leaves100", "100 array fields", lambda: models.wide(100), 0, 100),
    ("leaves1000", "1,000 array fields", lambda: models.wide(1_000), 0, 1_000),
    ("leaves10000", "10,000 array fields", lambda: models.wide(10_000), 0, 10_000),
    ("mlp10", "MLP, 10 leaves (5 Linear)", lambda: models.mlp(10), 5, 0),
    ("mlp100", "MLP, 100 leaves (50 Linear)", lambda: models.mlp(100), 50, 0),
    ("mlp1000", "MLP, 1,000 leaves (500 Linear)", lambda: models.mlp(1_000), 500, 0),
    ("modules100", "100 nested modules", lambda: models.modules(100), 100, 0),
    ("modules1000", "1,000 nested modules", lambda: models.modules(1_000), 1_000, 0),
    ("statics100", "100 static fields", lambda: models.statics(100), 0, 1),
    ("chain50", "a chain of modules 50 deep", lambda: models.chain(50), 50, 1),
    ("chain100", "a chain of modules 100 deep", lambda: models.chain(100), 100, 1),
    ("chain200", "a chain of modules 200 deep", lambda: models.chain(200), 200, 1),
    (
        "chain1000",
        "a chain of modules 1,000 deep",
        lambda: models.chain(1_000),
        1_000,
        1,
    ),
]


def run(rep: h.Report, s: h.Settings) -> None:
    _child(rep, s)
    _kwonly(rep, s)
    _keys_in_turn(rep, s)
    _keys_in_use(rep, s)
    for key, label, make, submodules, top_leaves in MODELS:
        if s.quick and key not in ("leaves100", "mlp10", "chain50"):
            continue
        # A chain 1,000 deep: Equinox's construction and JAX's flatten recurse.
        with models.recursion_limit(submodules):
            m, p = make()
            t = h.compare(
                _variants(m, p, models.x_input()), s, raw=rep.raw, key=f"call.{key}"
            )
            del m, p
        _rows(rep, key, label, t, submodules, top_leaves)
    _eqx_nn(rep, s)
    _dicts(rep, s)
    _wrapper_options(rep, s)
    _jaxtyped(rep, s)
    _static_tuple(rep, s)


def _child(rep: h.Report, s: h.Settings) -> None:
    m, p, x = models.seed_pair()
    v = _variants(m, p, x)
    fj, raw = _fj(), _raw()
    v["filter_jit fresh"] = h.fresh(lambda a: fj(a, x), lambda: models.tree_copy(p))
    v["es.jit apply_updates"] = h.fresh(lambda a: a(x), models.zero_update_maker(m))
    v["jax.jit apply_updates"] = h.fresh(
        lambda a: raw(a, x), models.zero_update_maker(p)
    )
    t = h.compare(v, s, raw=rep.raw, key="call.child")
    _rows(rep, "child", "seed Child", t, 0, 2)
    rep.compare_row(
        GROUP, "call.child.apply_updates",
        "seed Child, new instance by eqx.apply_updates: es.jit / jax.jit",
        t, "es.jit apply_updates", "jax.jit apply_updates", "fresh", ("<=", 1.0),
    )  # fmt: skip
    rep.compare_row(
        GROUP, "call.child.filter_jit", "seed Child: eqx.filter_jit / es.jit (speed-up)",
        t, "filter_jit fresh", "es.jit fresh", "fresh", (">=", 5.0),
    )  # fmt: skip


def _kwonly(rep: h.Report, s: h.Settings) -> None:
    """Equinox's own `__call__(self, x, *, key=None)`, called `m(x)` and
    `m(x, key=k)` (a `jax.random.key`; with it the body runs dropout)."""
    m, p = models.kwonly()
    x, k = models.x_input(), jax.random.key(0)
    for name, key, label in (
        ("kwonly", None, "__call__(self, x, *, key=None), called m(x)"),
        ("kwonly_key", k, "__call__(self, x, *, key=None), called m(x, key=k)"),
    ):
        if s.quick and name != "kwonly":
            continue
        t = h.compare(
            _kwonly_variants(m, p, x, key), s, raw=rep.raw, key=f"call.{name}"
        )
        _rows(rep, name, label, t, 0, 2)


def _keys_in_turn(rep: h.Report, s: h.Settings) -> None:
    """Keys of one class called in turn, fresh instances: a train and an eval
    instance alternating (a static `train` flag), and 4 values of a static `mode`,
    each against the same call pattern with one key (instances of the same class,
    other arrays, one static value): es.jit / es.jit. Raw `jax.jit` on equivalent
    `eqx.Module`s in the same turns is shown."""
    cls, eqx_cls = models.modal()
    raw = _raw()
    x = models.x_input()
    w = models.arrays(4)
    cases = [
        ("keys2", "a train and an eval instance in turn (2 keys)", "train",
         (True, False)),
        ("keys4", "4 values of a static field in turn (4 keys)", "mode", (0, 1, 2, 3)),
    ]  # fmt: skip
    for name, label, field, values in cases:
        if s.quick and name != "keys2":
            continue
        fixed = {"train": True, "mode": 0}
        turns = {
            "turn": [{**fixed, field: v} for v in values],
            "one": [fixed] * len(values),
        }
        made = {
            (kind, c): [c(w=w[i], **kw) for i, kw in enumerate(turn)]
            for kind, turn in turns.items()
            for c in (cls, eqx_cls)
        }
        for (_, c), instances in made.items():  # each key compiled and guarded
            call = (lambda a: a(x)) if c is cls else (lambda a: raw(a, x))
            for a in instances * 3:
                jax.block_until_ready(call(models.tree_copy(a)))
        t = h.compare(
            {
                "keys in turn": h.fresh(lambda a: a(x), _in_turn(made["turn", cls])),
                "one key": h.fresh(lambda a: a(x), _in_turn(made["one", cls])),
                "jax.jit keys in turn": h.fresh(
                    lambda a: raw(a, x), _in_turn(made["turn", eqx_cls])
                ),
                "jax.jit one key": h.fresh(
                    lambda a: raw(a, x), _in_turn(made["one", eqx_cls])
                ),
            },
            s, raw=rep.raw, key=f"call.{name}",
        )  # fmt: skip
        rep.compare_row(
            GROUP, f"call.{name}.fresh",
            f"{label}: es.jit / the same pattern with one key",
            t, "keys in turn", "one key", "fresh", ("<=", 1.1), readme=True,
        )  # fmt: skip
        rep.compare_row(
            GROUP, f"call.{name}.raw", f"{label}: es.jit / jax.jit",
            t, "keys in turn", "jax.jit keys in turn", "fresh",
        )  # fmt: skip


class Indexed(es.Module):
    """A block with its own static index, which the program does not read: every
    key shares one program, so that 1,000 keys cost traces, not compiles."""

    w: jax.Array
    index: int = eqx.field(static=True)

    @es.jit
    def __call__(self, x):
        return self.w * x


class EqxIndexed(eqx.Module):
    w: jax.Array
    index: int = eqx.field(static=True)

    def __call__(self, x):
        return self.w * x


KEYS_IN_USE = (4, 20, 100, 1_000)


def _keys_in_use(rep: h.Report, s: h.Settings) -> None:
    """Keys of one class in use at once: a fresh instance of the next of n keys at
    each call (n = 4, 20, 100, 1,000), against one key over as many instances (other
    arrays, as many of them); and one key called with one of 20 others between
    each of its calls, against one key alone; all timed in the same interleaved
    rounds. A note gives the median of the per-round ratios and their spread. Raw
    `jax.jit` on the same pattern of the largest n is shown."""
    x = models.x_input()
    counts = (20,) if s.quick else KEYS_IN_USE
    ws = models.arrays(max(counts))
    blocks = [Indexed(w, i) for i, w in enumerate(ws)]
    beside = [m for b in blocks[1:21] for m in (blocks[0], b)]
    patterns = {
        **{f"{n} keys": blocks[:n] for n in counts},
        **{f"one key x{n}": [Indexed(w, 0) for w in ws[:n]] for n in counts},
        "one key beside 20": beside,
        "one key alone": [Indexed(w, 0) for w in ws[:40]],
    }
    n = max(counts)
    raw = _raw()
    eqx_patterns = {
        f"jax.jit {n} keys": [EqxIndexed(w, i) for i, w in enumerate(ws)],
        f"jax.jit one key x{n}": [EqxIndexed(w, 0) for w in ws],
    }
    for instances in patterns.values():  # each key traced and guarded
        for a in instances * 3:
            jax.block_until_ready(a(x))
    for instances in eqx_patterns.values():
        for a in instances * 2:
            jax.block_until_ready(raw(a, x))
    variants = {
        **{k: h.fresh(lambda a: a(x), _in_turn(v)) for k, v in patterns.items()},
        **{
            k: h.fresh(lambda a: raw(a, x), _in_turn(v))
            for k, v in eqx_patterns.items()
        },
        **{  # each instance's own key's dispatcher, called with its leaves: no guard
            k: h.fresh(lambda a: a[0](*a[1]), _in_turn(_dispatchers(patterns[p], x)))
            for k, p in (
                (f"{n} dispatchers", f"{n} keys"),
                (f"one dispatcher x{n}", f"one key x{n}"),
            )
        },
    }
    t = h.compare(variants, s, raw=rep.raw, key="call.keys_in_use")
    samples = rep.raw["call.keys_in_use"]["samples_s"]
    rows = [(f"keys{n}_in_use", f"{n} keys", f"one key x{n}") for n in counts]
    rows.append(("key_beside20", "one key beside 20", "one key alone"))
    for key, num, den in rows:
        ratios = sorted(a / b for a, b in zip(samples[num], samples[den]))
        note = (
            f"per-round ratio: median {statistics.median(ratios):.3f}, "
            f"{ratios[0]:.3f} to {ratios[-1]:.3f} over {len(ratios)} rounds"
        )
        label = (
            "one key, called with one of 20 others of its class between its calls"
            if num == "one key beside 20"
            else f"{num} of one class in use, a fresh instance of the next each call"
        )
        rep.compare_row(
            GROUP, f"call.{key}", f"{label}: es.jit / {den}",
            t, num, den, "fresh", ("<=", 1.1), readme=False, note=note,
        )  # fmt: skip
    rep.compare_row(
        GROUP, f"call.keys{n}_in_use.dispatchers",
        f"{n} keys of one class in use, their dispatchers called alone (no guard): "
        f"{n} dispatchers / one dispatcher x{n} (shown: the part JAX's own "
        "dispatcher takes, one per key)",
        t, f"{n} dispatchers", f"one dispatcher x{n}", "fresh", readme=False,
    )  # fmt: skip
    rep.compare_row(
        GROUP, f"call.keys{n}_in_use.raw",
        f"{n} keys of one class in use: jax.jit / jax.jit one key x{n} (shown)",
        t, f"jax.jit {n} keys", f"jax.jit one key x{n}", "fresh", readme=False,
    )  # fmt: skip
    rep.compare_row(
        GROUP, f"call.keys{n}_in_use.vs_raw", f"{n} keys of one class in use: es.jit / jax.jit",
        t, f"{n} keys", f"jax.jit {n} keys", "fresh", readme=False,
    )  # fmt: skip


def _dispatchers(instances: list[Any], x: jax.Array) -> list[tuple[Any, list]]:
    """Each instance's key's own dispatcher (what its guard calls), and the leaves
    it is called with."""
    f = type(instances[0]).__call__.es_jit.f
    pairs = [key_and_leaves((a, x)) for a in instances]
    return [(f.entries[key].call, leaves) for key, leaves in pairs]


def _in_turn(instances: list[Any]) -> Callable[[], Any]:
    """A maker of fresh copies of `instances`, one after the other, round and round
    (each batch starts where the last ended: the order never repeats a key)."""
    it = itertools.cycle(instances)
    return lambda: models.tree_copy(next(it))


def _eqx_nn(rep: h.Report, s: h.Settings) -> None:
    """Equinox's layers as it ships them, through `es.jit(lambda m, x: m(x))`: every
    layer runs. Against `jax.jit` with the arrays taken out before each call (what
    `jax.jit` needs for them) and the floor; and `jax.jit` with them taken out once,
    shown."""
    x = models.x_input()
    cases: list[tuple[str, str, Callable[[], Any], int]] = [
        ("eqx_mlp_d2", "eqx.nn.MLP 4→16×2→4 (3 Linear)",
         lambda: models.eqx_mlp(16, 2), 3),
        ("eqx_mlp_d8", "eqx.nn.MLP 4→16×8→4 (9 Linear)",
         lambda: models.eqx_mlp(16, 8), 9),
        ("eqx_sequential", "eqx.nn.Sequential, 3 Linear + 2 Lambda(relu), 4→16→16→4",
         lambda: models.eqx_sequential(16), 5),
    ]  # fmt: skip
    for key, label, make, submodules in cases:
        if s.quick and key != "eqx_mlp_d2":
            continue
        t = h.compare(_eqx_nn_variants(make(), x), s, raw=rep.raw, key=f"call.{key}")
        _rows(rep, key, label, t, submodules, 0, "jax.jit + eqx.filter")
        for inst in ("fresh", "same"):
            rep.compare_row(
                GROUP, f"call.{key}.once_{inst}",
                f"{label}: es.jit / jax.jit, partitioned once",
                t, f"es.jit {inst}", f"jax.jit once {inst}", inst, readme=True,
            )  # fmt: skip


def _dicts(rep: h.Report, s: h.Settings) -> None:
    """A plain function of a dict of arrays (parameters as `jax.jit` code passes
    them), a new dict of the same arrays on every call: es.jit / jax.jit."""
    for n in (10,) if s.quick else (10, 100):
        params = {f"w{i}": a for i, a in enumerate(models.arrays(n))}
        t = h.compare(_dict_variants(params), s, raw=rep.raw, key=f"call.dict{n}")
        label = f"a dict of {n} arrays, plain function"
        rep.compare_row(
            GROUP, f"call.dict{n}.fresh", f"{label}: es.jit / jax.jit",
            t, "es.jit fresh", "jax.jit fresh", "fresh", ("<=", 1.0), readme=True,
        )  # fmt: skip
        rep.compare_row(
            GROUP, f"call.dict{n}.floor",
            f"{label}: the floor (jax.jit on the leaves, flat) / jax.jit",
            t, "floor", "jax.jit fresh", "fresh", readme=True,
        )  # fmt: skip


def _dict_variants(params: dict[str, jax.Array]) -> dict[str, h.Variant]:
    def body(params: dict, x: jax.Array) -> jax.Array:
        return params["w0"] * x

    x, names = models.x_input(), sorted(params)
    ours, raw = es.jit(body), jax.jit(body)
    flat = jax.jit(lambda leaves, x: body(dict(zip(names, leaves)), x))
    return {
        "floor": h.fresh(lambda a: flat(a, x), lambda: [params[k] for k in names]),
        "es.jit fresh": h.fresh(lambda d: ours(d, x), lambda: dict(params)),
        "jax.jit fresh": h.fresh(lambda d: raw(d, x), lambda: dict(params)),
    }


def _wrapper_options(rep: h.Report, s: h.Settings) -> None:
    """`maxsize=N` against the default, fresh, 100 leaves."""
    x = models.x_input()
    wraps = {"default": es.jit, "maxsize=8": es.jit(maxsize=8)}
    v: dict[str, h.Variant] = {}
    for name, wrap in wraps.items():
        m, _ = models.wide(100, wrap=wrap)
        v[name] = h.fresh(lambda a: a(x), lambda m=m: models.tree_copy(m))
    t = h.compare(v, s, raw=rep.raw, key="call.options100")
    for name, key in (("maxsize=8", "maxsize"),):
        rep.compare_row(
            GROUP, f"call.{key}.fresh", f"100 array leaves: es.jit({name}) / es.jit",
            t, name, "default", "fresh", ("<=", 1.2),
        )  # fmt: skip


def _jaxtyped(rep: h.Report, s: h.Settings) -> None:
    """A method whose annotations jaxtyping checks while tracing, next to the same
    method unchecked: a hit runs no check."""
    try:
        from beartype import beartype
    except ImportError:
        rep.skip_row(GROUP, "call.jaxtyped", "jaxtyped method", "skipped: no beartype")
        return
    from jaxtyping import Array, Float, jaxtyped

    def body(self: Any, x: Float[Array, " n"]) -> Float[Array, " n"]:
        return self.w * x

    class Checked(es.Module):
        w: jax.Array
        __call__ = es.jit(jaxtyped(typechecker=beartype)(body))

    class Unchecked(es.Module):
        w: jax.Array
        __call__ = es.jit(body)

    x, w = jnp.ones(8), jnp.full(8, 2.0)
    c, u = Checked(w), Unchecked(w)
    v = {
        "checked fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(c)),
        "unchecked fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(u)),
    }
    t = h.compare(v, s, raw=rep.raw, key="call.jaxtyped")
    rep.compare_row(
        GROUP, "call.jaxtyped.fresh", "@es.jit over @jaxtyped / the same unchecked",
        t, "checked fresh", "unchecked fresh", "fresh",
    )  # fmt: skip


def _static_tuple(rep: h.Report, s: h.Settings) -> None:
    """A big static tuple: on a new instance of a module, and as an argument."""
    n = s.static_tuple
    table = tuple(range(n))
    x = jnp.ones((4,), jnp.float32)
    w = jnp.ones((4,), jnp.float32)
    m = models.StaticTable(w=w, table=table)
    p = models.EqxStaticTable(w=w, table=table)
    raw, fj = _raw(), _fj()
    reps = s.static_tuple_reps
    t = {
        "es.jit": h.median_time(lambda: models.tree_copy(m)(x), reps),
        "filter_jit": h.median_time(lambda: fj(models.tree_copy(p), x), reps),
        "jax.jit": h.median_time(lambda: raw(models.tree_copy(p), x), reps),
    }
    rep.raw["call.static_tuple_module"] = t
    rep.info_row(
        GROUP, "call.static_tuple.module",
        f"{n:,}-element static tuple field, new instance: es.jit / filter_jit / jax.jit",
        t, instance="fresh", readme=True,
    )  # fmt: skip

    def f(tab, x):
        return x * len(tab)

    es_f, fj_f = es.jit(f), eqx.filter_jit(f)
    t = {
        "es.jit": h.median_time(lambda: es_f(table, x), reps),
        "filter_jit": h.median_time(lambda: fj_f(table, x), reps),
    }
    rep.raw["call.static_tuple_arg"] = t
    rep.info_row(
        GROUP, "call.static_tuple.arg",
        f"{n:,}-element tuple as a plain-function argument: es.jit / filter_jit",
        t, instance="same", readme=True,
    )  # fmt: skip


def profile(out: list[str]) -> None:
    """cProfile of the es.jit hit at 1,000 leaves, fresh and same instance."""
    m, _ = models.wide(1_000)
    x = models.x_input()
    jax.block_until_ready(m(x))
    k = 2_000
    pool = [models.tree_copy(m) for _ in range(k)]
    jax.block_until_ready(pool[0](x))
    pool[0] = models.tree_copy(m)
    with h.profiled(f"es.jit hit, 1,000 array leaves, FRESH instance, {k} calls", out):
        for i in range(k):
            pool[i](x)
            pool[i] = None
    with h.profiled(f"es.jit hit, 1,000 array leaves, same instance, {k} calls", out):
        for _ in range(k):
            m(x)


if (
    __name__ == "__main__"
):  # the keys rows alone: `python benchmarks/bench_call.py keys`
    if sys.argv[1:] not in (["keys"], ["keys", "--quick"]):
        sys.exit("usage: python benchmarks/bench_call.py keys [--quick]")
    report, settings = h.Report(), h.Settings.make(quick="--quick" in sys.argv)
    _keys_in_turn(report, settings)
    _keys_in_use(report, settings)
    print(h.render(report.rows))
    for row in report.rows:
        print(f"{row.key}: {row.note}" if row.note else row.key)
