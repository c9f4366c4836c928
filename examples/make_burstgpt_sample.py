"""Write a seeded, bursty trace in BurstGPT's CSV layout (nothing is downloaded).

    python examples/make_burstgpt_sample.py                      # examples/burstgpt-sample.csv (checked in)
    python examples/make_burstgpt_sample.py --rows 5000000 --out /tmp/burstgpt-5m.csv   # the memory benchmark's

The arrivals are an inhomogeneous Poisson process: a slow daily swing of the base rate, plus burst episodes (they
start at random, last tens of seconds, and multiply the rate), the way BurstGPT's published traces look.
Lengths are log-normal like BurstGPT's (requests longer than responses, GPT-4 with longer answers), and a few
requests failed (0 response tokens), as in the real file. It is made up: it only looks like the real thing, so
docs/operator/replay.md says where to get the real traces.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def bursty_rate(seconds: int, rng: np.random.Generator, *, base: float, burst_every_s: float, burst_s: float,
                burst_factor: float) -> np.ndarray:  # fmt: skip
    """Requests per second for each second of the trace."""
    t = np.arange(seconds, dtype=np.float64)
    rate = base * (1.0 + 0.5 * np.sin(2 * np.pi * t / 86_400.0))  # a day's swing (flat over a short sample)
    starts = np.cumsum(rng.exponential(burst_every_s, size=int(seconds / burst_every_s * 2) + 4))
    starts = starts[starts < seconds].astype(np.int64)
    lengths = np.maximum(rng.exponential(burst_s, size=len(starts)), 3.0).astype(np.int64)
    boost = np.bincount(starts, minlength=seconds + 1) - np.bincount(
        np.minimum(starts + lengths, seconds), minlength=seconds + 1
    )
    in_burst = np.cumsum(boost)[:seconds] > 0
    return np.where(in_burst, rate * burst_factor, rate)


def sample(rows: int, *, seed: int, base: float, burst_every_s: float, burst_s: float, burst_factor: float) -> pa.Table:
    rng = np.random.default_rng(seed)
    mean_factor = 1.0 + (burst_factor - 1.0) * burst_s / (burst_every_s + burst_s)
    seconds = int(rows / (base * mean_factor) * 1.3) + 60  # enough time for `rows` arrivals, cut below
    rate = bursty_rate(seconds, rng, base=base, burst_every_s=burst_every_s, burst_s=burst_s,
                       burst_factor=burst_factor)  # fmt: skip
    counts = rng.poisson(rate)
    whole = np.repeat(np.arange(seconds, dtype=np.float64), counts)
    times = np.sort(whole + rng.random(len(whole)))[:rows]  # BurstGPT's rows are in time order
    n = len(times)
    gpt4 = rng.random(n) < 0.2
    request = np.clip(np.rint(rng.lognormal(np.log(600), 1.0, n)), 1, 32_000).astype(np.int64)
    response = np.clip(np.rint(rng.lognormal(np.where(gpt4, np.log(320), np.log(220)), 0.8, n)), 1, 8_000)
    response = np.where(rng.random(n) < 0.03, 0, response).astype(np.int64)  # failed requests
    return pa.table(
        {
            "Timestamp": pa.array(np.round(times, 3)),
            "Model": pa.array(np.where(gpt4, "GPT-4", "ChatGPT")),
            "Request tokens": pa.array(request),
            "Response tokens": pa.array(response),
            "Total tokens": pa.array(request + response),
            "Log Type": pa.array(np.where(rng.random(n) < 0.7, "Conversation log", "API log")),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--out", default=str(Path(__file__).with_name("burstgpt-sample.csv")))
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--base-rate", type=float, default=3.0, help="requests per second outside bursts")
    parser.add_argument("--burst-every-s", type=float, default=90.0)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--burst-factor", type=float, default=6.0)
    args = parser.parse_args()
    table = sample(args.rows, seed=args.seed, base=args.base_rate, burst_every_s=args.burst_every_s,
                   burst_s=args.burst_s, burst_factor=args.burst_factor)  # fmt: skip
    # No quoting, as in the real file (no value holds a comma); the batch size bounds memory for 5M rows.
    options = pacsv.WriteOptions(include_header=False, quoting_style="none", batch_size=65_536)
    with open(args.out, "wb") as out:
        out.write((",".join(COLUMNS) + "\n").encode())  # pyarrow would quote the names
        pacsv.write_csv(table, out, write_options=options)
    print(f"{args.out}: {table.num_rows} rows over {table['Timestamp'][-1].as_py():.0f} s")


if __name__ == "__main__":
    main()
