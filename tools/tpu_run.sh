#!/usr/bin/env bash
# The record of the suite and the benchmarks on the accelerator machine, into $OUT:
#   bash tools/tpu_run.sh [tools/record.py's options, such as --parts fast,slow]
# Needs .whl-tpu/ (the wheels of the pure-Python packages the machine's index lacks:
# equinox, diffrax, lineax, optimistix, beartype, jax_dataclasses). A venv that sees
# the machine's JAX: the packages are installed in its site-packages, where the
# suite's "user's line" tests expect libraries to be. flax is best effort (its own
# dependencies come from the index; nothing installed is upgraded).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that comes back}"
V=/tmp/v
if ! "$V/bin/python" -c "import equinox, optax, diffrax" 2>/dev/null; then
  python3 -m venv --system-site-packages "$V"
  "$V/bin/pip" install -q --no-deps .whl-tpu/*.whl
  export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
  index=(--isolated --only-binary=:all: --index-url file:///opt/pypi/simple)
  "$V/bin/pip" install -q "${index[@]}" --no-deps jaxtyping wadler-lindig optax \
    absl-py typing-extensions
  "$V/bin/pip" list --format=freeze | grep -E '^[A-Za-z0-9_.-]+==' > /tmp/installed.txt
  "$V/bin/python" -c "import jax, jaxlib; print(f'jax=={jax.__version__}')
print(f'jaxlib=={jaxlib.__version__}')" >> /tmp/installed.txt
  "$V/bin/pip" install -q "${index[@]}" -c /tmp/installed.txt flax \
    || echo "flax: not installed (its dependencies did not resolve)"
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 "$V/bin/python" tools/record.py --out "$OUT" "$@" 2>&1 \
  | tee -a "$OUT/log.txt"
