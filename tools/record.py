"""A record of the test suite and the benchmarks on whatever platform JAX finds:
`benchmarks/results/<platform>.json` (`cpu`, `tpu`, `gpu`).

    python tools/record.py                  # every part, into benchmarks/results/
    python tools/record.py --quick          # a few test files, the quick benchmarks
    python tools/record.py --out DIR        # the JSON into DIR instead
    python tools/record.py --parts fast,bench   # some parts (below)
    python tools/record.py --merge A.json B.json --out DIR  # two runs' parts, one

The parts, in this order, one process at a time (an accelerator is held by one
process; this one never imports JAX itself):

- `fast`, `slow`: the fast tier, then the slow tier (`-m slow`), with the runtime
  type checks that pyproject's `addopts` turn on (`--jaxtyping-packages`);
- `fast-unchecked`, `slow-unchecked`: the same without them (`addopts` overridden);
- `bench`: `benchmarks/run.py --only call,training`, `--only sgd` and `--only
  peers` (the groups whose rows depend on the device; the others measure the host,
  or start a second process on the device).

The JSON holds the date, the versions, the device (`device_kind`, the count), each
pytest run's passed / failed / errors / skipped counts (from its JUnit XML), its
failures by name and its wall time, and every benchmark row. Each part has a time
limit (`--timeout`); a part that runs over is recorded as such.

On the accelerator machine, `bash tools/tpu_run.sh [OPTIONS]` (with `$OUT` set and
the wheels of the packages its index lacks in `.whl-tpu/`) makes a venv that sees
the machine's JAX, installs the packages into its site-packages (where the suite's
"user's line" tests expect libraries), and runs this script with `--out $OUT`.
A part that does not fit in one command's time runs in the next
(`--parts fast,slow`, then `--parts fast-unchecked,slow-unchecked,bench`), and
`--merge` makes one record of the two. A tier too long for one command runs in
groups of its test files (`--group 1/2`, then `--group 2/2`, each file in one
group, the groups balanced by file size), and `--merge` adds the groups' counts.
Sizes change with the tests: `--group I/N@RECORD` runs the files RECORD's group
I/N held (its run again, in place of one that went over its time), and
`--group rest@RECORD` the files that no run in RECORD holds. A part that ran whole
(all its groups, merged first) takes the place of an older record's part.

"""

import argparse
import datetime
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
UNCHECKED = ["-o", "addopts=-p no:cacheprovider"]  # pyproject's, less the checks
PYTEST = {
    "fast": [],
    "slow": ["-m", "slow"],
    "fast-unchecked": UNCHECKED,
    "slow-unchecked": [*UNCHECKED, "-m", "slow"],
}
QUICK_TESTS = {
    "fast": ["tests/test_module.py", "tests/test_where.py"],
    "slow": [
        "tests/test_fallback.py::test_a_checkout_that_is_not_installed_imports_with_"
        "a_version"
    ],
}
BENCH = {"full": [["--only", "call,training"], ["--only", "sgd"], ["--only", "peers"]]}
BENCH["quick"] = [[*args, "--quick"] for args in BENCH["full"]]
PARTS = [*PYTEST, "bench"]
VERSIONS = ("jax", "jaxlib", "libtpu", "equinox", "eqx_static", "jaxtyping")
VERSIONS += ("optax", "diffrax", "beartype", "pytest", "hypothesis", "flax")


def _env() -> dict[str, str]:
    """This checkout first on the path, unbuffered output."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _run(command: list[str], timeout: float) -> tuple[int | None, float]:
    """Run `command` from the root, its output passed through; (exit code or None
    if it ran over, seconds)."""
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    try:
        rc = subprocess.run(command, cwd=ROOT, env=_env(), timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = None
    return rc, round(time.perf_counter() - start, 1)


def counts(junit: Path) -> dict[str, object]:
    """Passed / failed / errors / skipped, the failures by name and the skips with
    their reasons, from pytest's JUnit XML."""
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    got = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    skips = [
        f"{case.get('classname')}::{case.get('name')}: {skip.get('message')}"
        for case in suite.iter("testcase")
        if (skip := case.find("skipped")) is not None
    ]
    return {
        "passed": got["tests"] - got["failures"] - got["errors"] - got["skipped"],
        "failed": got["failures"],
        "errors": got["errors"],
        "skipped": got["skipped"],
        "failures": failed,
        "skips": skips,
    }


def group_files(group: str, part: str = "fast") -> list[str]:
    """The test files of group `I/N`: each file in the group that is lightest
    so far, the heaviest files placed first (size stands in for time). Sizes
    change with the tests, so `I/N@RECORD` is the files that `part`'s group I/N
    ran in RECORD (a group that went over its time, run again), and `rest@RECORD`
    the test files that no run of `part` in RECORD held."""
    group, _, old = group.partition("@")
    if old:
        part_of = json.loads(Path(old).read_text())["pytest"].get(part, {})
        runs = part_of.get("runs", [part_of])
        if group == "rest":
            held = {w for r in runs for w in r.get("command", "").split()}
            return [f for f in group_files("1/1") if f not in held]
        ran = [r for r in runs if r.get("groups") == [group]]
        if not ran:
            raise SystemExit(f"--group {group}@{old}: no run of {part} {group} there")
        return [w for w in ran[0]["command"].split() if w.endswith(".py")]
    i, n = (int(x) for x in group.split("/"))
    if not 1 <= i <= n:
        raise SystemExit(f"--group {group}: I/N with 1 <= I <= N")
    files = sorted((ROOT / "tests").rglob("test_*.py"), key=lambda f: f.stat().st_size)
    groups: list[list[Path]] = [[] for _ in range(n)]
    for f in reversed(files):
        min(groups, key=lambda g: sum(x.stat().st_size for x in g)).append(f)
    return sorted(str(f.relative_to(ROOT)) for f in groups[i - 1])


def pytest_part(
    name: str, quick: bool, timeout: float, tmp: Path, group: str | None = None
) -> dict:
    junit = tmp / f"{name}.xml"
    files = QUICK_TESTS[name.split("-")[0]] if quick else []
    files = group_files(group, name) if group else files
    command = [sys.executable, "-m", "pytest", "-q", *PYTEST[name], *files]
    rc, seconds = _run([*command, f"--junitxml={junit}"], timeout)
    got: dict = {"command": " ".join(command[1:]), "exit_code": rc, "seconds": seconds}
    if group:
        got["groups"] = [group.partition("@")[0]]
    if rc is None:
        got["timed_out"] = True
    if junit.exists():
        got.update(counts(junit))
    return got


def bench_part(quick: bool, timeout: float, tmp: Path) -> dict:
    """Every row of each benchmark run, and each run's settings."""
    got: dict = {"runs": [], "rows": []}
    for i, args in enumerate(BENCH["quick" if quick else "full"]):
        out = tmp / f"bench{i}.json"
        command = [sys.executable, "benchmarks/run.py", *args, "--json", str(out)]
        rc, seconds = _run(command, timeout)
        run: dict = {"args": args, "exit_code": rc, "seconds": seconds}
        if out.exists():
            data = json.loads(out.read_text())
            run |= {k: data[k] for k in ("mode", "groups", "settings", "machine")}
            got["rows"] += data["rows"]
        got["runs"].append(run)
    return got


def device() -> dict:
    """The platform and device, asked of JAX in a process of its own (which lets
    the device go when it ends)."""
    code = (
        "import json, jax, eqx_static; d = jax.devices(); print(json.dumps({"
        "'platform': jax.default_backend(), 'device_kind': d[0].device_kind, "
        "'device_count': len(d), 'devices': [repr(x) for x in d], "
        "'eqx_static': eqx_static.__version__}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"JAX failed to start:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def _git() -> str | None:
    try:
        command = ["git", "describe", "--always", "--dirty"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() or None
    except OSError:
        return None


COUNTS = ("passed", "failed", "errors", "skipped", "failures", "skips", "seconds")
SUMMED = (*COUNTS, "groups", "trees")  # each run keeps its groups and trees


def _add(a: dict, b: dict) -> dict:
    """One part run in two groups of files: the counts added, each group's
    command and exit code kept. A group that went over its time counted nothing,
    and a later run of it takes its place."""
    runs = a.get("runs", [a])
    if again := [r for r in runs if r.get("timed_out") and r["groups"] == b["groups"]]:
        kept = [g for g in a["groups"] if g not in b["groups"]]
        a = {**a, "groups": kept, "runs": [r for r in runs if r not in again]}
    if set(a["groups"]) & set(b["groups"]):
        raise SystemExit(f"--merge: group(s) {a['groups']} and {b['groups']} overlap")
    runs = [*a.get("runs", [a]), *b.get("runs", [b])]
    runs = [{k: v for k, v in r.items() if k not in COUNTS} for r in runs]
    both = [(k, a.get(k), b.get(k)) for k in SUMMED]  # a group that ran over: none
    summed = {k: y if x is None else x if y is None else x + y for k, x, y in both}
    if summed["trees"]:
        summed["trees"] = list(dict.fromkeys(summed["trees"]))
    return {**summed, "runs": runs, "timed_out": any(r.get("timed_out") for r in runs)}


def _whole(part: dict) -> bool:
    """Whether a part ran as a whole: without groups, or in all of 1/N to N/N (a
    whole run takes the place of any earlier run of its part, group by group)."""
    groups = part.get("groups")
    n = len(groups or [])
    return groups is None or sorted(groups) == sorted(
        f"{i}/{n}" for i in range(1, n + 1)
    )


def merge(paths: list[Path]) -> dict:
    """One record of the parts of several (of one platform): later files win,
    and a part run in groups of files adds its groups' counts."""
    records = [json.loads(p.read_text()) for p in paths]
    if len({r["device"]["platform"] for r in records}) != 1:
        raise SystemExit("--merge: the records are of different platforms")
    out = {**records[-1], "pytest": {}, "benchmarks": None}
    for r in records:
        for name, got in r["pytest"].items():
            if "trees" not in got and r.get("git"):
                got = {**got, "trees": [r["git"]]}
            old = out["pytest"].get(name)
            both = old is not None and "groups" in old and not _whole(got)
            out["pytest"][name] = _add(old, got) if both else got
        if r["benchmarks"]:
            out["benchmarks"] = {"git": r.get("git"), **r["benchmarks"]}
    out["parts"] = [p for p in PARTS if p in out["pytest"] or p == "bench"]
    if out["benchmarks"] is None:
        out["parts"].remove("bench")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a subset, to try it")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON's folder")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"among {PARTS}")
    parser.add_argument("--timeout", type=float, default=1800, help="s per process")
    parser.add_argument("--merge", type=Path, nargs="+", help="records to combine")
    parser.add_argument("--group", help="I/N: the tiers' test files of group I of N")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        record = merge(args.merge)
    else:
        parts = args.parts.split(",")
        if unknown := set(parts) - set(PARTS):
            parser.error(f"unknown part(s) {sorted(unknown)}; choose among {PARTS}")
        record = run(parts, args.quick, args.timeout, args.out, args.group)
    path = _save(record, args.out)
    print(f"wrote {path}")
    for name, got in record["pytest"].items():
        print(
            f"  {name}: {got.get('passed')} passed, {got.get('failed')} failed, "
            f"{got.get('errors')} errors, {got.get('skipped')} skipped "
            f"({got['seconds']} s)"
        )
    return 0


def _save(record: dict, out: Path) -> Path:
    path = out / f"{record['device']['platform']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def run(
    parts: list[str], quick: bool, timeout: float, out: Path, group: str | None = None
) -> dict:
    """The record, saved after each part (a run cut short keeps what it did)."""
    record: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "parts": [p for p in PARTS if p in parts],
        "git": _git(),
        "device": device(),
        "python": sys.version.split()[0],
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "versions": {p: _version(p) for p in VERSIONS},  # the checkout's, below
        "pytest": {},
        "benchmarks": None,
    }
    record["versions"]["eqx_static"] = record["device"].pop("eqx_static")
    print(f"recording on {record['device']} ({record['mode']})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in (p for p in PYTEST if p in parts):
            got = pytest_part(name, quick, timeout, Path(tmp), group)
            record["pytest"][name] = got
            _save(record, out)
        if "bench" in parts:
            record["benchmarks"] = bench_part(quick, timeout, Path(tmp))
    return record


if __name__ == "__main__":
    sys.exit(main())
