"""Compile counts (DESIGN §4, last bullet; §5), and first-call cost.

Each count is taken three independent ways:

- `cache_info().misses` of the wrapper;
- a Python counter incremented in the traced body (a trace);
- a `jax.monitoring` listener on "/jax/core/compile/backend_compile_duration"
  (an XLA compile), counted only around the calls under test (updates and the
  eager checks of the results happen outside that window).

Rows: the seed sequence (3), 1,000 `with_dynamic` updates and calls (1), 10 flips
of a static field the method never reads under `depends_on="auto"` (0 extra), with
and without `jax.nn.relu` in the method. Then the first call (trace + compile) of
`es.jit` against `eqx.filter_jit` on the same body, in fresh classes.
"""

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models


GROUP = "compiles"
TITLE = "compile counts"
EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compiles while `active`."""

    def __init__(self) -> None:
        self.count = 0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
        if self.active and event == EVENT:
            self.count += 1

    def call(self, fn: Callable[[], Any]) -> Any:
        self.active = True
        try:
            return jax.block_until_ready(fn())
        finally:
            self.active = False


_COUNTER: CompileCounter | None = None


def counter() -> CompileCounter:
    global _COUNTER
    if _COUNTER is None:
        _COUNTER = CompileCounter()
    return _COUNTER


def _seed_sequence() -> tuple[dict[str, float | None], bool]:
    cc = counter()
    before = cc.count
    traces = [0]
    _, child_cls = models.make_seed(traces)
    c = child_cls(dp=2.0, sp=False, dc=3.0, sc=False)
    x = jnp.array(1.5)
    steps = [
        lambda c: c,
        lambda c: c.with_static(sp=True),
        lambda c: c.with_static(sc=True),
        lambda c: c.with_dynamic(dp=3.0),
        lambda c: c.with_dynamic(dc=4.0),
    ]
    got = []
    for step in steps:
        c = step(c)
        for _ in range(2):
            got.append((c, cc.call(lambda c=c: c(x))))
    misses = child_cls.__call__.cache_info().misses
    compiles = cc.count - before
    ok = all(
        abs(
            float(y)
            - (float(c.dc) * 1.5 if c.sc else 1.5) * (float(c.dp) if c.sp else 1.0)
        )
        < 1e-6
        for c, y in got
    )
    return {"misses": misses, "traces": traces[0], "xla compiles": compiles}, ok


def _dynamic_updates(n: int) -> tuple[dict[str, float | None], bool]:
    cc = counter()
    before = cc.count
    traces = [0]
    _, child_cls = models.make_seed(traces)
    c = child_cls(dp=2.0, sp=True, dc=3.0, sc=True)
    x = jnp.array(1.5)
    outs = []
    for i in range(n):
        c = c.with_dynamic(dp=float(i), dc=float(i) / 2)
        outs.append(cc.call(lambda c=c: c(x)))
    ok = all(
        abs(float(y) - i * (i / 2) * 1.5) < 1e-3 * max(1, i * i)
        for i, y in enumerate(outs)
    )
    misses = child_cls.__call__.cache_info().misses
    return {
        "misses": misses,
        "traces": traces[0],
        "xla compiles": cc.count - before,
    }, ok


def _auto_flips(flips: int, relu: bool) -> tuple[dict[str, float | None], bool]:
    """Extra misses, traces and compiles after the first call, flipping a static
    field the method never reads."""
    cc = counter()
    traces = [0]
    act = jax.nn.relu if relu else (lambda v: v)

    class Auto(es.Module):
        scale: float
        square: bool = eqx.field(static=True)
        unread: bool = eqx.field(static=True)

        @es.jit(depends_on="auto")
        def __call__(self, x):
            traces[0] += 1
            return act(self.scale * (x * x if self.square else x))

    m = Auto(scale=2.0, square=True, unread=False)
    x = jnp.array(1.5)
    cc.call(lambda: m(x))
    base = (Auto.__call__.cache_info().misses, traces[0], cc.count)
    outs = []
    for _ in range(flips):
        m = m.with_static(unread=not m.unread)
        outs.append(cc.call(lambda m=m: m(x)))
    ok = all(float(y) == 2.0 * 1.5 * 1.5 for y in outs)
    return {
        "extra misses": Auto.__call__.cache_info().misses - base[0],
        "extra traces": traces[0] - base[1],
        "extra xla compiles": cc.count - base[2],
    }, ok


def _first_call_classes(n: int) -> tuple[Any, Any, jax.Array]:
    """Instances of two fresh classes whose `__call__` is the same body under
    `es.jit` and under `eqx.filter_jit`: cold caches on both."""
    names = tuple(f"f{i}" for i in range(n))

    def body(self, x):
        total = getattr(self, names[0])
        for name in names[1:]:
            total = total + getattr(self, name)
        return total * x

    values = dict(zip(names, models.arrays(n), strict=True))
    made = []
    for wrap in (es.jit, eqx.filter_jit):
        cls = type(
            "FirstCall",
            (es.Module,),
            {
                "__annotations__": dict.fromkeys(names, jax.Array),
                "__call__": wrap(body),
                "__module__": __name__,
            },
        )
        made.append(cls(**values))
    return made[0], made[1], models.x_input()


def _first_call_seed() -> tuple[Any, Any, jax.Array]:
    _, a = models.make_seed(wrap=es.jit)
    _, b = models.make_seed(wrap=eqx.filter_jit)
    return (
        a(dp=2.0, sp=True, dc=3.0, sc=True),
        b(dp=2.0, sp=True, dc=3.0, sc=True),
        jnp.array(1.5),
    )


def run(rep: h.Report, s: h.Settings) -> None:
    judged = ("misses", "traces", "xla compiles")
    vals, ok = _seed_sequence()
    rep.count_row(
        GROUP, "compiles.seed", "seed sequence (DESIGN §5): misses / traces / XLA compiles",
        vals, ("==", 3), judged, ok, "" if ok else "results differ from eager arithmetic",
    )  # fmt: skip
    vals, ok = _dynamic_updates(s.updates)
    rep.count_row(
        GROUP, "compiles.dynamic",
        f"{s.updates:,} with_dynamic updates + calls: misses / traces / XLA compiles",
        vals, ("==", 1), judged, ok, "" if ok else "wrong results",
    )  # fmt: skip
    judged = ("extra misses", "extra traces", "extra xla compiles")
    for relu in (False, True):
        key = "compiles.auto_relu" if relu else "compiles.auto"
        what = "with jax.nn.relu" if relu else "without relu"
        name = f'depends_on="auto", 10 flips of an unread static ({what}): extra misses / traces / XLA compiles'
        try:
            vals, ok = _auto_flips(10, relu)
        except Exception as e:  # an unsupported option must not stop the run
            rep.count_row(
                GROUP, key, name, dict.fromkeys(judged), ("==", 0), judged,
                note=f"{type(e).__name__}: {e}"[:100],
            )  # fmt: skip
            continue
        rep.count_row(
            GROUP, key, name, vals, ("==", 0), judged, ok,
            "" if ok else "results differ from the default setting",
        )  # fmt: skip

    cases: list[tuple[str, str, Callable[[], tuple[Any, Any, jax.Array]]]] = [
        ("child", "seed Child", _first_call_seed),
        ("fields100", "100 array fields", lambda: _first_call_classes(100)),
    ]
    for key, label, make in cases:
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
        rep.raw[f"compiles.first_call.{key}"] = times
        rep.compare_row(
            GROUP, f"compiles.first_call.{key}",
            f"first call (trace + compile), {label}: es.jit / filter_jit",
            med, "es.jit", "filter_jit", readme=key == "child",
        )  # fmt: skip
