"""The answer section of report.html: per map, one row per load band and one column per hardware, each cell the
band's verdict in a few words (the best arm and its ratio over plain decoding, plain decoding, a tie, too few
data); the console's full sentences stay one click away, folded."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.answer import BandAnswer
from orchestrator.analysis.opmap.results import OperatingMap
from orchestrator.report.html.charts import cell_or_none, deciding_label
from orchestrator.report.html.overview import per_engine
from orchestrator.report.html.text import bullets, ci, esc


def _ratio(opmap: OperatingMap, band: str, arm: str) -> str:
    cell = cell_or_none(opmap, band, arm)
    if cell is None or cell.speedup is None or cell.speedup.deciding.point is None:
        return ""
    s = cell.speedup
    # The column says the ratio is over the hardware's `off` arm; a per-engine comparison names its baseline
    unequal = f" vs {s.baseline} per engine: not equal hardware" if per_engine(opmap, arm) else ""
    return f' <span class="muted">{esc(deciding_label(s))} {esc(ci(s.deciding))}{esc(unequal)}</span>'


def _instead(found: BandAnswer, arm: str) -> str:
    """The mark of an arm that did not run as configured: never crowned unmarked. What ran instead is said once
    under the tables (_instead_notes) and in the mark's title: in every cell it made each row three lines tall,
    and the two maps' tables no longer fitted side by side."""
    if arm not in found.ran_instead:
        return ""
    return f' <span class="unverified" title="not as configured: {esc(found.ran_instead[arm])}">\u26a0</span>'


def _cell(opmap: OperatingMap, found: BandAnswer) -> str:
    off = any(opmap.is_baseline(a) for a in found.best)
    if found.status == "best":
        (arm,) = found.best
        # Green only for an arm that ran its policy: the verdict on one that did not is on what ran instead
        colour = "v-no_difference" if arm in found.ran_instead else "v-helps"
        text = f'<span class="v {colour}">{esc(arm)}</span>{_instead(found, arm)}{_ratio(opmap, found.band, arm)}'
    elif found.status == "plain_decoding":
        text = '<span class="v v-hurts">plain decoding</span>: speculation off'
    elif found.status == "tie":
        # "lead": the leaders' interval excludes 1 but not the margin (answer.py): a tie would claim equality
        said = "tie" if "tie for best" in found.message else "not separated"
        text = f"{said}: " + ", ".join(esc(a) + _instead(found, a) for a in found.best)
        text += " (with plain decoding: speculation off)" if off else ""
    elif found.status == "no_difference":
        text = '<span class="v v-no_difference">no difference</span>' + (": speculation off" if off else "")
    elif found.requests == 0:
        text = '<span class="muted">no requests here</span>'
    else:
        text = f'<span class="muted">too few data (n = {found.requests})</span>'
    return f'<td title="{esc(found.message)}">{text}</td>'


def _head(hardware: str, bases: list[str]) -> str:
    over = f' title="ratios over {esc(", ".join(bases))}"' if bases else ""
    return f"<th{over}>{esc(hardware)}</th>"


def _map_table(opmap: OperatingMap, answers: Sequence[BandAnswer]) -> str:
    mine = [a for a in answers if a.measure == opmap.measure]
    hardware = list(dict.fromkeys(a.hardware for a in mine))
    if not hardware:
        return ""
    by = {(a.band_index, a.hardware): a for a in mine}
    bases = {h: sorted({opmap.baselines.get(a, opmap.baseline) for x in mine if x.hardware == h for a in x.best})
             for h in hardware}  # fmt: skip
    head = "".join(_head(h, bases[h]) for h in hardware)
    rows = []
    for i, band in enumerate(opmap.bands):
        cells = "".join(_cell(opmap, by[(i, h)]) if (i, h) in by else "<td></td>" for h in hardware)
        rows.append(f"<tr><th>{esc(band.label)}</th>{cells}</tr>")
    title = f"by {opmap.measure.replace('_', ' ')} ({opmap.unit})"
    return (
        f'<div><h3>{esc(title)}</h3><table class="answer"><thead><tr><th>band</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _instead_notes(answers: Sequence[BandAnswer]) -> str:
    """Once per marked arm, under both maps' tables: what ran instead of its policy."""
    instead: dict[str, str] = {}
    for found in answers:
        instead.update({a: said for a, said in found.ran_instead.items() if a in found.best})
    return "".join(f'<p class="unverified">\u26a0 {esc(arm)} did not run as configured: {esc(said)}</p>'
                   for arm, said in sorted(instead.items()))  # fmt: skip


def answer_section(maps: Sequence[OperatingMap], answers: Sequence[BandAnswer], lines: Sequence[str]) -> str:
    """`lines`: the answer block as the console prints it, folded below the tables."""
    if not lines:
        return ""
    ordered = sorted(maps, key=lambda m: m.measure != "offered_rate")  # load as the operator sets it first
    tables = "".join(_map_table(m, answers) for m in ordered)
    full = bullets(line.strip() for line in lines[1:] if line.startswith("  "))
    if not tables:  # no per-band verdicts to tabulate: the sentences are the answer
        return f'<section class="answer"><h2>Answer</h2><p class="meta">{esc(lines[0])}</p>{full}</section>'
    return (
        f'<section class="answer"><h2>Answer</h2><p class="meta">{esc(lines[0])}; per band and hardware the best arm '
        "and its ratio over that hardware's off arm; hover a cell for its sentence</p>"
        f'<div class="row">{tables}</div>{_instead_notes(answers)}'
        f"<details><summary>the answer in full, as the console prints it</summary>{full}</details></section>"
    )
