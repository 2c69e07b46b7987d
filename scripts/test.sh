#!/usr/bin/env bash
# The test job: lint, types, the core suite (spec, reference, proofs, traces), the spec's
# mutants, then inside each real vLLM (0.32 and 0.33) the live suite, a seeded lockstep
# fuzz, the benchmark (its ratio printed, never asserted) and `dualbudget mutate` (budget
# bugs planted in vLLM's scheduler: every one killed or equivalent with its reason, see
# docs/mutate.md). Installs everything it needs (virtual environments under the
# repository root).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
mkdir -p out

ensure_core_env
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict, every package"
.venv/bin/python scripts/mypy_strict.py
echo "== core tests (no vLLM)"
.venv/bin/pytest -m "not live" tests
echo "== every proof obligation and every mutant (dualbudget prove --mutants)"
.venv/bin/dualbudget prove --mutants --json out/prove.json --junit out/prove.xml \
  --witness-dir out/witnesses
echo "== every shipped trace (dualbudget replay)"
.venv/bin/dualbudget replay tests/data/traces/*

export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0
for version in 0.32 0.33; do
  echo "== vLLM $version environment"
  ensure_vllm_env "$version"
  echo "== live tests against vLLM $version"
  ".venv-vllm-$version/bin/pytest" -m live tests
  echo "== lockstep fuzz against vLLM $version (seed 1)"
  ".venv-vllm-$version/bin/dualbudget" fuzz --examples 200 --seed 1 \
    --json "out/fuzz-$version.json" --out-dir "out/divergences-$version"
  echo "== steps/s of the reference and of vLLM $version (printed, not asserted)"
  ".venv-vllm-$version/bin/dualbudget" bench --json "out/bench-$version.json"
  echo "== budget bugs planted in vLLM $version's scheduler (dualbudget mutate)"
  ".venv-vllm-$version/bin/dualbudget" mutate --json "out/mutate-$version.json" \
    --out-dir "out/mutants-$version"
done
