"""eqx_static: Equinox modules with declared static fields, compiled methods that
compile once per distinct program, and one-line updates."""

import importlib.metadata

from ._compile import CacheInfo as CacheInfo, CompileInfo as CompileInfo
from ._diverge import DivergenceError as DivergenceError
from ._jit import Compiled as Compiled, jit as jit, Lowered as Lowered
from ._module import Module as Module
from ._report import (
    RecompileError as RecompileError,
    TracedFieldError as TracedFieldError,
)
from ._update import (
    edit as edit,
    with_dynamic as with_dynamic,
    with_static as with_static,
)


__all__ = [
    "CacheInfo",
    "CompileInfo",
    "Compiled",
    "DivergenceError",
    "Lowered",
    "Module",
    "RecompileError",
    "TracedFieldError",
    "edit",
    "jit",
    "with_dynamic",
    "with_static",
]
__version__ = importlib.metadata.version("eqx_static")
