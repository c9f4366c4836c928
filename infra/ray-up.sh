#!/usr/bin/env bash
# Start a local Ray head that listens on loopback only, for `specdrill deploy` and `ray job submit`.
# Usage: infra/ray-up.sh [NUM_CPUS] [TEMP_DIR]     Stop it with: infra/ray-down.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ray_bin="${RAY_BIN:-$here/.venv/bin/ray}"
num_cpus="${1:-8}"
temp_dir="${2:-${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # keeps GCS and raylet on 127.0.0.1 (see README)
mkdir -p "$temp_dir"
"$ray_bin" start --head --node-ip-address=127.0.0.1 --port="${RAY_PORT:-6380}" \
  --dashboard-host=127.0.0.1 --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" \
  --num-cpus="$num_cpus" --temp-dir="$temp_dir" --disable-usage-stats
echo "RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6380}  dashboard: http://127.0.0.1:${RAY_DASHBOARD_PORT:-8265}"
