#!/usr/bin/env bash
# Check a vLLM source tree (a pull request's checkout, an unpacked sdist: DIR holds vllm/)
# without building it: `dualbudget check --vllm-src DIR`, the tree's Python run over the
# compiled parts of a vLLM release this project pins (the newest; DUALBUDGET_VLLM=0.32
# picks another). Builds the environments it needs on first use, as scripts/check.sh does;
# further arguments go to `dualbudget check`.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: scripts/check-vllm-checkout.sh DIR [dualbudget check flags]" >&2
  exit 2
fi
tree=$(cd "$1" && pwd)
shift
source "$(dirname "$0")/lib.sh"
cd "$repo"
version=${DUALBUDGET_VLLM:-$(vllm_releases | sort -V | tail -1)}
ensure_core_env
ensure_vllm_env "$version"
export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0
exec ".venv-vllm-$version/bin/dualbudget" check --vllm-src "$tree" "$@"
