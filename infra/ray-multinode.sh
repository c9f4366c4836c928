#!/usr/bin/env bash
# A multi-node Ray on one machine: a head and 2 worker nodes on 127.0.0.1, each worker declaring fake GPUs, so
# placement (arms on GPU nodes, load workers spread) can be rehearsed without a cluster.
# Usage: infra/ray-multinode.sh [GPUS_PER_WORKER] [TEMP_DIR]      Stop it with: infra/ray-down.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ray_bin="${RAY_BIN:-$here/.venv/bin/ray}"
gpus="${1:-2}"
temp_dir="${2:-${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}}"
port="${RAY_PORT:-6380}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # every Ray listener on 127.0.0.1
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
mkdir -p "$temp_dir"
"$ray_bin" start --head --node-ip-address=127.0.0.1 --port="$port" --dashboard-host=127.0.0.1 \
  --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" --num-cpus=4 --num-gpus=0 --temp-dir="$temp_dir" \
  --resources='{"head": 1}' --disable-usage-stats
for i in 1 2; do
  "$ray_bin" start --address="127.0.0.1:$port" --node-ip-address=127.0.0.1 --num-cpus=4 --num-gpus="$gpus" \
    --resources="{\"worker$i\": 1}" --disable-usage-stats
done
echo "RAY_ADDRESS=127.0.0.1:$port  dashboard: http://127.0.0.1:${RAY_DASHBOARD_PORT:-8265}  (3 nodes, ${gpus} fake GPUs per worker)"
