#!/usr/bin/env bash
# A multi-node Ray on one machine: a head and 2 worker nodes, all on 127.0.0.1, each worker declaring fake
# GPUs, to rehearse placement (arms on GPU nodes, load workers spread) without a cluster.
# `ray start --address` cannot join a second node on loopback only (Linux swaps in the eth0 address), so the
# nodes are started by ray.cluster_utils.Cluster, which keeps them on 127.0.0.1. Runs in the foreground until
# Ctrl-C / SIGTERM, which stops all three nodes.
# Every listener of the three nodes gets a free port; the head's may be given as infra/ray-up.sh's are (RAY_PORT,
# RAY_DASHBOARD_PORT, ...).
# Usage: infra/ray-multinode.sh [GPUS_PER_WORKER] [TEMP_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python_bin="${PYTHON_BIN:-$here/.venv/bin/python}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # every Ray listener on 127.0.0.1
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
  "${RAY_BIN:-$here/.venv/bin/ray}" get-auth-token --generate >/dev/null   # a token-mode head needs one
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"   # tools.localray
exec "$python_bin" - "${1:-2}" "${2:-${SPECDRILL_RAY_TMP:-/tmp/specdrill-ray}}" <<'PY'
import os, signal, sys, threading
from ray._common.utils import get_ray_address_file
from ray.cluster_utils import Cluster
from tools.localray import RayPorts

gpus, temp_dir = int(sys.argv[1]), sys.argv[2]
head_ports = RayPorts.from_env()
os.environ.update(head_ports.process_env())  # the head's metrics exporters read their ports from the environment
# Cluster writes its address to Ray's default temp dir (/tmp/ray), whatever temp_dir says; on a machine where no
# Ray has run yet that folder does not exist and the head fails to start.
os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
cluster = Cluster(
    initialize_head=True,
    head_node_args={
        "num_cpus": 4, "num_gpus": 0, "resources": {"head": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": True, "dashboard_host": "127.0.0.1", "temp_dir": temp_dir,
        **head_ports.node_args(head=True),
    },
)
# Each node unpacks job working dirs into its own folder: on a shared one, a worker node's agent re-extracts the
# package (remove, then unzip) under the running job driver's feet.
for i in (1, 2):
    cluster.add_node(num_cpus=4, num_gpus=gpus, resources={f"worker{i}": 1}, node_ip_address="127.0.0.1",
                     runtime_env_dir_name=f"runtime_resources_worker{i}", **RayPorts.pick().node_args(head=False))
cluster.wait_for_nodes()
# A job's supervisor finds its cluster through the address file in the node's temp dir (`ray start` writes it
# there; Cluster only to /tmp/ray); without it Ray falls back to "any GCS process on this machine", so with
# another Ray running here the job's driver may join that one.
with open(get_ray_address_file(temp_dir), "w") as f:
    f.write(cluster.address)
print(f"RAY_ADDRESS={cluster.address}  dashboard: http://127.0.0.1:{head_ports.dashboard}  (3 nodes, {gpus} fake GPUs "
      "per worker)", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
stop.wait()
cluster.shutdown()
PY
