"""Ten minutes of real-time load on Ray load workers, with a fault burst half-way (`make bench-soak`).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_soak.py [--duration-s 600] [--json out.json]

The suite runs the same scenario for 60 s (tests/orchestrator/execute/test_long_runs.py, tests/soak.py). This run
adds what only length shows: whether the load workers' memory or send lateness drift. Every 5 s it reads the
resident set of each Locust process of this run (found by the plan path in its environment), compared from the end
of the first minute (imports and warm-up before it) to the end; per minute of the schedule it takes the send
lateness's p50 and p99 from the trace. It prints the last minute against the first as ratios, and checks, as the
suite does, that every scheduled request is exactly one row. """

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from loadshapes.null_server import NullConfig, NullServer, ServerThread
from tests.soak import soak


def _rss_of_workers(workdir: Path) -> int:
    """Summed VmRSS (bytes) of the Locust processes whose plan lies under `workdir`."""
    total = 0
    marker = f"SPECDRILL_LOAD_PLAN={workdir}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if marker not in Path(entry.path, "environ").read_bytes():
                continue
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:  # the process ended, or is not ours to read
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    samples: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory(prefix="specdrill-soak-") as tmp:
        workdir = Path(tmp)

        def sample(done: threading.Event) -> None:
            start = time.monotonic()
            while not done.wait(5.0):
                rss = _rss_of_workers(workdir / "w")
                if rss:
                    samples.append((time.monotonic() - start, rss))

        server = ServerThread(NullServer(NullConfig(chunks=16, tokens_per_chunk=2, chunk_delay_s=0.02)))
        try:
            started = time.monotonic()
            shape, summaries, table = soak(server, workdir, duration_s=args.duration_s, burst_s=10.0, during=sample)
            wall_s = time.monotonic() - started
            received = len(server.server.received_ids)
        finally:
            server.stop()
    scheduled = sum(s.scheduled for s in summaries)
    lost = any(s.lost for s in summaries)
    minutes = _per_minute(table)
    classes = Counter(table.column("error_class").to_pylist())
    first, last = minutes[0], minutes[-1]
    # Memory from the end of the first minute on: before it the workers are still importing and warming up.
    steady = [r for t, r in samples if t >= 60.0] or [r for _, r in samples] or [0]
    rss_first, rss_last = steady[0], steady[-1]
    rss_per_minute = [
        round(max((r for t, r in samples if int(t // 60) == m), default=0) / 2**20, 1)
        for m in range(int(samples[-1][0] // 60) + 1 if samples else 0)
    ]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "duration_s": args.duration_s, "wall_s": round(wall_s, 1),
        "expected": round(shape.expected_requests), "scheduled": scheduled, "rows": table.num_rows,
        "received": received, "lost_worker": lost,
        "http_500_rows": classes["http_500"], "truncated_rows": classes["truncated_stream"],
        "lateness_per_minute": [{"minute": m, "n": n, "p50_ms": p50, "p99_ms": p99} for m, n, p50, p99 in minutes],
        "lateness_p50_last_over_first": round(last[2] / first[2], 3) if first[2] else None,
        "lateness_p99_last_over_first": round(last[3] / first[3], 3) if first[3] else None,
        "worker_rss_max_mib_per_minute": rss_per_minute,
        "worker_rss_at_60s_mib": round(rss_first / 2**20, 1), "worker_rss_last_mib": round(rss_last / 2**20, 1),
        "worker_rss_max_mib": round(max((r for _, r in samples), default=0) / 2**20, 1),
        "worker_rss_last_over_60s": round(rss_last / rss_first, 3) if rss_first else None,
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    ok = not lost and scheduled == table.num_rows == received
    print("every scheduled request is one row" if ok else "ROWS LOST: see scheduled / rows / received above")
    raise SystemExit(0 if ok else 1)


def _per_minute(trace: pa.Table) -> list[tuple[int, int, float, float]]:
    # DuckDB reads the Arrow table by its variable name.
    rows = duckdb.sql(
        """
        WITH t AS (SELECT scheduled_ns, send_lateness_ns FROM trace WHERE send_lateness_ns IS NOT NULL)
        SELECT CAST((scheduled_ns - (SELECT min(scheduled_ns) FROM t)) // 60000000000 AS INTEGER) AS minute,
               count(*), quantile_cont(send_lateness_ns, 0.5) / 1e6, quantile_cont(send_lateness_ns, 0.99) / 1e6
        FROM t GROUP BY minute ORDER BY minute
        """
    ).fetchall()
    return [(int(m), int(n), round(float(p50), 3), round(float(p99), 3)) for m, n, p50, p99 in rows]


if __name__ == "__main__":
    main()
