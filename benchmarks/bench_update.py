"""Update cost of one field (targets: near dataclasses.replace, far faster than eqx.tree_at).

- nested layout (`f0`, a static `flag`, a tuple of the other n-1 arrays) at 100 /
  1,000 / 10,000 leaves: `with_dynamic`, `with_static`, `es.edit`, `eqx.tree_at`
  and `dataclasses.replace` on a plain frozen dataclass with the same fields;
  targets at 10,000 leaves: `with_dynamic` <= 5x `dataclasses.replace`, >= 1,000x
  faster than `eqx.tree_at`; growth 100 -> 10,000 leaves <= 2x;
- wide layout (one field per array) at 100 / 1,000 / 10,000 fields: growth of
  `with_dynamic` <= 2x; the rest informational;
- `es.edit` of one nested leaf at 1,000 nested modules against the same
  `with_dynamic` (target within 3x).

Updates are not blocked (their output is a module; blocking would flatten it).
"""

import dataclasses
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import models


GROUP = "update"
TITLE = "update one field"


def _edit_f0(m: Any, new: Any) -> Any:
    with es.edit(m) as m2:
        m2.f0 = new
    return m2


def _variants(m: Any, plain: Any, new: Any) -> dict[str, Any]:
    return {
        "with_dynamic": lambda: m.with_dynamic(f0=new),
        "with_static": lambda: m.with_static(flag=True),
        "es.edit": lambda: _edit_f0(m, new),
        "eqx.tree_at": lambda: eqx.tree_at(lambda t: t.f0, m, new),
        "dataclasses.replace": lambda: dataclasses.replace(plain, f0=new),
    }


def _layout(
    rep: h.Report,
    s: h.Settings,
    layout: str,
    make: Any,
    unit: str,
    sizes: tuple[int, ...],
    judged: bool,
) -> None:
    wd: dict[int, float] = {}
    for n in sizes:
        m, plain = make(n)
        new = m.f0 + 1
        t = h.compare(
            _variants(m, plain, new),
            s,
            block=False,
            raw=rep.raw,
            key=f"update.{layout}{n}",
        )
        wd[n] = t["with_dynamic"]
        rep.info_row(
            GROUP, f"update.{layout}{n}.times",
            f"{layout}, {n:,} {unit}: with_dynamic / with_static / es.edit / tree_at / replace",
            {k: t[k] for k in _variants(m, plain, new)},
        )  # fmt: skip
        big = judged and n >= 10_000
        rep.compare_row(
            GROUP, f"update.{layout}{n}.replace",
            f"{layout}, {n:,} {unit}: with_dynamic / dataclasses.replace",
            t, "with_dynamic", "dataclasses.replace",
            target=("<=", 5.0) if big else None,
        )  # fmt: skip
        rep.compare_row(
            GROUP, f"update.{layout}{n}.tree_at",
            f"{layout}, {n:,} {unit}: eqx.tree_at / with_dynamic (speed-up)",
            t, "eqx.tree_at", "with_dynamic",
            target=(">=", 1000.0) if big else None,
        )  # fmt: skip
    lo, hi = min(wd), max(wd)
    if hi > lo:
        t = {f"with_dynamic {hi:,}": wd[hi], f"with_dynamic {lo:,}": wd[lo]}
        rep.compare_row(
            GROUP, f"update.{layout}.growth",
            f"{layout}: with_dynamic at {hi:,} {unit} / at {lo:,}",
            t, f"with_dynamic {hi:,}", f"with_dynamic {lo:,}", target=("<=", 2.0),
            note="(timed in separate rounds)",
        )  # fmt: skip


def _wide(n: int) -> tuple[Any, Any]:
    m, _ = models.wide(n, wrap=None)
    return m, models.plain_wide(n)


def run(rep: h.Report, s: h.Settings) -> None:
    _layout(rep, s, "nested", models.nested, "leaves", s.update_sizes, judged=True)
    _layout(rep, s, "wide", _wide, "fields", s.wide_sizes, judged=False)

    n = s.edit_modules
    m = models.stack(n)
    i = n // 2
    new = m.layers[i].w + 1
    path = f"layers.{i}.w"

    def edit() -> Any:
        with es.edit(m) as m2:
            m2.layers[i].w = new
        return m2

    t = h.compare(
        {"es.edit": edit, "with_dynamic": lambda: m.with_dynamic(**{path: new})},
        s,
        block=False,
        raw=rep.raw,
        key=f"update.stack{n}",
    )
    rep.compare_row(
        GROUP, "update.edit_nested",
        f"{n:,} nested modules, one leaf: es.edit / with_dynamic",
        t, "es.edit", "with_dynamic", target=("<=", 3.0),
    )  # fmt: skip


def profile(out: list[str]) -> None:
    m, _ = models.nested(10_000)
    new = m.f0 + 1
    with h.profiled("with_dynamic, nested 10,000 leaves, 20,000 calls", out):
        for _ in range(20_000):
            m.with_dynamic(f0=new)
    st = models.stack(1_000)
    new = st.layers[500].w + 1
    with h.profiled("es.edit of one leaf, 1,000 nested modules, 2,000 calls", out):
        for _ in range(2_000):
            with es.edit(st) as m2:
                m2.layers[500].w = new
