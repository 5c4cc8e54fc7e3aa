"""The compile key: the one description of a call that everything else reads.

A key is a tree of hashable tuples mirroring the call's arguments:

- `LEAF` marks a traced value (an array, or a Python scalar inside a module); its
  shape, dtype, weak type and sharding are checked by `jax.jit`'s own dispatch;
- `(MODULE, cls, statics, children, extras)` is an `eqx.Module`: its static field
  values compared by type *and* value, then the keys of its dynamic fields;
- `(SEQ, type, children)` is a plain list or tuple, `(TREE, treedef, children)` any
  other pytree node, `(STATIC, typed_value)` a leaf outside modules that is not an
  array (static, as under `eqx.filter_jit`).

`build` turns a key and the traced leaves back into the arguments, `diff` names
what differs between two keys in field terms, and `leaf_origins` says which field
or argument each traced leaf came from.
"""

import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np
from equinox._module._flatten import WRAPPER_FIELD_NAMES  # equinox 0.13
from equinox._module._module import _currently_initialising as _initialising
from jax.core import Tracer

from ._fields import _infos, field_info, FieldInfo, instance_dict, is_module


LEAF: Final = "·"
MODULE: Final = 0
SEQ: Final = 1
TREE: Final = 2
STATIC: Final = 3

_SCALARS: Final = frozenset({bool, int, float, complex})
_ABSENT: Final = object()
_ARRAYS: Final = (jax.Array, np.ndarray, np.generic)


def plan(cls: type) -> FieldInfo:
    """The field names of a module class (`_infos.get` first: this is hot)."""
    return _infos.get(cls) or field_info(cls)


# ----------------------------------------------------------------------------------
# Typed static values: `1`, `True` and `1.0` are different keys.


class Typed(tuple):
    """A static value in a key. Compares and hashes by type as well as by value
    (`1`, `True` and `1.0` differ; so do `-0.0` and `0.0`; `nan` equals itself),
    element by element inside tuples and frozensets; keeps the value as `.value`."""

    value: Any


def typed(v: Any) -> Typed:
    tv = Typed((type(v), _form(v)))
    tv.value = v
    return tv


def _form(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v.hex()
    if t is complex:
        return (v.real.hex(), v.imag.hex())
    if t in _PLAIN:
        return v
    if isinstance(v, tuple):
        return tuple((type(x), _form(x)) for x in v)
    if isinstance(v, frozenset):
        return frozenset((type(x), _form(x)) for x in v)
    if isinstance(v, np.generic):
        return (v.dtype.str, v.tobytes())
    return v


_PLAIN: Final = frozenset({bool, int, str, type(None), bytes})


class _ById:
    """Compares by identity: for unhashable bookkeeping attributes of a module."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ById) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


# ----------------------------------------------------------------------------------
# Walking the arguments.


def make_key(
    args: tuple, kwargs: dict[str, Any], leaves: list, on_device: bool = True
) -> tuple:
    """The key of a call; appends its traced leaves to `leaves`, in key order.

    With `on_device`, a memoised module contributes its Python scalars as device
    arrays (see `_memo`); a wrapper that donates buffers asks for the originals."""
    nodes = []
    for a in args:  # the common cases first: this is the hot path
        t = type(a)
        kind = _kinds.get(t) or _kind_of(t)
        if kind is _ARR:
            leaves.append(a)
            nodes.append(LEAF)
        elif kind is _MOD and on_device and (e := ready(a)) is not None:
            leaves += e[3]
            nodes.append(e[1])
        else:
            nodes.append(top_node(a, leaves, on_device))
    if kwargs:
        names = tuple(sorted(kwargs))
        kw = tuple([top_node(kwargs[k], leaves, on_device) for k in names])
        return tuple(nodes), names, kw
    return tuple(nodes), (), ()


# A module is frozen, so its key and leaves are computed once per instance and kept
# while the instance lives: `id` -> [weak reference, key, leaves, device leaves, the
# `jax_enable_x64` they were made under]. This is what makes a cache-hit call O(1)
# in the size of the model. Instances whose key could change (holding a list, a
# dict or another mutable pytree; made while any module is being initialised or
# edited) or that hold tracers are never memoised. On the instance's second call
# its Python scalars are put on the device once, as `jax.jit` would do on every
# call (not under a trace, and again if `jax_enable_x64` changes).
_memo: Final[dict[int, list]] = {}


def ready(v: Any) -> list | None:
    """The memo entry of the module `v`, if its device leaves can be used as is."""
    e = _memo.get(id(v))
    if e is None or e[3] is None or e[0]() is not v:
        return None
    if e[4] is not None and e[4] is not x64():
        return None
    return e


try:  # jax 0.10: a cheaper read of the same setting than `jax.config.jax_enable_x64`
    from jax._src.config import enable_x64 as _enable_x64

    def x64() -> bool:
        return _enable_x64.value
except ImportError:  # pragma: no cover

    def x64() -> bool:
        return bool(jax.config.jax_enable_x64)  # pyright: ignore


def top_node(v: Any, leaves: list, on_device: bool = True) -> Any:
    kind = _kinds.get(type(v)) or _kind_of(type(v))
    if kind is not _MOD:
        return node(v, leaves, False)
    e = _memo.get(id(v))
    if e is not None and e[0]() is v:
        if on_device:
            if ready(v) is None:
                e[3], e[4] = _on_device(e[2])
            leaves.extend(e[2] if e[3] is None else e[3])
        else:
            leaves.extend(e[2])
        return e[1]
    mine: list = []
    n = module_node(v, mine)
    leaves.extend(mine)
    if _memoisable(n, mine):
        i = id(v)
        ref = weakref.ref(v, lambda r: _forget(i, r))
        _memo[i] = [ref, n, tuple(mine), None, None]
    return n


def _forget(i: int, ref: weakref.ref) -> None:
    e = _memo.get(i)
    if e is not None and e[0] is ref:
        del _memo[i]


def _memoisable(n: Any, leaves: list) -> bool:
    return (
        not _initialising._dict  # pyright: ignore[reportAttributeAccessIssue]
        and not any(isinstance(x, Tracer) for x in leaves)
        and _frozen(n)
    )


def _frozen(n: Any) -> bool:
    if n is LEAF or n is None:
        return True
    tag = n[0]
    if tag == MODULE:
        return all(map(_frozen, n[3]))
    if tag == SEQ:
        return n[1] is tuple and all(map(_frozen, n[2]))
    return tag == STATIC


def _on_device(leaves: tuple) -> tuple[tuple | None, bool | None]:
    """The leaves with Python scalars on the device (None under a trace), and the
    `jax_enable_x64` that decided their dtypes (None: there were none)."""
    if not any(type(x) in _SCALARS for x in leaves):
        return leaves, None
    flag = x64()
    out = tuple(jax.device_put(x) if type(x) in _SCALARS else x for x in leaves)
    if any(isinstance(x, Tracer) for x in out):
        return None, None
    return out, flag


_ARR, _SCALAR, _MOD, _SEQ, _NONE, _OTHER = range(1, 7)
_kinds: Final[dict[type, int]] = {}


def _kind_of(t: type) -> int:
    """How to key a value of type `t` (cached: `isinstance` on ABCs is slow)."""
    if issubclass(t, eqx.Module):
        k = _MOD
    elif issubclass(t, _ARRAYS) or issubclass(t, Tracer):
        k = _ARR
    elif t in _SCALARS:
        k = _SCALAR
    elif t is tuple or t is list:
        k = _SEQ
    elif t is type(None):
        k = _NONE
    else:
        k = _OTHER
    _kinds[t] = k
    return k


def node(v: Any, leaves: list, in_module: bool) -> Any:
    kind = _kinds.get(type(v)) or _kind_of(type(v))
    if kind is _ARR or (in_module and kind is _SCALAR):
        leaves.append(v)
        return LEAF
    if kind is _MOD:
        return module_node(v, leaves)
    if kind is _SEQ:
        return (SEQ, type(v), tuple([node(x, leaves, in_module) for x in v]))
    if kind is _NONE:
        return None
    flat, treedef = jtu.tree_flatten(v, is_leaf=is_module)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0] is v:
        return (STATIC, typed(v))
    return (TREE, treedef, tuple([node(x, leaves, in_module) for x in flat]))


def module_node(m: eqx.Module, leaves: list) -> tuple:
    cls = type(m)
    p = _infos.get(cls) or field_info(cls)
    d = instance_dict(m)
    statics = tuple([typed(d[n]) for n in p.static_names])
    scalars = p.traces_scalars
    children = tuple([node(d[n], leaves, scalars) for n in p.dynamic_names])
    if len(d) == len(p.names):
        return (MODULE, cls, statics, children, None)
    # As in Equinox's flatten: the wrapper attributes of `eqx.module_update_wrapper`
    # are part of the structure; anything else (a cached property) is not.
    extras = tuple(
        (k, v if _hashable(v) else _ById(v))
        for k in WRAPPER_FIELD_NAMES
        if (v := d.get(k, _ABSENT)) is not _ABSENT
    )
    return (MODULE, cls, statics, children, extras or None)


def _hashable(v: object) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


# ----------------------------------------------------------------------------------
# Rebuilding the arguments from a key and the traced leaves.


def build_call(key: tuple, leaves: Sequence) -> tuple[tuple, dict[str, Any]]:
    it = iter(leaves)
    args, names, kw = key
    return (
        tuple([build(n, it) for n in args]),
        {k: build(n, it) for k, n in zip(names, kw)},
    )


def build(n: Any, it: Iterator) -> Any:
    if n is LEAF:
        return next(it)
    if n is None:
        return None
    tag = n[0]
    if tag == MODULE:
        _, cls, statics, children, extras = n
        p = plan(cls)
        values = {name: tv.value for name, tv in zip(p.static_names, statics)}
        values.update(zip(p.dynamic_names, [build(c, it) for c in children]))
        obj = object.__new__(cls)
        d = instance_dict(obj)
        d.update((name, values[name]) for name in p.names)  # declaration order
        if extras is not None:
            d.update((k, v.value if isinstance(v, _ById) else v) for k, v in extras)
        return obj
    if tag == SEQ:
        return n[1]([build(c, it) for c in n[2]])
    if tag == TREE:
        return n[1].unflatten([build(c, it) for c in n[2]])
    return n[1].value


# ----------------------------------------------------------------------------------
# Explaining keys in field terms.


def find_unhashable(key: tuple) -> str | None:
    """Names the first unhashable static value in `key`, for an error message."""
    args, names, kw = key
    for i, n in enumerate((*args, *kw)):
        where = f"args[{i}]" if i < len(args) else names[i - len(args)]
        found = _find_unhashable(n, where)
        if found:
            return found
    return None


def _find_unhashable(n: Any, path: str) -> str | None:
    if n is LEAF or n is None:
        return None
    if n[0] == MODULE:
        p = plan(n[1])
        for name, tv in zip(p.static_names, n[2]):
            if not _hashable(tv):
                kind = type(tv.value).__name__
                return f"the static field {name!r} of `{n[1].__qualname__}` holding a {kind}"
        for name, c in zip(p.dynamic_names, n[3]):
            found = _find_unhashable(c, f"{path}.{name}")
            if found:
                return found
        return None
    if n[0] == STATIC:
        return None if _hashable(n[1]) else f"{path}, a {type(n[1].value).__name__}"
    for i, c in enumerate(n[2]):
        found = _find_unhashable(c, f"{path}[{i}]")
        if found:
            return found
    return None


class Origin(NamedTuple):
    """Where a traced leaf comes from: a printable path, and the field if any."""

    path: str
    cls: type | None
    field: str | None


def leaf_origins(key: tuple, argnames: Sequence[str]) -> list[Origin]:
    out: list[Origin] = []
    args, names, kw = key
    for i, n in enumerate(args):
        _origins(n, _argname(argnames, i), None, None, out)
    for k, n in zip(names, kw):
        _origins(n, k, None, None, out)
    return out


def _argname(argnames: Sequence[str], i: int) -> str:
    return argnames[i] if i < len(argnames) else f"args[{i}]"


def _origins(n: Any, path: str, cls: type | None, field: str | None, out: list):
    if n is LEAF:
        out.append(Origin(path, cls, field))
    elif n is None or n[0] == STATIC:
        return
    elif n[0] == MODULE:
        for name, c in zip(plan(n[1]).dynamic_names, n[3]):
            _origins(c, f"{path}.{name}", n[1], name, out)
    else:
        for i, c in enumerate(n[2]):
            _origins(c, f"{path}[{i}]", cls, field, out)


def diff(old: tuple, new: tuple, argnames: Sequence[str]) -> list[str]:
    """What differs from `old` to `new`, one phrase per difference, in field terms."""
    out: list[str] = []
    (oa, on, ok), (na, nn, nk) = old, new
    if len(oa) != len(na) or on != nn:
        return [
            f"call signature changed: {len(oa)} -> {len(na)} positional, "
            f"keywords {list(on)} -> {list(nn)}"
        ]
    for i, (a, b) in enumerate(zip(oa, na)):
        _diff(a, b, _argname(argnames, i), i == 0 and _is_self(argnames), out)
    for k, a, b in zip(nn, ok, nk):
        _diff(a, b, k, False, out)
    return out


def _is_self(argnames: Sequence[str]) -> bool:
    return bool(argnames) and argnames[0] == "self"


def _diff(a: Any, b: Any, path: str, is_self: bool, out: list) -> None:
    if a == b:
        return
    if _tag(a) != _tag(b):
        out.append(f"{_what(path, is_self)} changed kind: {_kind(a)} -> {_kind(b)}")
    elif _tag(a) == MODULE:
        _diff_module(a, b, path, is_self, out)
    elif _tag(a) == STATIC:
        out.append(f"{_what(path, is_self)} changed {_show(a[1])} -> {_show(b[1])}")
    elif len(a[2]) != len(b[2]) or a[:2] != b[:2]:
        out.append(f"{_what(path, is_self)} structure changed")
    else:
        for i, (x, y) in enumerate(zip(a[2], b[2])):
            _diff(x, y, f"{path}[{i}]", False, out)


def _diff_module(a: tuple, b: tuple, path: str, is_self: bool, out: list) -> None:
    if a[1] is not b[1]:
        who = "class" if is_self else f"{_what(path, is_self)} class"
        out.append(f"{who} {a[1].__qualname__} -> {b[1].__qualname__}")
        return
    p = plan(a[1])
    for name, x, y in zip(p.static_names, a[2], b[2]):
        if x != y:
            out.append(
                f"static field {_field(path, name, is_self)!r} changed "
                f"{_show(x)} -> {_show(y)}"
            )
    for name, x, y in zip(p.dynamic_names, a[3], b[3]):
        _diff(x, y, _field(path, name, is_self), False, out)
    if a[4] != b[4]:
        out.append(f"{_what(path, is_self)} extra attributes changed")


def _field(path: str, name: str, is_self: bool) -> str:
    return name if is_self else f"{path}.{name}"


def _what(path: str, is_self: bool) -> str:
    return (
        "self"
        if is_self
        else (
            f"argument {path}"
            if "." not in path and "[" not in path
            else f"field {path!r}"
        )
    )


def _tag(n: Any) -> Any:
    return n if n is LEAF or n is None else n[0]


def _kind(n: Any) -> str:
    return {
        LEAF: "traced",
        None: "None",
        MODULE: "module",
        SEQ: "sequence",
        TREE: "pytree",
        STATIC: "static",
    }[_tag(n)]


def _show(tv: Any) -> str:
    return repr(tv.value)
