#!/usr/bin/env bash
# The main job: `dualbudget check` — the proofs, then a short lockstep fuzz of the installed
# vLLM (the newest release with a lock file, vllm 0.34.0, by default; DUALBUDGET_VLLM=0.32
# or 0.33 for an earlier one) against the reference, then one verdict table. Builds the
# environments it needs on first use.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
version=${DUALBUDGET_VLLM:-$(vllm_releases | sort -V | tail -1)}
ensure_core_env
ensure_vllm_env "$version"
export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0
exec ".venv-vllm-$version/bin/dualbudget" check "$@"
