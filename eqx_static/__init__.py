"""eqx_static: Equinox modules with declared static fields, compiled methods that
compile once per distinct program, and one-line updates."""

import importlib.metadata
import pathlib
import tomllib

from ._compile import CacheInfo as CacheInfo, CompileInfo as CompileInfo
from ._diverge import DivergenceError as DivergenceError
from ._jit import Compiled as Compiled, jit as jit, Lowered as Lowered
from ._module import (
    Module as Module,
    with_dynamic as with_dynamic,
    with_static as with_static,
)
from ._report import (
    RecompileError as RecompileError,
    TracedFieldError as TracedFieldError,
)
from ._update import edit as edit


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

try:
    __version__ = importlib.metadata.version("eqx_static")
except importlib.metadata.PackageNotFoundError:
    # A checkout put on `sys.path`, not installed: the version its pyproject declares.
    _pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
    try:
        _project = tomllib.loads(_pyproject.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        _project = {}
    _ours = _project.get("name") == "eqx_static"
    __version__ = _project.get("version", "unknown") if _ours else "unknown"
