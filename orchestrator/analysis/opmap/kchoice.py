"""The evidence for choosing a draft length k in each batch band: every k some arm executed there, compared on
the same requests, with intervals. The choice itself is orchestrator/decide/recommend/build.py's.

Per band, the candidates are the arms on one engine's hardware (the primary baseline's) that ran one k there
throughout (their configured k for the band's batch sizes, confirmed by the k they executed), with at least the
map's minimum of requests. The `off` arm (no drafter) is a candidate of its own, apart from a speculative arm
whose schedule gives k = 0 there (its drafter still loaded). The band's best is the speculative candidate with
the shortest per-token latency; every other candidate, `off` included, is compared with it request by request
(the same requests: bands are the baseline twin's), giving its per-token latency relative to the best with a
block-bootstrap interval.

An arm running another engine's design (SGLang's adaptive steps, TensorRT-LLM's schedule, cap or gate) is a
candidate of its own, one per arm and named by its design, whatever k it ran in the band: it is evidence for
that design as configured, not for a k (its k is the band's mean executed k, rounded, for display only).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.results import MapCell, MapSettings, OperatingMap, RatioCI, Verdict
from orchestrator.analysis.opmap.speedup import PAIR_COLUMNS, CellBlocks, paired_ratios
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.db import sql_list
from orchestrator.analysis.read.source import Requests
from serve_apps.policy_kinds import facts

# How far the k an arm executed in a band may stray from its configured k and still count as running it.
K_EVIDENCE_TOLERANCE = 0.5


class KCandidate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    k: int
    arm: str
    # False: the `off` arm (no drafter); True: an arm with a drafter that ran k here (k = 0: a schedule's zero)
    speculative: bool = True
    requests: int
    mean_executed_k: float | None
    tpot_p50_s: float | None
    # The map's per-token speedup over the primary baseline (its latency / this candidate's, > 1: faster);
    # None for the baseline itself. Runs of the same traffic are compared through it.
    speedup: RatioCI | None = None
    # This candidate's per-token latency over the band's best speculative candidate's, on the same requests
    # (>= 1: slower); None for the best itself.
    vs_best: RatioCI | None
    pairs: int
    # Another engine's design ("SGLang sglang_adaptive"): a candidate per arm, not per k; None: vLLM's policies
    design: str | None = None


def design_of(kind: str) -> str | None:
    """The design label of another engine's policy kind; None for vLLM's (off, fixed, dynamic)."""
    found = facts(kind)
    return None if found.runs_on_vllm else f"{found.engine} {found.name}"


class BandChoice(BaseModel):
    """One batch band's evidence (summary.json's k_choices)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    band: str
    band_index: int
    low: int
    high: int
    requests: int  # the primary baseline's requests in the band (the band's n)
    clock_s: float  # how long the band lasted on the primary baseline's clock, over every unit
    min_requests: int  # per candidate, for a verdict (the map's rule)
    margin: float  # the map's margin: within it, two candidates are equal
    candidates: list[KCandidate]  # by k, `off` first
    best_arm: str | None  # the fastest speculative candidate; None: no speculative arm has evidence here
    message: str


def _band_limits(bands: OperatingMap, index: int) -> tuple[int, int]:
    band = bands.bands[index]
    return int(band.low), int(band.upper - 1) if band.high is not None else int(band.low)


def _configured_k(arm: ArmInfo, low: int, high: int) -> int | None:
    """The one k the arm's policy gives for every batch size of the band, else None."""
    table = arm.k_table()
    ks = set(table[max(low, 1) : min(high, len(table) - 1) + 1].tolist())
    return int(ks.pop()) if len(ks) == 1 else None


def _candidates(
    batch_map: OperatingMap, index: int, arms: Sequence[ArmInfo], dropped: set[str], settings: MapSettings
) -> list[tuple[int, ArmInfo, MapCell]]:
    """`off` first, then the speculative candidates by k; per k the arm with the most requests."""
    low, high = _band_limits(batch_map, index)
    primary = batch_map.baseline
    found: dict[tuple[bool, int, str], tuple[int, ArmInfo, MapCell]] = {}
    for arm in arms:
        on_primary = arm.name == primary or (batch_map.baselines.get(arm.name) == primary and arm.engines_ratio == 1)
        if not on_primary or arm.name in dropped or arm.data_parallel_size > 1:
            continue
        cell = next((c for c in batch_map.cells if c.band_index == index and c.arm == arm.name), None)
        if cell is None or cell.requests < settings.min_requests:
            continue
        ran = cell.mean_executed_k if cell.mean_executed_k is not None else 0.0
        if design_of(arm.kind) is not None:  # evidence for its design as configured, whatever k it ran here
            found[(True, round(ran), arm.name)] = (round(ran), arm, cell)
            continue
        k = _configured_k(arm, low, high)
        if k is None or abs(ran - k) > K_EVIDENCE_TOLERANCE:
            continue  # configured for k but did not run it here: no evidence for k
        key = (arm.kind != "off", k, "")
        if key not in found or cell.requests > found[key][2].requests:
            found[key] = (k, arm, cell)
    return [found[key] for key in sorted(found)]


def _tpot_speedup(cell: MapCell) -> float:
    """Per-token speedup over the primary baseline (the baseline itself: 1); -inf without one."""
    if cell.speedup is None:
        return 1.0
    point = cell.speedup.tpot.point
    return float(point) if point is not None else float("-inf")


def _pairs_vs_best(
    requests: Requests, band_set: int, comparisons: list[tuple[int, str, str]]
) -> dict[tuple[int, str, str], CellBlocks]:
    """Per (band, best, candidate): per-block totals of the candidate's requests paired with the band's best's copy, in
    PAIR_COLUMNS' layout with the sign turned so that paired_ratios' per-token ratio reads candidate / best
    (>= 1: the candidate is slower), from the maps' `scored` view."""
    con = requests.con
    con.execute("CREATE OR REPLACE TEMP TABLE k_pairs (band BIGINT, best VARCHAR, other VARCHAR)")
    if not comparisons:
        return {}
    con.executemany("INSERT INTO k_pairs VALUES (?, ?, ?)", comparisons)
    key = f"band_{band_set}"
    arms = sql_list(sorted({arm for _, best, other in comparisons for arm in (best, other)}))
    # The candidates' requests, narrow, once: `scored` is a view over the trace, and joining it to itself would
    # read and pair the trace twice more and hold the twin join and this one in memory together (the arm list
    # is a literal, so only the candidates' files are read).
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE k_rows AS
        SELECT arm, {key} AS band, pair_unit, request_index, run_id, block, usable, log_tpot, met, clock_s
        FROM scored WHERE arm IN {arms} AND request_index >= 0 AND {key} >= 0
        """
    )
    rows = con.execute(
        """
        SELECT p.band, p.best, p.other, count(*),
               sum(CASE WHEN a.usable AND b.usable THEN a.log_tpot - b.log_tpot ELSE 0.0 END),
               sum((a.usable AND b.usable)::DOUBLE), sum(a.met::DOUBLE), sum(b.met::DOUBLE),
               sum(a.clock_s), sum(b.clock_s)
        FROM k_rows a JOIN k_pairs p ON a.arm = p.other AND a.band = p.band
        JOIN k_rows b ON b.arm = p.best AND b.band = p.band AND b.pair_unit = a.pair_unit
             AND b.request_index = a.request_index
        GROUP BY p.band, p.best, p.other, a.run_id, a.block
        ORDER BY 1, 2, 3, a.run_id, a.block
        """
    ).fetchall()
    con.execute("DROP TABLE k_rows")
    found: dict[tuple[int, str, str], list[tuple[list[float], int]]] = {}
    for band, best, other, count, *values in rows:
        found.setdefault((int(band), str(best), str(other)), []).append(([float(v) for v in values], int(count)))
    return {
        key_: CellBlocks(
            totals=np.array([v for v, _ in blocks], dtype=np.float64).reshape(-1, PAIR_COLUMNS),
            rows=sum(c for _, c in blocks),
        )
        for key_, blocks in found.items()
    }


def paired_vs(
    requests: Requests, band_set: int, comparisons: Sequence[tuple[int, str, str]], settings: MapSettings
) -> dict[tuple[int, str], RatioCI]:
    """Per (band, other): `other`'s per-token latency over `reference`'s on the same requests in that band of
    band set `band_set` (>= 1: other is slower), with a block-bootstrap interval, for (band, reference, other)
    triples; each (band, other) once. The maps' `scored` view must exist on `requests`."""
    both = paired_both(requests, band_set, comparisons, settings)
    return {(band, other): found.tpot for (band, _, other), found in both.items()}


class PairedRatios(BaseModel):
    """`reference` against `other` on the same requests: per-token speedup (other / reference, > 1: reference is
    faster) and goodput ratio (other / reference, > 1: other carried more), with their pairs."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tpot: RatioCI
    goodput: RatioCI
    pairs: int


def paired_both(
    requests: Requests, band_set: int, comparisons: Sequence[tuple[int, str, str]], settings: MapSettings
) -> dict[tuple[int, str, str], PairedRatios]:
    """Per (band, reference, other) triple with pairs: both ratios of `paired_ratios` on the same requests in
    that band of band set `band_set`. The maps' `scored` view must exist on `requests`."""
    blocks = _pairs_vs_best(requests, band_set, list(comparisons))
    found_ratios: dict[tuple[int, str, str], PairedRatios] = {}
    for position, (key, found) in enumerate(sorted(blocks.items())):
        if found.rows:
            tpot, goodput = paired_ratios(found, settings, np.random.default_rng([settings.seed, key[0], position, 11]))
            found_ratios[key] = PairedRatios(tpot=tpot, goodput=goodput, pairs=found.rows)
    return found_ratios


def choose_k(
    requests: Requests,
    batch_map: OperatingMap,
    arms: Sequence[ArmInfo],
    *,
    band_set: int,
    max_k: int,
    dropped: set[str] | None = None,
    settings: MapSettings | None = None,
) -> list[BandChoice]:
    """Per band of the batch map (band set `band_set` of the maps' `scored` view, which must exist on
    `requests`), the evidence a choice of k is made from (`max_k` bounds the k a band lists as not measured)."""
    chosen_settings = settings or batch_map.settings
    per_band = {
        i: _candidates(batch_map, i, arms, dropped or set(), chosen_settings) for i in range(len(batch_map.bands))
    }
    best: dict[int, tuple[int, ArmInfo, MapCell]] = {}
    comparisons: list[tuple[int, str, str]] = []
    for i, found in per_band.items():
        speculative = [c for c in found if c[1].kind != "off"]
        if not speculative:
            continue
        # Fastest per-token latency; ties to the smaller k (sorted by k, max keeps the first of equals).
        top = max(speculative, key=lambda c: (_tpot_speedup(c[2]), -c[0]))
        best[i] = top
        comparisons += [(i, top[1].name, arm.name) for _, arm, _ in found if arm.name != top[1].name]
    blocks = _pairs_vs_best(requests, band_set, comparisons)
    return [
        _evidence(batch_map, i, per_band[i], best.get(i), blocks, max_k, chosen_settings)
        for i in range(len(batch_map.bands))
    ]


def _evidence(
    batch_map: OperatingMap,
    index: int,
    found: list[tuple[int, ArmInfo, MapCell]],
    best: tuple[int, ArmInfo, MapCell] | None,
    blocks: dict[tuple[int, str, str], CellBlocks],
    max_k: int,
    settings: MapSettings,
) -> BandChoice:
    low, high = _band_limits(batch_map, index)
    label = batch_map.bands[index].label
    baseline = next((c for c in batch_map.cells if c.band_index == index and c.arm == batch_map.baseline), None)
    candidates: list[KCandidate] = []
    for position, (k, arm, cell) in enumerate(found):
        vs_best: RatioCI | None = None
        pairs = 0
        if best is not None and arm.name != best[1].name:
            none = CellBlocks(totals=np.zeros((0, PAIR_COLUMNS)), rows=0)
            pair_blocks = blocks.get((index, best[1].name, arm.name), none)
            pairs = pair_blocks.rows
            if pairs:
                rng = np.random.default_rng([settings.seed, index, position, 7])
                vs_best = paired_ratios(pair_blocks, settings, rng)[0]
            else:
                vs_best = RatioCI(point=None, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
        candidates.append(
            KCandidate(
                k=k, arm=arm.name, speculative=arm.kind != "off", requests=cell.requests,
                mean_executed_k=cell.mean_executed_k, tpot_p50_s=cell.measure("tpot_s").p50,
                speedup=cell.speedup.tpot if cell.speedup is not None else None, vs_best=vs_best, pairs=pairs,
                design=design_of(arm.kind),
            )
        )  # fmt: skip
    measured = {c.k for c in candidates if c.speculative and c.design is None}
    evidence = ", ".join(
        ("off" if not c.speculative else c.design or f"k={c.k}") + f" ({c.arm}) "
        + ("best" if c.vs_best is None else ratio_text(c.vs_best)) + f" n={c.requests}"
        for c in candidates
    )  # fmt: skip
    gaps = [k for k in range(max_k + 1) if k not in measured]
    return BandChoice(
        band=label, band_index=index, low=low, high=high, requests=baseline.requests if baseline else 0,
        clock_s=baseline.clock_s if baseline else 0.0, min_requests=settings.min_requests, margin=settings.margin,
        candidates=candidates, best_arm=best[1].name if best else None,
        message=f"{label}: per-token latency vs the fastest speculative arm: {evidence or 'no candidate'}"
        + (f"; k = {', '.join(map(str, gaps))} not measured" if gaps else ""),
    )  # fmt: skip


def ratio_text(ratio: RatioCI, digits: int = 3) -> str:
    if ratio.point is None:
        return "n/a"
    if ratio.low is None or ratio.high is None:
        return f"{ratio.point:.{digits}f}x (no interval)"
    return f"{ratio.point:.{digits}f}x [{ratio.low:.{digits}f}, {ratio.high:.{digits}f}]"
