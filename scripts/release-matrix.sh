#!/usr/bin/env bash
# The release matrix (docs/release-matrix.md): every vLLM release of
# requirements/matrix.txt in an environment of its own under .venv-matrix/, each detected
# by its decisions and fuzzed, one row each; the arguments go to `dualbudget matrix`:
#   bash scripts/release-matrix.sh                                  # every listed release
#   bash scripts/release-matrix.sh --releases 0.27.1,0.31.0 --examples 24 --jobs 1
#   bash scripts/release-matrix.sh --render docs/release-matrix     # the table from the JSONs
# Builds (or brings up to date) the core environment first (scripts/lib.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_core_env
cd "$repo"
exec "$repo/.venv/bin/dualbudget" matrix "$@"
