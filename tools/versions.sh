#!/usr/bin/env bash
# The whole test suite on every Python this machine has (through pyenv), at the
# newest releases the package index serves each one, and at the declared floors
# (`tools/floors.py`) on the oldest: what CI's matrix runs, here.
#   tools/versions.sh            # all four combinations, one after the other
#   tools/versions.sh 3.12.1     # one Python, at its newest releases
#   PYTEST_ARGS='-m "not slow"' tools/versions.sh
# Each combination gets a virtual environment of its own in .venvs/ (reused), and
# its summary line in .venvs/summary.txt.
set -u
cd "$(dirname "$0")/.."
combos=("3.11.7 floors" "3.11.7 newest" "3.12.1 newest" "3.13.0 newest")
[[ $# -gt 0 ]] && combos=("$1 ${2:-newest}")
mkdir -p .venvs
python3 tools/floors.py > .venvs/floors.txt
status=0
for combo in "${combos[@]}"; do
  read -r py kind <<<"$combo"
  venv=.venvs/$py-$kind
  interpreter=$(PYENV_VERSION=$py pyenv which python) || { echo "no Python $py here" >&2; status=1; continue; }
  [[ -x $venv/bin/python ]] || "$interpreter" -m venv "$venv"
  constraints=()
  [[ $kind == floors ]] && constraints=(-c .venvs/floors.txt)
  "$venv/bin/pip" install -q --upgrade "${constraints[@]}" -e ".[test]" || { status=1; continue; }
  versions=$("$venv/bin/python" -c "import jax, jaxlib, equinox, sys; print(f'python {sys.version.split()[0]}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, equinox {equinox.__version__}')")
  echo "== $combo: $versions"
  line=$(eval "$venv/bin/python -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-}" | tee /dev/stderr | tail -1)
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  echo "$combo ($versions): $line" >> .venvs/summary.txt
done
exit $status
