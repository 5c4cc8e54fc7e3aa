"""The shape of the package, checked as CI runs the tests: no module imports
another in a cycle, and nothing is imported inside a function (so that what a
module depends on is read at its top)."""

import importlib.util
from pathlib import Path


_TOOL = Path(__file__).resolve().parent.parent / "tools" / "house.py"


def _house():
    spec = importlib.util.spec_from_file_location("house", _TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle_and_no_import_inside_a_function():
    assert _house().import_problems() == []


def test_the_check_sees_a_cycle_and_a_nested_import(tmp_path, monkeypatch):
    """The check itself can fail: a package whose two modules import each other,
    one of them inside a function."""
    house = _house()
    (tmp_path / "_a.py").write_text("from . import _b\n")
    (tmp_path / "_b.py").write_text("from ._a import x\n\ndef f():\n    import os\n")
    monkeypatch.setattr(house, "PACKAGE", tmp_path)
    problems = house.import_problems()
    assert "an import cycle: _a -> _b -> _a" in problems
    assert "an import inside a function or class: _b.py:4" in problems
