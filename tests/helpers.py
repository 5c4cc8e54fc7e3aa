"""Shared by the test files: the seed classes, a count of XLA compiles made
independently of the library, and a pytree that fails loudly when anything walks
the whole tree."""

import threading
import types
from typing import Any

import equinox as eqx
import eqx_static as es
import jax


def seed() -> types.SimpleNamespace:
    """Fresh copies of the README's `Parent`/`Child`, with a trace counter."""
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


# XLA compiles, counted by JAX's own monitoring events: independent of the
# library's counters, which the tests compare with it.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = [0]
_compiles_lock = threading.Lock()


def _on_event(event: str, duration: float, **kwargs: Any) -> None:
    if event == _COMPILE_EVENT:
        with _compiles_lock:
            _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


class XlaCompiles:
    """XLA compiles in this process since this object was made (`.count`). Make
    the inputs first: an eager JAX operation compiles too."""

    def __init__(self):
        self.start = _compiles[0]

    @property
    def count(self) -> int:
        return _compiles[0] - self.start
