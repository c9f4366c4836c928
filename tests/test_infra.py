"""infra/: KubeRay manifests checked against KubeRay's own CRD schemas (vendored from ray-project/kuberay at
feeaf72fa, gzipped in tests/data/kuberay), the cluster launcher YAML against Ray's own schema, scripts parse."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).resolve().parent / "data" / "kuberay"


def _schema(kind: str) -> dict[str, Any]:
    with gzip.open(CRDS / f"ray.io_{kind}.yaml.gz") as handle:
        crd = yaml.safe_load(handle)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def unknown_fields(doc: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What `kubectl apply --validate=strict` refuses: keys the structural schema does not declare."""
    found: list[str] = []
    if isinstance(doc, dict) and schema.get("type") == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        for key, value in doc.items():
            if properties is not None and key in properties:
                found.extend(unknown_fields(value, properties[key], f"{path}.{key}"))
            elif isinstance(extra, dict):
                found.extend(unknown_fields(value, extra, f"{path}.{key}"))
            elif properties is not None and not preserve and extra is not True:
                found.append(f"{path}.{key}".lstrip("."))
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(doc):
            found.extend(unknown_fields(item, schema["items"], f"{path}[{i}]"))
    return found


def problems(doc: dict[str, Any], kind: str) -> list[str]:
    schema = _schema(kind)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    return errors + [f"{p}: unknown field" for p in unknown_fields(doc, schema)]


@pytest.mark.parametrize(("path", "kind"), [("raycluster.yaml", "rayclusters"), ("rayjob.yaml", "rayjobs")])
def test_kuberay_manifests_follow_the_crd(path: str, kind: str) -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / path).read_text())
    assert doc["apiVersion"] == "ray.io/v1"
    assert problems(doc, kind) == []
    images = {c["image"] for c in _containers(doc)}
    assert images == {"specdrill:0.1.0-gpu"}


def test_the_checker_catches_typos_and_bad_types() -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / "raycluster.yaml").read_text())
    doc["spec"]["workerGroupSpecs"][0]["replica"] = 2  # typo of replicas
    doc["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-cpus"] = 16  # must be a string
    found = problems(doc, "rayclusters")
    assert any("workerGroupSpecs[0].replica: unknown field" in p for p in found)
    assert any("num-cpus" in p and "not of type 'string'" in p for p in found)


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_cluster_launcher_config_follows_rays_schema() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "infra" / "cluster-launcher.yaml").read_text())
    validate_config(prepare_config(config))
    config["available_node_types"]["gpu"]["resources"] = {"CPU": "sixteen"}
    with pytest.raises(jsonschema.ValidationError, match="not of type 'integer'"):
        validate_config(prepare_config(config))


@pytest.mark.parametrize("script", ["ray-up.sh", "ray-down.sh", "ray-multinode.sh", "demo.sh"])
def test_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / "infra" / script)], check=True)
