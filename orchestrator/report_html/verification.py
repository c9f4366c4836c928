"""The executed-policy section of report.html: per arm and band, the draft length the engines ran against the
one configured, the findings, and the cross-and-recover switch timings."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from orchestrator.analysis.results import ArmVerification, BandKCheck, SwitchTiming, VerificationReport
from orchestrator.report_html.text import EXEMPT, NO_DATA, esc, num, passfail, pct, status_mark, table


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
        f"&middot; executed k matches the configured k on {pct(arm.match_fraction)} of steps</p>"
        f"{_band_checks(arm.bands)}{_findings(arm)}"
    )


def _switch_timings(timings: Sequence[SwitchTiming], exempt: Collection[str]) -> str:
    if not timings:
        return ""
    rows = [
        [
            esc(t.arm),
            esc(t.shape),
            esc(t.run),
            str(t.repeat),
            esc(t.reference),
            num(t.crossed_up_s),
            num(t.switched_s),
            num(t.switch_lag_s),
            num(t.crossed_down_s),
            num(t.recovered_s),
            num(t.recovery_s),
            esc(t.quiet_k if t.quiet_k is not None else NO_DATA),
            esc(t.loaded_k if t.loaded_k is not None else NO_DATA),
            num(t.bound_s),
            status_mark(t.status) + _exempt(t.arm, t.status, exempt),
            esc(t.message),
        ]
        for t in timings
    ]
    header = [
        "arm",
        "shape",
        "run",
        "repeat",
        "reference",
        "crossed up (s)",
        "switched (s)",
        "lag (s)",
        "crossed down (s)",
        "recovered (s)",
        "recovery (s)",
        "quiet k",
        "loaded k",
        "bound (s)",
        "check",
        "message",
    ]
    return f"<h3>Switch timings (cross and recover)</h3>{table(header, rows)}"


def _k_switch_costs(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f"<h3>k-switch cost</h3><ul>{items}</ul>"


def verification_section(report: VerificationReport, exempt: Collection[str] = ()) -> str:
    """`exempt`: the campaign's gates.exempt_arms, marked "(exempt)" where they failed."""
    summary = (
        table(
            ["arm", "kind", "topology", "steps", "match", "check"],
            [
                [
                    esc(a.arm), esc(a.kind), esc(a.topology), str(a.steps), pct(a.match_fraction),
                    status_mark(a.status) + _exempt(a.arm, a.status, exempt),
                ]
                for a in report.arms
            ],
        )
        if report.arms
        else '<p class="muted">No arms verified.</p>'
    )
    arms = "".join(_arm_verification(a, exempt) for a in report.arms)
    failed = {a.arm for a in report.arms if a.status == "fail"} | {
        t.arm for t in report.switch_timings if t.status == "fail"
    }
    marked = EXEMPT if failed and failed <= set(exempt) else ""  # every failure is an exempt arm's
    return (
        f"<section><h2>Executed policy {status_mark(report.status)}{marked}</h2>{summary}{arms}"
        f"{_switch_timings(report.switch_timings, exempt)}{_k_switch_costs(report.k_switch_costs)}</section>"
    )
