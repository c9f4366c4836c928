"""The serve path per pair of nodes: from a load worker's send to the Serve replica's receipt of the request,
for each (load worker's node, replica's node). On a cluster a worker may send through the proxy of its own node
to a replica elsewhere; this is where a slow or misrouted path shows.

Both ends are wall-clock readings (each process's monotonic clock anchored once to the epoch, timebase/): on two
nodes the figure also holds the offset between their clocks (NTP keeps it near a millisecond, not at zero), so a
pair of nodes is compared with itself over time, and a negative p50 means the clocks disagree, not time travel.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.read.source import Requests

WorkerNode = tuple[str, str, int, int, str | None]  # (arm, shape, repeat, worker, the worker's Ray node)


class ServePath(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    client_node: str | None  # the load worker's Ray node (None: not recorded)
    server_node: str | None  # the replica's Ray node, as the arm reported it
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def message(self) -> str:
        where = f"{(self.client_node or '?')[:8]} -> {(self.server_node or '?')[:8]}"
        same = " (one node)" if self.client_node == self.server_node else " (two nodes: includes their clock offset)"
        return (
            f"serve path {where}{same}: send -> replica receipt p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, "
            f"max {self.max_ms:.2f} ms, n={self.requests}"
        )


def _worker_nodes(workers: Sequence[WorkerNode]) -> pa.Table:
    keys = ("arm", "shape", "repeat", "worker", "client")
    rows = [dict(zip(keys, w, strict=True)) for w in workers]
    schema = pa.schema([("arm", pa.string()), ("shape", pa.string()), ("repeat", pa.int32()),
                        ("worker", pa.int32()), ("client", pa.string())])  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def serve_paths(requests: Requests, workers: Sequence[WorkerNode]) -> list[ServePath]:
    """Exact quantiles per (worker node, replica node) over the requests the replica received."""
    requests.con.register("worker_nodes", _worker_nodes(workers))
    try:
        rows = requests.con.execute(
            """
            SELECT w.client, t.node_id AS server, count(*) AS n,
                   quantile_disc(d, 0.5) AS p50, quantile_disc(d, 0.99) AS p99, max(d) AS mx
            FROM (SELECT arm, shape, repeat, worker, node_id, (server_received_ns - sent_ns) / 1e6 AS d FROM trace
                  WHERE server_received_ns IS NOT NULL AND sent_ns IS NOT NULL) t
            LEFT JOIN worker_nodes w USING (arm, shape, repeat, worker)
            GROUP BY ALL ORDER BY w.client NULLS LAST, server NULLS LAST
            """
        ).fetchall()
    finally:
        requests.con.unregister("worker_nodes")
    return [
        ServePath(client_node=c, server_node=s, requests=int(n), p50_ms=p50, p99_ms=p99, max_ms=mx)
        for c, s, n, p50, p99, mx in rows
    ]
