"""`tools/record.py`, the record of the suite and the benchmarks on a platform: its
pytest counts read from JUnit XML, its merge of two partial records; and the SGD
benchmark it runs times the same training for each peer."""

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_sgd  # noqa: E402  (the benchmark's own step and loops)


def _record():
    spec = importlib.util.spec_from_file_location(
        "record", ROOT / "tools" / "record.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a pytest process
def test_counts_are_pytest_s_own(tmp_path):
    """Two passed, one failed, one error (in a fixture), two skipped: as pytest
    counts them in the same run's summary line."""
    (tmp_path / "test_some.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def broken():
                raise RuntimeError

            def test_a(): pass
            def test_b(): pass
            def test_c(): assert False
            def test_d(broken): pass
            @pytest.mark.skip(reason="no")
            def test_e(): pass
            @pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.skip)])
            def test_f(x): pass
            """
        )
    )
    junit = tmp_path / "out.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["test_some.py", f"--junitxml={junit}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert "1 failed, 2 passed, 2 skipped, 1 error" in done.stdout, done.stdout
    got = _record().counts(junit)
    assert got == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 2,
        "failures": ["test_some::test_c", "test_some::test_d"],
        "skips": ["test_some::test_e: no", "test_some::test_f[1]: unconditional skip"],
    }


def test_a_merge_keeps_each_record_s_parts(tmp_path):
    record = _record()
    base = {"device": {"platform": "tpu"}, "date": "d"}
    a = {**base, "pytest": {"fast": {"passed": 1}}, "benchmarks": None}
    b = {**base, "pytest": {"slow": {"passed": 2}}, "benchmarks": {"rows": [1]}}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, r in zip(paths, (a, b)):
        path.write_text(json.dumps(r))
    got = record.merge(paths)
    assert got["pytest"] == {"fast": {"passed": 1}, "slow": {"passed": 2}}
    assert got["benchmarks"] == {"rows": [1], "git": None}  # b has no tree
    assert got["parts"] == ["fast", "slow", "bench"]


def test_the_groups_hold_each_test_file_once():
    record = _record()
    files = sorted(
        str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py")
    )
    groups = [record.group_files(f"{i}/3") for i in (1, 2, 3)]
    assert sorted(sum(groups, [])) == files
    assert all(groups)
    with pytest.raises(SystemExit, match="1 <= I <= N"):
        record.group_files("4/3")


def test_a_merge_adds_a_part_s_groups(tmp_path):
    record = _record()
    base = {"device": {"platform": "tpu"}, "benchmarks": None}
    part = {"passed": 3, "failed": 1, "errors": 0, "skipped": 2, "seconds": 1.5}
    a = {"fast": {**part, "failures": ["a"], "groups": ["1/2"], "exit_code": 1}}
    b = {"fast": {**part, "failures": ["b"], "groups": ["2/2"], "exit_code": 0}}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, r, git in zip(paths, (a, b), ("c4b99c5", "4448a2c")):
        path.write_text(json.dumps({**base, "pytest": r, "git": git}))
    got = record.merge(paths)["pytest"]["fast"]
    assert got["trees"] == ["c4b99c5", "4448a2c"]  # the groups ran different trees
    assert {k: got[k] for k in ("passed", "failed", "skipped", "seconds")} == {
        "passed": 6,
        "failed": 2,
        "skipped": 4,
        "seconds": 3.0,
    }
    assert got["failures"] == ["a", "b"] and got["groups"] == ["1/2", "2/2"]
    assert [r["exit_code"] for r in got["runs"]] == [1, 0]
    assert [r["groups"] for r in got["runs"]] == [["1/2"], ["2/2"]]  # which ran over
    with pytest.raises(SystemExit, match="overlap"):
        record.merge([paths[0], paths[0]])
    over = {"fast": {"seconds": 9.0, "groups": ["3/3"], "timed_out": True}}
    paths[1].write_text(json.dumps({**base, "pytest": over}))
    got = record.merge(paths)["pytest"]["fast"]
    assert got["passed"] == 3 and got["failed"] == 1 and got["timed_out"]
    again = (
        tmp_path / "again.json"
    )  # group 3/3 run again takes the place of its overrun
    again.write_text(
        json.dumps({**base, "pytest": {"fast": {**part, "groups": ["3/3"]}}})
    )
    got = record.merge([*paths, again])["pytest"]["fast"]
    assert got["passed"] == 6 and not got["timed_out"]
    assert [r["groups"] for r in got["runs"]] == [["1/2"], ["3/3"]]
    assert got["groups"] == ["1/2", "3/3"]


def test_a_part_run_whole_takes_the_place_of_an_older_one(tmp_path):
    record = _record()
    base = {"device": {"platform": "tpu"}, "benchmarks": None}
    part = {"passed": 3, "failed": 0, "errors": 0, "skipped": 0, "seconds": 1.0}
    old = {"fast": {**part, "groups": ["1/3", "3/3"]}}
    paths = [tmp_path / f"{i}.json" for i in range(4)]
    paths[0].write_text(json.dumps({**base, "pytest": old}))
    for i, path in enumerate(paths[1:], 1):
        group = {"fast": {**part, "passed": i, "groups": [f"{i}/3"]}}
        path.write_text(json.dumps({**base, "pytest": group, "git": "c"}))
    whole = tmp_path / "whole" / "tpu.json"
    whole.parent.mkdir()
    whole.write_text(json.dumps(record.merge(paths[1:])))
    got = record.merge([paths[0], whole])["pytest"]["fast"]
    assert got["passed"] == 6 and got["groups"] == ["1/3", "2/3", "3/3"]
    with pytest.raises(SystemExit, match="overlap"):  # a group: added, not whole
        record.merge([paths[0], paths[2], paths[3]])


def test_a_group_is_run_again_with_the_files_a_record_holds(tmp_path):
    record = _record()
    files = "tests/test_a.py tests/canary/test_b.py"
    ran = {"command": f"-m pytest -q -m slow {files}", "groups": ["5/6"]}
    old = {"slow": {"groups": ["5/6"], "runs": [ran]}, "fast": {"groups": ["1/4"]}}
    path = tmp_path / "tpu.json"
    path.write_text(json.dumps({"pytest": old}))
    assert record.group_files(f"5/6@{path}", "slow") == files.split()
    every = record.group_files("1/1")
    old["slow"]["runs"].append({"command": f"-m pytest -q -m slow {every[0]}"})
    path.write_text(json.dumps({"pytest": old}))
    assert record.group_files(f"rest@{path}", "slow") == every[1:]  # none ran those
    assert record.group_files(f"rest@{path}", "slow-unchecked") == every
    for part, group in (("slow", "4/6"), ("fast", "5/6"), ("slow-unchecked", "5/6")):
        with pytest.raises(SystemExit, match=f"no run of {part} {group}"):
            record.group_files(f"{group}@{path}", part)


def test_the_sgd_peers_train_alike():
    """es.jit, eqx.filter_jit and the hand loop take the same steps from the same
    model: the losses agree, step by step, in both modes."""
    loops = bench_sgd.make_loops(width=16, depth=2)
    for mode in bench_sgd.MODES:
        losses = {
            p: [np.asarray(loops[f"{p}, {mode}"]()) for _ in range(3)]
            for p in bench_sgd.PEERS
        }
        for p in bench_sgd.PEERS:
            np.testing.assert_allclose(losses[p], losses["hand loop"], rtol=1e-6)
        assert losses["es.jit"][0] > losses["es.jit"][2]  # it trains
