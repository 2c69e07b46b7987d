# Shared by scripts/test.sh and scripts/check.sh: build the environments they run in.
# Every version is pinned; a step that fails stops the script (set -e in the callers).

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=python3.11

# The core environment: dualbudget with its pinned dependencies and the linters.
ensure_core_env() {
  local venv="$repo/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "setuptools==80.9.0" -e "$repo[dev]"
}

# A vLLM environment (0.32 or 0.33), built once and reused while its inputs are unchanged.
ensure_vllm_env() {
  local version=$1 venv="$repo/.venv-vllm-$1"
  local stamp="$venv/.dualbudget-inputs"
  local inputs
  inputs=$(cat "$repo/scripts/install-vllm.sh" "$repo"/requirements/*.txt "$repo/pyproject.toml" | sha256sum)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$repo"
    return
  fi
  rm -rf "$venv"
  bash "$repo/scripts/install-vllm.sh" "$version" "$venv"
  echo "$inputs" > "$stamp"
}
