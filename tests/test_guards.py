"""Guards against the general path. A cache hit runs the guards of the keys of the
call's first argument's class: code made from a key that checks a new call against
it and dispatches its traced leaves, without building or hashing a key. Here the
guard a real `es.jit` call installs (its dispatcher swapped for one that returns
the leaves it is given) is tried on fresh instances of every model of the
benchmarks and random changes to them (an attribute added to an instance, a field
retyped, a static flipped, a leaf made a non-array, a submodule swapped for a
subclass): it must agree with the general path, passing exactly when the key is
the same, and then giving the same leaves, in the same order."""

import collections
import dataclasses
import inspect
import random
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from eqx_static._guard import MISS
from eqx_static._key import key_and_leaves


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import models  # noqa: E402  (the benchmarks' own models)


MODELS: dict[str, Callable[[], Any]] = {
    "seed Child": lambda: models.seed_pair()[0],
    "10 array fields": lambda: models.wide(10)[0],
    "100 array fields": lambda: models.wide(100)[0],
    "10 nested modules": lambda: models.modules(10)[0],
    "10 static fields": lambda: models.statics(10)[0],
    "a tuple of arrays": lambda: models.nested(8)[0],
    "a chain 12 deep": lambda: models.chain(12)[0],
    "an MLP of 10 leaves": lambda: models.mlp(10)[0],
    "an MLP inside a module": lambda: models.make_net(),
    "a static table": lambda: models.StaticTable(jnp.ones(4), tuple(range(100))),
    "__call__(x, *, key=None)": lambda: models.kwonly()[0],
    "static train and mode flags": lambda: models.modal()[0](jnp.ones(4), False, 3),
    "eqx.nn.MLP as shipped": lambda: models.eqx_mlp(16, 2),
    "eqx.nn.Sequential as shipped": lambda: models.eqx_sequential(16),
    # wider than the guard reads field by field: read with `operator.itemgetter`
    "30 static fields": lambda: models.statics(30)[0],
    "30 fields, half submodules": lambda: _wide_mixed(30),
}


def _wide_mixed(n: int) -> Any:
    """A module of `n` fields: arrays, submodules and static floats in turn."""
    kinds = [("a", jax.Array, None), ("m", models.Layer, None), ("s", float, True)]
    fields = [(f"{p}{i}", t, st) for i in range(n) for p, t, st in [kinds[i % 3]]]
    cls = type(
        f"Mixed{n}",
        (es.Module,),
        {
            "__annotations__": {name: t for name, t, _ in fields},
            **{name: eqx.field(static=True) for name, _, st in fields if st},
        },
    )
    values = {
        name: jnp.full(4, i, jnp.float32) if t is jax.Array
        else models.Layer(jnp.full(4, i, jnp.float32), i) if t is models.Layer
        else i + 0.5
        for i, (name, t, _) in enumerate(fields)
    }  # fmt: skip
    return cls(**values)


def _general(args: tuple) -> tuple[Any, list] | None:
    try:
        return key_and_leaves(args)
    except TypeError:  # an unhashable static value: the general path refuses it
        return None


def installed(args: tuple) -> Callable:
    """The guard `es.jit` installs for a call with these positional arguments (at
    the key's second call), its parameters named `p_p0`, `p_p1`, ..."""
    ns: dict[str, Any] = {}
    exec(f"def f({', '.join(f'p{i}' for i in range(len(args)))}): return 0", ns)
    jf = es.jit(ns["f"])
    jf(*args), jf(*args)
    (guard,) = jf._slots[type(args[0])]
    assert guard.es_entry.key == key_and_leaves(args)[0]
    return guard


def make_guard(args: tuple) -> Callable:
    """The installed guard, its dispatcher a function that returns the leaves it is
    given: the leaves of a call it passes, or None."""
    guard = installed(args)
    entry = types.SimpleNamespace(call=lambda *leaves: list(leaves))
    check = types.FunctionType(guard.__code__, {**guard.__globals__, "ENTRY": entry})
    return lambda *a: None if (got := check(*a)) is MISS else got


def _guard_of(args: tuple) -> tuple[Any, Callable]:
    """The key of a call with these positional arguments, and its guard."""
    key, _ = key_and_leaves(args)
    return key, make_guard(args)


def _agree(guard: Callable, key: Any, args: tuple) -> bool:
    """Whether the guard says of `args` what the general path says."""
    got, want = guard(*args), _general(args)
    if want is None or want[0] != key:
        return got is None
    return (
        got is not None
        and len(got) == len(want[1])
        and all(a is b for a, b in zip(got, want[1]))
    )


def _modules_in(m: Any) -> list[Any]:
    found = jax.tree.leaves(
        m, is_leaf=lambda x: isinstance(x, eqx.Module) and x is not m
    )
    return [m, *(x for x in found if isinstance(x, eqx.Module))]


def _set(module: Any, name: str, value: Any) -> None:
    object.__setattr__(module, name, value)


def _change(rng: random.Random, m: Any) -> Any:
    """A fresh copy of `m` with one random change somewhere inside it."""
    m = jax.tree.map(lambda a: a, m)  # a fresh instance, as a training loop makes
    target = rng.choice(_modules_in(m))
    d = vars(target)
    name = rng.choice(list(d))
    value = d[name]
    static = name in {
        f.name for f in dataclasses.fields(target) if f.metadata.get("static")
    }
    kind = rng.choice(["extra", "retype", "flip", "non-array", "subclass", "none"])
    if kind == "extra":
        _set(target, "extra", 1)
    elif kind == "retype" and isinstance(value, jax.Array):
        _set(
            target, name, value.astype(jnp.int32) if rng.random() < 0.5 else value[None]
        )
    elif kind == "flip" and static:
        _set(target, name, not value if isinstance(value, bool) else (value, 1))
    elif kind == "non-array" and isinstance(value, jax.Array):
        _set(target, name, float(np.asarray(value).ravel()[0]) if value.size else 0.0)
    elif kind == "subclass" and target is not m:
        _set(
            target,
            "__class__",
            type("Sub" + type(target).__name__, (type(target),), {}),
        )
    return m


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_guard_agrees_with_the_general_path(name):
    m, x = MODELS[name](), models.x_input()
    key, guard = _guard_of((m, x))
    assert _agree(guard, key, (m, x))
    assert _agree(guard, key, (jax.tree.map(lambda a: a, m), x))  # fresh: passes
    rng = random.Random(name)
    verdicts = set()
    for _ in range(30):
        changed = _change(rng, m)
        assert _agree(guard, key, (changed, x))
        verdicts.add(guard(changed, x) is None)
    assert verdicts == {True, False}  # some changes change the key, some do not


def test_a_hit_on_a_changed_module_gives_the_eager_result():
    """The same, through `es.jit`: each changed module's call equals the eager one."""
    rng = random.Random(0)
    m, x = models.chain(6)[0], models.x_input()
    for _ in range(20):
        changed = _change(rng, m)
        try:
            want = type(changed).__call__.fn(changed, x)
        except Exception:  # a change the body cannot run with
            continue
        np.testing.assert_allclose(changed(x), want)


# 1,000 deep in the slow tier: test_signatures' deep models reach it in the fast one.
@pytest.mark.parametrize("depth", [150, pytest.param(1_000, marks=pytest.mark.slow)])
def test_a_guard_is_made_for_keys_of_any_depth(depth):
    """No depth cliff: a chain of modules, and dicts nested as deep, get a guard
    that agrees with the general path (the writer does not recurse)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * depth))  # to build and flatten the chain
    try:
        chain, x = models.chain(depth)[0], models.x_input()
        key, guard = _guard_of((chain, x))
        assert _agree(guard, key, (chain, x))
        assert _agree(guard, key, (jax.tree.map(lambda a: a, chain), x))
        d: Any = {"x": x}
        for _ in range(depth):
            d = {"inner": d, "x": x}
        key, guard = _guard_of((d,))
        assert _agree(guard, key, (d,)) and guard(d) is not None
        d["inner"]["inner"]["x"] = 1.0
        assert _agree(guard, key, (d,)) and guard(d) is None
    finally:
        sys.setrecursionlimit(limit)


def test_es_jit_serves_fresh_instances_from_the_guard():
    """A training loop's fresh instances are hits, served by the guard made at the
    key's second call: the general path serves only the first two calls."""
    m, x = models.seed_pair()[0], models.x_input()
    type(m).__call__.cache_clear()
    m(x)
    for _ in range(5):
        m = jax.tree.map(lambda a: a + 0, m)
        m(x)
    assert type(m).__call__.cache_info() == es.CacheInfo(5, 1, None, 1)
    assert type(m).__call__.es_jit.f.general == 2


@dataclasses.dataclass(frozen=True)
class _Point:
    x: float
    y: float


class _HashRaises:
    def __hash__(self) -> int:
        raise ValueError("no hash today")


class _Kinds(es.Module):
    w: jax.Array
    f: float = eqx.field(static=True)
    t: tuple = eqx.field(static=True)
    p: _Point = eqx.field(static=True)
    fn: Callable = eqx.field(static=True)
    kind: type = eqx.field(static=True)


def _kinds() -> _Kinds:
    return _Kinds(jnp.ones(3), 1.5, (1, "a"), _Point(1.0, 2.0), jnp.tanh, int)


@pytest.mark.parametrize(
    "field, value, same",
    [
        ("f", float("1.5"), True),  # another float object, the same value
        ("f", 2.5, False),
        ("f", 1, False),  # another type
        ("t", tuple([1, "a"]), True),
        ("t", (1, "b"), False),
        ("t", (True, "a"), False),  # `==` to (1, "a"), another key
        ("p", _Point(1.0, 2.0), True),
        ("p", _Point(1.0, 3.0), False),
        ("p", _Point(1, 2), False),  # `==`, fields of another type
        ("fn", jnp.sin, False),
        ("kind", int, True),  # a class: the same object
        ("kind", float, False),
    ],
)
def test_the_guard_compares_other_static_values_as_keys(field, value, same):
    """Static values that are not ints, strings or bools are checked by their
    typed token (a class by identity): a new object with the same typed value
    passes the guard, an equal value of another type does not, as the general path
    decides."""
    m, x = _kinds(), models.x_input()
    key, guard = _guard_of((m, x))
    changed = jax.tree.map(lambda a: a, m)
    _set(changed, field, value)
    assert _agree(guard, key, (changed, x))
    assert (guard(changed, x) is not None) is same


def test_the_guard_refuses_a_static_value_it_cannot_key():
    """A static value whose hash raises fails the guard (the general path then
    says why), never passes it."""
    m, x = _kinds(), models.x_input()
    key, guard = _guard_of((m, x))
    changed = jax.tree.map(lambda a: a, m)
    _set(changed, "p", _HashRaises())
    assert guard(changed, x) is None


@pytest.mark.parametrize(
    "name", ["seed Child", "30 static fields", "30 fields, half submodules"]
)
def test_a_field_renamed_in_the_instance_fails_the_guard(name):
    """An instance whose dictionary holds as many entries as the class has fields,
    one under another name, fails the guard (it does not raise)."""
    m, x = MODELS[name](), models.x_input()
    key, guard = _guard_of((m, x))
    changed = jax.tree.map(lambda a: a, m)
    first = next(iter(vars(changed)))
    _set(changed, "renamed", vars(changed)[first])
    object.__delattr__(changed, first)
    assert len(vars(changed)) == len(vars(m))
    assert guard(changed, x) is None


@pytest.mark.parametrize(
    "value, same", [(float("2.5"), True), (3.5, False), (2, False), (True, False)]
)
def test_a_wide_module_s_static_values_are_compared_as_keys(value, same):
    """In a module read with `operator.itemgetter`, a static value that is not the
    same object is compared by typed token: the same float passes, another value
    or an equal value of another type does not."""
    m, x = _wide_mixed(30), models.x_input()
    key, guard = _guard_of((m, x))
    changed = jax.tree.map(lambda a: a, m)
    _set(changed, "s2", value)  # 2.5 in `m`
    assert _agree(guard, key, (changed, x))
    assert (guard(changed, x) is not None) is same


class _Name(str):
    """A string key of another type: another key, as a static value of it is."""


_Pair = collections.namedtuple("_Pair", "a b")
_Other = collections.namedtuple("_Other", "a b")  # the same fields, another class

_ARGS = {
    "None": None,
    "an int": 3,
    "a float": 0.5,
    "a string": "s",
    "an array": jnp.ones(3),
    "a tuple of arrays": (jnp.ones(3), jnp.zeros(2)),
    "a list of arrays": [jnp.ones(3), jnp.zeros(2)],
    "a tuple of ints": (1, 2),
    "a mixed list": [jnp.ones(3), 1, None],
    "a dict": {"a": jnp.ones(3), "b": 2},
    "a dict of arrays": {"b": jnp.zeros(2), "a": jnp.ones(3)},  # not in sorted order
    "a dict of arrays in sorted order": {"a": jnp.ones(3), "b": jnp.zeros(2)},
    "a dict of one array": {"a": jnp.ones(3)},
    "an empty dict": {},
    "an ordered dict": collections.OrderedDict(a=jnp.ones(3), b=jnp.zeros(2)),
    "a dict holding a module": {"m": models.Layer(jnp.ones(4), 1), "n": 1},
    "a dict of a string subclass key": {_Name("a"): jnp.ones(3), "b": jnp.zeros(2)},
    "a dict of int keys": {1: jnp.ones(3), 2: jnp.zeros(2)},
    "a module": models.Layer(jnp.ones(4), 1),
    "a mixed tuple": (jnp.ones(3), 1, None),
    "a tuple holding a module": (models.Layer(jnp.ones(4), 1), 2),
    "a named tuple": _Pair(jnp.ones(3), models.Layer(jnp.ones(4), 1)),
    "another named tuple": _Other(jnp.ones(3), models.Layer(jnp.ones(4), 1)),
    "a named tuple holding an int": _Pair(jnp.ones(3), 2),
    "an optimiser's state": optax.adam(1e-3).init(
        eqx.filter(models.make_net(), eqx.is_array)
    ),
}


@pytest.mark.parametrize("old", sorted(_ARGS))
def test_the_guard_of_a_plain_function_agrees_for_every_kind_of_argument(old):
    """Positional arguments of every kind a key holds, each replaced by one of
    every other kind (and by a fresh copy of itself): the guard agrees with the
    general path."""
    args = (_ARGS[old], models.x_input())
    key, guard = _guard_of(args)
    for new in [jax.tree.map(lambda a: a, _ARGS[old]), *_ARGS.values()]:
        changed = (new, models.x_input())
        assert _agree(guard, key, changed), (old, new)


class _Touchy:
    """A key that hashes as `"a"` does and raises when compared."""

    def __hash__(self) -> int:
        return hash("a")

    def __eq__(self, other: object) -> bool:
        raise TypeError("not comparable")


def _assert_same_output(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert type(g) is type(w) or isinstance(g, jax.Array)
        np.testing.assert_array_equal(g, w)


def test_a_hit_on_a_dict_argument_gives_the_eager_result():
    """Dicts of string keys through `es.jit`, the guard's fast case among them:
    each call equals the eager one, whatever the order of insertion, the key types
    or the kinds of the values; and `eqx.filter_jit`'s, except where it takes a
    key of a `str` subclass for the `str` of the same value."""

    def f(d, x):
        keys = sorted(d, key=repr)
        return x * len(d), [type(k).__name__ for k in keys], {k: d[k] for k in keys}

    x = models.x_input()
    a, b = jnp.ones(4), jnp.arange(4.0)
    calls = [
        {"a": a, "b": b}, {"b": b, "a": a}, {"a": b, "b": a}, {"a": a},
        {_Name("a"): a, "b": b}, {"a": a, "b": 2}, {"a": a, "b": b, "c": a},
        {"a": a, "b": b.astype(jnp.int32)}, {"a": a, "b": None}, {},
    ]  # fmt: skip
    jf, ff = es.jit(f), eqx.filter_jit(f)
    for d in calls * 2:
        want = f(d, x)
        _assert_same_output(jf(dict(d), x), want)
        if not any(type(k) is _Name for k in d):
            _assert_same_output(ff(dict(d), x), want)
    assert jf.cache_info().hits == len(calls) + 2  # the second round; b, a; b, a


def test_the_guard_of_a_dict_reads_no_key_of_another_type():
    """A dict key that is not a `str` fails the guard by its type, before any
    comparison of it runs; the general path then raises, as JAX's flatten does."""
    args = ({"a": jnp.ones(3), "b": jnp.zeros(2)}, models.x_input())
    key, guard = _guard_of(args)
    changed = ({_Touchy(): jnp.ones(3), "b": jnp.zeros(2)}, models.x_input())
    assert guard(*changed) is None
    errors = []
    for flatten in (
        lambda: key_and_leaves(changed),
        lambda: jax.tree.flatten(changed),
    ):
        with pytest.raises(Exception) as info:
            flatten()
        errors.append(type(info.value))
    assert errors[0] is errors[1]


@dataclasses.dataclass(frozen=True)
class _Cfg:
    scale: float


def _wide_with(value: Any) -> Any:
    """A plain module of 25 array fields (read by `operator.itemgetter`) and a
    static field holding `value`."""
    names = [f"a{i}" for i in range(25)]
    cls = type(
        "WideWith",
        (eqx.Module,),
        {
            "__annotations__": dict.fromkeys([*names, "v"], Any),
            "v": eqx.field(static=True),
        },
    )
    return cls(**{n: jnp.float32(i) for i, n in enumerate(names)}, v=value)


class _Holds(eqx.Module):
    cfg: Any = eqx.field(static=True)


def _scale_holder(treedef: Any) -> Any:
    return jax.tree.unflatten(treedef, []).cfg


def _scale_of(v: Any) -> Any:
    if type(v) is frozenset:
        return next(iter(v)).scale
    if isinstance(v, jax.tree_util.PyTreeDef):  # a `_Holds`'s structure
        return _scale_holder(v).scale
    return v[0] if type(v) is list else v[0].scale if type(v) is tuple else v.scale


@pytest.mark.parametrize(
    "make, change",
    [
        (lambda: _wide_with([1.0]), lambda m: m.v.__setitem__(0, 5.0)),
        (lambda: _wide_with(_Cfg(1.0)), lambda m: object.__setattr__(m.v, "scale", 5.0)),
        (
            lambda: models.Layer(jnp.ones(4), _Cfg(1.0)),
            lambda m: object.__setattr__(m.k, "scale", 5.0),
        ),
        (
            lambda: models.Layer(jnp.ones(4), (_Cfg(1.0), 2)),
            lambda m: object.__setattr__(m.k[0], "scale", 5.0),
        ),
        (
            lambda: models.Layer(jnp.ones(4), frozenset({_Cfg(1.0)})),
            lambda m: object.__setattr__(next(iter(m.k)), "scale", 5.0),
        ),
        (
            lambda: models.Layer(jnp.ones(4), jax.tree.structure(_Holds(_Cfg(1.0)))),
            lambda m: object.__setattr__(_scale_holder(m.k), "scale", 5.0),
        ),
    ],
    ids=["a list, wide module", "a frozen dataclass, wide module",
         "a frozen dataclass", "a frozen dataclass in a tuple",
         "a frozen dataclass in a frozenset",
         "a frozen dataclass in a tree structure"],
)  # fmt: skip
def test_a_static_value_changed_in_place_fails_the_guard(make, change):
    """The guard takes the same object for the same token only where the object
    cannot change (a number, a string, a tuple of them): a list, or a frozen
    dataclass changed with `object.__setattr__`, is read again, as the general
    path reads it, and the call gives the eager result."""
    m, x = make(), models.x_input()
    field = "v" if hasattr(m, "v") else "k"

    def f(m, x):
        return x * _scale_of(getattr(m, field))

    key, guard = _guard_of((m, x))
    jf = es.jit(f)
    jf(m, x), jf(m, x)  # the second call is served by the guard
    change(m)
    assert _agree(guard, key, (m, x))
    assert guard(m, x) is None
    np.testing.assert_array_equal(jf(m, x), f(m, x))


@dataclasses.dataclass(frozen=True)
class _Options:
    depth: int


@pytest.mark.parametrize(
    "static", [7, "a", b"b", None, int, True, False, 1.5, frozenset({1}), _Options(2)]
)
def test_a_tuple_of_values_that_cannot_change_is_passed_by_identity(static):
    """A tuple holding only values that cannot change (numbers, strings, bytes,
    None, types, bools, frozensets of them) is the same key while it is the same
    object: its guard checks identity before it compares the tuple whole (so a
    10**6-element static tuple costs no walk on a hit). A frozen dataclass can
    change (`object.__setattr__`): a tuple holding one is compared item by item.
    Both agree with the general path."""
    x = jnp.ones(3)
    t = (static, static)
    key, guard = _guard_of((t, x))
    source = inspect.getsource(installed((t, x)))
    whole = "p_p0 is not " in source and "SUB(p_p0)" in source
    assert whole == (type(static) is not _Options), source
    assert _agree(guard, key, (t, x)) and _agree(guard, key, ((static, static), x))
    assert _agree(guard, key, ((static, 8), x))


def test_a_wide_module_s_statics_are_passed_by_identity_when_they_cannot_change():
    """A module of more than 24 fields reads its statics at once; when every one
    cannot change, the guard checks them by identity before comparing."""
    m, x = models.statics(30)[0], models.x_input()
    key, guard = _guard_of((m, x))
    source = inspect.getsource(installed((m, x)))
    assert "map(is_," in source, source
    assert _agree(guard, key, (m, x)) and _agree(
        guard, key, (jax.tree.map(lambda a: a, m), x)
    )


def test_a_dict_of_arrays_read_at_once_then_more_arguments():
    """A dict of string keys whose values are all arrays is read with one
    `itemgetter`; the checks after it (the next arguments) start where its leaves
    end in the key: the guard passes its own call and agrees on others."""
    x = jnp.ones(3)
    args = ({"a": x, "b": x}, x, "p")
    key, guard = _guard_of(args)
    assert guard(*args) is not None
    source = inspect.getsource(installed(args))
    assert "p_p0['a']" not in source and "AT.issuperset" in source, source  # at once
    assert _agree(guard, key, args) and _agree(guard, key, ({"a": x, "b": x}, x, "q"))
    assert _agree(guard, key, ({"a": x, "b": x}, jnp.ones(4), "p"))


def test_short_statics_are_literals_in_the_guard_and_long_ones_constants():
    """An int, str or bytes static is written into the guard's source when short
    (readable in its log) and held as a constant when long (a 4,300-digit int has
    no literal); either way the guard passes its own call and turns others away."""
    x = jnp.ones(3)
    short = (3, "abc", b"xy")
    long = (10**40, "s" * 64, b"b" * 64)
    for statics in (short, long):
        args = (*statics, x)
        key, guard = _guard_of(args)
        source = inspect.getsource(installed(args))
        literals = [f"== {v!r}" in source for v in statics]
        assert literals == [statics is short] * 3, source
        assert guard(*args) is not None and _agree(guard, key, args)
        for i in range(3):
            other = list(args)
            other[i] = type(statics[i])(statics[i] * 2)
            assert guard(*other) is None and _agree(guard, key, tuple(other))


def test_a_tuple_holding_a_list_is_not_passed_by_identity():
    """A list inside a tuple can change in place while the tuple stays the same
    object: such a tuple is checked item by item, never by identity."""
    x = jnp.ones(3)
    inner = [1, 2]
    t = (3, inner)
    key, guard = _guard_of((t, x))
    assert guard(t, x) is not None
    inner.append(4)
    assert guard(t, x) is None and _agree(guard, key, (t, x))


def test_the_ends_of_a_key_s_nodes_in_one_pass_agree_with_a_walk():
    """`ends` (what the writer reads, so that a chain 1,000 deep is written in
    linear time) agrees, at every node, with a walk that skips each node's
    children one by one, and has no other entry."""
    from eqx_static._key import ends, node_at

    def walked(key: Any, i: int) -> int:
        n = node_at(key, i)
        j = n.next
        for _ in range(max(n.children, 0)):
            j = walked(key, j)
        return j

    Box = collections.namedtuple("Box", "inner")
    chain: Any = jnp.ones(2)
    for _ in range(30):
        chain = Box(chain)
    values = [
        (chain, ((1, (2, jnp.ones(1))), [3, {"a": None, "b": (jnp.ones(1),)}])),
        (models.Layer(jnp.ones(3), 2), {"x": [models.Layer(jnp.ones(1), 1)], "y": "s"}),
        (_wide_mixed(7), (), [], {}, None, [jnp.ones(1), jnp.ones(2)]),
    ]
    for args in values:
        key, _ = key_and_leaves(args)
        starts, i = [], 0
        while i < len(key):
            starts.append(i)
            i = node_at(key, i).next
        assert ends(key) == {i: walked(key, i) for i in starts}
