"""Peak memory of a load worker replaying a window of a 5-million-row BurstGPT-format file (issue 18).

    .venv/bin/python benchmarks/bench_replay_memory.py [--rows 5000000] [--file /tmp/burstgpt-5m.csv]

The file is generated (examples/make_burstgpt_sample.py, seeded: about 0.9 requests per second with bursts, so
5M rows span about two months, as BurstGPT's do). Each case runs in a fresh process and reports its peak resident
set (VmHWM): importing what a worker imports; a worker's plan for one hour of the trace (validating the shape,
then its share of the requests with prompts built), with the hour a month in and at the file's end (the times of
almost every row are read to get there); and, for scale, reading the whole file into one Arrow table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE = r"""
import json, sys, time
start = time.perf_counter()
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.mixes import RequestMix
from loadshapes.shapes import Replay
case, path, start_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = {"case": case}
if case == "imports":
    pass
elif case == "whole_file":
    import pyarrow.csv as pacsv
    out["rows_held"] = pacsv.read_csv(path).num_rows
else:
    shape = Replay(path=path, format="burstgpt", start_s=start_s, duration_s=3600.0, bin_s=10.0)
    mix = RequestMix.model_validate({"entries": [{"workload": "chat", "weight": 1}]})
    plan = WorkerPlan(campaign="c", run="r", arm="a", shape_name="s", shape=shape, mix=mix, worker=0, workers=4,
                      target=Target(base_url="http://127.0.0.1:1", model="m"), trace_root="/tmp/unused")
    schedule = open_loop_schedule(plan)
    out["window_requests"] = int(shape.expected_requests)
    out["worker_requests"] = len(schedule)
    out["worker_prompt_words"] = sum(p.spec.prompt_tokens for p in schedule)
out["seconds"] = round(time.perf_counter() - start, 2)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
out["peak_rss_mib"] = round(int(hwm.split()[1]) / 1024, 1)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--file", default="/tmp/burstgpt-5m.csv")
    args = parser.parse_args()
    path = Path(args.file)
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "make_burstgpt_sample.py"), "--rows", str(args.rows),
             "--out", str(path), "--base-rate", "0.5"],
            check=True,
        )  # fmt: skip
    with path.open("rb") as handle:
        handle.seek(-200, 2)
        last = float(handle.read().decode().strip().splitlines()[-1].split(",")[0])
    print(f"{path}: {path.stat().st_size / 2**20:.0f} MiB, trace of {last / 86400:.1f} days")
    cases = [("imports", 0.0), ("window_day30", 30 * 86400.0), ("window_at_end", last - 3600.0), ("whole_file", 0.0)]
    for case, start_s in cases:
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CASE, case, str(path), str(start_s)], check=True, capture_output=True, text=True,
            cwd=ROOT,
        )  # fmt: skip
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["wall_s"] = round(time.perf_counter() - began, 2)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
