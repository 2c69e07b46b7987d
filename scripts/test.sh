#!/usr/bin/env bash
# The test job: lint, types, the core test suite, then the live suite inside each real vLLM.
# Installs everything it needs (virtual environments under the repository root).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"

ensure_core_env
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict spec reference"
.venv/bin/python scripts/mypy_strict.py
echo "== core tests (no vLLM)"
.venv/bin/pytest -m "not live" tests

for version in 0.32 0.33; do
  echo "== vLLM $version environment"
  ensure_vllm_env "$version"
  echo "== live tests against vLLM $version"
  VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0 \
    ".venv-vllm-$version/bin/pytest" -m live tests
done
