"""The executed-policy section of report.html: per arm and band, the draft length the engines ran against the
one configured, the findings, and the cross-and-recover switch timings."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from orchestrator.analysis.opmap.results import ArmVerification, BandKCheck, SwitchTiming, VerificationReport
from orchestrator.analysis.verify.findings import verdict_line
from orchestrator.report.html.text import EXEMPT, NO_DATA, esc, num, passfail, pct, status_mark, table


def _shares(executed: dict[str, float]) -> str:
    ordered = sorted(executed.items(), key=lambda kv: -kv[1])
    return ", ".join(f"k={esc(k)} {pct(share)}" for k, share in ordered) or NO_DATA


def _band_checks(bands: Sequence[BandKCheck]) -> str:
    rows = [
        [
            esc(b.band),
            str(b.steps),
            esc(", ".join(str(k) for k in b.configured_k) or NO_DATA),
            _shares(b.executed_k),
            num(b.mean_executed_k),
            pct(b.match_fraction),
            passfail(b.passed),
        ]
        for b in bands
    ]
    header = ["band", "steps", "configured k", "executed k (share of steps)", "mean k", "match", "check"]
    return table(header, rows) if rows else '<p class="muted">No banded steps.</p>'


def _findings(arm: ArmVerification) -> str:
    if not arm.findings:
        return ""
    items = "".join(
        f"<li>{status_mark(f.status)} <b>{esc(f.check)}</b>{' @ ' + esc(f.band) if f.band else ''}: "
        f"{esc(f.message)}</li>"
        for f in arm.findings
    )
    return f"<ul>{items}</ul>"


def _exempt(arm: str, status: str | None, exempt: Collection[str]) -> str:
    return EXEMPT if arm in exempt and status == "fail" else ""


def _arm_verification(arm: ArmVerification, exempt: Collection[str]) -> str:
    return (
        f"<h3>{esc(arm.arm)} {status_mark(arm.status)}{_exempt(arm.arm, arm.status, exempt)}</h3>"
        f'<p class="meta">kind {esc(arm.kind)} &middot; topology {esc(arm.topology)} &middot; {arm.steps} steps '
        f"&middot; {esc(as_configured(arm))}</p>"
        f"{_findings(arm)}<details><summary>per band: configured and executed k</summary>{_band_checks(arm.bands)}"
        "</details>"
    )


def as_configured(arm: ArmVerification) -> str:
    """The share of steps that ran the configured k, and what that share does not prove: the words of the arm's
    status (a "not exercised" arm also says which check the load never exercised)."""
    share = verdict_line(arm)  # a failed arm: what failed first, so the line never reads like a pass
    unproven = [f.check for f in arm.findings if f.status in ("not_verifiable", "not_exercised")]
    if arm.status in ("not_verifiable", "not_exercised") and unproven:
        return f"{share}; {', '.join(unproven)} {arm.status.replace('_', ' ')}"
    return share


def _k(value: int | None) -> str:
    return NO_DATA if value is None else str(value)


def _switch_timings(timings: Sequence[SwitchTiming], exempt: Collection[str]) -> str:
    """Few columns, each short, so the table fits a 1280 px window; the message says the rest."""
    if not timings:
        return ""

    def pair(first: float | None, second: float | None, gap: float | None) -> str:
        return f"{num(first, 1)} \u2192 {num(second, 1)} ({num(gap, 1)})"

    rows = [
        [
            esc(t.arm),
            esc(f"{t.shape} r{t.repeat}"),
            pair(t.crossed_up_s, t.switched_s, t.switch_lag_s),
            pair(t.crossed_down_s, t.recovered_s, t.recovery_s),
            esc(f"{_k(t.quiet_k)} / {_k(t.loaded_k)}"),
            num(t.bound_s, 1),
            status_mark(t.status) + _exempt(t.arm, t.status, exempt),
            esc(t.message),
        ]
        for t in timings
    ]
    header = ["arm", "unit", "up: crossed \u2192 switched (lag) s", "down: crossed \u2192 recovered (lag) s",
              "k quiet / loaded", "bound s", "check", "message"]  # fmt: skip
    return f"<h3>Switch timings (cross and recover)</h3>{table(header, rows)}"


def _k_switch_costs(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f"<h3>k-switch cost</h3><ul>{items}</ul>"


def verification_section(report: VerificationReport, exempt: Collection[str] = ()) -> str:
    """`exempt`: the campaign's gates.exempt_arms, marked "(exempt)" where they failed. Arms that pass are one row
    each; an arm that did not pass has its findings shown, every arm's per-band table is folded."""
    summary = (
        table(
            ["arm", "kind", "topology", "steps", "as configured", "check"],
            [
                [
                    esc(a.arm),
                    esc(a.kind),
                    esc(a.topology),
                    str(a.steps),
                    esc(as_configured(a)),
                    status_mark(a.status) + _exempt(a.arm, a.status, exempt),
                ]
                for a in report.arms
            ],
        )
        if report.arms
        else '<p class="muted">No arms verified.</p>'
    )
    shown = "".join(_arm_verification(a, exempt) for a in report.arms if a.status != "pass")
    passing = [a for a in report.arms if a.status == "pass"]
    folded = (
        f"<details><summary>arms that pass: their findings and per-band k ({len(passing)})</summary>"
        + "".join(_arm_verification(a, exempt) for a in passing)
        + "</details>"
        if passing
        else ""
    )
    failed = {a.arm for a in report.arms if a.status == "fail"} | {
        t.arm for t in report.switch_timings if t.status == "fail"
    }
    marked = EXEMPT if failed and failed <= set(exempt) else ""  # every failure is an exempt arm's
    return (
        f"<section><h2>Executed policy {status_mark(report.status)}{marked}</h2>{summary}{shown}{folded}"
        f"{_switch_timings(report.switch_timings, exempt)}{_k_switch_costs(report.k_switch_costs)}</section>"
    )
