"""Shared by the test files: fresh copies of the seed classes (DESIGN §2)."""

import types
from typing import Any

import equinox as eqx
import eqx_static as es


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
