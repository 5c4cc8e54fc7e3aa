"""Compile counts and the cost of a miss.

Each count is taken independently several ways:

- `cache_info().misses` of the wrapper (calls that traced);
- a Python counter incremented in the traced body (a trace);
- `compile_info().compiles` of the wrapper (XLA compiles, as the library counts
  them);
- a `jax.monitoring` listener on "/jax/core/compile/backend_compile_duration"
  (an XLA compile, as JAX reports it), counted only around the calls under test
  (updates and the eager checks of the results happen outside that window).

Rows: the seed sequence (3), 1,000 `with_dynamic` updates and calls (1), 10 flips
of a static field the program does not use (0 extra XLA compiles, 10 traces), with
and without `jax.nn.relu`. Then the cost of a miss: the first call (trace +
compile) of `es.jit` against `eqx.filter_jit` on the same body (and its CPU time
on 200 operations over eight constants of 100,000 floats, with the `eqx_static`
logger off and at INFO: what a compile records, and the fingerprint's own
cost), and, on a model
whose compile takes over half a second, a miss whose program is reused against
one that compiles; a miss whose program is reused against `jax.jit`'s trace and
lowering of the same call, on the attention blocks and on 100 and 1,000 nested
modules. Last, a second process with JAX's persistent compilation cache
makes no XLA compile; and a miss costs no more with 1,200 keys held than with 100.
"""

import functools
import logging
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
import numpy as np


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
        # The dispatcher's probe compiles once per process, at the first key (in a
        # run of this group alone, inside the seed sequence): not the program's.
        probe = kwargs.get("fun_name") == "jit(eqx_static_dispatcher_probe)"
        if self.active and event == EVENT and not probe:
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


def _unread_flips(flips: int, relu: bool) -> tuple[dict[str, float | None], bool]:
    """Extra traces and compiles after the first call, setting a static field the
    program does not use to a new value each time: each is a new key (one trace)
    whose program is the one compiled already (no XLA compile)."""
    cc = counter()
    traces = [0]
    act = jax.nn.relu if relu else (lambda v: v)

    class Flipped(es.Module):
        scale: float
        square: bool = eqx.field(static=True)
        unread: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            return act(self.scale * (x * x if self.square else x))

    m = Flipped(scale=2.0, square=True, unread=0)
    x = jnp.array(1.5)
    cc.call(lambda: m(x))
    info = Flipped.__call__
    base = (info.cache_info().misses, traces[0], cc.count, info.compile_info().compiles)
    outs = []
    for i in range(flips):
        m = m.with_static(unread=i + 1)
        outs.append(cc.call(lambda m=m: m(x)))
    ok = all(float(y) == 2.0 * 1.5 * 1.5 for y in outs)
    return {
        "extra misses": info.cache_info().misses - base[0],
        "extra traces": traces[0] - base[1],
        "extra xla compiles": cc.count - base[2],
        "extra compile_info().compiles": info.compile_info().compiles - base[3],
    }, ok


def _attention(wrap: Callable) -> type:
    """Six attention blocks with MLPs (`eqx.nn`): about a second to compile here."""

    class Blocks(es.Module):
        blocks: tuple
        eps: float = eqx.field(static=True)  # in the program: a new value compiles
        tag: int = eqx.field(static=True)  # not in the program

        def __call__(self, x):
            for attention, mlp in self.blocks:
                x = x + attention(x, x, x)
                x = x + jax.vmap(mlp)(x) * self.eps
            return x.mean()

    Blocks.__call__ = wrap(Blocks.__call__)  # pyright: ignore[reportAttributeAccessIssue]
    return Blocks


def _attention_model(cls: type) -> Any:
    keys = jax.random.split(jax.random.key(0), 6)
    blocks = tuple(
        (eqx.nn.MultiheadAttention(4, 64, key=k), eqx.nn.MLP(64, 64, 256, 2, key=k))
        for k in keys
    )
    return cls(blocks, 1.0, 0)


def _miss_costs(reps: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds of a miss that reuses a program (a new `tag`), of one that compiles
    (a new `eps`), of `eqx.filter_jit`'s first call on the same model, and of
    `eqx.filter_jit`'s and `jax.jit`'s trace and lowering alone (their `lower`) for
    a new key."""
    ours = _attention(lambda f: es.jit(f, warn_after=None))
    theirs = _attention(eqx.filter_jit)
    plain = _attention(lambda f: f)
    lower = eqx.filter_jit(plain.__call__).lower
    jax_lower = jax.jit(
        lambda p, s, x: eqx.combine(p, s)(x), static_argnums=1
    ).lower  # on the arrays, the rest static (as `jax.jit` users partition)
    x = jnp.ones((16, 64))
    m = _attention_model(ours)
    jax.block_until_ready(m(x))  # the first compile, and JAX warmed up
    times: dict[str, list[float]] = {
        "reused": [],
        "compiling": [],
        "filter_jit": [],
        "filter_jit lower": [],
        "jax.jit trace + lower": [],
    }
    for i in range(1, reps + 1):
        for name, make in (
            ("reused", lambda i=i: m.with_static(tag=i)),
            ("compiling", lambda i=i: m.with_static(eps=1.0 + i / 1000)),
            (
                "filter_jit",
                lambda i=i: _attention_model(theirs).with_static(eps=2.0 + i),
            ),
        ):
            mi = make()
            t0 = time.perf_counter()
            jax.block_until_ready(mi(x))
            times[name].append(time.perf_counter() - t0)
        mi = _attention_model(ours).with_static(tag=-i)
        t0 = time.perf_counter()
        lower(mi, x)
        times["filter_jit lower"].append(time.perf_counter() - t0)
        p, st = eqx.partition(_attention_model(plain).with_static(tag=-i), eqx.is_array)
        t0 = time.perf_counter()
        jax_lower(p, st, x)
        times["jax.jit trace + lower"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, times


def _reused_miss_modules(n: int, reps: int) -> tuple[dict[str, float], dict]:
    """Seconds of a miss whose program is reused (a new value of a static `tag` the
    body never reads) on `n` nested modules, and of `jax.jit`'s trace and lowering
    of the same call on the equivalent `eqx.Module`
    (`jax.jit(lambda m, x: m(x)).trace(m, x).lower()`), each on a new key every
    time, in a random order per repetition; medians."""
    m, p = models.tagged_modules(n, lambda f: es.jit(f, warn_after=None))
    x = models.x_input()
    raw = jax.jit(lambda m, x: m(x))
    jax.block_until_ready(m(x))  # the program compiled, JAX warmed up
    raw.trace(p, x).lower()
    times: dict[str, list[float]] = {"reused": [], "jax.jit trace + lower": []}
    for i in range(1, reps + 1):
        calls = [
            ("reused", m.with_static(tag=i), lambda a: jax.block_until_ready(a(x))),
            ("jax.jit trace + lower", type(p)(p.layers, i),
             lambda a: raw.trace(a, x).lower()),
        ]  # fmt: skip
        random.shuffle(calls)
        for name, a, call in calls:
            t0 = time.perf_counter()
            call(a)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, times


def _misses_with_keys_held(sizes: tuple[int, ...], reps: int) -> dict[str, float]:
    """Seconds of a miss (a new key whose program is shared: trace, lower, find)
    with `n` keys already held, for each `n`, the sizes measured in turn."""

    def make() -> Callable:
        @es.jit(warn_after=None)
        def f(x, tag):  # `tag`: a static argument the program does not read
            return jnp.sin(x) * 2

        return f

    x = jnp.ones(8)
    fs = {n: make() for n in sizes}
    for n, f in fs.items():
        for i in range(n):
            f(x, i)
    times: dict[str, list[float]] = {f"{n} keys": [] for n in sizes}
    for r in range(reps):
        for n, f in fs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(x, n + r))
            times[f"{n} keys"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


_PERSISTENT = """
import sys
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import models
x = jnp.array(1.5)  # before counting: eager code compiles too
# With the persistent cache on, each XLA compile is a miss of that cache (JAX
# reports its compile duration on a hit too).
misses = [0]
jax.monitoring.register_event_listener(
    lambda e, **k: misses.__setitem__(0, misses[0] + (e == sys.argv[2]))
)
_, child = models.make_seed()
for sp in (False, True):
    jax.block_until_ready(child(dp=2.0, sp=sp, dc=3.0, sc=True)(x))
print(misses[0], child.__call__.compile_info().compiles)
"""


_CACHE_MISS = "/jax/compilation_cache/cache_misses"


def _persistent_cache() -> dict[str, float | None]:
    """XLA compiles in two processes sharing JAX's persistent compilation cache."""
    import subprocess
    import sys
    import tempfile

    out: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("first process", "second process"):
            done = subprocess.run(
                [sys.executable, "-c", _PERSISTENT, cache, _CACHE_MISS],
                capture_output=True,
                text=True,
                cwd=h.HERE,
                timeout=300,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-500:])
            xla, _ = done.stdout.split()
            out[f"{label}: XLA compiles"] = float(xla)
    return out


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


def _constants_body(seed: int) -> Callable:
    """A new function of 200 operations on eight constants of 100,000 floats (new
    values for each `seed`): its first call hashes what a miss records."""
    rng = np.random.default_rng(seed)
    consts = jax.device_put([rng.random(100_000, np.float32) for _ in range(8)])

    def body(x):
        for i in range(200):
            x = x * consts[i % 8] if i % 2 else x + consts[i % 8]
        return x

    return body


def _first_call_cpu(reps: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """CPU seconds of the first call on `_constants_body`: `es.jit` with logging
    off, with INFO on for the `eqx_static` logger, and `eqx.filter_jit`, a new
    function each, interleaved in a random order per round; medians (the first
    round warms JAX up)."""
    logger = logging.getLogger("eqx_static")
    x = jnp.ones(100_000, jnp.float32)
    times: dict[str, list[float]] = {"es.jit": [], "es.jit, INFO": [], "filter_jit": []}
    times["fingerprint"] = []
    for r in range(reps + 1):
        times["fingerprint"].append(_fingerprint_cpu(_constants_body(r), x))
        # One code wrapped anew each round: its loop warning is not measured.
        quiet = functools.partial(es.jit, warn_after=None)
        wraps = [("es.jit", quiet), ("es.jit, INFO", quiet),
                 ("filter_jit", eqx.filter_jit)]  # fmt: skip
        random.shuffle(wraps)
        for name, wrap in wraps:
            f, level = wrap(_constants_body(r)), logger.level
            logger.setLevel(logging.INFO if name.endswith("INFO") else level)
            try:
                t0 = time.process_time()
                jax.block_until_ready(f(x))
                times[name].append(time.process_time() - t0)
            finally:
                logger.setLevel(level)
    return {k: statistics.median(v[1:]) for k, v in times.items()}, times


def _fingerprint_cpu(body: Callable, x: jax.Array) -> float:
    """CPU seconds of what a miss computes to share programs (the host callbacks
    read from the jaxpr, the module's digest) on `body`'s lowering, as the miss
    path calls it."""
    from eqx_static import _jax, _sharing

    traced = jax.jit(body).trace(x)
    lowering = _jax.lowering_of(traced.lower())
    t0 = time.process_time()
    later = _sharing.fingerprint(
        lowering, _sharing.host_callbacks(lowering, traced.jaxpr)[0]
    )
    assert later is not None and later() is not None
    return time.process_time() - t0


def run(rep: h.Report, s: h.Settings) -> None:
    judged = ("misses", "traces", "xla compiles")
    vals, ok = _seed_sequence()
    rep.count_row(
        GROUP, "compiles.seed", "seed sequence: misses / traces / XLA compiles",
        vals, ("==", 3), judged, ok, "" if ok else "results differ from eager arithmetic",
    )  # fmt: skip
    vals, ok = _dynamic_updates(s.updates)
    rep.count_row(
        GROUP, "compiles.dynamic",
        f"{s.updates:,} with_dynamic updates + calls: misses / traces / XLA compiles",
        vals, ("==", 1), judged, ok, "" if ok else "wrong results",
    )  # fmt: skip
    judged = ("extra xla compiles", "extra compile_info().compiles")
    for relu in (False, True):
        key = "compiles.unread_relu" if relu else "compiles.unread"
        what = "with jax.nn.relu" if relu else "without relu"
        name = (
            f"10 flips of a static field the program does not use ({what}): extra "
            "misses / traces / XLA compiles / compile_info"
        )
        vals, ok = _unread_flips(10, relu)
        rep.count_row(
            GROUP, key, name, vals, ("==", 0), judged, ok and vals["extra traces"] == 10,
            "" if ok else "results differ from eager",
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
            med, "es.jit", "filter_jit", target=("<=", 1.05), readme=key == "child",
        )  # fmt: skip

    med, raw = _first_call_cpu(s.first_call_reps + 2)
    rep.raw["compiles.first_call.constants"] = raw
    rep.compare_row(
        GROUP, "compiles.first_call.constants",
        "first call, 200 operations on 8 constants of 100,000 floats, logging off (CPU time): es.jit / filter_jit",
        med, "es.jit", "filter_jit", target=("<=", 1.02), readme=False,
    )  # fmt: skip
    rep.compare_row(
        GROUP, "compiles.first_call.constants_info",
        "the same with INFO logging on for eqx_static (its operations recorded): es.jit / filter_jit",
        med, "es.jit, INFO", "filter_jit",
    )  # fmt: skip
    rep.compare_row(
        GROUP, "compiles.first_call.fingerprint",
        "of which the fingerprint that shares programs (callbacks, digest; CPU time): its cost / filter_jit's first call",
        med, "fingerprint", "filter_jit",
    )  # fmt: skip
    med, raw = _miss_costs(s.first_call_reps + 2)
    rep.raw["compiles.miss_costs"] = raw
    rep.compare_row(
        GROUP, "compiles.reused_miss",
        "6 attention blocks (about 1 s to compile): a miss that reuses a program / a miss that compiles",
        med, "reused", "compiling", target=("<=", 0.1),
    )  # fmt: skip
    rep.compare_row(
        GROUP, "compiles.reused_miss_vs_lower",
        "6 attention blocks: a miss that reuses a program / eqx.filter_jit's trace and lowering of a new key",
        med, "reused", "filter_jit lower",
    )  # fmt: skip
    rep.compare_row(
        GROUP, "compiles.reused_miss_vs_jax",
        "6 attention blocks: a miss that reuses a program / jax.jit's trace and lowering of the same call",
        med, "reused", "jax.jit trace + lower", target=("<=", 1.2),
    )  # fmt: skip
    rep.compare_row(
        GROUP, "compiles.compiling_miss",
        "6 attention blocks: a miss that compiles / eqx.filter_jit's first call",
        med, "compiling", "filter_jit", target=("<=", 1.05),
    )  # fmt: skip
    for n in (100,) if s.quick else (100, 1_000):
        med, raw = _reused_miss_modules(n, s.first_call_reps + 2)
        rep.raw[f"compiles.reused_miss_vs_jax.modules{n}"] = raw
        rep.compare_row(
            GROUP, f"compiles.reused_miss_vs_jax.modules{n}",
            f"{n:,} nested modules: a miss that reuses a program (a new unread static) / jax.jit's trace and lowering of the same call",
            med, "reused", "jax.jit trace + lower", target=("<=", 1.2),
        )  # fmt: skip
    med = _misses_with_keys_held((100, 1_200), 20 if s.quick else 200)
    rep.compare_row(
        GROUP, "compiles.miss_with_keys",
        "a miss (a new key, its program shared) with 1,200 keys held / with 100",
        med, "1200 keys", "100 keys", target=("<=", 1.2),
    )  # fmt: skip
    vals = _persistent_cache()
    rep.count_row(
        GROUP, "compiles.persistent",
        "JAX's persistent compilation cache, seed Child (2 programs): XLA compiles in the second process",
        vals, ("==", 0), ("second process: XLA compiles",),
    )  # fmt: skip
