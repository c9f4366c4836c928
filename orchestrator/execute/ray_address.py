"""Whether a Ray cluster answers at an address, found in seconds. ray.init given an address where nothing (or
something other than Ray) listens retries for minutes, printing raw rpc warnings from Ray's C++ client
(`specdrill deploy --check --address 127.0.0.1:1` ran past 120 s: issue 40); commands ask here first."""

from __future__ import annotations

import os
import socket

# Seconds a TCP connection to the cluster's address may take before it counts as unreachable (a black-holed host).
REACH_TIMEOUT_S = 5.0


def why_unreachable(target: str) -> str | None:
    """Why no Ray answers at a cluster address ("host:port", "ray://host:port"), in one line, found within about
    2 x REACH_TIMEOUT_S; None where one may. "auto" and "local" are Ray's to resolve."""
    if target in ("auto", "local"):
        return None
    client = target.startswith("ray://")
    host, _, port = target.split("://", 1)[-1].rstrip("/").rpartition(":")
    host = host.strip("[]")  # an IPv6 literal: [::1]:6379
    if not host or not port.isdigit():
        return f"Ray address {target!r}: expected host:port (or ray://host:port, auto)"
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
        reason = None if client else _no_gcs(host, int(port))
    except OSError as exc:
        reason = f"no answer within {REACH_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else (
            exc.strerror or str(exc))  # fmt: skip
    if reason is None:
        return None
    return (
        f"no Ray cluster at {target!r}: {reason}: start one (infra/ray-up.sh or `ray start --head`) or give the "
        "address it prints (--address or RAY_ADDRESS)"
    )


# gRPC codes that mean no GCS is there: another server (an HTTP proxy answers UNIMPLEMENTED), none, or no answer.
# Any other code (UNAUTHENTICATED: a cluster with token auth) is a GCS answering: ray.init takes it from there.
_NOT_A_GCS = ("UNIMPLEMENTED", "UNAVAILABLE", "DEADLINE_EXCEEDED")


def _no_gcs(host: str, port: int) -> str | None:
    """Why no Ray GCS answers at host:port (its first call, GetClusterId, as ray.init makes it), or None. Skipped
    for a TLS cluster (RAY_USE_TLS), which this plain channel cannot reach."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    import grpc

    try:  # Ray's generated GCS protocol (private; tests/orchestrator/execute/test_ray_address.py pins it): without it,
        # ray.init decides as before
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return None
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.GetClusterId(request, timeout=REACH_TIMEOUT_S)
        except grpc.RpcError as exc:
            code = exc.code().name
            if code in _NOT_A_GCS:
                return f"it accepts connections but no Ray GCS answers there (gRPC {code})"
    return None
