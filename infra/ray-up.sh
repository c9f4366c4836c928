#!/usr/bin/env bash
# Start a local Ray head that listens on loopback only, for `specdrill deploy` and `ray job submit`.
# Every listener gets a free port unless given: RAY_PORT (GCS), RAY_DASHBOARD_PORT, RAY_DASHBOARD_AGENT_HTTP_PORT,
# RAY_DASHBOARD_AGENT_GRPC_PORT, RAY_RUNTIME_ENV_AGENT_PORT, RAY_METRICS_EXPORT_PORT, RAY_NODE_MANAGER_PORT,
# RAY_OBJECT_MANAGER_PORT, RAY_CLIENT_SERVER_PORT, AUTOSCALER_METRIC_PORT, DASHBOARD_METRIC_PORT (Ray's defaults,
# 6379/8265/52365/10001/..., collide with any other Ray on the machine: a head whose job agent finds its port taken
# never runs jobs). The ports are written to TEMP_DIR/ports.env.
# Usage: infra/ray-up.sh [NUM_CPUS] [TEMP_DIR]     Stop it with: infra/ray-down.sh [TEMP_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ray_bin="${RAY_BIN:-$here/.venv/bin/ray}"
python_bin="${PYTHON_BIN:-$here/.venv/bin/python}"
num_cpus="${1:-8}"
temp_dir="${2:-${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # keeps GCS and raylet on 127.0.0.1 (docs/operator/security.md)
mkdir -p "$temp_dir"
(cd "$here" && "$python_bin" -m tools.localray ports) > "$temp_dir/ports.env"
set -a
# shellcheck disable=SC1091
. "$temp_dir/ports.env"   # the given ports, free ones for the rest; exported: the metrics ports are read from env
set +a
# A given port that is taken makes `ray start` hang ~90 s and fail with a traceback that does not name it.
if ! held="$(cd "$here" && "$python_bin" -m tools.localray held "$temp_dir")"; then
  echo "ray-up: cannot start Ray: $(echo "$held" | paste -sd ';' | sed 's/;/; /g')" >&2
  exit 1
fi
# `ray start` in token mode refuses to start without a token; Ray's own ray.init makes one the same way.
if [ "${RAY_AUTH_MODE:-}" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
  "$ray_bin" get-auth-token --generate >/dev/null
fi
"$ray_bin" start --head --node-ip-address=127.0.0.1 --port="$RAY_PORT" \
  --dashboard-host=127.0.0.1 --dashboard-port="$RAY_DASHBOARD_PORT" \
  --dashboard-agent-listen-port="$RAY_DASHBOARD_AGENT_HTTP_PORT" \
  --dashboard-agent-grpc-port="$RAY_DASHBOARD_AGENT_GRPC_PORT" \
  --runtime-env-agent-port="$RAY_RUNTIME_ENV_AGENT_PORT" --metrics-export-port="$RAY_METRICS_EXPORT_PORT" \
  --node-manager-port="$RAY_NODE_MANAGER_PORT" --object-manager-port="$RAY_OBJECT_MANAGER_PORT" \
  --ray-client-server-port="$RAY_CLIENT_SERVER_PORT" --min-worker-port=0 --max-worker-port=0 \
  --num-cpus="$num_cpus" --temp-dir="$temp_dir" --disable-usage-stats
echo "RAY_ADDRESS=127.0.0.1:$RAY_PORT  dashboard: http://127.0.0.1:$RAY_DASHBOARD_PORT  (ports: $temp_dir/ports.env)"
