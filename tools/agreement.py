"""Do two runs of one campaign reach the same verdicts? Real time (`specdrill run`) against virtual time
(`specdrill simulate`), offered-rate band by offered-rate band, from their summary.json files.

    python -m tools.agreement REAL/summary.json VIRTUAL/summary.json [--arm fixed3-single]

The offered-rate bands are planned from the campaign's seed, so both runs of one campaign band the same
requests alike and their bands can be matched by label. A band counts only where both runs have a verdict
(enough requests in both arms): elsewhere there is nothing to agree on, and it is listed as such.
Reads summary.json as plain JSON, so summaries of another specdrill version compare as long as they carry
the map fields used here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_VERDICT = "insufficient_data"


@dataclass(frozen=True)
class BandAgreement:
    arm: str
    band: str
    real_ratio: float | None  # per-token latency ratio, baseline / arm (> 1: the arm is faster)
    virtual_ratio: float | None
    real_verdict: str
    virtual_verdict: str

    @property
    def comparable(self) -> bool:
        """Both runs reached a verdict on this band (enough data in both)."""
        return NO_VERDICT not in (self.real_verdict, self.virtual_verdict)

    @property
    def agrees(self) -> bool:
        return self.comparable and self.real_verdict == self.virtual_verdict

    @property
    def ratio_difference(self) -> float | None:
        """Real ratio relative to the virtual one, minus 1: +0.6 is a real-time speedup 60% larger."""
        if self.real_ratio is None or not self.virtual_ratio:
            return None
        return self.real_ratio / self.virtual_ratio - 1.0


def _rate_map(summary: dict[str, Any]) -> dict[str, Any]:
    for operating_map in summary.get("maps", []):
        if operating_map.get("measure") == "offered_rate":
            return dict(operating_map)
    raise ValueError(f"summary of run {summary.get('run')!r} has no offered-rate map")


def _cells(operating_map: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["arm"], c["band"]): c for c in operating_map["cells"] if c.get("speedup") is not None}


def compare_summaries(
    real: dict[str, Any], virtual: dict[str, Any], arms: list[str] | None = None
) -> list[BandAgreement]:
    """Per arm (every compared arm, or `arms`) and offered-rate band of the real run: both runs' per-token latency
    ratio against the baseline and verdicts. Bands the virtual run lacks count as without a verdict there."""
    real_cells, virtual_cells = _cells(_rate_map(real)), _cells(_rate_map(virtual))
    out: list[BandAgreement] = []
    for (arm, band), cell in real_cells.items():
        if arms is not None and arm not in arms:
            continue
        twin = virtual_cells.get((arm, band))
        out.append(
            BandAgreement(
                arm=arm,
                band=band,
                real_ratio=cell["speedup"]["tpot"]["point"],
                virtual_ratio=None if twin is None else twin["speedup"]["tpot"]["point"],
                real_verdict=cell["speedup"]["verdict"],
                virtual_verdict=NO_VERDICT if twin is None else twin["speedup"]["verdict"],
            )
        )
    return out


def format_agreement(rows: list[BandAgreement]) -> list[str]:
    lines = []
    for r in rows:
        real = "-" if r.real_ratio is None else f"{r.real_ratio:.2f}x"
        virtual = "-" if r.virtual_ratio is None else f"{r.virtual_ratio:.2f}x"
        diff = "" if r.ratio_difference is None else f" ({r.ratio_difference:+.0%})"
        word = ("agree" if r.agrees else "DISAGREE") if r.comparable else "not comparable"
        lines.append(f"{r.arm:16} {r.band:14} real {real} {r.real_verdict:13} virtual {virtual} "
                     f"{r.virtual_verdict:13}{diff}  {word}")  # fmt: skip
    comparable = [r for r in rows if r.comparable]
    agreed = sum(r.agrees for r in comparable)
    lines.append(f"verdicts agree in {agreed} of {len(comparable)} comparable bands ({len(rows)} bands in all)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("real", type=Path, help="summary.json of the real-time run")
    parser.add_argument("virtual", type=Path, help="summary.json of the virtual-time run")
    parser.add_argument("--arm", action="append", help="only this arm (repeatable)")
    args = parser.parse_args(argv)
    real, virtual = (json.loads(p.read_text()) for p in (args.real, args.virtual))
    rows = compare_summaries(real, virtual, args.arm)
    print("\n".join(format_agreement(rows)))
    lagged = real.get("engine_lagged_units") or []
    if lagged:
        print(f"real run: the engine lagged in {len(lagged)} unit(s): {'; '.join(lagged)}")
    return 0 if all(r.agrees for r in rows if r.comparable) else 1


if __name__ == "__main__":
    sys.exit(main())
