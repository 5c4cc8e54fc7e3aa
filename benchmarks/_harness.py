"""Timing, rows and the JSON record shared by every benchmark group.

Method (see benchmarks/README.md):

- every timed callable is warmed up first (compiles, caches); warm-up is
  never timed;
- the variants of one comparison are timed in interleaved rounds, a random order per
  round, one batch per variant per round, each batch sized to a fixed wall time, the
  garbage collector off inside a batch;
- a call batch ends with `jax.block_until_ready` on its last output (the CPU stream
  runs in order); update batches are not blocked (their output is a module, and
  blocking would flatten it);
- a variant's time is the min-of-medians: the least, over groups of `GROUP`
  consecutive rounds, of the median per-call time in the group. Ratios are taken
  between variants timed in the same rounds of the same process.

"Fresh" variants get a new module for every call, made before the batch (not
timed) by `jax.tree.map(lambda a: a, m)` or a jitted `eqx.apply_updates` with zero
updates, as a training loop makes them; each is dropped right after its call, so
its deallocation (and anything keyed on its lifetime) is timed as in a loop.
"""

import cProfile
import dataclasses
import gc
import io
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import jax


HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# ----------------------------------------------------------------------------------
# Settings


@dataclasses.dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int  # interleaved rounds per comparison (one batch per variant each)
    batch_s: float  # wall time of one batch
    call_sizes: tuple[int, ...]  # array leaves of the cache-hit models
    update_sizes: tuple[int, ...]  # array leaves of the nested update models
    wide_sizes: tuple[int, ...]  # array fields of the wide update models
    memory_sizes: tuple[int, ...]  # array leaves of the memory rows (and the Child)
    edit_modules: int  # nested modules of the es.edit row
    updates: int  # dynamic updates in the compile-count check
    first_call_reps: int
    static_tuple: int  # elements of the big static tuple
    static_tuple_reps: int
    live_k: int  # live instances in the memory row

    @classmethod
    def make(cls, quick: bool) -> Self:
        if quick:
            return cls(
                quick=True,
                rounds=5,
                batch_s=0.002,
                call_sizes=(100,),
                update_sizes=(100, 10_000),
                wide_sizes=(100, 1_000),
                memory_sizes=(100,),
                edit_modules=1_000,
                updates=100,
                first_call_reps=1,
                static_tuple=100_000,
                static_tuple_reps=1,
                live_k=50,
            )
        return cls(
            quick=False,
            rounds=20,
            batch_s=0.01,
            call_sizes=(10, 100, 1_000, 10_000),
            update_sizes=(100, 1_000, 10_000),
            wide_sizes=(100, 1_000, 10_000),
            memory_sizes=(100, 1_000),
            edit_modules=1_000,
            updates=1_000,
            first_call_reps=5,
            static_tuple=1_000_000,
            static_tuple_reps=3,
            live_k=500,
        )


# ----------------------------------------------------------------------------------
# Timing


@dataclasses.dataclass(frozen=True)
class Variant:
    """`call(arg)` timed; `arg` is `make()` (untimed, before the batch), one per
    call. Without `make`, `call()` is timed with no argument."""

    call: Callable[..., Any]
    make: Callable[[], Any] | None = None


def same(call: Callable[[Any], Any], m: Any) -> Variant:
    """The same instance on every call (through the same loop as `fresh`)."""
    return Variant(call, lambda: m)


def fresh(call: Callable[[Any], Any], make: Callable[[], Any]) -> Variant:
    """A new instance on every call, made by `make` outside the timed loop."""
    return Variant(call, make)


def _as_variant(v: Variant | Callable[[], Any]) -> Variant:
    return v if isinstance(v, Variant) else Variant(v)


def _batch(v: Variant, n: int, block: bool) -> float:
    """Seconds per call of `n` back-to-back calls."""
    out = None
    if v.make is None:
        fn = v.call
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
    pool = [v.make() for _ in range(n)]
    call = v.call
    gc.disable()
    try:
        t0 = time.perf_counter()
        for i in range(n):
            out = call(pool[i])
            pool[i] = None  # a loop drops the previous module: time that too
        if block:
            jax.block_until_ready(out)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    return (t1 - t0) / n


def _calibrate(v: Variant, batch_s: float, block: bool) -> int:
    """Calls per batch so that one batch takes about `batch_s` seconds."""
    for i in range(3):  # warm-up, never timed
        t0 = time.perf_counter()
        _batch(v, 1, block)
        # After the first two calls (the first may compile; `es.jit` makes a key's
        # guard at its second call), a call slower than a whole batch needs no more
        # warm-up.
        if i > 1 and time.perf_counter() - t0 > batch_s:
            return 1
    n = 1
    while True:
        per_call = _batch(v, n, block)
        if per_call * n >= batch_s / 4 or n >= 1 << 18:
            return max(1, min(1 << 18, round(batch_s / max(per_call, 1e-9))))
        n *= 4


GROUP = 5  # rounds per median in the min-of-medians
SLOW_BUDGET_S = 2.0  # a variant slower than this over its rounds stops after GROUP


def compare(
    variants: dict[str, Variant | Callable[[], Any]],
    s: Settings,
    block: bool = True,
    raw: dict[str, Any] | None = None,
    key: str = "",
) -> dict[str, float]:
    """Seconds per call of each variant: min over groups of `GROUP` interleaved
    rounds of the median batch time in the group. The per-round samples go to
    `raw[key]` if given."""
    vs = {name: _as_variant(v) for name, v in variants.items()}
    sizes = {name: _calibrate(v, s.batch_s, block) for name, v in vs.items()}
    samples: dict[str, list[float]] = {name: [] for name in vs}
    spent = dict.fromkeys(vs, 0.0)
    order = list(vs)
    for r in range(s.rounds):
        random.shuffle(order)
        gc.collect()
        for name in order:
            if r >= GROUP and spent[name] > SLOW_BUDGET_S:
                continue  # such as a quadratic `dataclasses.replace` at 10,000 fields
            per_call = _batch(vs[name], sizes[name], block)
            samples[name].append(per_call)
            spent[name] += per_call * sizes[name]
    out = {name: min_of_medians(v) for name, v in samples.items()}
    if raw is not None:
        raw[key] = {"per_call_s": out, "samples_s": samples, "batch_calls": sizes}
    return out


def min_of_medians(v: list[float], group: int = GROUP) -> float:
    """The least median over consecutive groups of `group` samples (a short last
    group is dropped unless it is the only one): robust to other jobs' bursts."""
    groups = [v[i : i + group] for i in range(0, len(v), group)]
    groups = [g for g in groups if len(g) == group] or groups
    return min(statistics.median(g) for g in groups)


def median_time(fn: Callable[[], Any], reps: int, warm: int = 2) -> float:
    """Median wall time of `reps` blocked calls after `warm` untimed ones (for calls
    too slow to batch, such as hashing a 10^6-element static tuple; two, since
    `es.jit` makes a key's guard at its second call)."""
    for _ in range(warm):
        jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------------
# Rows


@dataclasses.dataclass
class Row:
    """One line of the table and of the JSON.

    `values` maps a variant label to seconds per call (unit "s"), a count ("count")
    or bytes ("bytes"); `ratio` is `values[num] / values[den]` where the row is a
    comparison; `target` is the performance target, as an operator and a number applied to the
    ratio (or to the count), and `meets_target` says whether it holds (None: no
    target, or not measured)."""

    group: str
    key: str  # stable id, used by the table of docs/benchmarks.md
    name: str
    instance: str | None = None  # "fresh", "same", or None (not a call)
    values: dict[str, float | None] = dataclasses.field(default_factory=dict)
    unit: str = "s"
    ratio: float | None = None
    ratio_of: str | None = None  # "num / den", labels in `values`
    target_op: str | None = None  # "<=", ">=", "=="
    target_value: float | None = None
    target: str | None = None  # as printed, e.g. "<= 1.00x"
    meets_target: bool | None = None
    readme: bool = False  # shown in the table of docs/benchmarks.md (once the README's)
    note: str = ""
    margin: float | None = None  # `values[num] - values[den]`, for a margin row


def _target_text(op: str, value: float, unit: str) -> str:
    if unit == "x":
        return f"{op} {value:g}x"
    return f"{op} {value:g}"


def _check(op: str, value: float, target: float) -> bool:
    return {"<=": value <= target, ">=": value >= target, "==": value == target}[op]


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def compare_row(
        self,
        group: str,
        key: str,
        name: str,
        t: dict[str, float],
        num: str,
        den: str,
        instance: str | None = None,
        target: tuple[str, float] | None = None,
        readme: bool | None = None,
        note: str = "",
        unit: str = "s",
        ratio: float | None = None,
    ) -> Row:
        """A ratio `t[num] / t[den]` (or `ratio`, measured otherwise: the median of
        per-round ratios) with both values, and its target if any."""
        r = t[num] / t[den] if ratio is None else ratio
        row = Row(
            group,
            key,
            name,
            instance,
            {num: t[num], den: t[den]},
            unit,
            r,
            f"{num} / {den}",
            note=note,
            readme=bool(target) if readme is None else readme,
        )
        if target is not None:
            op, value = target
            row.target_op, row.target_value = op, value
            row.target = _target_text(op, value, "x")
            row.meets_target = _check(op, r, value)
        return self.add(row)

    def margin_row(
        self,
        group: str,
        key: str,
        name: str,
        t: dict[str, float],
        num: str,
        den: str,
        instance: str,
        target_us: float | None,
    ) -> Row:
        """A difference `t[num] - t[den]`, judged against at most `target_us` µs
        (None: shown, not judged)."""
        margin = t[num] - t[den]
        judged = target_us is not None
        row = Row(
            group, key, name, instance, {num: t[num], den: t[den]}, "s",
            ratio_of=f"{num} - {den}", target_op="<=" if judged else None,
            target_value=target_us, target=f"<= +{target_us:g} us" if judged else None,
            meets_target=margin * 1e6 <= target_us if judged else None,
            readme=True, margin=margin,
        )  # fmt: skip
        return self.add(row)

    def count_row(
        self,
        group: str,
        key: str,
        name: str,
        values: dict[str, float | None],
        target: tuple[str, float],
        judged: tuple[str, ...],
        ok_extra: bool = True,
        note: str = "",
    ) -> Row:
        """Counts (compiles) judged against one target: every label in `judged`
        must meet it, and `ok_extra` (results correct) must hold."""
        op, value = target
        measured = [values[k] for k in judged]
        meets = (
            None
            if any(v is None for v in measured)
            else all(_check(op, v, value) for v in measured if v is not None)
            and ok_extra
        )
        return self.add(
            Row(
                group,
                key,
                name,
                None,
                values,
                "count",
                target_op=op,
                target_value=value,
                target=_target_text(op, value, "count"),
                meets_target=meets,
                readme=True,
                note=note,
            )
        )

    def info_row(
        self,
        group: str,
        key: str,
        name: str,
        values: dict[str, float | None],
        unit: str = "s",
        instance: str | None = None,
        readme: bool = False,
        note: str = "",
    ) -> Row:
        return self.add(
            Row(group, key, name, instance, values, unit, readme=readme, note=note)
        )

    def skip_row(self, group: str, key: str, name: str, why: str) -> Row:
        return self.add(Row(group, key, name, values={}, unit="", note=why))


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "s":
        us = v * 1e6
        if us < 10_000:
            return f"{us:,.1f} us"
        return f"{us / 1e3:,.1f} ms" if us < 10_000_000 else f"{v:,.1f} s"
    if unit == "bytes":
        return f"{v:,.0f} B"
    if unit == "count":
        return f"{v:g}"
    return f"{v:,.2f}"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return ""
    if r >= 100:
        return f"{r:,.0f}x"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def status(row: Row) -> str:
    if row.meets_target is None:
        return "n/a" if row.target else ""
    return "PASS" if row.meets_target else "MISS"


def render(rows: list[Row]) -> str:
    """The console table: one line per row, grouped."""
    lines: list[str] = []
    group = None
    header = f"{'measurement':<62} {'inst.':<6} {'values':<34} {'ratio':>9}  {'target':<10} {'':<4}"
    for r in rows:
        if r.group != group:
            group = r.group
            lines += ["", f"== {group} ==", header, "-" * len(header)]
        vals = " / ".join(fmt_value(v, r.unit) for v in r.values.values())
        shown = fmt_ratio(r.ratio) if r.margin is None else f"{r.margin * 1e6:+.1f} us"
        line = (
            f"{r.name:<62} {r.instance or '':<6} {vals:<34} {shown:>9}  "
            f"{r.target or '':<10} {status(r):<4}"
        )
        lines.append(f"{line} {r.note}".rstrip())
    return "\n".join(lines)


# ----------------------------------------------------------------------------------
# Machine, profile


def _git_state() -> str | None:
    """The commit measured, "+dirty" if `eqx_static/` has uncommitted changes and
    the package was imported from this work tree."""
    import eqx_static

    root = HERE.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        pkg = Path(eqx_static.__file__).resolve().parent
        if pkg.is_relative_to(root):
            dirty = git("status", "--porcelain", "eqx_static")
            return head + ("+dirty" if dirty else "")
        # Imported from elsewhere (such as an export of HEAD): compare the blobs.
        tree = git("ls-tree", "HEAD", "eqx_static/").splitlines()
        committed = {ln.split("\t")[1].split("/")[-1]: ln.split()[2] for ln in tree}
        files = sorted(p.name for p in pkg.iterdir() if p.is_file())
        blobs = git("hash-object", *(str(pkg / f) for f in files)).split()
        if dict(zip(files, blobs, strict=True)) == committed:
            return head
        return f"{head} (eqx_static imported from {pkg})"
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
        "date": time.strftime("%Y-%m-%d"),
        "system": platform.system(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "machine": platform.machine(),
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
                "optax",
                "flax",
                "jax_dataclasses",
                "matplotlib",
            )
        },
    }


@contextmanager
def profiled(title: str, out: list[str], limit: int = 18) -> Iterator[None]:
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(limit)
        text = buf.getvalue()
        text = text[text.find("ncalls") :] if "ncalls" in text else text
        out.append(f"--- {title} ---\n{text}")
