# Shared by scripts/test.sh and scripts/check.sh: build the environments they run in.
# Every version is an exact pin of a lock file under requirements/; a step that fails stops
# the script (set -e in the callers).

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The Python of the core environment and of the vLLM environments (the whole suite runs on
# it); ensure_smoke_env builds the other supported ones (pyproject.toml's requires-python).
python_version=3.11
locks="$repo/requirements"

# The interpreter of Python $1 (3.12): python3.12 where it runs, else pyenv's newest
# installation of that version (pyenv's shim answers only for the active versions).
python_of() {
  local version=$1 found
  if "python$version" -c '' 2>/dev/null; then
    echo "python$version"
    return
  fi
  if command -v pyenv > /dev/null; then
    found=$(pyenv versions --bare | grep -E "^${version//./\\.}(\\.[0-9]+)?$" | sort -V | tail -1)
    if [ -n "$found" ]; then
      echo "$(pyenv root)/versions/$found/bin/python$version"
      return
    fi
  fi
  echo "lib.sh: no Python $version here (python$version, pyenv)" >&2
  return 1
}

pip_in() {
  "$1/bin/python" -m pip --disable-pip-version-check "${@:2}"
}

# The vLLM releases the live checks run against: one lock file each,
# requirements/vllm-<release>.lock (tests/unit/test_packaging.py holds them equal to the
# release records of spec/releases.py).
vllm_releases() {
  local lock
  for lock in "$locks"/vllm-*.lock; do
    lock=${lock##*/vllm-}
    echo "${lock%.lock}"
  done
}

# The core environment: dualbudget (editable) with the runtime, test and tool pins. The
# pins go in with --no-deps and `pip check` then proves the lock closed: a dependency the
# lock forgot fails here instead of being resolved behind its back.
ensure_core_env() {
  local venv="$repo/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    "$(python_of "$python_version")" -m venv "$venv"
  fi
  pip_in "$venv" install --quiet -r "$locks/pip.lock"
  pip_in "$venv" install --quiet --no-deps -r "$locks/dev.lock"
  pip_in "$venv" install --quiet --no-deps --no-build-isolation -e "$repo"
  pip_in "$venv" check
}

# The built wheel, made once per run from the core environment's pinned setuptools.
build_wheel() {
  local dist="$repo/out/dist"
  rm -rf "$dist"
  pip_in "$repo/.venv" wheel --quiet --no-deps --no-build-isolation \
    --wheel-dir "$dist" "$repo"
  echo "$dist"/dualbudget-*.whl
}

# An environment on another supported Python (3.12, 3.13) holding the built wheel, as a
# user installs it, beside the runtime and test pins.
ensure_smoke_env() {
  local version=$1 wheel=$2 venv="$repo/.venv-py$1"
  if [ ! -x "$venv/bin/python" ]; then
    "$(python_of "$version")" -m venv "$venv"
  fi
  pip_in "$venv" install --quiet -r "$locks/pip.lock"
  pip_in "$venv" install --quiet --no-deps -r "$locks/runtime.lock" -r "$locks/test.lock"
  pip_in "$venv" install --quiet --no-deps --force-reinstall "$wheel"
  pip_in "$venv" check
}

# The digest of what install-vllm.sh builds the environment of release $1 from.
vllm_env_inputs() {
  cat "$repo/scripts/lib.sh" "$repo/scripts/install-vllm.sh" "$locks/pip.lock" \
    "$locks/vllm-$1.lock" "$locks/vllm-runtime.txt" "$locks/ray.txt" "$locks/runtime.lock" "$locks/test.lock" \
    | sha256sum
}

# A vLLM environment (one release of vllm_releases), built once and reused while the files
# it is built from are unchanged.
ensure_vllm_env() {
  local version=$1 venv="$repo/.venv-vllm-$1"
  local stamp="$venv/.dualbudget-inputs"
  local inputs
  inputs=$(vllm_env_inputs "$version")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ]; then
    pip_in "$venv" install --quiet --no-deps -e "$repo"
    return
  fi
  rm -rf "$venv"
  bash "$repo/scripts/install-vllm.sh" "$version" "$venv"
  echo "$inputs" > "$stamp"
}
