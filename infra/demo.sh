#!/usr/bin/env bash
# make demo: a loopback Ray head of its own (a free port for every listener), the quickstart campaign submitted as
# a Ray job, the report, that Ray stopped again (only it: not `ray stop`, which stops every Ray on the machine).
# Usage: infra/demo.sh [CAMPAIGN]    VENV (.venv), SPECDRILL_DEMO_CPUS (8), SPECDRILL_SERVE_PORT (free),
#                                     RAY_*_PORT (free: see infra/ray-up.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
venv="${VENV:-$here/.venv}"
export PATH="$venv/bin:$PATH" RAY_BIN="$venv/bin/ray" PYTHON_BIN="$venv/bin/python"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # every Ray listener on 127.0.0.1
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"   # Ray 2.5x+ token auth: the job client must send the token too
campaign="${1:-campaigns/quickstart.yaml}"
output="$here/runs/quickstart-$(date +%Y%m%d-%H%M%S)"
temp_dir="$(mktemp -d /tmp/sddemo.XXXXXX)"   # short: Ray's socket paths have a length limit
log="$temp_dir/ray-up.log"
started=0
cleanup() {
  local status=$?
  if [ "$started" = 1 ]; then infra/ray-down.sh "$temp_dir" >/dev/null 2>&1 || true; fi
  if [ "$status" -eq 0 ]; then rm -rf "$temp_dir"; fi   # else its logs stay, for the failure line's pointer
}
trap cleanup EXIT
echo "demo: starting a Ray head on 127.0.0.1 (temp dir $temp_dir)"
started=1
if ! infra/ray-up.sh "${SPECDRILL_DEMO_CPUS:-8}" "$temp_dir" >"$log" 2>&1; then
  # One line: ray-up's own reason (a port someone holds), else the last line of `ray start`'s output.
  reason="$(grep -m1 '^ray-up: ' "$log" | sed 's/^ray-up: //' || true)"
  [ -n "$reason" ] || reason="\`ray start\` failed: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
  logs=""
  if [ -d "$temp_dir/session_latest" ]; then logs=", Ray's logs: $temp_dir/session_latest/logs"; fi
  echo "demo: $reason (output: $log$logs)" >&2
  exit 1
fi
set -a
# shellcheck disable=SC1091
. "$temp_dir/ports.env"   # the ports ray-up.sh chose
set +a
# The dashboard's job agent comes up seconds after `ray start`: wait for it quietly, or say in one line why not.
if ! why="$(python -m tools.localray wait-job-agent "$temp_dir" "$RAY_DASHBOARD_PORT" \
    "$RAY_DASHBOARD_AGENT_HTTP_PORT" "${SPECDRILL_AGENT_TIMEOUT_S:-120}" 2>&1)"; then
  echo "demo: ${why:-the job agent of Ray did not come up} (Ray's logs: $temp_dir/session_latest/logs)" >&2
  exit 1
fi
serve_port="${SPECDRILL_SERVE_PORT:-$(python -c 'from tools.localray import free_port; print(free_port())')}"
echo "demo: Ray is up (dashboard http://127.0.0.1:$RAY_DASHBOARD_PORT); submitting $campaign as a Ray job"
status=0
ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" --working-dir . -- \
  specdrill run "$campaign" --output "$output" --serve-port "$serve_port" || status=$?
[ "$status" -eq 0 ] || { echo "demo: the job failed (exit $status): its log is above; run directory $output" >&2
                         exit "$status"; }
echo "report: $output/report.html   traces: $output/traces   summary: $output/summary.json"
