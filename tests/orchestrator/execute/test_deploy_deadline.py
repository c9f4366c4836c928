"""wait_running's deadline line says what Serve's controller says of the replicas still coming up (slow to
initialize, not scheduled), read from Serve's own status objects; with nothing said it keeps its guess."""

from __future__ import annotations

import time

import pytest
from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger, ReplicaState
from ray.serve.schema import ApplicationStatus, ApplicationStatusOverview, DeploymentStatusOverview, ServeStatus

from orchestrator.execute.deploy import DeployError, wait_running

# What Serve's controller writes of a replica whose constructor is still running after the slow-startup period
# (deployment_state.py, "have taken more than ... to initialize").
SLOW = (
    "Deployment 'Arm' in application 'clicheck.off-t' has 1 replicas that have taken more than 15s to initialize.\n"
    "This may be caused by a slow __init__ or reconfigure method."
)


def _status(message: str) -> ServeStatus:
    deployment = DeploymentStatusOverview(
        status=DeploymentStatus.UPDATING,
        status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_STARTED,
        replica_states={ReplicaState.STARTING: 1},
        message=message,
    )
    app = ApplicationStatusOverview(
        status=ApplicationStatus.DEPLOYING, message="", last_deployed_time_s=0.0, deployments={"Arm": deployment}
    )
    return ServeStatus(applications={"clicheck.off-t": app})


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (SLOW, "(Serve: Deployment 'Arm' in application 'clicheck.off-t' has 1 replicas that have taken more than"),
        ("", "(not enough CPUs/GPUs in the cluster for their resources?)"),
    ],
)
def test_the_deadline_names_what_serve_says_of_the_waiting_replicas(
    monkeypatch: pytest.MonkeyPatch, message: str, said: str
) -> None:
    from ray import serve

    monkeypatch.setattr(serve, "status", lambda: _status(message))
    with pytest.raises(DeployError) as caught:
        wait_running(["clicheck.off-t"], deadline=time.monotonic() - 1)
    line = str(caught.value)
    assert line.startswith("arms not running before the deadline: clicheck.off-t ")
    assert said in line and "\n" not in line
