"""eqx_static: Equinox modules with declared static fields, compiled methods that
compile once per distinct program, and one-line updates."""

import importlib.metadata
import pathlib
import tomllib

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


def _version() -> str:
    """The installed version; imported from a checkout that is not installed (put
    on `sys.path`), the version in the checkout's `pyproject.toml`, else "unknown"."""
    try:
        return importlib.metadata.version("eqx_static")
    except importlib.metadata.PackageNotFoundError:
        pass
    path = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
    return project["version"] if project.get("name") == "eqx_static" else "unknown"


__version__ = _version()
