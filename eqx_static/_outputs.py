"""Outputs of a compiled call: array leaves leave the program, new on every call;
every other leaf rides in the output's tree structure, as `eqx.filter_jit` does, so
that `jax.jit`'s own cache keeps it per trace (per `jax_enable_x64`, per avals)."""

from typing import Any

import jax.tree_util as jtu

from ._key import ARRAY_TYPES


class Static:
    """A pytree node without children whose metadata is the static part of an
    output. `jax.jit` stores it with the trace that produced it."""

    __slots__ = ("mask", "statics", "treedef")

    def __init__(self, treedef: Any, mask: tuple[bool, ...] | None, statics: tuple):
        self.treedef = treedef
        self.mask = mask  # None: the output is one array
        self.statics = statics


jtu.register_pytree_node(Static, lambda s: ((), s), lambda s, _: s)

_ONE = Static(None, None, ())


def split(out: Any) -> tuple[list, Static]:
    """The arrays of `out`, and the rest of it."""
    if isinstance(out, ARRAY_TYPES):
        return [out], _ONE
    flat, treedef = jtu.tree_flatten(out)
    mask = tuple([isinstance(x, ARRAY_TYPES) for x in flat])
    arrays = [x for x, m in zip(flat, mask) if m]
    statics = tuple([None if m else x for x, m in zip(flat, mask)])
    return arrays, Static(treedef, mask, statics)


def combine(arrays: list, static: Static) -> Any:
    """The inverse of `split`."""
    if static.mask is None:
        return arrays[0]
    it = iter(arrays)
    flat = [next(it) if m else s for m, s in zip(static.mask, static.statics)]
    return static.treedef.unflatten(flat)
