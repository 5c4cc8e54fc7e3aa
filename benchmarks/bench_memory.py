"""Memory that a cache-hit call keeps per live instance (nothing, by design: the
cache remembers keys, never instances), against the instance's own size.

With `tracemalloc` (Python allocations only; arrays are shared, not copied): make
K fresh instances by `jax.tree.map(lambda a: a, m)` and keep them alive (their own
size), then call each once and keep them alive (what the calls added). Both divided
by K. Target: the calls add no more than the instances' own size. The same for raw
`jax.jit` on the equivalent `eqx.Module`, for reference. Measured from outside, so
it needs no internals.

And the memory a key costs when its program is shared: RSS growth over 2,000 keys
that differ only in an unread static field (one program), per key. Target: 50 KB.
"""

import gc
import os
import tracemalloc
from collections.abc import Callable
from typing import Any

import _harness as h
import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import models


GROUP = "memory"
TITLE = "memory per live instance and per shared key"


def _measure(m: Any, call: Callable[[Any], Any], k: int) -> tuple[float, float]:
    """(own bytes per instance, bytes added by one call per instance)."""
    for _ in range(3):  # warm caches that are not per instance
        jax.block_until_ready(call(models.tree_copy(m)))
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        pool = [models.tree_copy(m) for _ in range(k)]
        gc.collect()
        own = tracemalloc.get_traced_memory()[0] - base
        out = None
        for p in pool:
            out = call(p)
        jax.block_until_ready(out)
        del out
        gc.collect()
        added = tracemalloc.get_traced_memory()[0] - base - own
    finally:
        tracemalloc.stop()
    del pool
    return own / k, added / k


def _rss() -> int:
    """Resident bytes of this process (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _shared_keys(k: int) -> tuple[float, int]:
    """(RSS bytes per key, programs compiled) for `k` keys that differ only in a
    static field the program never reads: one program, `k` keys sharing it."""

    class Tagged(es.Module):
        w: jax.Array
        tag: int = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            return jnp.tanh(self.w @ x) * 2.0

    m = Tagged(w=jnp.ones((64, 64)), tag=0)
    x = jnp.ones(64)
    for i in range(-20, 0):  # JAX's own caches warm, allocator settled
        jax.block_until_ready(m.with_static(tag=i)(x))
    gc.collect()
    before = _rss()
    for i in range(k):
        jax.block_until_ready(m.with_static(tag=i)(x))
    gc.collect()
    return (_rss() - before) / k, Tagged.__call__.compile_info().compiles


def run(rep: h.Report, s: h.Settings) -> None:
    k = 200 if s.quick else 2_000
    per_key, programs = _shared_keys(k)
    rep.raw["memory.shared_key"] = {
        "k": k,
        "rss_per_key": per_key,
        "programs": programs,
    }
    rep.compare_row(
        GROUP, "memory.shared_key",
        f"{k:,} keys sharing one program: RSS per key / 50 KB",
        {"RSS per key": per_key, "50 KB": 50_000.0}, "RSS per key", "50 KB",
        target=("<=", 1.0), unit="bytes",
        note=f"({programs} program compiled for the {k + 20:,} keys)",
    )  # fmt: skip
    x = models.x_input()
    cases: list[tuple[str, str, Callable[[], tuple[Any, Any]]]] = [
        ("child", "seed Child", lambda: models.seed_pair()[:2]),
    ]
    cases += [
        (f"leaves{n}", f"{n:,} array leaves", lambda n=n: models.wide(n))
        for n in s.memory_sizes
    ]
    raw = jax.jit(lambda m, x: m(x))
    for key, label, make in cases:
        m, p = make()
        xx = models.seed_pair()[2] if key == "child" else x
        k = s.live_k if key in ("child", "leaves100") else max(20, s.live_k // 5)
        own, added = _measure(m, lambda a, xx=xx: a(xx), k)
        p_own, p_added = _measure(p, lambda a, xx=xx: raw(a, xx), k)
        t = {"kept": max(added, 0.0), "instance": own}
        rep.raw[f"memory.{key}"] = {
            "k": k,
            "es_own_bytes": own,
            "es_added_bytes": added,
            "eqx_own_bytes": p_own,
            "jax_jit_added_bytes": p_added,
        }
        rep.compare_row(
            GROUP, f"memory.{key}",
            f"{label}: bytes a hit keeps per live instance / the instance's own bytes",
            t, "kept", "instance", "fresh", ("<=", 1.0), unit="bytes",
            note=f"(raw jax.jit keeps {p_added:,.0f} B per instance of {p_own:,.0f} B)",
        )  # fmt: skip
