"""What `specdrill tune CAMPAIGN --design D` prints: for which topology and why, on which time scale and how many
traffic samples, each design's best with its per-band speedup (an interval over seeds where there are several),
where the topology drops a design to a static k which k, the oracle's figure beside them, and per band which
design wins: a winner only when it is ahead of the next beyond the margin and beyond both intervals over seeds
(the lowest seed of one above the highest of the other); else they cannot be told apart on this traffic.
"""

from __future__ import annotations

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.tune.designs import DesignBest, DesignsResult
from orchestrator.decide.tune.words import answered_for

TIME_SCALE = "in virtual time (the simulator's prediction on the campaign's own load, not a measured engine)"


def figure(r: SeedRange, seeds: int) -> str:
    """A speedup over off: its median and, over several seeds, [lowest, highest seed]."""
    if r.median is None:
        return "-"
    return f"{r.median:.2f}x" if seeds < 2 else f"{r.median:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def apart(top: SeedRange, other: SeedRange, margin: float) -> bool:
    """`top` ahead of `other` beyond the margin at the median and beyond both intervals over seeds (with one seed
    each interval is its one value: the margin decides)."""
    assert top.median is not None and other.median is not None and top.low is not None and other.high is not None
    return top.median / other.median > 1 + margin and top.low > other.high


def _design_lines(found: DesignBest, result: DesignsResult) -> list[str]:
    figures = ", ".join(figure(r, result.seeds) for r in found.ranges)
    if found.static_k is None:
        return [f"  {found.design}: {found.policy} ({found.candidates} tried): {figures}"]
    return [
        f"  {found.design}: static k = {found.static_k} ({found.policy}; {found.candidates} static k tried): {figures}",
        f"    {found.fallback}: {found.dropped}. On {result.topology} this design does not switch with load: its "
        f"best there is static k = {found.static_k}, not a schedule" + (f"; {found.within}" if found.within else ""),
    ]


def _band_line(result: DesignsResult, band: int, margin: float) -> str | None:
    ranked = sorted(((r, f.design) for f in result.best if (r := f.ranges[band]).median is not None),
                    key=lambda rd: rd[0].median or 0.0, reverse=True)  # fmt: skip
    if not ranked:
        return None
    (top, winner), rest = ranked[0], ranked[1:]
    close = [d for r, d in rest if not apart(top, r, margin)]
    beyond = [(r, d) for r, d in rest if apart(top, r, margin)]
    if not close:
        lead = f"{winner} wins"
    elif result.seeds < 2:
        lead = f"{winner}, {', '.join(close)} tie within {margin:.0%}"
    else:
        lead = (f"{winner}, {', '.join(close)} cannot be told apart (within {margin:.0%} or inside each other's "
                "intervals over seeds)")  # fmt: skip
    ahead = ""
    if beyond:
        r, d = beyond[0]
        assert top.median is not None and r.median is not None
        what = "the margin" if result.seeds < 2 else "the margin and the intervals"
        ahead = f", {top.median / r.median:.2f}x ahead of {d} beyond {what}"
    return f"  {result.bands[band]} req/s: {lead} ({figure(top, result.seeds)} over off{ahead})"


def words(result: DesignsResult, margin: float = MapSettings().margin) -> list[str]:
    """The answer's lines, in the order the module's docstring gives."""
    samples = (
        f"{result.seeds} seeds of the traffic, median [lowest, highest seed]"
        if result.seeds > 1
        else "one traffic sample (one seed: no interval, a difference inside the seeds' spread cannot be seen; "
        "--seeds 3 for a decision)"
    )
    lines = [
        answered_for(f"{result.topology} ({result.topology_name})", result.topology_why),
        f"each design's best on this traffic {TIME_SCALE}, {samples}: {result.objective} speedup over off on the "
        f"same engines per offered-rate band ({', '.join(result.bands)} req/s):",
    ]
    for found in result.best:
        lines += _design_lines(found, result)
    parallel = result.topology.startswith("data_parallel")
    if parallel and any(f.engine == "TensorRT-LLM" for f in result.best):
        lines.append(f"  TensorRT-LLM's designs: no data-parallel fallback is modelled; each of {result.topology}'s "
                     "engines plays the design as one engine would")  # fmt: skip
    where = f" on {result.oracle_topology}, where a schedule runs" if result.oracle_topology != result.topology else ""
    lines.append(f"  oracle (best k per batch, {result.oracle_schedule}{where}): "
                 + ", ".join(figure(r, result.seeds) for r in result.oracle_ranges))  # fmt: skip
    lines.append(
        f"under off the traffic ran each engine at batch 1-{result.reach}: up to there the figures are measured (the "
        "simulator's prediction on the campaign's own load); a setting for larger batches (a schedule's tail, a "
        "slot's) is the oracle's, inherited, not measured"
    )
    lines += [line for b in range(len(result.bands)) if (line := _band_line(result, b, margin)) is not None]
    return lines
