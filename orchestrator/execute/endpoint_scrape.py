"""What a foreign server (an endpoint arm: `vllm serve`, any OpenAI server with Prometheus /metrics) says about
its engine while a unit runs, sampled from /metrics into the run directory (orchestrator/rundir/endpoint_samples.py).

Such a server has no step timeline; what it says per request (vLLM: each step's drafts) is in the trace, but not
the batch each step ran in. Its running-requests gauge sampled every few hundred milliseconds gives that batch
approximately, and its counters before and after the unit let the report check that the trace holds every draft
the server verified. The names and the path are the engine kind's dialect (serve_apps/engine_kinds/dialects/).
Only GET of that path is sent: never specdrill's own endpoints.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pyarrow as pa

from orchestrator.rundir.endpoint_samples import SCHEMA
from serve_apps.engine_kinds.dialects.base import COUNTER_KEYS, Dialect
from timebase.clock import now_ns


@dataclass(frozen=True)
class Sample:
    time_ns: int
    running: float | None
    waiting: float | None
    engines: int
    counters: dict[str, float | None] = field(default_factory=dict)
    draft_length: float | None = None  # the server's gauge of the draft length in force, where it has one


def parse(text: str, time_ns: int, dialect: Dialect) -> Sample:
    """One scrape: the gauges and counters summed over their label sets (a data-parallel server labels each
    engine), the number of engines from the label sets of the running gauge. Names match by suffix (Ray Serve LLM
    prefixes vLLM's: ray_vllm:...)."""
    sums: dict[str, float] = {}
    running_sets = 0
    gauge = (dialect.draft_length,) if dialect.draft_length else ()
    wanted = (dialect.running, dialect.waiting, *dialect.counters.values(), *gauge)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        metric = next((w for w in wanted if name.endswith(w)), None)
        if metric is None:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        sums[metric] = sums.get(metric, 0.0) + number
        if metric == dialect.running:
            running_sets += 1
    return Sample(
        time_ns=time_ns,
        running=sums.get(dialect.running),
        waiting=sums.get(dialect.waiting),
        engines=running_sets,
        counters={key: sums.get(name) for key, name in dialect.counters.items()},
        draft_length=sums.get(dialect.draft_length) if dialect.draft_length else None,
    )


def fetch_metrics(url: str, headers: dict[str, str], timeout_s: float, path: str = "/metrics") -> str | None:
    """The server's Prometheus text; None when it has none (or does not answer)."""
    try:
        request = urllib.request.Request(f"{url}{path}", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return str(response.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError):
        return None


def scrape(url: str, headers: dict[str, str], dialect: Dialect, timeout_s: float = 5.0) -> Sample | None:
    """None when the server has no /metrics (or does not answer): the unit still runs, unverified."""
    text = fetch_metrics(url, headers, timeout_s, dialect.metrics_path)
    return None if text is None else parse(text, now_ns(), dialect)


def speculation_counters(url: str, headers: dict[str, str], dialect: Dialect) -> dict[str, float]:
    """Every speculation metric of the server's /metrics by its full name and labels ({} without /metrics): what
    a foreign server without telemetry says it runs, kept in the manifest."""
    text = fetch_metrics(url, headers, timeout_s=10, path=dialect.metrics_path)
    found: dict[str, float] = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or dialect.speculation not in line:
            continue
        name, _, value = line.rpartition(" ")
        try:
            found[name] = float(value)
        except ValueError:
            continue
    return found


class MetricsSampler:
    """Scrapes /metrics every `interval_s` on a thread while a unit runs. The first and last samples are taken
    synchronously in start() and stop(), so the counters' deltas cover exactly the unit's traffic (the warm-up and
    earlier units are before the first)."""

    def __init__(self, url: str, headers: dict[str, str], dialect: Dialect, interval_s: float = 0.3) -> None:
        self.url = url
        self.headers = headers
        self.dialect = dialect
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="endpoint-metrics", daemon=True)

    def _take(self) -> None:
        sample = scrape(self.url, self.headers, self.dialect)
        if sample is not None:
            self.samples.append(sample)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> MetricsSampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        # The server's counters are updated when a request's last step is recorded, a moment after its response
        # went out: a short pause keeps the final scrape from missing the last requests' drafts.
        time.sleep(max(self.interval_s, 0.5))
        self._take()

    def table(self) -> pa.Table:
        ordered = sorted(self.samples, key=lambda s: s.time_ns)
        return pa.table(
            {
                "time_ns": [s.time_ns for s in ordered],
                "running": [s.running for s in ordered],
                "waiting": [s.waiting for s in ordered],
                "engines": [s.engines for s in ordered],
                **{str(key): [s.counters.get(key) for s in ordered] for key in COUNTER_KEYS},
                "draft_length": [s.draft_length for s in ordered],
            },
            schema=SCHEMA,
        )
