"""The k-switch cost of each dynamic arm for the report's verification section: the excess step time after a
change of the executed k, against a step-time fit of the run's own steps (step_model.py: the fit `specdrill
calibrate` writes a profile from, one home below both)."""

from __future__ import annotations

from orchestrator.analysis.read.inputs import RunInputs
from orchestrator.analysis.steps.arm_steps import (
    BLOCK_STEPS,
    arm_steps,
    missing_fit_columns,
    timeline_files,
    timeline_steps,
)
from orchestrator.analysis.steps.kswitch import describe
from orchestrator.analysis.steps.step_model import CalibrationError, fit_steps
from serve_apps.policy_kinds import facts

MIN_SWITCHES = 2  # one switch gives a value without an interval
# The fit holds its steps in memory (an n x 8 design and its copies): past this many steps of the run it fits an
# even sample of blocks of consecutive steps, so that the report's memory stays flat however long the run. Eight
# coefficients are pinned long before 100,000 steps; the k-switch cost's interval widens with fewer switches.
REPORT_FIT_STEPS = 100_000


def k_switch_lines(inputs: RunInputs, *, max_steps: int = REPORT_FIT_STEPS) -> list[str]:
    """One line per dynamic arm with a step timeline; none for runs without (endpoint arms) or without a
    dynamic arm."""
    files = timeline_files(inputs)
    policies = {arm.name: arm.policy for arm in inputs.planned.arms}
    dynamic = sorted(arm for arm in files if arm in policies and facts(policies[arm].kind).adaptive)
    if not dynamic:
        return []
    # Which arms can be fitted is told from two columns: the steps themselves are read only for a fit (every step
    # of the run, the report's largest read), never just to say that no fit is possible.
    missing = {arm: why for arm, found in files.items() if (why := missing_fit_columns(inputs, found)) is not None}
    lines = [f"arm {arm}: k-switch cost not measurable: {missing[arm]}" for arm in dynamic if arm in missing]
    wanted = [arm for arm in dynamic if arm not in missing]
    if not wanted:
        return lines
    fitted_arms = [arm for arm in files if arm not in missing]
    total = sum(timeline_steps(inputs, files[arm]) for arm in fitted_arms)
    every = -(-total // max_steps)
    usable = arm_steps(inputs, arms=fitted_arms, every=every)
    held = sum(len(s) for s in usable.values())
    sampled = (f"; fitted on {held:,} of its {total:,} steps, one block of {BLOCK_STEPS:,} consecutive steps in "
               f"{every}" if every > 1 else "")
    in_sample = f" in the {held:,} steps fitted (of {total:,})" if every > 1 else ""
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
            lines.append(f"arm {report.arm}: k-switch cost not identifiable: {n} switches{in_sample}")
        else:
            against = f"excess step time against this run's step fit{sampled}"
            lines.append(f"arm {report.arm}: {describe(switch)} ({against})")
    return sorted(lines)
