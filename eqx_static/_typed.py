"""Static values in the compile key, compared by type as well as by value.

`1`, `True` and `1.0` are equal to Python, with one hash, and they trace different
programs (`jnp.asarray(n)` is `int32`, `bool` or `float32`): in a key they are three
values. So are `-0.0` and `0.0`; `nan` equals itself. This holds inside tuples,
frozensets, named tuples, dataclasses and modules; a type with its own `__eq__` is
compared by it. An unhashable static value of a plain `eqx.Module` (a list) is
compared with `==`, as Equinox's tree structure compares it."""

import math
from typing import Any, Final

import numpy as np

from ._compat import generated_dataclass_eq, module_eq


class Unset:
    """A field not set (yet): a module whose `__init__` is still running, or one
    that left a field unset, as Equinox allows."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = Unset()

# Value types whose `==` already tells types apart from each other's values.
SIMPLE: Final = frozenset({bool, int, str, bytes, type(None), type, Unset})


class Typed:
    """A hashable static value as a key: its type and value (`form`), hashed once,
    so a large static tuple is hashed once per object."""

    __slots__ = ("_hash", "form", "value")

    def __init__(self, value: Any, form: Any):
        self.value = value
        self.form = form
        try:
            self._hash: int | None = hash(form)
        except TypeError:  # `static_value` compares it with `==` instead
            self._hash = None

    @property
    def hashable(self) -> bool:
        return self._hash is not None

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Typed or self._hash != other._hash:
            return False
        try:
            return bool(self.form == other.form)
        except Exception:  # an `__eq__` that raises (on a hash collision): unequal
            return False

    def __hash__(self) -> int:
        if self._hash is None:
            raise TypeError(f"unhashable static value: {type(self.value).__name__}")
        return self._hash

    def __repr__(self) -> str:
        return repr(self.value)


class ByEq:
    """An unhashable static value of a module (a list in a static field of a plain
    `eqx.Module`, a wrapper's `__annotations__` dict): compared with `==`, as
    Equinox's tree structure compares it. It hashes by its type only, so keys that
    differ only in such a value are told apart by `==`, one by one."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not ByEq:
            return False
        try:
            return other.value is self.value or bool(other.value == self.value)
        except Exception:
            return False

    def __hash__(self) -> int:
        return hash(type(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


def typed(v: Any) -> Any:
    """`v` as a key, to be paired with `type(v)`: itself if its type is `SIMPLE`,
    else a `Typed` form (made once per object while the object is recent)."""
    t = type(v)
    if t in SIMPLE:
        return v
    hit = _memo.get(id(v))
    if hit is not None and hit.value is v:
        return hit
    out = Typed(v, (t, _form(v)))
    if len(_memo) >= 4096:
        _memo.clear()
    _memo[id(v)] = out  # keeps `v` alive while it is here, so the id is safe
    return out


_memo: Final[dict[int, Typed]] = {}


def static_value(v: Any) -> Any:
    """A static value of a module as a key: typed if hashable, else compared with
    `==` (an `es.Module` refuses unhashable ones at construction)."""
    if type(v) in SIMPLE:
        return v
    key = typed(v)
    return key if key.hashable else ByEq(v)


def is_hashable(v: object) -> bool:
    """Whether `v` keys as a hashable static value (its typed form, hashed once
    and kept for the key)."""
    return type(v) in SIMPLE or typed(v).hashable


def value_of(s: Any) -> Any:
    """The Python value of a static entry of a key."""
    return s.value if type(s) is Typed or type(s) is ByEq else s


def forget() -> None:
    """Drop the typed forms made so far (they keep their values alive)."""
    _memo.clear()


def _form(v: Any) -> Any:
    """What `v` is compared by: its type and value, recursively."""
    t = type(v)
    if t in SIMPLE:
        return v
    if t is float:
        if math.isnan(v):  # every nan is one key; its sign is kept (copysign)
            return "-nan" if math.copysign(1.0, v) < 0 else "nan"
        return v.hex()
    if t is complex:
        return (_form(v.real), _form(v.imag))
    if isinstance(v, np.generic):
        return (v.dtype.str, v.tobytes())
    if t is tuple or (isinstance(v, tuple) and _default_eq(t, tuple)):
        return tuple([(type(x), _form(x)) for x in v])
    if t is frozenset:
        return frozenset([(type(x), _form(x)) for x in v])
    fields = getattr(t, "__dataclass_fields__", None)
    if fields is not None and (t.__eq__ is module_eq or generated_dataclass_eq(t)):
        d = getattr(v, "__dict__", None)
        if d is not None:
            items = [(k, d.get(k, UNSET)) for k in fields]
            return tuple([(k, type(x), _form(x)) for k, x in items])
    return v  # compared by its own `__eq__`


def _default_eq(t: type, base: type) -> bool:
    return t.__eq__ is base.__eq__ and t.__hash__ is base.__hash__
