"""Benchmark suite for `eqx_static` (DESIGN §4): one table of ratios, one process.

Run from the repository root:

    python benchmarks/run.py            # full run, under 3 minutes on 2 CPU cores
    python benchmarks/run.py --quick    # CI smoke test, under 30 seconds
    python benchmarks/run.py --json out.json   # default: benchmarks/results/latest.json
    python benchmarks/run.py --profile  # also cProfile the §4 hot paths

The optional comparisons (flax, jax_dataclasses) run when the `bench` extra is
installed (`pip install -e '.[bench]'`); otherwise their rows say "skipped".

Sections:

1. cache-hit call overhead: `es.jit` against a raw `jax.jit(lambda m, x: m(x))` on
   the same module, `eqx.filter_jit`, and the seed's own workaround (a frozen
   dataclass that builds a `jax.jit` over a static method on every call); on the
   seed's `Child` and on models with 100 and 1,000 dynamic array fields;
2. the same call through flax.struct, jax_dataclasses and flax.nnx;
3. update cost (`with_dynamic`, `with_static`, `es.edit`, `eqx.tree_at`,
   `dataclasses.replace`, flax `.replace`, `jax_dataclasses.copy_and_mutate`) at
   100, 1,000 and 10,000 array leaves;
4. compile counts (not timed), by `cache_info().misses` and by a trace counter;
5. first-call cost (trace and compile) of `es.jit` against `eqx.filter_jit`.

Methodology: every timed operation is warmed up first (never timed); then the
variants of one comparison are timed in interleaved rounds, each round one batch
per variant sized to a fixed wall time, the batch's last output passed to
`jax.block_until_ready` (the CPU stream runs in order, so this waits for all of
them), the garbage collector off within a batch. A variant's time is the least of
the medians of its per-call times over groups of 5 rounds (min-of-medians), and
ratios are taken between variants measured in the same rounds. The §4 targets
are shown as PASS/MISS for information only: the script never asserts a timing
and exits 0 whatever it measures.
"""

import argparse
import cProfile
import dataclasses
import functools
import gc
import io
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


try:  # the optional `bench` extra
    import flax.struct as flax_struct
    from flax import nnx
except ImportError:
    flax_struct = nnx = None
try:
    import jax_dataclasses as jdc
except ImportError:
    jdc = None

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "latest.json"


# ----------------------------------------------------------------------------------
# Settings


@dataclasses.dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int  # interleaved rounds per comparison (one batch per variant each)
    batch_s: float  # wall time of one batch
    call_sizes: tuple[int, ...]  # dynamic fields of the cache-hit models
    update_sizes: tuple[int, ...]  # array leaves of the update models
    wide_sizes: tuple[int, ...]  # array fields of the one-field-per-leaf models
    first_call_reps: int
    updates: int  # dynamic updates in the compile-count check

    @classmethod
    def make(cls, quick: bool) -> Self:
        if quick:
            return cls(
                quick=True,
                rounds=10,
                batch_s=0.003,
                call_sizes=(100,),
                update_sizes=(100, 10_000),
                wide_sizes=(100,),
                first_call_reps=2,
                updates=100,
            )
        return cls(
            quick=False,
            rounds=30,
            batch_s=0.01,
            call_sizes=(100, 1_000),
            update_sizes=(100, 1_000, 10_000),
            wide_sizes=(100, 1_000, 10_000),
            first_call_reps=5,
            updates=1_000,
        )


# ----------------------------------------------------------------------------------
# Timing


def _batch(fn: Callable[[], Any], n: int, block: bool) -> float:
    """Seconds per call of `n` back-to-back calls, the last output waited for if
    `block` (not for updates: their output is a module, whose flatten would be
    timed too)."""
    out = None
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn()
        if block:
            jax.block_until_ready(out)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    return (t1 - t0) / n


def _calibrate(fn: Callable[[], Any], batch_s: float, block: bool) -> int:
    """Calls per batch so that one batch takes about `batch_s` seconds."""
    for i in range(3):  # warm-up: compiles, caches, memos; never timed
        t0 = time.perf_counter()
        out = fn()
        if block:
            jax.block_until_ready(out)
        # The first call may compile; after it, a call slower than a whole batch
        # (such as `dataclasses.replace` on 10,000 fields) needs no more warm-up.
        if i > 0 and time.perf_counter() - t0 > batch_s:
            return 1
    n = 1
    while True:
        per_call = _batch(fn, n, block)
        if per_call * n >= batch_s / 4 or n >= 1 << 20:
            return max(1, min(1 << 20, round(batch_s / max(per_call, 1e-9))))
        n *= 4


GROUP = 5  # rounds per median in the min-of-medians
SLOW_BUDGET_S = 2.0  # a variant slower than this per round-set stops after GROUP rounds


def compare(
    variants: dict[str, Callable[[], Any]], s: Settings, block: bool = True
) -> dict[str, float]:
    """Seconds per call of each variant: min over groups of `GROUP` interleaved
    rounds of the median batch time in the group."""
    sizes = {name: _calibrate(fn, s.batch_s, block) for name, fn in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    spent = dict.fromkeys(variants, 0.0)
    order = list(variants)
    for r in range(s.rounds):
        random.shuffle(order)
        gc.collect()
        for name in order:
            if r >= GROUP and spent[name] > SLOW_BUDGET_S:
                continue  # such as a quadratic `dataclasses.replace` at 10,000 fields
            per_call = _batch(variants[name], sizes[name], block)
            samples[name].append(per_call)
            spent[name] += per_call * sizes[name]
    return {name: min_of_medians(v) for name, v in samples.items()}


def min_of_medians(v: list[float], group: int = GROUP) -> float:
    """The least median over consecutive groups of `group` samples (a short last
    group is dropped, unless it is the only one): robust to other jobs' bursts."""
    groups = [v[i : i + group] for i in range(0, len(v), group)]
    groups = [g for g in groups if len(g) == group] or groups
    return min(statistics.median(g) for g in groups)


# ----------------------------------------------------------------------------------
# The table


@dataclasses.dataclass
class Row:
    section: str
    case: str
    value: float | None = None  # seconds, a ratio or a count
    unit: str = "s"  # "s" (shown in us or ms), "x" (a ratio) or "count"
    target: str = ""
    status: str = ""  # PASS / MISS / "" (informational) / skipped text
    note: str = ""


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}

    def time(self, section: str, case: str, seconds: float, note: str = "") -> None:
        self.rows.append(Row(section, case, seconds, "s", note=note))

    def ratio(
        self,
        section: str,
        case: str,
        value: float,
        target: str = "",
        ok: bool | None = None,
    ) -> None:
        status = "" if ok is None else ("PASS" if ok else "MISS")
        self.rows.append(Row(section, case, value, "x", target, status))

    def count(
        self, section: str, case: str, value: int | None, target: str, ok: bool | None
    ) -> None:
        status = "n/a" if value is None else ("PASS" if ok else "MISS")
        self.rows.append(Row(section, case, value, "count", target, status))

    def skip(self, section: str, case: str, why: str) -> None:
        self.rows.append(Row(section, case, None, "", "", why))

    def render(self) -> str:
        lines = []
        header = f"{'case':<66} {'value':>12}  {'target':<14} {'status':<8}"
        section = None
        for r in self.rows:
            if r.section != section:
                section = r.section
                lines += ["", f"== {section} ==", header, "-" * len(header)]
            line = f"{r.case:<66} {_fmt(r):>12}  {r.target:<14} {r.status:<8}"
            lines.append(f"{line} {r.note}".rstrip())
        return "\n".join(lines)


def _fmt(r: Row) -> str:
    if r.value is None:
        return "-"
    if r.unit == "s":
        v = r.value * 1e6
        return f"{v:,.1f} us" if v < 10_000 else f"{v / 1e3:,.1f} ms"
    if r.unit == "x":
        return f"{r.value:,.2f}x" if r.value >= 0.1 else f"{r.value:.2g}x"
    return str(r.value)


# ----------------------------------------------------------------------------------
# Models


def make_seed(counter: list[int] | None = None) -> tuple[type, type]:
    """Fresh `Parent`/`Child` classes of DESIGN §2 (fresh classes: a cold cache).

    `counter[0]` counts traces of `__call__`'s body."""
    counter = counter if counter is not None else [0]

    class Parent(es.Module):
        dp: float
        sp: bool = eqx.field(static=True)

        @es.jit
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


def arrays(n: int, shape: tuple[int, ...] = (4,)) -> list[jax.Array]:
    """`n` distinct small float32 arrays, placed in one batched transfer."""
    return jax.device_put([np.full(shape, i, np.float32) for i in range(n)])


def make_sum_model(n: int, counter: list[int] | None = None) -> es.Module:
    """An `es.Module` with dynamic array fields f0..f{n-1}; `m(x)` sums them times x."""
    counter = counter if counter is not None else [0]
    names = tuple(f"f{i}" for i in range(n))

    def call(self, x):
        counter[0] += 1
        total = getattr(self, names[0])
        for name in names[1:]:
            total = total + getattr(self, name)
        return total * x

    cls = type(
        f"Sum{n}",
        (es.Module,),
        {
            "__annotations__": dict.fromkeys(names, jax.Array),
            "__call__": es.jit(call),
            "__module__": __name__,
        },
    )
    return cls(**dict(zip(names, arrays(n), strict=True)))


class Nested(es.Module):
    """`n` array leaves: one field `f0`, the others in a tuple; one static flag."""

    f0: jax.Array
    rest: tuple[jax.Array, ...]
    flag: bool = eqx.field(static=True)


@dataclasses.dataclass(frozen=True)
class PlainNested:
    f0: jax.Array
    rest: tuple[jax.Array, ...]
    flag: bool


def make_wide(n: int) -> tuple[es.Module, Any]:
    """An `es.Module` with `n` array fields and a static flag, and a plain frozen
    dataclass instance with the same fields."""
    names = [f"f{i}" for i in range(n)]
    ann = {**dict.fromkeys(names, jax.Array), "flag": bool}
    cls = type(
        f"Wide{n}",
        (es.Module,),
        {
            "__annotations__": ann,
            "flag": eqx.field(static=True),
            "__module__": __name__,
        },
    )
    plain = dataclasses.make_dataclass(f"PlainWide{n}", list(ann.items()), frozen=True)
    values = {**dict(zip(names, arrays(n), strict=True)), "flag": False}
    return cls(**values), plain(**values)


# ----------------------------------------------------------------------------------
# 1. Cache-hit call overhead


def bench_calls(rep: Report, s: Settings) -> None:
    sec = "1. cache-hit call overhead"
    _, child_cls = make_seed()
    m = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    w = WorkaroundChild(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    raw = jax.jit(lambda m, x: m(x))
    fj = eqx.filter_jit(lambda m, x: m(x))
    t = compare(
        {
            "es.jit": lambda: m(x),
            "jax.jit": lambda: raw(m, x),
            "filter_jit": lambda: fj(m, x),
            "workaround": lambda: w(x),
        },
        s,
    )
    rep.raw["calls_child"] = t
    rep.time(sec, "Child: es.jit  m(x)", t["es.jit"])
    rep.time(sec, "Child: jax.jit(lambda m, x: m(x))", t["jax.jit"])
    rep.time(sec, "Child: eqx.filter_jit(lambda m, x: m(x))", t["filter_jit"])
    rep.time(
        sec, "Child: seed workaround (dataclass + jax.jit per call)", t["workaround"]
    )
    r1 = t["es.jit"] / t["jax.jit"]
    r2 = t["filter_jit"] / t["es.jit"]
    rep.ratio(sec, "Child: es.jit / jax.jit", r1, "<= 1.00x", r1 <= 1.0)
    rep.ratio(sec, "Child: filter_jit / es.jit (speed-up)", r2, ">= 4.00x", r2 >= 4.0)
    rep.ratio(
        sec, "Child: workaround / es.jit (speed-up)", t["workaround"] / t["es.jit"]
    )

    checked = _checked_and_unchecked()
    if checked is None:
        rep.skip(sec, "jaxtyped method: checked / unchecked", "skipped: no beartype")
    else:
        t = compare(checked, s)
        rep.raw["calls_jaxtyped"] = t
        rep.time(sec, "jaxtyped method (@es.jit over @jaxtyped)", t["checked"])
        rep.time(sec, "same method, unchecked", t["unchecked"])
        r = t["checked"] / t["unchecked"]
        rep.ratio(sec, "jaxtyped hit / unchecked hit", r, "~1.00x (no check)")

    for n in s.call_sizes:
        t = compare(_sum_call_variants(make_sum_model(n)), s)
        rep.raw[f"calls_sum{n}"] = t
        rep.time(sec, f"{n} fields: es.jit", t["es.jit"])
        rep.time(sec, f"{n} fields: jax.jit", t["jax.jit"])
        rep.time(sec, f"{n} fields: filter_jit", t["filter_jit"])
        rep.ratio(sec, f"{n} fields: es.jit / jax.jit", t["es.jit"] / t["jax.jit"])
        rep.ratio(
            sec, f"{n} fields: filter_jit / es.jit", t["filter_jit"] / t["es.jit"]
        )


def _checked_and_unchecked() -> dict[str, Callable[[], Any]] | None:
    """A cache-hit call of a method whose annotations jaxtyping checks while tracing,
    next to the same method without the check: a hit runs no check at all."""
    try:
        from beartype import beartype
    except ImportError:
        return None
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
    return {"checked": lambda: c(x), "unchecked": lambda: u(x)}


def _sum_call_variants(big: es.Module) -> dict[str, Callable[[], Any]]:
    x = jnp.ones((4,), jnp.float32)
    raw = jax.jit(lambda m, x: m(x))
    fj = eqx.filter_jit(lambda m, x: m(x))
    return {
        "es.jit": lambda: big(x),
        "jax.jit": lambda: raw(big, x),
        "filter_jit": lambda: fj(big, x),
    }


# ----------------------------------------------------------------------------------
# 2. Alternatives (optional `bench` extra)


def bench_alternatives(rep: Report, s: Settings) -> None:
    sec = "2. alternatives (cache-hit call, Child's fields)"
    _, child_cls = make_seed()
    m = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    raw = jax.jit(lambda m, x: m(x))
    variants: dict[str, Callable[[], Any]] = {
        "es.jit": lambda: m(x),
        "jax.jit": lambda: raw(m, x),
    }
    labels = {
        "flax.struct": "jax.jit on a flax.struct.dataclass method",
        "jdc": "jax.jit on a jax_dataclasses.pytree_dataclass method",
        "nnx": "nnx.jit on a flax.nnx.Module method",
    }
    makers = {"flax.struct": _flax_struct_child, "jdc": _jdc_child, "nnx": _nnx_child}
    installed = {"flax.struct": flax_struct, "jdc": jdc, "nnx": nnx}
    skipped: dict[str, str] = {}
    for key, make in makers.items():
        if installed[key] is None:
            skipped[key] = "skipped: not installed"
            continue
        try:  # an API change in an optional library must not stop the run
            call = make()
            jax.block_until_ready(call(x))
        except Exception as e:
            skipped[key] = f"skipped: {type(e).__name__}: {e}"[:120]
        else:
            variants[key] = functools.partial(call, x)

    t = compare(variants, s)
    rep.raw["calls_alternatives"] = t
    rep.time(sec, "es.jit (Child)", t["es.jit"])
    rep.time(sec, "jax.jit(lambda m, x: m(x)) on Child", t["jax.jit"])
    for key, label in labels.items():
        if key in skipped:
            rep.skip(sec, label, skipped[key])
            continue
        rep.time(sec, label, t[key])
        rep.ratio(sec, f"  {key} / jax.jit on Child", t[key] / t["jax.jit"])
        rep.ratio(sec, f"  es.jit / {key}", t["es.jit"] / t[key])


def _flax_struct_child() -> Callable[[jax.Array], Any]:
    """`x -> jax.jit(FlaxChild.__call__)(m, x)` on a `flax.struct` Child."""

    @flax_struct.dataclass
    class FlaxChild:
        dp: float
        dc: float
        sp: bool = flax_struct.field(pytree_node=False)
        sc: bool = flax_struct.field(pytree_node=False)

        def __call__(self, x):
            y = self.dc * x if self.sc else x
            return self.dp * y if self.sp else y

    m = FlaxChild(dp=2.0, sp=True, dc=3.0, sc=True)
    call = jax.jit(FlaxChild.__call__)
    return lambda x: call(m, x)


def _jdc_child() -> Callable[[jax.Array], Any]:
    """`x -> jax.jit(JdcChild.__call__)(m, x)` on a `jax_dataclasses` Child."""

    @jdc.pytree_dataclass
    class JdcChild:
        dp: float
        dc: float
        sp: jdc.Static[bool]
        sc: jdc.Static[bool]

        def __call__(self, x):
            y = self.dc * x if self.sc else x
            return self.dp * y if self.sp else y

    m = JdcChild(dp=2.0, sp=True, dc=3.0, sc=True)
    call = jax.jit(JdcChild.__call__)
    return lambda x: call(m, x)


def _nnx_child() -> Callable[[jax.Array], Any]:
    """`x -> m(x)` on a `flax.nnx` Child whose `__call__` is under `nnx.jit`."""

    class NnxChild(nnx.Module):
        def __init__(self, dp: float, sp: bool, dc: float, sc: bool):
            self.dp = nnx.Param(jnp.asarray(dp))
            self.dc = nnx.Param(jnp.asarray(dc))
            self.sp = sp
            self.sc = sc

        @nnx.jit
        def __call__(self, x):
            y = self.dc[...] * x if self.sc else x
            return self.dp[...] * y if self.sp else y

    return NnxChild(dp=2.0, sp=True, dc=3.0, sc=True)


# ----------------------------------------------------------------------------------
# 3. Update cost


def _edit_f0(m: Any, new: Any) -> Any:
    with es.edit(m) as m2:
        m2.f0 = new
    return m2


def _update_variants(m: Any, plain: Any, new: jax.Array) -> dict[str, Callable]:
    """One-field updates of the module `m` and of the plain dataclass `plain`."""
    return {
        "with_dynamic": lambda: m.with_dynamic(f0=new),
        "with_static": lambda: m.with_static(flag=True),
        "es.edit": lambda: _edit_f0(m, new),
        "eqx.tree_at": lambda: eqx.tree_at(lambda t: t.f0, m, new),
        "dataclasses.replace (plain)": lambda: dataclasses.replace(plain, f0=new),
    }


def _alt_updaters(leaves: list[jax.Array], new: jax.Array) -> dict[str, Callable]:
    """flax.struct `.replace` and `jax_dataclasses.copy_and_mutate`, when installed."""
    out: dict[str, Callable] = {}
    if flax_struct is not None:

        @flax_struct.dataclass
        class FlaxNested:
            f0: jax.Array
            rest: tuple
            flag: bool = flax_struct.field(pytree_node=False)

        fm = FlaxNested(leaves[0], tuple(leaves[1:]), False)
        out["flax .replace"] = lambda: fm.replace(f0=new)
    if jdc is not None:

        @jdc.pytree_dataclass
        class JdcNested:
            f0: jax.Array
            rest: tuple
            flag: jdc.Static[bool]

        jm = JdcNested(leaves[0], tuple(leaves[1:]), False)

        def copy_and_mutate() -> Any:
            with jdc.copy_and_mutate(jm) as m2:
                m2.f0 = new
            return m2

        out["jdc copy_and_mutate"] = copy_and_mutate
    return out


def bench_updates(rep: Report, s: Settings) -> None:
    sec = "3. update cost (one field), nested layout: f0 + tuple of n-1 arrays"
    wd: dict[int, float] = {}
    for n in s.update_sizes:
        leaves = arrays(n)
        new = leaves[0] + 1
        m = Nested(f0=leaves[0], rest=tuple(leaves[1:]), flag=False)
        p = PlainNested(f0=leaves[0], rest=tuple(leaves[1:]), flag=False)
        variants = _update_variants(m, p, new)
        alt = _alt_updaters(leaves, new)
        variants.update(alt)
        t = compare(variants, s, block=False)
        rep.raw[f"updates_nested{n}"] = t
        for name in variants:
            rep.time(sec, f"{n:>6} leaves: {name}", t[name])
        for name in ("flax .replace", "jdc copy_and_mutate"):
            if name not in alt:
                rep.skip(sec, f"{n:>6} leaves: {name}", "skipped: not installed")
        wd[n] = t["with_dynamic"]
        r = t["with_dynamic"] / t["dataclasses.replace (plain)"]
        big = n >= 10_000
        rep.ratio(
            sec, f"{n:>6} leaves: with_dynamic / dataclasses.replace", r,
            "<= 5.00x" if big else "", (r <= 5.0) if big else None,
        )  # fmt: skip
        r = t["eqx.tree_at"] / t["with_dynamic"]
        rep.ratio(
            sec, f"{n:>6} leaves: tree_at / with_dynamic (speed-up)", r,
            ">= 1000x" if big else "", (r >= 1000) if big else None,
        )  # fmt: skip
        rep.ratio(
            sec,
            f"{n:>6} leaves: es.edit / with_dynamic",
            t["es.edit"] / t["with_dynamic"],
        )
    lo, hi = min(wd), max(wd)
    if hi > lo:
        r = wd[hi] / wd[lo]
        rep.ratio(
            sec, f"with_dynamic({hi}) / with_dynamic({lo})", r, "<= 2.00x", r <= 2.0
        )
    rep.raw["with_dynamic_by_size"] = wd

    sec = "3b. update cost, wide layout: n array fields (informational)"
    for n in s.wide_sizes:
        m, p = make_wide(n)
        new = m.f0 + 1
        variants = _update_variants(m, p, new)
        t = compare(variants, s, block=False)
        rep.raw[f"updates_wide{n}"] = t
        for name in variants:
            rep.time(sec, f"{n:>6} fields: {name}", t[name])
        rep.ratio(
            sec, f"{n:>6} fields: with_dynamic / dataclasses.replace",
            t["with_dynamic"] / t["dataclasses.replace (plain)"],
        )  # fmt: skip
        rep.ratio(
            sec, f"{n:>6} fields: tree_at / with_dynamic (speed-up)",
            t["eqx.tree_at"] / t["with_dynamic"],
        )  # fmt: skip


# ----------------------------------------------------------------------------------
# 4. Compile counts


def bench_compiles(rep: Report, s: Settings) -> None:
    sec = "4. compile counts (misses / traces of the body)"
    # The seed sequence, DESIGN §5.
    traces = [0]
    _, child_cls = make_seed(traces)
    c = child_cls(dp=2.0, sp=False, dc=3.0, sc=False)
    x = jnp.array(1.5)
    ok = True
    steps = [
        lambda c: c,
        lambda c: c.with_static(sp=True),
        lambda c: c.with_static(sc=True),
        lambda c: c.with_dynamic(dp=3.0),
        lambda c: c.with_dynamic(dc=4.0),
    ]
    for step in steps:
        c = step(c)
        eager = (c.dc * 1.5 if c.sc else 1.5) * (c.dp if c.sp else 1.0)
        for _ in range(2):
            ok = ok and bool(jnp.allclose(c(x), eager))
    misses = child_cls.__call__.cache_info().misses
    rep.raw["seed_sequence"] = {"misses": misses, "traces": traces[0], "results_ok": ok}
    good = misses == 3 and traces[0] == 3 and ok
    rep.count(
        sec, f"seed sequence: misses={misses} traces={traces[0]}", misses, "3", good
    )
    if not ok:
        rep.rows[-1].note = "results differ from eager arithmetic"

    # Dynamic updates and calls.
    traces = [0]
    _, child_cls = make_seed(traces)
    c = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    for i in range(s.updates):
        c = c.with_dynamic(dp=float(i), dc=float(i) / 2)
        c(x)
    misses = child_cls.__call__.cache_info().misses
    rep.raw["dynamic_updates"] = {
        "updates": s.updates,
        "misses": misses,
        "traces": traces[0],
    }
    rep.count(
        sec, f"{s.updates} with_dynamic + call: misses={misses} traces={traces[0]}",
        misses, "1", misses == 1 and traces[0] == 1,
    )  # fmt: skip

    # Relevance: flipping an unread static field with depends_on="auto".
    flips = 10
    try:
        extra = _auto_flips(flips)
    except Exception as e:  # depends_on="auto" not supported
        rep.raw["auto_flips"] = {"error": f"{type(e).__name__}: {e}"}
        case = f'depends_on="auto", {flips} flips of unread static'
        rep.count(sec, case, None, "0 extra", None)
        rep.rows[-1].note = f"{type(e).__name__}: {e}"[:100]
        return
    misses, traces_n, ok = extra
    rep.raw["auto_flips"] = {
        "flips": flips,
        "extra_misses": misses,
        "extra_traces": traces_n,
        "results_ok": ok,
    }
    rep.count(
        sec, f'depends_on="auto", {flips} flips of unread static: extra={misses} traces={traces_n}',
        misses, "0 extra", misses == 0 and traces_n == 0 and ok,
    )  # fmt: skip
    if not ok:
        rep.rows[-1].note = "results differ from the default setting"


def _auto_flips(flips: int) -> tuple[int, int, bool]:
    """Extra misses and traces after the first call, flipping a static field that the
    method never reads, and whether every result was right."""
    traces = [0]

    class Auto(es.Module):
        scale: float
        square: bool = eqx.field(static=True)
        unread: bool = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def __call__(self, x):
            traces[0] += 1
            return self.scale * (x * x if self.square else x)

    m = Auto(scale=2.0, square=True, unread=False)
    x = jnp.array(1.5)
    m(x)
    base_misses, base_traces = Auto.__call__.cache_info().misses, traces[0]
    ok = True
    for _ in range(flips):
        m = m.with_static(unread=not m.unread)
        ok = ok and float(m(x)) == 2.0 * 1.5 * 1.5
    extra = Auto.__call__.cache_info().misses - base_misses
    return extra, traces[0] - base_traces, ok


# ----------------------------------------------------------------------------------
# 5. First-call cost


def _first_call_classes(n: int) -> tuple[Any, Any, jax.Array]:
    """Two instances of fresh classes whose `__call__` is the same (fresh) body under
    `es.jit` and under `eqx.filter_jit`: cold caches on both."""
    names = tuple(f"f{i}" for i in range(n))

    def body(self, x):
        total = getattr(self, names[0])
        for name in names[1:]:
            total = total + getattr(self, name)
        return total * x

    values = dict(zip(names, arrays(n), strict=True))
    ann = dict.fromkeys(names, jax.Array)
    made = []
    for wrap in (es.jit, eqx.filter_jit):
        cls = type(
            "FirstCall",
            (es.Module,),
            {"__annotations__": ann, "__call__": wrap(body), "__module__": __name__},
        )
        made.append(cls(**values))
    return made[0], made[1], jnp.ones((4,), jnp.float32)


def _first_call_seed() -> tuple[Any, Any, jax.Array]:
    def body(self, x):
        y = self.dc * x if self.sc else x
        return self.dp * y if self.sp else y

    made = []
    for wrap in (es.jit, eqx.filter_jit):

        class FirstChild(es.Module):
            dp: float
            dc: float
            sp: bool = eqx.field(static=True)
            sc: bool = eqx.field(static=True)
            __call__ = wrap(body)

        made.append(FirstChild(dp=2.0, dc=3.0, sp=True, sc=True))
    return made[0], made[1], jnp.array(1.5)


def bench_first_call(rep: Report, s: Settings) -> None:
    sec = "5. first call (trace + compile), median of fresh classes"
    cases: list[tuple[str, Callable[[], tuple[Any, Any, jax.Array]]]] = [
        ("Child", _first_call_seed),
        ("100 fields", lambda: _first_call_classes(100)),
    ]
    for label, make in cases:
        times: dict[str, list[float]] = {"es.jit": [], "filter_jit": []}
        for _ in range(s.first_call_reps + 1):  # the first repetition warms JAX up
            a, b, x = make()
            pair = [("es.jit", a), ("filter_jit", b)]
            random.shuffle(pair)
            for name, m in pair:
                t0 = time.perf_counter()
                jax.block_until_ready(m(x))
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        rep.raw[f"first_call_{label}"] = med
        rep.time(sec, f"{label}: es.jit first call", med["es.jit"])
        rep.time(sec, f"{label}: eqx.filter_jit first call", med["filter_jit"])
        rep.ratio(
            sec, f"{label}: es.jit / filter_jit", med["es.jit"] / med["filter_jit"]
        )


# ----------------------------------------------------------------------------------
# Profiling (--profile)


@contextmanager
def _profiled(title: str, out: list[str]) -> Iterator[None]:
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        out.append(f"--- {title} ---\n{buf.getvalue()}")


def profile_hot_paths() -> str:
    """cProfile of the §4 hot paths: a cache-hit call and the update helpers."""
    out: list[str] = []
    _, child_cls = make_seed()
    m = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    m(x)
    n = 20_000
    with _profiled(f"es.jit cache hit on Child, {n} calls", out):
        for _ in range(n):
            m(x)
    leaves = arrays(10_000)
    nested = Nested(f0=leaves[0], rest=tuple(leaves[1:]), flag=False)
    new = leaves[0] + 1
    with _profiled("with_dynamic, 10,000 leaves, 20,000 calls", out):
        for _ in range(20_000):
            nested.with_dynamic(f0=new)
    with _profiled("es.edit, 10,000 leaves, 200 calls", out):
        for _ in range(200):
            _edit_f0(nested, new)
    return "\n".join(out)


# ----------------------------------------------------------------------------------
# Main


def _git_state() -> str | None:
    """The commit measured, with "+dirty" if the package has uncommitted changes."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--", "eqx_static")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    return {
        "git": _git_state(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "jax_backend": jax.default_backend(),
        "versions": {
            p: version(p)
            for p in (
                "jax",
                "jaxlib",
                "equinox",
                "eqx_static",
                "flax",
                "jax_dataclasses",
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test (< 30 s)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="output JSON path"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the hot paths")
    args = parser.parse_args(argv)
    s = Settings.make(args.quick)
    random.seed(0)

    info = machine()
    v = info["versions"]
    print(
        f"machine: {info['platform']}, {info['cpu_count']} CPUs, python {info['python']}, "
        f"jax {v['jax']} ({info['jax_backend']}), equinox {v['equinox']}, "
        f"eqx_static {v['eqx_static']}, flax {v['flax']}, jax_dataclasses {v['jax_dataclasses']}"
    )
    print(
        f"mode: {'quick' if s.quick else 'full'}; {s.rounds} rounds of "
        f"{s.batch_s * 1e3:.0f} ms batches; eqx_static at git {info['git']}"
    )

    rep = Report()
    start = time.perf_counter()
    sections: list[tuple[str, Callable[[Report, Settings], None]]] = [
        ("calls", bench_calls),
        ("alternatives", bench_alternatives),
        ("updates", bench_updates),
        ("compiles", bench_compiles),
        ("first_call", bench_first_call),
    ]
    durations = {}
    for name, fn in sections:
        t0 = time.perf_counter()
        fn(rep, s)
        durations[name] = time.perf_counter() - t0
    total = time.perf_counter() - start

    print(rep.render())
    misses = [r.case for r in rep.rows if r.status == "MISS"]
    passes = sum(r.status == "PASS" for r in rep.rows)
    print(
        f"\n§4 targets: {passes} PASS, {len(misses)} MISS (informational; exit code 0)"
    )
    print(
        f"wall time: {total:.1f} s ({', '.join(f'{k} {v:.1f}s' for k, v in durations.items())})"
    )

    profile = profile_hot_paths() if args.profile else None
    if profile:
        print("\n" + profile)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": info,
        "mode": "quick" if s.quick else "full",
        "settings": dataclasses.asdict(s),
        "wall_seconds": total,
        "section_seconds": durations,
        "rows": [dataclasses.asdict(r) for r in rep.rows],
        "raw_seconds": rep.raw,
        "profile": profile,
    }
    args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
