"""The k-switch cost of each dynamic arm for the report's verification section: the excess step time after a
change of the executed k, against a step-time fit of the run's own steps (step_model.py: the fit `specdrill
calibrate` writes a profile from, one home below both)."""

from __future__ import annotations

from orchestrator.analysis.arm_steps import arm_steps, missing_fit_columns, timeline_files
from orchestrator.analysis.inputs import RunInputs
from orchestrator.analysis.kswitch import describe
from orchestrator.analysis.step_model import CalibrationError, fit_steps
from serve_apps.policies import DynamicPolicy

MIN_SWITCHES = 2  # one switch gives a value without an interval


def k_switch_lines(inputs: RunInputs) -> list[str]:
    """One line per dynamic arm with a step timeline; none for runs without (endpoint arms) or without a
    dynamic arm."""
    files = timeline_files(inputs)
    policies = {arm.name: arm.policy for arm in inputs.campaign.arms()}
    dynamic = sorted(arm for arm in files if isinstance(policies.get(arm), DynamicPolicy))
    if not dynamic:
        return []
    # Which arms can be fitted is told from two columns: the steps themselves are read only for a fit (every step
    # of the run, the report's largest read), never just to say that no fit is possible.
    missing = {arm: why for arm, found in files.items() if (why := missing_fit_columns(inputs, found)) is not None}
    lines = [f"arm {arm}: k-switch cost not measurable: {missing[arm]}" for arm in dynamic if arm in missing]
    wanted = [arm for arm in dynamic if arm not in missing]
    if not wanted:
        return lines
    usable = arm_steps(inputs, arms=[arm for arm in files if arm not in missing])
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
