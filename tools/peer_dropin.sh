#!/bin/bash
# Runs the test suite of optimistix, lineax or diffrax with every `eqx.filter_jit` read
# as `eqx_static.jit`: the library's own decorators (applied at import) and the tests'.
# A pytest plugin written into a temp dir sets `equinox.filter_jit = eqx_static.jit`
# before the library is imported, stops the run if the library does not see it, and
# prints how many es.jit wrappers were made and how often the library's own were called.
# The tests are the library's own at the installed version, under its own pytest config
# (jaxtyping instrumentation, filterwarnings).
# Usage: tools/peer_dropin.sh [--baseline] LIB GIT_DIR [pytest args...]
#   (pytest args naming test files, e.g. tests/test_solve.py, run those instead of all)
#   LIB:        optimistix | lineax | diffrax
#   GIT_DIR:    a git directory of patrick-kidger/LIB (the search tool's fetch gives one)
#   --baseline: the same run with Equinox's own filter_jit, to see what fails anyway
#   PYTHON:     env var, defaults to .venv/bin/python; run from the project root.
# Example: tools/peer_dropin.sh lineax /work/.mirror/patrick-kidger+lineax/repo -k vmap
{  # read whole before it runs: editing the script meanwhile cannot derail a run
set -u
baseline=0
[[ ${1:-} == --baseline ]] && { baseline=1; shift; }
lib=${1:?usage: peer_dropin.sh [--baseline] LIB GIT_DIR [pytest args...]}
git_dir=$(realpath "${2:?usage: peer_dropin.sh [--baseline] LIB GIT_DIR [pytest args...]}")
shift 2
py=$(realpath -s "${PYTHON:-.venv/bin/python}")
case $lib in
  optimistix|lineax) tests=tests ;;
  diffrax) tests=test ;;
  *) echo "LIB must be optimistix, lineax or diffrax" >&2; exit 2 ;;
esac
ver=$("$py" -c "import importlib.metadata as m; print(m.version('$lib'))") || exit 2
git --git-dir="$git_dir" rev-parse -q --verify "v$ver^{commit}" >/dev/null \
  || { echo "no tag v$ver in $git_dir" >&2; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git --git-dir="$git_dir" archive "v$ver" "$tests" pyproject.toml | tar -x -C "$scratch" || exit 2
cat >"$scratch/_es_dropin.py" <<'EOF'
import functools, importlib.util, os, sys
import equinox as eqx
import eqx_static as es
import jax
import pytest
from eqx_static._jit import _Jit

compiles = []  # every XLA compile JAX reports in the run, by program name
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(kw.get("fun_name"))
    if event == "/jax/core/compile/backend_compile_duration" else None
)

LIB, BASELINE = os.environ["ES_DROPIN_LIB"], os.environ["ES_DROPIN_BASELINE"] == "1"
ENTRY = {"optimistix": "minimise", "lineax": "linear_solve", "diffrax": "diffeqsolve"}[LIB]
assert LIB not in sys.modules, f"{LIB} was imported before the plugin"
made = {}  # top-level package of the wrapped function -> es.jit wrappers made
own = []  # the library's own wrappers: they live as long as the process

def jit(fn=None, /, **kwargs):
    if fn is None:  # `eqx.filter_jit(donate=...)`
        return functools.partial(jit, **kwargs)
    wrapper = es.jit(fn, **kwargs)
    where = (getattr(fn, "__module__", None) or "?").split(".")[0]
    made[where] = made.get(where, 0) + 1
    if where == LIB:
        own.append(wrapper)
    return wrapper

if not BASELINE:
    eqx.filter_jit = jit

def pytest_addoption(parser):
    if importlib.util.find_spec("pytest_benchmark") is None:  # optimistix's addopts
        parser.addoption("--benchmark-skip", action="store_true")

def pytest_collection_finish(session):
    entry = getattr(sys.modules.get(LIB), ENTRY, None)
    is_es = type(entry) is _Jit
    if entry is not None and is_es == BASELINE:
        pytest.exit(f"{LIB}.{ENTRY} is {entry!r}: the replacement is "
                    f"{'on in a baseline run' if BASELINE else 'not in effect'}", 3)

def pytest_terminal_summary(terminalreporter):
    write = terminalreporter.write_line
    write(f"XLA compiles: {len(compiles)}")
    if BASELINE:
        return write(f"baseline: eqx.filter_jit is Equinox's ({eqx.filter_jit.__module__})")
    caches = {id(getattr(w, "f", None) or w.cache): w.cache_info() for w in own}.values()
    hits, misses = sum(c.hits for c in caches), sum(c.misses for c in caches)
    by = ", ".join(f"{n} in {m}" for m, n in sorted(made.items()))
    write(f"es.jit wrappers made: {by}; calls to the {len(own)} of {LIB}: "
          f"{hits + misses} ({hits} hits, {misses} misses)")
EOF
# Each test file in a pytest process of its own, as the libraries' own `python -m tests`
# does (one process for a whole suite runs out of memory, or crashes XLA's compiler).
files=() opts=()
for a in "$@"; do [[ $a == "$tests"/* ]] && files+=("$a") || opts+=("$a"); done
[[ ${#files[@]} == 0 ]] && files=($(cd "$scratch" && ls "$tests"/test_*.py))
es_dir=$(cd "$scratch" && "$py" -c "import eqx_static, os; print(os.path.dirname(eqx_static.__file__))")
es_rev=$(git -C "$es_dir" log -1 --format=%h 2>/dev/null || echo "not in git")
[[ -n $(git -C "$es_dir" status --porcelain . 2>/dev/null) ]] && es_rev+=" + uncommitted changes"
mode=$([[ $baseline == 1 ]] && echo "baseline (eqx.filter_jit)" || echo "eqx_static.jit")
echo "$lib $ver tests from v$ver; $mode; eqx_static from $es_dir ($es_rev)"
rc=0
for f in "${files[@]}"; do
  (cd "$scratch" && ES_DROPIN_LIB=$lib ES_DROPIN_BASELINE=$baseline nice -n 10 \
    "$py" -m pytest -p _es_dropin -p no:cacheprovider -q "$f" "${opts[@]}") | tee "$scratch/out"
  r=${PIPESTATUS[0]}
  (( r != 0 && r != 5 )) && { (( r > rc )) && rc=$r; }  # 5: nothing selected in this file
  line=$(grep -E "(passed|failed|skipped|error|selected|no tests ran).* in [0-9.]+s" "$scratch/out" | tail -1)
  xla=$(grep -o -E "XLA compiles: [0-9]+" "$scratch/out" | tail -1)
  echo "$f: ${line:-1 crashed (pytest exited $r, no summary)}; ${xla:-XLA compiles: ?}" >>"$scratch/summary"
done
echo "== $lib, $mode, per file:"; cat "$scratch/summary" 2>/dev/null
echo "== total:" $(grep -o -E "([0-9]+ (passed|failed|skipped|xfailed|xpassed|error|deselected|crashed)|XLA compiles: [0-9]+)" \
  "$scratch/summary" | sed 's/XLA compiles: \([0-9]*\)/\1 compiles/' | awk '{n[$2]+=$1} END {for (k in n) printf "%d %s, ", n[k], k}')
exit $rc
}