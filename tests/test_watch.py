"""The watched instance dictionary of `es.jit(depends_on="auto")` (`_Watched` in
`_relevance.py`): every dict method that hands out a static field's value counts
as a read of it, so the entry is keyed on that field.

Each route below reads the static field `flag` of `m` only through one dict
method (no attribute read of `flag`). If that method stopped reporting the read,
the entry compiled for `flag=True` would be reused for `flag=False` and the
result would be stale: the test compares every call with the eager method.
"""

import copy
from collections.abc import Callable
from typing import Any

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _values(m: Any) -> bool:
    return next(v for v in vars(m).values() if type(v) is bool)


def _copy_method(m: Any) -> bool:
    return vars(m).copy()["flag"]


def _copy_copy(m: Any) -> bool:  # `copy.copy` (and pickle) call `__reduce__`
    return copy.copy(vars(m))["flag"]


def _eq(m: Any) -> bool:
    d = vars(m)
    return d == {"w": m.w, "k": m.k, "flag": True}


def _ne(m: Any) -> bool:
    d = vars(m)
    return not (d != {"w": m.w, "k": m.k, "flag": True})


def _or(m: Any) -> bool:
    return (vars(m) | {})["flag"]


def _popitem(m: Any) -> bool:  # `flag` is the last field: popitem hands it out
    d = vars(m)
    name, value = d.popitem()
    d[name] = value
    return value


def _pop(m: Any) -> bool:
    d = vars(m)
    value = d.pop("flag")
    d["flag"] = value
    return value


def _repr(m: Any) -> bool:
    return "'flag': True" in repr(vars(m))


ROUTES: dict[str, Callable[[Any], bool]] = {
    "values": _values,
    "copy": _copy_method,
    "copy.copy (__reduce__)": _copy_copy,
    "__eq__": _eq,
    "__ne__": _ne,
    "__or__": _or,
    "popitem": _popitem,
    "pop": _pop,
    "__repr__": _repr,
}


def _make(read: Callable[[Any], bool]) -> Any:
    class M(es.Module):
        w: jax.Array
        k: int = eqx.field(static=True)
        flag: bool = eqx.field(static=True)  # last: see `_popitem`

        def eager(self, x):
            return self.w * x * (2.0 if read(self) else 3.0)

        @es.jit(depends_on="auto")
        def auto(self, x):
            return self.w * x * (2.0 if read(self) else 3.0)

    return M


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_read_through_the_watched_dict_keys_the_entry(route):
    cls = _make(ROUTES[route])
    x = jnp.array(1.5, jnp.float32)
    w = jnp.array(2.0, jnp.float32)
    flags = [True, False, True, False]
    for flag in flags:
        m = cls(w, 1, flag)
        got, want = m.auto(x), m.eager(x)
        np.testing.assert_array_equal(got, want)
        assert float(got) == (6.0 if flag else 9.0)
    # One entry per value of `flag`: the read was seen, and keyed on.
    assert cls.auto.cache_info().misses == 2
    # The instance dicts were left as they were (pop and popitem put `flag` back).
    assert list(vars(cls(w, 1, True))) == ["w", "k", "flag"]


def test_a_compiled_method_called_on_self_inside_an_auto_trace():
    """The inner call keys `self`, whose dict is watched: the reads it passes
    over are reported, and every result equals the eager one."""

    class M(es.Module):
        w: jax.Array
        flag: bool = eqx.field(static=True)
        k: int = eqx.field(static=True)

        def eager_inner(self, x):
            return self.w * x * (2.0 if self.flag else 3.0)

        @es.jit
        def inner(self, x):
            return self.eager_inner(x)

        @es.jit(depends_on="auto")
        def outer(self, x):
            return self.inner(x) + 1.0

    x = jnp.array(1.5, jnp.float32)
    w = jnp.array(2.0, jnp.float32)
    for flag, k in [(True, 1), (False, 1), (True, 2), (False, 2)]:
        m = M(w, flag, k)
        np.testing.assert_array_equal(m.outer(x), m.eager_inner(x) + 1.0)
