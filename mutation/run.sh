#!/usr/bin/env bash
# Mutation testing of eqx_static with mutmut: how many small changes
# to the library does the test suite notice?
#
#   bash mutation/run.sh [module ...]      # default: _key _update _module _compile _report
#   bash mutation/run.sh _compile          # also runs tests/test_cache.py etc. per mutant
#   JOBS=4 bash mutation/run.sh _key       # parallel workers (default 2)
#   MUTATION_TESTS=own bash mutation/run.sh _sharing   # only the module's own tests
#   MUTATION_TESTS='tests/test_environment.py' bash mutation/run.sh _jax   # these only
#   MUTANTS='eqx_static._key.x_make_guard* eqx_static._key.xǁ_Writerǁ*' bash mutation/run.sh _key
#                                          # only these mutants (fnmatch patterns)
#
# Needs mutmut 3 in the venv (`.venv/bin/pip install mutmut`). The repository is
# copied (tracked and untracked, not ignored, files) to a temporary directory and
# mutated there: the working tree is never touched. Prints killed/total per
# module; the copy is kept, so that `cd <copy> && mutmut show <mutant>` shows a
# survivor's diff and `mutmut run <mutant>` re-runs one (after copying changed
# tests into <copy>/tests and <copy>/mutants/tests, delete
# <copy>/mutants/mutmut-stats.json: mutmut runs only the tests that called the
# mutated function when the stats were taken). Survivors that no test
# can catch are listed, with the reason, in mutation/equivalent.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/eqx_static_mutation.XXXXXX")
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$work")
cd "$work"
[ $# -gt 0 ] || set -- _key _update _module _compile _report
"$py" mutation/configure.py "$@"
# shellcheck disable=SC2086  # MUTANTS: mutmut name patterns, split on spaces
"$py" -m mutmut run --max-children "${JOBS:-2}" ${MUTANTS:-} >mutmut.log 2>&1 || { tail -n 40 mutmut.log; exit 1; }
if grep -q "failed to collect stats\|Failed to run clean test" mutmut.log; then
    echo "The unmutated tests fail in the copy; see $work/mutmut.log" >&2; exit 1
fi
"$py" mutation/score.py -v
echo "copy kept in $work"
