"""The k-switch cost of each dynamic arm for the report's verification section: the excess step time after a
change of the executed k, against a step-time fit of the run's own steps (step_model.py: the fit `specdrill
calibrate` writes a profile from, one home below both)."""

from __future__ import annotations

from orchestrator.analysis.arm_steps import arm_steps
from orchestrator.analysis.inputs import RunInputs
from orchestrator.analysis.kswitch import describe
from orchestrator.analysis.step_model import CalibrationError, fit_steps

MIN_SWITCHES = 2  # one switch gives a value without an interval


def k_switch_lines(inputs: RunInputs) -> list[str]:
    """One line per dynamic arm with a step timeline; none for runs without (endpoint arms) or without a
    dynamic arm."""
    steps = arm_steps(inputs)
    dynamic = sorted(arm for arm, s in steps.items() if s.dynamic)
    if not dynamic:
        return []
    missing = {arm: s.missing for arm, s in steps.items() if s.missing}
    lines = [f"arm {arm}: k-switch cost not measurable: {missing[arm]}" for arm in dynamic if arm in missing]
    usable = {arm: s for arm, s in steps.items() if arm not in missing}
    wanted = [arm for arm in dynamic if arm in usable]
    if not wanted:
        return lines
    try:
        fitted = fit_steps(usable)
    except CalibrationError as exc:
        said = f"no step-time fit of this run's steps ({exc})"
        return [*lines, *(f"arm {arm}: k-switch cost not identifiable: {said}" for arm in wanted)]
    for report in fitted.arms:
        if report.arm not in wanted:
            continue
        switch = report.k_switch
        n = 0 if switch is None else switch.switches
        if switch is None or n < MIN_SWITCHES:
            lines.append(f"arm {report.arm}: k-switch cost not identifiable: {n} switches")
        else:
            lines.append(f"arm {report.arm}: {describe(switch)} (excess step time against this run's step fit)")
    return sorted(lines)
