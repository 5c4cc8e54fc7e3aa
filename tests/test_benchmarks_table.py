"""The README's benchmark table is generated from the committed
`benchmarks/results/latest.json` (`python benchmarks/readme_table.py`): CI fails when
the two disagree. A consistency check of text, never a timing assertion."""

import importlib.util
import json
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def _readme_table():
    path = ROOT / "benchmarks" / "readme_table.py"
    spec = importlib.util.spec_from_file_location("readme_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_generated_from_latest_json():
    rt = _readme_table()
    data = rt.load()
    readme = (ROOT / "README.md").read_text()
    assert rt.region(readme) == rt.render(data), (
        "README's benchmark table differs from benchmarks/results/latest.json: "
        "run `python benchmarks/readme_table.py` (or `benchmarks/run.py --readme`)"
    )


def test_latest_json_is_a_full_run_with_judged_rows():
    data = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    assert data["mode"] == "full"
    rows = data["rows"]
    assert {r["instance"] for r in rows} >= {"fresh", "same"}
    for r in rows:
        assert {
            "key",
            "name",
            "values",
            "ratio",
            "target",
            "meets_target",
            "instance",
        } <= set(r)
        if r["target_op"] is not None and r["meets_target"] is not None:
            assert isinstance(r["meets_target"], bool)


def test_rewrite_only_touches_the_region():
    rt = _readme_table()
    data = rt.load()
    text = f"before\n{rt.START}\nold table\n{rt.END}\nafter\n"
    new = rt.rewrite(text, data)
    assert new.startswith(f"before\n{rt.START}\n") and new.endswith(
        f"{rt.END}\nafter\n"
    )
    assert rt.region(new) == rt.render(data)
