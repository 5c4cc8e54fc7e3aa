"""Cache-hit calls (the first three performance targets).

Every speed figure has a fresh-instance row (a new module on every call, as a
training loop makes them) beside the same-instance row:

- `es.jit` against a raw `jax.jit(lambda m, x: m(x))` on an equivalent plain
  `eqx.Module`: seed `Child`, 10 / 100 / 1,000 / 10,000 array leaves, 100 nested
  modules, 100 static fields (targets: fresh <= 0.8x, same <= 0.8x);
- the floor: raw `jax.jit` called on the module's leaves, already flattened (no
  Python at all before JAX's dispatcher), against raw `jax.jit` on the module: the
  least any wrapper that keys a module in Python can cost (no target);
- `eqx.filter_jit` against `es.jit` on the seed `Child` (target >= 4x faster);
- `maxsize=N` against the default wrapper, fresh, 100
  leaves (target within 1.2x);
- a jaxtyped method against the same unchecked method; the seed's workaround;
- a 10^6-element static tuple: a call on a new instance and as a plain-function
  argument (ms, no target).
"""

from collections.abc import Callable
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models


GROUP = "call"
TITLE = "cache-hit call"
FRESH = ("<=", 0.8)
SAME = ("<=", 0.8)


def _raw() -> Callable[[Any, Any], Any]:
    return jax.jit(lambda m, x: m(x))


def _fj() -> Callable[[Any, Any], Any]:
    return eqx.filter_jit(lambda m, x: m(x))


def _pair_variants(
    m: Any, p: Any, x: jax.Array, filter_jit: str = ""
) -> dict[str, h.Variant]:
    """es.jit on `m` and raw jax.jit on `p`, fresh and same; eqx.filter_jit on `p`
    too if `filter_jit` says "fresh", "same" or "both"."""
    raw = _raw()
    leaves, treedef = jax.tree.flatten(p)
    flat = jax.jit(lambda leaves, x: jax.tree.unflatten(treedef, leaves)(x))
    v = {
        "floor fresh": h.fresh(lambda a: flat(a, x), lambda: list(leaves)),
        "es.jit fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(m)),
        "es.jit same": h.same(lambda a: a(x), m),
        "jax.jit fresh": h.fresh(lambda a: raw(a, x), lambda: models.tree_copy(p)),
        "jax.jit same": h.same(lambda a: raw(a, x), p),
    }
    if filter_jit:
        fj = _fj()
        if filter_jit in ("fresh", "both"):
            v["filter_jit fresh"] = h.fresh(
                lambda a: fj(a, x), lambda: models.tree_copy(p)
            )
        if filter_jit in ("same", "both"):
            v["filter_jit same"] = h.same(lambda a: fj(a, x), p)
    return v


def _pair_rows(rep: h.Report, key: str, label: str, t: dict[str, float]) -> None:
    for inst, target in (("fresh", FRESH), ("same", SAME)):
        rep.compare_row(
            GROUP,
            f"call.{key}.{inst}",
            f"{label}: es.jit / jax.jit",
            t,
            f"es.jit {inst}",
            f"jax.jit {inst}",
            inst,
            target,
        )
    rep.compare_row(
        GROUP, f"call.{key}.floor",
        f"{label}: jax.jit on the leaves already flattened / jax.jit on the module",
        t, "floor fresh", "jax.jit fresh", "fresh", readme=True,
    )  # fmt: skip


def run(rep: h.Report, s: h.Settings) -> None:
    _child(rep, s)
    for n in s.call_sizes:
        m, p = models.wide(n)
        x = models.x_input()
        v = _pair_variants(m, p, x, filter_jit="fresh")
        if n == 100:
            es_apply, raw_apply = (
                models.zero_update_maker(m),
                models.zero_update_maker(p),
            )
            raw = _raw()
            v["es.jit apply_updates"] = h.fresh(lambda a, x=x: a(x), es_apply)
            v["jax.jit apply_updates"] = h.fresh(
                lambda a, x=x, raw=raw: raw(a, x), raw_apply
            )
        t = h.compare(v, s, raw=rep.raw, key=f"call.leaves{n}")
        _pair_rows(rep, f"leaves{n}", f"{n:,} array leaves", t)
        if n == 100:
            rep.compare_row(
                GROUP, "call.leaves100.apply_updates",
                "100 array leaves, new instance by eqx.apply_updates: es.jit / jax.jit",
                t, "es.jit apply_updates", "jax.jit apply_updates", "fresh", FRESH,
            )  # fmt: skip
        rep.compare_row(
            GROUP, f"call.leaves{n}.filter_jit", f"{n:,} array leaves: filter_jit / es.jit",
            t, "filter_jit fresh", "es.jit fresh", "fresh",
        )  # fmt: skip

    for key, label, make in (
        ("modules100", "100 nested modules", lambda: models.modules(100)),
        ("statics100", "100 static fields", lambda: models.statics(100)),
    ):
        m, p = make()
        t = h.compare(
            _pair_variants(m, p, models.x_input()), s, raw=rep.raw, key=f"call.{key}"
        )
        _pair_rows(rep, key, label, t)

    _wrapper_options(rep, s)
    _jaxtyped(rep, s)
    _static_tuple(rep, s)


def _child(rep: h.Report, s: h.Settings) -> None:
    m, p, x = models.seed_pair()
    v = _pair_variants(m, p, x, filter_jit="both")
    raw = _raw()
    v["es.jit apply_updates"] = h.fresh(lambda a: a(x), models.zero_update_maker(m))
    v["jax.jit apply_updates"] = h.fresh(
        lambda a: raw(a, x), models.zero_update_maker(p)
    )
    w = models.WorkaroundChild(dp=2.0, sp=True, dc=3.0, sc=True)
    v["workaround same"] = h.same(lambda a: a(x), w)
    t = h.compare(v, s, raw=rep.raw, key="call.child")
    _pair_rows(rep, "child", "seed Child", t)
    rep.compare_row(
        GROUP, "call.child.apply_updates",
        "seed Child, new instance by eqx.apply_updates: es.jit / jax.jit",
        t, "es.jit apply_updates", "jax.jit apply_updates", "fresh", FRESH,
    )  # fmt: skip
    for inst in ("fresh", "same"):
        rep.compare_row(
            GROUP, f"call.child.filter_jit.{inst}",
            "seed Child: eqx.filter_jit / es.jit (speed-up)",
            t, f"filter_jit {inst}", f"es.jit {inst}", inst, (">=", 4.0),
        )  # fmt: skip
    rep.compare_row(
        GROUP, "call.child.workaround",
        "seed Child: seed's workaround / es.jit (speed-up)",
        t, "workaround same", "es.jit same", "same",
    )  # fmt: skip


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
