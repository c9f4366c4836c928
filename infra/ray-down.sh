#!/usr/bin/env bash
# Stop the Ray that infra/ray-up.sh started in TEMP_DIR, by the processes of that temp dir. Not `ray stop`: that
# stops every Ray on the machine, other people's and other test sessions' included.
# Usage: infra/ray-down.sh [TEMP_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
temp_dir="${1:-${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}}"
cd "$here" && exec "${PYTHON_BIN:-$here/.venv/bin/python}" -m tools.localray stop "$temp_dir"
