"""The benchmark table of `docs/benchmarks.md` is generated from the committed
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


def test_the_table_is_generated_from_latest_json():
    rt = _readme_table()
    data = rt.load()
    assert rt.PAGE == ROOT / "docs" / "benchmarks.md"
    page = rt.PAGE.read_text()
    assert rt.region(page) == rt.render(data), (
        "the benchmark table of docs/benchmarks.md differs from "
        "benchmarks/results/latest.json: run `python benchmarks/readme_table.py` "
        "(or `benchmarks/run.py --readme`)"
    )


def test_the_readme_links_the_table_and_does_not_copy_it():
    rt = _readme_table()
    readme = (ROOT / "README.md").read_text()
    assert rt.START not in readme and "(docs/benchmarks.md)" in readme


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


def test_the_tpu_table_is_generated_from_its_record():
    rt = _readme_table()
    page = rt.PAGE.read_text()
    record = rt.load(rt.TPU)
    assert rt.region(page, rt.TPU_START, rt.TPU_END) == rt.render_record(record)


def test_a_record_s_table_says_what_did_not_run():
    rt = _readme_table()
    record = rt.load(rt.TPU)
    some = {"passed": 5, "failed": 1, "errors": 0, "skipped": 0, "seconds": 3.0}
    record["pytest"] = {
        "slow": {**some, "groups": ["1/3"], "failures": ["t::x"], "skips": ["t::y: z"]},
        "fast": {**some, "groups": ["1/2", "2/2"], "failures": [], "timed_out": True},
        "fast-unchecked": {**some, "trees": [record["git"], "0ther"]},
    }
    text = rt.render_record(record)
    assert "| 3 s | run at git `" + record["git"] + "`, `0ther` |" in text
    record["benchmarks"]["git"] = record["git"]
    assert "The benchmarks ran at git" not in rt.render_record(record)
    runs = [{"groups": ["1/2"]}, {"groups": ["2/2"], "timed_out": True}]
    record["pytest"]["fast"]["runs"] = runs
    assert "**group 2/2 went over its time" in rt.render_record(record)
    record["benchmarks"]["git"] = "0ther"
    assert "The benchmarks ran at git `0ther`." in rt.render_record(record)
    assert "| slow | 5 | 1 | 0 | 0 | 3 s | **groups 1/3 only: the rest" in text
    assert "failed: `t::x`; skipped (z): `t::y`" in text
    assert "| fast | 5 | 1 | 0 | 0 | 3 s | test files in 2 groups; **a run went" in text
