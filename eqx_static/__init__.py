"""eqx_static: Equinox modules with declared static fields, compiled methods that
recompile exactly when a static field changes, and one-line updates."""

import importlib.metadata

from ._aot import Compiled as Compiled, Lowered as Lowered
from ._budget import RecompileError as RecompileError
from ._cache import CacheInfo as CacheInfo
from ._edit import edit as edit
from ._jit import jit as jit, TracedFieldError as TracedFieldError
from ._module import Module as Module
from ._relevance import UndeclaredStaticRead as UndeclaredStaticRead
from ._update import with_dynamic as with_dynamic, with_static as with_static


__all__ = [
    "CacheInfo",
    "Compiled",
    "Lowered",
    "Module",
    "RecompileError",
    "TracedFieldError",
    "UndeclaredStaticRead",
    "edit",
    "jit",
    "with_dynamic",
    "with_static",
]
__version__ = importlib.metadata.version("eqx_static")
