"""eqx_static: Equinox modules with declared static fields, compiled methods that
compile once per distinct program, and one-line updates."""

import importlib.metadata

from ._aot import Compiled as Compiled, Lowered as Lowered
from ._budget import RecompileError as RecompileError
from ._cache import CacheInfo as CacheInfo, CompileInfo as CompileInfo
from ._edit import edit as edit
from ._errors import TracedFieldError as TracedFieldError
from ._jit import jit as jit
from ._module import Module as Module
from ._update import with_dynamic as with_dynamic, with_static as with_static


__all__ = [
    "CacheInfo",
    "CompileInfo",
    "Compiled",
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
