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
ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT:-8265}" --working-dir . \
  -- specdrill run "$campaign" --output "$output"
echo "report: $output/report.html   traces: $output/traces   summary: $output/summary.json"
