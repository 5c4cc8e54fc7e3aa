"""Shared by the test files: the seed classes (DESIGN §2), and a pytree that
fails loudly when anything walks the whole tree."""

import types
from typing import Any

import equinox as eqx
import eqx_static as es
import jax


def seed() -> types.SimpleNamespace:
    """Fresh copies of DESIGN §2's `Parent`/`Child`, with a trace counter."""
    traces = [0]

    class Parent(es.Module):
        dp: Any
        sp: bool = eqx.field(static=True)

        @es.jit
        def __call__(self, x):
            traces[0] += 1
            return self.dp * self.g(x) if self.sp else self.g(x)

        def g(self, x):
            raise NotImplementedError

    class Child(Parent):
        dc: Any
        sc: bool = eqx.field(static=True)

        def g(self, x):
            return self.dc * x if self.sc else x

    return types.SimpleNamespace(Parent=Parent, Child=Child, traces=traces)


class Bomb:
    """A pytree node whose flatten raises once armed: any whole-tree walk hits it."""

    armed = False


def _flatten_bomb(bomb: Bomb):
    if Bomb.armed:
        raise AssertionError("the whole tree was flattened")
    return (), None


jax.tree_util.register_pytree_node(Bomb, _flatten_bomb, lambda aux, children: Bomb())
