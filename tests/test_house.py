"""The shape of the package, checked as CI runs the tests: no module imports
another in a cycle, and nothing is imported inside a function (so that what a
module depends on is read at its top); and the module table of
`docs/development.md` ("How it is built") lists every module, and names only test
files that exist. (Its line counts are written by `tools/house.py --write`; CI's
lint job runs `tools/house.py --check`.)"""

import importlib.util
import re
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


_MODULE_ROW = re.compile(r"^\| `(?P<name>[\w.]+\.py)` \|", re.M)


def test_the_module_table_lists_every_module():
    house = _house()
    page = house.PAGE.read_text()
    table = page.split("| module |", 1)[1].split("\n\n", 1)[0]
    rows = {m["name"] for m in _MODULE_ROW.finditer(table)}
    assert rows == {p.name for p in house.PACKAGE.glob("*.py")}
    tests = Path(__file__).parent
    for name in set(re.findall(r"`(test_\w+\.py)`", table)):
        assert (tests / name).exists(), name


def test_the_counts_are_rewritten_in_place():
    """`--write` changes only the counts of the table's rows and total."""
    house = _house()
    page = (
        "text\n| `_a.py` | 1 / 1 | what | `test_a.py` |\n| total | 9 / 9 | | |\nmore\n"
    )
    new = house.rewrite(page, {"_a.py": (1200, 800)})
    assert new == page.replace("1 / 1", "1,200 / 800").replace("9 / 9", "1,200 / 800")


def test_the_data_layer_imports_nothing_of_the_jit_and_no_module_writes_another_s():
    house = _house()
    assert house.layer_problems() == []
    assert house.write_problems() == []


def test_the_layer_and_write_checks_can_fail(tmp_path, monkeypatch):
    """`_module` importing `_jit`; writes into another module's state, each kind."""
    house = _house()
    (tmp_path / "_module.py").write_text("from . import _jit\n")
    (tmp_path / "_jit.py").write_text(
        "from . import _jax\nfrom ._report import table, marker\n\n"
        "def f():\n"
        "    _jax.DISPATCH = False\n"  # 5: an attribute of another module
        "    table['k'] = 1\n"  # 6: an item of another module's dict
        "    del table['k']\n"  # 7
        "    table.pop('k', None)\n"  # 8: a mutating method
        "    marker.current = 1\n"  # 9: an attribute of another module's object
        "    own = {}\n    own['k'] = table.get('k')\n"  # 10-11: no
    )
    monkeypatch.setattr(house, "PACKAGE", tmp_path)
    assert house.layer_problems() == ["the data layer imports the jit: _module -> _jit"]
    assert house.write_problems() == [
        f"writes another module's global: _jit.py:{n}" for n in (5, 6, 7, 8, 9)
    ]


def test_the_core_reaches_the_diagnostics_only_through_their_hooks():
    assert _house().hook_problems() == []


def test_the_hook_check_can_fail(tmp_path, monkeypatch):
    """A core module's name of the diagnostics not in `HOOKS`, by attribute or by
    import; the diagnostics themselves and `__init__` may use any."""
    house = _house()
    (tmp_path / "_compile.py").write_text(
        "from . import _report\nfrom ._diverge import check, Miss, _value\n\n"
        "_report.log()\n_report.diff()\n"
    )
    (tmp_path / "_report.py").write_text("from . import _diverge\n_diverge._value\n")
    (tmp_path / "__init__.py").write_text("from ._report import diff\n")
    monkeypatch.setattr(house, "PACKAGE", tmp_path)
    said = "is not a hook of the diagnostics: call them through tools/house.py's"
    got = house.hook_problems()
    assert [p.split(" is not")[0] for p in got] == [
        "_compile.py:2: _diverge._value",
        "_compile.py:5: _report.diff",
    ]
    assert all(said in p for p in got)


def test_every_module_keeps_to_its_line_budget():
    house = _house()
    assert house.budget_problems(house.table()) == []


def test_the_budget_check_can_fail():
    """A module one line over its budget, one whose budget is left more than the
    slack above it (the ratchet), one without a budget, a 13th module."""
    house = _house()
    counts = {name: (0, lines) for name, lines in house.BUDGET.items()}
    counts["_jit.py"] = (0, house.BUDGET["_jit.py"] + 1)
    counts["_key.py"] = (0, house.BUDGET["_key.py"] - house.SLACK - 1)
    counts["_guard.py"] = (0, house.BUDGET["_guard.py"] - house.SLACK)  # allowed
    counts["_new.py"] = (0, 1)
    problems = house.budget_problems(counts)
    assert problems[0].startswith(f"_jit.py has {house.BUDGET['_jit.py'] + 1} code")
    assert problems[1].startswith("_key.py's budget of")
    assert not any(p.startswith("_guard.py") for p in problems)
    assert "_new.py has no budget in tools/house.py" in problems
    assert f"13 modules, more than {house.MAX_MODULES}" in problems


def test_the_package_is_as_the_formatter_writes_it():
    """So that the line counts are the formatter's: no `fmt:` marker, no line over
    88 columns, every module unchanged by `ruff format`."""
    assert _house().style_problems() == []


def test_the_style_check_can_fail(tmp_path, monkeypatch):
    house = _house()
    (tmp_path / "_a.py").write_text("x = [1,2]  # fmt: skip\n")
    (tmp_path / "_b.py").write_text(f'z = "{"x" * 90}"\n')
    (tmp_path / "_c.py").write_text("y=1\n")
    monkeypatch.setattr(house, "PACKAGE", tmp_path)
    assert house.style_problems() == [
        "_a.py:1: a `fmt:` marker",
        "_b.py:1: a line over 88 columns",
        "_c.py is not as `ruff format` writes it",
    ]
    monkeypatch.setattr(house, "formatted", lambda path: None)  # no ruff: said once
    assert house.style_problems() == [
        "_a.py:1: a `fmt:` marker",
        "_b.py:1: a line over 88 columns",
        "no ruff to format with: `pip install -e '.[test]'`",
    ]
