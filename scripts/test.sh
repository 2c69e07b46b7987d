#!/usr/bin/env bash
# The test job: lint, types, the import contracts, the core suite (spec, reference, proofs,
# traces, packaging), the spec's mutants, the built wheel on the other supported Pythons
# (3.12 and 3.13: installed as a user installs it, then a smoke set), then inside each real
# vLLM release (one per requirements/vllm-*.lock) the live suite, `dualbudget check` on a
# copy of the release's Python sources given as a tree under review (--vllm-src: the
# proofs and a seeded lockstep fuzz) and `dualbudget mutate` (budget bugs planted in
# vLLM's scheduler: every one killed or equivalent with its reason, see docs/mutate.md);
# on the newest release also the same fuzz against the installed vLLM, once locally and
# once on a local Ray (whose JSON must equal it), and the benchmark (its ratio printed,
# never asserted). Installs everything it needs (virtual environments under the
# repository root, from the lock files under requirements/).
# Under CI=true (.ci/run sets it) a skipped test fails its run (tests/conftest.py), and so
# does a run that collects no test (pytest's exit code 5 stops this script like any other).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
mkdir -p out

# pytest-xdist: a worker per core, each test module whole in one worker (tests/conftest.py).
parallel="--numprocesses auto --dist loadgroup"
# The live tests wait on the processes they start (vLLM's import, the fuzz's workers): with
# a worker per core they kept 155% of two cores busy, so they run one worker more.
live_parallel="--numprocesses $(($(nproc) + 1)) --dist loadgroup"

# Each stage's line says when it started, so a run's log shows where its time went.
stage() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

ensure_core_env
stage "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
stage "mypy --strict, every package and the tests"
.venv/bin/mypy -p dualbudget -p tests
stage "the import contracts of docs/design.md §3.1 (lint-imports)"
.venv/bin/lint-imports --no-cache
stage "core tests (no vLLM)"
.venv/bin/pytest -m "not live" $parallel tests
stage "every proof obligation and every mutant (dualbudget prove --mutants)"
.venv/bin/dualbudget prove --mutants --json out/prove.json --junit out/prove.xml \
  --witness-dir out/witnesses
stage "every shipped trace (dualbudget replay)"
.venv/bin/dualbudget replay dualbudget/traces/*

smoke_started=$SECONDS
wheel=$(build_wheel)
for python in 3.12 3.13; do
  stage "the built wheel on Python $python: install from the lock files, then the smoke set"
  ensure_smoke_env "$python" "$wheel"
  # -P: the installed wheel, never the checkout that the current directory would put first.
  ".venv-py$python/bin/python" -P -c 'import dualbudget, sys
assert "site-packages" in dualbudget.__file__, dualbudget.__file__
print("dualbudget from", dualbudget.__file__, "on Python", sys.version.split()[0])'
  ".venv-py$python/bin/dualbudget" schedule examples/upstream-p-eagle.json > /dev/null
  ".venv-py$python/bin/dualbudget" prove --only C3 --witness-dir "out/smoke-$python/witnesses"
  ".venv-py$python/bin/pytest" -m "not live" tests/unit/test_contract.py tests/worked/test_contract_reference.py
done
stage "the smoke set on Python 3.12 and 3.13 took $((SECONDS - smoke_started)) s"

export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0
newest=$(vllm_releases | sort -V | tail -n 1)
for version in $(vllm_releases); do
  stage "vLLM $version environment"
  ensure_vllm_env "$version"
  stage "live tests against vLLM $version"
  ".venv-vllm-$version/bin/pytest" -m live $live_parallel --durations=12 tests
  if [ "$version" = "$newest" ]; then
    # Every release's seeded fuzz runs inside `check --vllm-src` below, on a copy of the
    # same sources at the same seed and examples; the installed vLLM's own run is kept
    # for the newest, whose JSON the Ray run must equal. The executor seam is the same
    # code under every release, and the live suite compares it at 20 examples in each.
    stage "lockstep fuzz against vLLM $version (seed 1)"
    ".venv-vllm-$version/bin/dualbudget" fuzz --examples 200 --seed 1 \
      --json "out/fuzz-$version.json" --out-dir "out/divergences-$version"
    stage "the same fuzz on a local Ray: the same JSON as the local run, timings aside"
    # One --out-dir for both: the scenario files' paths are part of the JSON compared.
    ".venv-vllm-$version/bin/dualbudget" fuzz --examples 200 --seed 1 --executor ray \
      --json "out/fuzz-ray-$version.json" --out-dir "out/divergences-$version"
    ".venv-vllm-$version/bin/python" -m dualbudget.campaign.same_results \
      "out/fuzz-$version.json" "out/fuzz-ray-$version.json"
  fi
  stage "dualbudget check --vllm-src on a copy of vLLM $version's Python sources"
  src=$(mktemp -d)
  ".venv-vllm-$version/bin/python" -m tests.vllm_trees "$src" > /dev/null
  # The fuzz at the plain fuzz's seed and examples, uncapped: its steps never depend on
  # the machine's speed.
  ".venv-vllm-$version/bin/dualbudget" check --vllm-src "$src" \
    --fuzz-examples 200 --seed 1 --fuzz-seconds 0 --out-dir "out/check-src-$version" --junit "out/check-src-$version.xml"
  rm -rf "$src"
  if [ "$version" = "$newest" ]; then
    # A speed figure, printed, never asserted: the newest release's serves (the live suite
    # runs the bench on every release, tests/live/test_bench_live.py).
    stage "steps/s of the reference and of vLLM $version (printed, not asserted)"
    ".venv-vllm-$version/bin/dualbudget" bench --json "out/bench-$version.json"
  fi
  stage "budget bugs planted in vLLM $version's scheduler (dualbudget mutate)"
  ".venv-vllm-$version/bin/dualbudget" mutate --json "out/mutate-$version.json" \
    --out-dir "out/mutants-$version"
done
stage "done"
