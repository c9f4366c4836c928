"""The serve path per pair of nodes (orchestrator/analysis/serve_path.py) on a trace with known delays."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from orchestrator.analysis.read.source import Requests
from orchestrator.analysis.serve_path import serve_paths


def test_each_pair_of_nodes_gets_its_exact_quantiles_and_says_where_clocks_differ() -> None:
    # Worker 0 on node A sends to the replica on node A (1..100 us), worker 1 on node B to it (1..100 ms).
    rows = [
        {"arm": "off", "shape": "s", "repeat": 0, "worker": w, "node_id": "A" * 12, "sent_ns": 1_000 * i,
         "server_received_ns": 1_000 * i + (i + 1) * (1_000 if w == 0 else 1_000_000)}
        for w in (0, 1) for i in range(100)
    ] + [{"arm": "off", "shape": "s", "repeat": 0, "worker": 1, "node_id": None, "sent_ns": 5,
          "server_received_ns": None}]  # fmt: skip
    con = duckdb.connect()
    con.register("trace", pa.Table.from_pylist(rows))
    workers = [("off", "s", 0, 0, "A" * 12), ("off", "s", 0, 1, "B" * 12)]
    paths = serve_paths(Requests(con=con, arms=("off",), has_steps=False, step_arms=frozenset()), workers)
    same, across = paths
    assert (same.client_node, same.server_node, same.requests) == ("A" * 12, "A" * 12, 100)
    assert (same.p50_ms, same.p99_ms, same.max_ms) == (0.05, 0.099, 0.1)  # exact (discrete) quantiles
    assert (across.client_node, across.requests, across.p50_ms, across.max_ms) == ("B" * 12, 100, 50.0, 100.0)
    assert same.message == (
        "serve path AAAAAAAA -> AAAAAAAA (one node): send -> replica receipt p50 0.05 ms, p99 0.10 ms, max 0.10 ms, "
        "n=100"
    )
    assert "BBBBBBBB -> AAAAAAAA (two nodes: includes their clock offset)" in across.message
