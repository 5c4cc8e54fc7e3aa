"""Peers, when installed (`pip install -e '.[bench]'`); skipped otherwise.

- cache-hit call on the seed's `Child` fields: `jax.jit` on a `flax.struct`
  dataclass method and on a `jax_dataclasses.pytree_dataclass` method (fresh and
  same instance), `nnx.jit` on a `flax.nnx.Module` method (same instance: nnx
  modules are mutable), all against raw `jax.jit` on the `eqx.Module` Child;
- `flax.struct` + `jax.jit` at 10 ... 10,000 array fields, fresh, beside `es.jit`
  and raw `jax.jit` (the scaling plot's flax line);
- one-field update at 10,000 leaves (nested layout): flax `.replace` and
  `jax_dataclasses.copy_and_mutate` beside `with_dynamic`;
- the call group's models (the seed Child, 10 array fields, 100 static fields,
  `__call__(self, x, *, key=None)` called `m(x)`, a chain of modules 50 deep), each
  in one comparison: `es.jit`, raw `jax.jit` on the `eqx.Module`, and `jax.jit` on
  the method of a `flax.struct` and of a `jax_dataclasses` dataclass with the same
  fields (the static ones `pytree_node=False` / `jdc.Static`) and the same body,
  all fresh; each ratio the median of the per-round ratios, with their 25th-75th
  percentiles (target: es.jit <= flax.struct + jax.jit); and beside them the
  least a hit in Python can pay: a function written for the model that reads its
  leaves field by field, checking nothing, and calls `jax.jit` on them, flat.
"""

import dataclasses
import functools
import itertools
import operator
import statistics
from collections.abc import Callable
from typing import Any

import _harness as h
import equinox as eqx
import jax
import jax.numpy as jnp
import models
from eqx_static._fields import instance_dict


try:
    import flax.struct as flax_struct
    from flax import nnx
except ImportError:
    flax_struct = nnx = None
try:
    import jax_dataclasses as jdc
except ImportError:
    jdc = None


GROUP = "peers"
TITLE = "peers (flax.struct, jax_dataclasses, flax.nnx)"


def _flax_child() -> Any:
    @flax_struct.dataclass
    class FlaxChild:
        dp: Any
        dc: Any
        sp: bool = flax_struct.field(pytree_node=False)
        sc: bool = flax_struct.field(pytree_node=False)

        def __call__(self, x):
            y = self.dc * x if self.sc else x
            return self.dp * y if self.sp else y

    inst = FlaxChild(dp=jnp.asarray(2.0), dc=jnp.asarray(3.0), sp=True, sc=True)
    return inst, jax.jit(FlaxChild.__call__)


def _jdc_child() -> Any:
    @jdc.pytree_dataclass
    class JdcChild:
        dp: Any
        dc: Any
        sp: jdc.Static[bool]
        sc: jdc.Static[bool]

        def __call__(self, x):
            y = self.dc * x if self.sc else x
            return self.dp * y if self.sp else y

    inst = JdcChild(dp=jnp.asarray(2.0), dc=jnp.asarray(3.0), sp=True, sc=True)
    return inst, jax.jit(JdcChild.__call__)


def _nnx_child(jit: Callable = lambda f: f) -> Any:
    """The seed Child as an nnx module, its `__call__` decorated by `jit`."""

    class NnxChild(nnx.Module):
        def __init__(self, dp: float, sp: bool, dc: float, sc: bool):
            self.dp = nnx.Param(jnp.asarray(dp))
            self.dc = nnx.Param(jnp.asarray(dc))
            self.sp = sp
            self.sc = sc

        @jit
        def __call__(self, x):
            y = self.dc[...] * x if self.sc else x
            return self.dp[...] * y if self.sp else y

    return NnxChild(dp=2.0, sp=True, dc=3.0, sc=True)


def flax_wide(n: int) -> tuple[Any, Callable[[Any, Any], Any]]:
    """`wide(n)`'s fields on a `flax.struct` dataclass; its method under `jax.jit`."""
    names = [f"f{i}" for i in range(n)]
    read = models._spaced(names)

    def body(self, x):
        for k in read:
            x = x + getattr(self, k)
        return x

    ann = {**dict.fromkeys(names, Any), "flag": bool}
    cls = type(
        f"FlaxWide{n}",
        (),
        {
            "__annotations__": ann,
            "flag": flax_struct.field(pytree_node=False),
            "__call__": body,
            "__module__": __name__,
        },
    )
    cls = flax_struct.dataclass(cls)
    values = {**dict(zip(names, models.arrays(n), strict=True)), "flag": False}
    return cls(**values), jax.jit(cls.__call__)


def run(rep: h.Report, s: h.Settings) -> None:
    if flax_struct is None and jdc is None:
        rep.skip_row(GROUP, "peers", "flax, jax_dataclasses", "skipped: not installed")
        return
    m, p, x = models.seed_pair()
    raw = jax.jit(lambda m, x: m(x))
    v: dict[str, h.Variant] = {
        "es.jit fresh": h.fresh(lambda a: a(x), lambda: models.tree_copy(m)),
        "es.jit same": h.same(lambda a: a(x), m),
        "jax.jit fresh": h.fresh(lambda a: raw(a, x), lambda: models.tree_copy(p)),
        "jax.jit same": h.same(lambda a: raw(a, x), p),
    }
    # The same arrays as es.Module stores (0-d, weakly typed), as in EqxChild.
    labels = {
        "flax.struct": "jax.jit on a flax.struct method",
        "jdc": "jax.jit on a jax_dataclasses method",
    }
    makers = {"flax.struct": _flax_child, "jdc": _jdc_child}
    installed = {"flax.struct": flax_struct, "jdc": jdc}
    skipped: dict[str, str] = {}
    for key, make in makers.items():
        if installed[key] is None:
            skipped[key] = "skipped: not installed"
            continue
        try:  # an API change in an optional library must not stop the run
            inst, call = make()
            jax.block_until_ready(call(inst, x))
        except Exception as e:
            skipped[key] = f"skipped: {type(e).__name__}: {e}"[:120]
            continue
        v[f"{key} fresh"] = h.fresh(
            lambda a, call=call: call(a, x), lambda inst=inst: models.tree_copy(inst)
        )
        v[f"{key} same"] = h.same(lambda a, call=call: call(a, x), inst)
    nnx_labels = {
        "nnx": "nnx.jit",
        "nnx tree": "nnx.jit(graph=False)",
        "nnx partial": "nnx.jit_partial(graph=False)",
    }
    for key in nnx_labels:
        try:  # `graph=` and `jit_partial` are flax >= 0.12's
            if nnx is None:
                raise ImportError("flax is not installed")
            v[f"{key} same"] = _nnx_timing(key, x)
        except Exception as e:
            skipped[key] = f"skipped: {type(e).__name__}: {e}"[:120]
    t = h.compare(v, s, raw=rep.raw, key="peers.child")
    for key, label in labels.items():
        if key in skipped:
            rep.skip_row(GROUP, f"peers.child.{key}", label, skipped[key])
            continue
        for inst in ("fresh", "same"):
            rep.compare_row(
                GROUP, f"peers.child.{key}.{inst}",
                f"seed Child: {label} / jax.jit on eqx.Module",
                t, f"{key} {inst}", f"jax.jit {inst}", inst, readme=True,
            )  # fmt: skip
    for key, label in nnx_labels.items():
        name = f"peers.child.{key.replace(' ', '_')}"
        if key in skipped:
            rep.skip_row(GROUP, name, label, skipped[key])
            continue
        rep.compare_row(
            GROUP, f"{name}.same", f"seed Child: {label} / jax.jit on eqx.Module",
            t, f"{key} same", "jax.jit same", "same", readme=True,
        )  # fmt: skip

    if flax_struct is not None:
        _flax_scaling(rep, s)
    _updates(rep, s)
    _calls(rep, s)


def _raw() -> Callable[..., Any]:
    return jax.jit(lambda m, x: m(x))


def _raw_kwonly() -> Callable[..., Any]:
    return jax.jit(lambda m, x, key=None: m(x, key=key))


def _with_x(build: Callable[[], tuple[Any, Any]]) -> Callable[[], tuple[Any, ...]]:
    return lambda: (*build(), models.x_input())


# key, label, the call group's (es.Module, eqx.Module, x) builder, raw jax.jit on
# the eqx.Module (as in the call group)
CALLS: list[tuple[str, str, Callable[[], tuple[Any, ...]], Callable[[], Any]]] = [
    ("child", "seed Child", models.seed_pair, _raw),
    ("leaves10", "10 array fields", _with_x(lambda: models.wide(10)), _raw),
    ("statics100", "100 static fields", _with_x(lambda: models.statics(100)), _raw),
    (
        "kwonly",
        "__call__(self, x, *, key=None), called m(x)",
        _with_x(models.kwonly),
        _raw_kwonly,
    ),
    ("chain50", "a chain of modules 50 deep", _with_x(lambda: models.chain(50)), _raw),
]
PEERS = {"flax.struct": "flax.struct + jax.jit", "jdc": "jax_dataclasses + jax.jit"}
NAMES = {**PEERS, "reader": "a reader of the leaves, no check, + jax.jit, flat"}


def _peer(obj: Any, kind: str, classes: dict[type, type]) -> Any:
    """`obj`, and every `eqx.Module` in its fields, rebuilt as a `flax.struct`
    (`kind` "flax.struct") or `jax_dataclasses` (`kind` "jdc") dataclass: the same
    fields, the static ones static, the same `__call__`."""
    if not isinstance(obj, eqx.Module):
        return obj
    cls = type(obj)
    if cls not in classes:
        ann: dict[str, Any] = {}
        ns: dict[str, Any] = {"__module__": __name__, "__annotations__": ann}
        for f in dataclasses.fields(cls):
            static = f.metadata.get("static", False)
            ann[f.name] = jdc.Static[Any] if static and kind == "jdc" else Any
            if static and kind == "flax.struct":
                ns[f.name] = flax_struct.field(pytree_node=False)
        if "__call__" in vars(cls):
            ns["__call__"] = vars(cls)["__call__"]
        new = type(f"{kind.split('.')[0].title()}{cls.__name__}", (), ns)
        classes[cls] = (
            flax_struct.dataclass if kind == "flax.struct" else jdc.pytree_dataclass
        )(new)
    fields = {
        f.name: _peer(getattr(obj, f.name), kind, classes)
        for f in dataclasses.fields(obj)
    }
    return classes[cls](**fields)


def _reader(m: Any, x: Any) -> Callable[[Any], Any]:
    """The least a hit in Python pays for `m(x)`: a function written for `m`'s
    fields that reads its array leaves through each module's `__dict__`, checks
    nothing, and calls one `jax.jit` on them, flat (in `jax.tree.leaves`' order)."""
    lines, count = [], itertools.count(1)

    def read(expr: str, v: Any) -> list[str]:
        if eqx.is_array(v):
            return [expr]
        if not isinstance(v, eqx.Module):
            return []
        d = f"d{next(count)}"
        lines.append(f"{d} = DICT({expr})")
        fields = [f.name for f in dataclasses.fields(v) if not f.metadata.get("static")]
        return [e for k in fields for e in read(f"{d}[{k!r}]", getattr(v, k))]

    leaves = read("a", m)
    treedef = jax.tree.structure(m)
    flat = jax.jit(lambda leaves, x: jax.tree.unflatten(treedef, leaves)(x))
    body = "\n    ".join([*lines, f"return FLAT([{', '.join(leaves)}], X)"])
    ns = {"DICT": instance_dict, "FLAT": lambda leaves, x: leaves, "X": x}
    exec(f"def reader(a):\n    {body}\n", ns)
    read_leaves, want = ns["reader"](m), jax.tree.leaves(m)  # JAX's leaves, in order
    assert len(read_leaves) == len(want) and all(map(operator.is_, read_leaves, want))
    ns["FLAT"] = flat
    jax.block_until_ready(ns["reader"](m))
    return ns["reader"]


def _calls(rep: h.Report, s: h.Settings) -> None:
    """The call group's models: es.jit, raw jax.jit on the eqx.Module and the peers'
    dataclasses + jax.jit, fresh, in one comparison each."""
    installed = {"flax.struct": flax_struct, "jdc": jdc}
    for key, label, build, raw_jit in CALLS:
        m, p, xm = build()
        raw = raw_jit()
        v = {
            "es.jit": h.fresh(lambda a, xm=xm: a(xm), lambda m=m: models.tree_copy(m)),
            "reader": h.fresh(_reader(m, xm), lambda m=m: models.tree_copy(m)),
            "jax.jit": h.fresh(
                lambda a, raw=raw, xm=xm: raw(a, xm), lambda p=p: models.tree_copy(p)
            ),
        }
        skipped: dict[str, str] = {}
        for kind in PEERS:
            try:  # an API change in an optional library must not stop the run
                if installed[kind] is None:
                    raise ImportError("not installed")
                inst = _peer(p, kind, {})
                call = jax.jit(type(inst).__call__)
                jax.block_until_ready(call(inst, xm))
            except Exception as e:
                skipped[kind] = f"skipped: {type(e).__name__}: {e}"[:120]
                continue
            v[kind] = h.fresh(
                lambda a, call=call, xm=xm: call(a, xm),
                lambda inst=inst: models.tree_copy(inst),
            )
        if len(skipped) == len(PEERS):
            rep.skip_row(GROUP, f"peers.call.{key}", label, "; ".join(skipped.values()))
            continue
        name = f"peers.call.{key}"
        h.compare(v, s, raw=rep.raw, key=name)
        samples = rep.raw[name]["samples_s"]
        rows = [("es", "es.jit", "jax.jit", None)]
        rows += [(k.split(".")[0], k, "jax.jit", None) for k in PEERS if k in v]
        if "flax.struct" in v:
            rows.append(("es_vs_flax", "es.jit", "flax.struct", ("<=", 1.0)))
            rows.append(("reader_vs_flax", "reader", "flax.struct", None))
        for row_key, num, den, target in rows:
            _paired_row(rep, f"{name}.{row_key}", label, samples, num, den, target)
        for kind, why in skipped.items():
            rep.skip_row(
                GROUP, f"{name}.{kind.split('.')[0]}", f"{label}: {PEERS[kind]}", why
            )


def _paired_row(
    rep: h.Report, key: str, label: str, samples: dict[str, list[float]], num: str,
    den: str, target: tuple[str, float] | None,
) -> None:  # fmt: skip
    """`num / den` as the median of the per-round ratios (the two timed in the same
    rounds), each variant's median beside it, the 25th-75th percentiles in a note."""
    ratios = [a / b for a, b in zip(samples[num], samples[den], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    names = {k: NAMES.get(k, k) for k in (num, den)}
    t = {names[k]: statistics.median(samples[k]) for k in (num, den)}
    rep.compare_row(
        GROUP, key, f"{label}: {names[num]} / {names[den]}{' on eqx.Module' if den == 'jax.jit' else ''}",
        t, names[num], names[den], "fresh", target, readme=True, ratio=median,
        note=f"median of {len(ratios)} rounds' ratios; 25th-75th {q1:.2f}-{q3:.2f}x",
    )  # fmt: skip


def _nnx_timing(key: str, x: Any) -> Any:
    """The same-instance hit of the nnx Child (nnx modules are mutable, so there
    is no fresh-instance row)."""
    if key == "nnx partial":  # `graph=False` is nnx's tree mode
        call = nnx.jit_partial(lambda m, x: m(x), _nnx_child(), graph=False)
    else:
        options = {"graph": False} if key == "nnx tree" else {}
        call = _nnx_child(functools.partial(nnx.jit, **options))
    jax.block_until_ready(call(x))
    return h.same(lambda a: a(x), call)


def _flax_scaling(rep: h.Report, s: h.Settings) -> None:
    x = models.x_input()
    for n in s.call_sizes:
        fm, call = flax_wide(n)
        m, p = models.wide(n)
        raw = jax.jit(lambda m, x: m(x))
        v = {
            "flax.struct fresh": h.fresh(
                lambda a, call=call: call(a, x), lambda fm=fm: models.tree_copy(fm)
            ),
            "flax.struct same": h.same(lambda a, call=call: call(a, x), fm),
            "es.jit fresh": h.fresh(lambda a: a(x), lambda m=m: models.tree_copy(m)),
            "jax.jit fresh": h.fresh(
                lambda a, raw=raw: raw(a, x), lambda p=p: models.tree_copy(p)
            ),
        }
        t = h.compare(v, s, raw=rep.raw, key=f"peers.flax_wide{n}")
        rep.compare_row(
            GROUP, f"peers.flax_wide{n}.fresh",
            f"{n:,} array fields: flax.struct + jax.jit / jax.jit on eqx.Module",
            t, "flax.struct fresh", "jax.jit fresh", "fresh",
        )  # fmt: skip
        rep.compare_row(
            GROUP, f"peers.flax_wide{n}.es",
            f"{n:,} array fields: es.jit / flax.struct + jax.jit",
            t, "es.jit fresh", "flax.struct fresh", "fresh",
        )  # fmt: skip


def _updates(rep: h.Report, s: h.Settings) -> None:
    n = max(s.update_sizes)
    m, _ = models.nested(n)
    leaves = [m.f0, *m.rest]
    new = m.f0 + 1
    v: dict[str, Any] = {"with_dynamic": lambda: m.with_dynamic(f0=new)}
    if flax_struct is not None:

        @flax_struct.dataclass
        class FlaxNested:
            f0: Any
            rest: tuple
            flag: bool = flax_struct.field(pytree_node=False)

        fm = FlaxNested(leaves[0], tuple(leaves[1:]), False)
        v["flax .replace"] = lambda: fm.replace(f0=new)
    if jdc is not None:

        @jdc.pytree_dataclass
        class JdcNested:
            f0: Any
            rest: tuple
            flag: jdc.Static[bool]

        jm = JdcNested(leaves[0], tuple(leaves[1:]), False)

        def copy_and_mutate() -> Any:
            with jdc.copy_and_mutate(jm) as m2:
                m2.f0 = new
            return m2

        v["jdc copy_and_mutate"] = copy_and_mutate
    t = h.compare(v, s, block=False, raw=rep.raw, key=f"peers.update{n}")
    for name in v:
        if name != "with_dynamic":
            rep.compare_row(
                GROUP, f"peers.update.{name.split()[0]}",
                f"nested, {n:,} leaves: {name} / with_dynamic",
                t, name, "with_dynamic",
            )  # fmt: skip
