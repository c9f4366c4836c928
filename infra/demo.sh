#!/usr/bin/env bash
# make demo: a loopback Ray head, the quickstart campaign submitted as a Ray job, the report, Ray stopped again.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
export PATH="$here/.venv/bin:$PATH"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # every Ray listener on 127.0.0.1
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"   # Ray 2.5x+ token auth: the job client must send the token too
campaign="${1:-campaigns/quickstart.yaml}"
output="$here/runs/quickstart-$(date +%Y%m%d-%H%M%S)"
infra/ray-up.sh "${SPECDRILL_DEMO_CPUS:-8}" "${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}"
trap 'infra/ray-down.sh >/dev/null 2>&1 || true' EXIT
address="http://127.0.0.1:${RAY_DASHBOARD_PORT:-8265}"
log="$(mktemp)"
status=1
for _ in $(seq 40); do   # the dashboard's job agent comes up a few seconds after `ray start`
  set +e
  ray job submit --address "$address" --working-dir . -- specdrill run "$campaign" --output "$output" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  grep -q "No available agent to submit job" "$log" || break
  sleep 3
done
rm -f "$log"
[ "$status" -eq 0 ] || exit "$status"
echo "report: $output/report.html   traces: $output/traces   summary: $output/summary.json"
