#!/usr/bin/env bash
# The core test suite (the README's, without vLLM) run twice while every core is kept busy
# by a spinning process, as on a loaded CI machine: no test may depend on the machine's
# speed (time budgets take an injected clock). Exit 0 only when both runs pass.
#   bash scripts/core-under-load.sh            # two runs
#   bash scripts/core-under-load.sh 3          # three
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_core_env
cd "$repo"
runs=${1:-2}
spinners=()
stop_spinners() { kill "${spinners[@]}" 2> /dev/null || true; }
trap stop_spinners EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  spinners+=($!)
done
echo "core-under-load: ${#spinners[@]} spinning processes, $runs runs of the core suite"
failed=0
for run in $(seq "$runs"); do
  started=$SECONDS
  if .venv/bin/pytest -m "not live" -q -p no:cacheprovider tests; then
    echo "core-under-load: run $run passed in $((SECONDS - started)) s"
  else
    echo "core-under-load: run $run FAILED after $((SECONDS - started)) s"
    failed=1
  fi
done
exit "$failed"
