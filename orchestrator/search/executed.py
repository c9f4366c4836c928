"""What the searched arm ran, read from its own units (issue 40): a dynamic arm on data-parallel engines loses its
schedule (vLLM drops `num_speculative_tokens_per_batch_size` and runs the static max k), so `search --arm dyn-dp2`
measures static k = 3, not the schedule. The search says so before its first unit (the prediction) and after its
last (the evidence: the engines' schedule_dropped flags and the executed k of every engine step), in the console
and in search.json, as the report's verifier reads the same columns (orchestrator/analysis/verify/findings.py)."""

from __future__ import annotations

from orchestrator.analysis.read.db import EngineSettings
from orchestrator.analysis.read.inputs import load_run
from orchestrator.analysis.read.telemetry import arm_telemetry
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.verify.step_counts import step_counts
from orchestrator.search.bracket import Outcome
from orchestrator.search.record import Executed
from serve_apps.arms import ArmSpec
from serve_apps.policies import DynamicPolicy


def predicted_drop(arm: ArmSpec) -> str | None:
    """The head line's warning where vLLM will drop this arm's schedule whatever the traffic; None otherwise."""
    if not isinstance(arm.policy, DynamicPolicy):
        return None
    resolved = arm.policy.resolve(arm.topology)
    if not resolved.schedule_dropped:
        return None
    return (f"{arm.name} runs on {arm.topology.label}: vLLM drops its schedule there and runs static k = "
            f"{resolved.num_speculative_tokens} in every step, so the search measures static k = "
            f"{resolved.num_speculative_tokens}, not the schedule; its engines' records will show")  # fmt: skip


def executed_policy(run_dir: str, arm: str) -> Executed | None:
    """What the arm's engines ran in every unit of the run: requests whose engine dropped the schedule, and the
    share of engine steps per executed k. None: the run holds no request of the arm."""
    inputs = load_run(run_dir)
    info = next(a for a in inputs.arms if a.name == arm)
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units if u.unit.arm == arm]
    requests = run_requests(inputs.store.root, units, settings=EngineSettings.from_env())
    try:
        telemetry = arm_telemetry(requests, [info])[0]
        counts = step_counts(requests, [info], info.max_num_seqs + 1).histogram[0].sum(axis=0)
    finally:
        requests.close()
    if telemetry.rows == 0:
        return None
    steps = int(counts.sum())
    shares = {int(k): float(n / steps) for k, n in enumerate(counts) if n} if steps else {}
    return Executed(kind=info.kind, max_k=info.k, requests=telemetry.rows, dropped=telemetry.dropped_rows,
                    steps=steps, executed_k=shares, cause=info.drop_cause)  # fmt: skip


def ran_as_static(executed: Executed | None) -> int | None:
    """The static k a dynamic arm ran instead of its schedule, from the evidence: its engines dropped the
    schedule on most of its requests and one k ran in nearly every step (vLLM's fallback runs max k); None where
    the schedule ran (or the arm is not dynamic)."""
    if executed is None or executed.kind != "dynamic" or not executed.executed_k:
        return None
    k, share = max(executed.executed_k.items(), key=lambda kv: kv[1])
    return k if executed.dropped > executed.requests / 2 and share >= 0.95 else None


def executed_line(arm: str, against: str, executed: Executed) -> str | None:
    """The evidence in one line where the arm did not run its schedule; None where it did."""
    k = ran_as_static(executed)
    if k is None:
        return None
    ran = ", ".join(f"k = {key} in {share:.1%}" for key, share in
                    sorted(executed.executed_k.items(), key=lambda kv: -kv[1]) if share >= 0.001)  # fmt: skip
    cause = f" ({executed.cause})" if executed.cause else ""
    return (f"{arm} did not run its schedule: its engines dropped it on {executed.dropped} of {executed.requests} "
            f"requests{cause} and executed {ran} of {executed.steps} steps; what this search measured is static "
            f"k = {k} against {against}")  # fmt: skip


def qualified(outcome: Outcome, executed: Executed | None) -> Outcome:
    """The outcome, its words saying what ran where the schedule did not (report.html shows the same words)."""
    k = ran_as_static(executed)
    if k is None:
        return outcome
    return outcome.model_copy(update={"message": f"{outcome.message}; measured as static k = {k}: the schedule "
                                      "was dropped"})  # fmt: skip
