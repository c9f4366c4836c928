#!/usr/bin/env bash
# Stop the Ray started by infra/ray-up.sh on this machine.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
"${RAY_BIN:-$here/.venv/bin/ray}" stop --force
