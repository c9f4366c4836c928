"""infra/: KubeRay manifests checked against KubeRay's own CRD schemas (vendored from ray-project/kuberay at
feeaf72fa, gzipped in tests/data/kuberay), the cluster launcher YAML against Ray's own schema, scripts parse."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests import DATA, REPO

# Imported before any test imports Ray: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read once at Ray's import.
from tests.ray_helpers import free_port, local_ray

CRDS = DATA / "kuberay"


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


# --- models on a cluster: token, cache, /dev/shm (docs/operator/models-on-a-cluster.md) -----------------------

MANIFESTS = [("raycluster.yaml", "rayclusters"), ("rayjob.yaml", "rayjobs")]


def _pods(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    return [(name, g["template"]["spec"]) for name, g in groups]


def _dockerfile_hf_home() -> str:
    lines = (REPO / "infra" / "Dockerfile").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith("ENV HF_HOME=")]
    return line.split("=", 1)[1]


@pytest.mark.parametrize(("path", "kind"), MANIFESTS)
def test_every_pod_mounts_a_memory_backed_shm_and_the_model_cache(path: str, kind: str) -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / path).read_text())
    pods = _pods(doc)
    assert any(
        c["resources"]["limits"].get("nvidia.com/gpu") for _, pod in pods for c in pod["containers"]
    ), "no GPU pod: the checks below would be vacuous"
    for group, pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            shm = volumes[mounts["/dev/shm"]]
            assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"], group
            env = {e["name"]: e for e in container["env"]}
            hf_home = env["HF_HOME"]["value"]
            assert hf_home == _dockerfile_hf_home(), f"{group}: the image and the manifest disagree on HF_HOME"
            cache_mounts = [p for p in mounts if hf_home == p or hf_home.startswith(p.rstrip("/") + "/")]
            assert cache_mounts, f"{group}: HF_HOME {hf_home} is on no volume"
            assert "emptyDir" in volumes[mounts[cache_mounts[0]]] or "persistentVolumeClaim" in volumes[
                mounts[cache_mounts[0]]
            ]


@pytest.mark.parametrize(("path", "kind"), MANIFESTS)
def test_the_hf_token_comes_only_from_an_optional_secret(path: str, kind: str) -> None:
    text = (REPO / "infra" / "kuberay" / path).read_text()
    doc = yaml.safe_load(text)
    for group, pod in _pods(doc):
        for container in pod["containers"]:
            (token,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
            assert "value" not in token, f"{group}: a literal token in a manifest"
            ref = token["valueFrom"]["secretKeyRef"]
            # optional: a cluster without the Secret still starts, and public models load.
            assert ref == {"name": "hf-token", "key": "token", "optional": True}, group
    assert 'kubectl create secret generic hf-token --from-literal=token="$HF_TOKEN"' in text
    assert "hf_" not in text.replace("hf-token", "").replace("hf_...", "")


def test_the_rayjob_pulls_the_campaigns_models_before_running_it() -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / "rayjob.yaml").read_text())
    pull, run = (part.strip() for part in doc["spec"]["entrypoint"].split("&&"))
    campaign = run.removeprefix("specdrill run ")
    assert pull == f"specdrill models pull {campaign}" and (REPO / campaign).is_file()


def test_the_launchers_token_lines_validate_once_uncommented() -> None:
    """The launcher documents the token as commented-out options: enabling them must still give a valid config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    text = (REPO / "infra" / "cluster-launcher.yaml").read_text()
    enabled = text.replace('    # - "--env HF_TOKEN_PATH', '    - "--env HF_TOKEN_PATH')
    enabled = enabled.replace("\n#   /home/ray/.specdrill-secrets", "\n  /home/ray/.specdrill-secrets")
    assert enabled != text
    config = yaml.safe_load(enabled)
    validate_config(prepare_config(config))
    (secrets,) = [m for m in config["file_mounts"] if m != RAY_TOKEN_MOUNT]
    assert any(f"HF_TOKEN_PATH={secrets}/" in opt for opt in config["docker"]["run_options"])
    cache = [o for o in config["docker"]["run_options"] if o.startswith("--volume ") and ":/models" in o]
    assert [c.split(":")[1] for c in cache] == [_dockerfile_hf_home().rsplit("/", 1)[0]]


# --- Ray's token and the results volume (tests/infra/test_manifests_start.py starts the nodes themselves) --------

RAY_TOKEN_MOUNT = "~/.ray/auth_token"  # Ray's default token file (`ray get-auth-token --generate` writes it)


def test_the_launcher_mounts_the_operators_ray_token_on_every_node() -> None:
    config = yaml.safe_load((REPO / "infra" / "cluster-launcher.yaml").read_text())
    assert config["file_mounts"][RAY_TOKEN_MOUNT] == RAY_TOKEN_MOUNT
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        assert command == "ray stop" or command.startswith("RAY_AUTH_MODE=token ray start ")
    assert "ray get-auth-token --generate" in (REPO / "infra" / "cluster-launcher.yaml").read_text()


@pytest.mark.parametrize(("path", "kind"), MANIFESTS)
def test_kuberay_generates_the_token_of_every_pod(path: str, kind: str) -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / path).read_text())
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert spec["authOptions"] == {"mode": "token"}
    for group, pod in _pods(doc):  # KubeRay adds RAY_AUTH_MODE and RAY_AUTH_TOKEN only where a pod sets neither
        for container in pod["containers"]:
            assert not {e["name"] for e in container["env"]} & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, group


def _output_root(campaign: str) -> str:
    output = yaml.safe_load((REPO / campaign).read_text())["output"]
    return "/" + output.strip("/").split("/")[0]


@pytest.mark.parametrize(("path", "kind"), MANIFESTS)
def test_every_pod_mounts_the_shared_results_claim_where_the_campaign_writes(path: str, kind: str) -> None:
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / path).read_text())
    root = _output_root("campaigns/gpu-llama3.1-8b-eagle.yaml")
    claim = yaml.safe_load((REPO / "infra" / "kuberay" / "results-pvc.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for group, pod in _pods(doc):
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == root]
            assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}, group


def test_the_launchers_nodes_mount_one_nfs_file_system_where_the_campaign_writes() -> None:
    config = yaml.safe_load((REPO / "infra" / "cluster-launcher.yaml").read_text())
    root = _output_root("campaigns/gpu-llama3.1-8b-eagle.yaml")
    (volume,) = [o for o in config["docker"]["run_options"] if o.endswith(f":{root}")]
    host_dir = volume.removeprefix("--volume ").split(":")[0]
    (nfs,) = [c for c in config["initialization_commands"] if "mount -t nfs4" in c]
    assert f":/ {host_dir})" in nfs  # the EFS export mounted on the directory the containers see as /results


# --- `specdrill models pull`: never downloads here (no network; HF_HUB_OFFLINE=1 wherever a Hub id is asked for) ---

HUB_TARGET = "meta-llama/Llama-3.1-8B-Instruct"
HUB_DRAFTER = "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"


def _vllm_campaign_yaml(path: Path, target: str, drafter: str, **extra: Any) -> Path:
    data = {
        "name": "pulltest",
        "engine": {"kind": "vllm", "model": target, **extra},
        "policies": {"off": "off", "draft": {"kind": "fixed", "method": "draft_model", "model": drafter, "k": 2}},
        "topologies": {"single": "single"},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _specdrill(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def _offline_env(hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"HF_TOKEN", "HF_TOKEN_PATH", "RAY_ADDRESS"}}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home)}


def test_models_pull_lists_target_and_drafters_and_skips_local_directories(tmp_path: Path) -> None:
    from serve_apps.engines.vllm_support import campaign_models, is_local_model, pull_here

    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    campaign = _vllm_campaign_yaml(tmp_path / "c.yaml", str(target), str(drafter))
    result = _specdrill("models", "pull", "--here", str(campaign), env=_offline_env(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{target}: skipped (local path)", f"{drafter}: skipped (local path)"]
    assert not (tmp_path / "hf").exists(), "a pull of local models touched the cache"

    from orchestrator.plan.campaign import load_campaign

    hub = load_campaign(_vllm_campaign_yaml(tmp_path / "h.yaml", HUB_TARGET, HUB_DRAFTER))
    assert campaign_models(hub) == [HUB_TARGET, HUB_DRAFTER]
    assert not any(is_local_model(m) for m in campaign_models(hub))
    assert is_local_model("./models/llama") and is_local_model("~/llama") and not is_local_model("gpt2")
    assert [p.skipped for p in pull_here([str(target), "./not/made/yet"])] == ["local path", "local path"]


def test_models_pull_of_a_hub_model_offline_fails_in_one_line_naming_the_model(tmp_path: Path) -> None:
    campaign = _vllm_campaign_yaml(tmp_path / "c.yaml", HUB_TARGET, HUB_DRAFTER)
    result = _specdrill("models", "pull", "--here", str(campaign), env=_offline_env(tmp_path / "hf"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"specdrill: error: {HUB_TARGET}: not in the cache at {tmp_path / 'hf' / 'hub'} and HF_HUB_OFFLINE is set:"
        " unset it to download"
    ]


def test_models_pull_of_a_simulated_campaign_is_refused(tmp_path: Path) -> None:
    campaign = REPO / "examples" / "sim-campaign.yaml"
    result = _specdrill("models", "pull", "--here", str(campaign), env=_offline_env(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == "specdrill: error: engine kind simulated: only vLLM campaigns load models"


# --- one Ray cluster whose nodes hold a Hugging Face token in their environment, as a KubeRay pod does ---------


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    token = f"hf_specdrilltest{uuid.uuid4().hex}"
    hf_home = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        # Ray's processes inherit this environment: the Secret-to-env path of infra/kuberay, on one machine.
        patch.setenv("HF_TOKEN", token)
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HOME", str(hf_home))
        with local_ray(num_cpus=4, num_gpus=1) as info:
            import ray

            temp_dir = str(info.get("temp_dir") or ray._private.worker._global_node.get_temp_dir_path())
            yield {**info, "token": token, "hf_home": hf_home, "temp_dir": temp_dir}


def test_models_pull_runs_one_task_per_gpu_node_with_the_nodes_offline_setting(
    token_cluster: dict[str, Any], tmp_path: Path
) -> None:
    from serve_apps.engines.vllm_support import ModelPullError, pull_on_gpu_nodes

    local = tmp_path / "tiny"
    local.mkdir()
    outcomes = pull_on_gpu_nodes([str(local)])
    (outcome,) = outcomes.values()  # the one node with a GPU
    assert outcome["models"] == [{"model": str(local), "path": None, "skipped": "local path"}]
    (outcome,) = pull_on_gpu_nodes([str(local), HUB_DRAFTER]).values()
    cache = token_cluster["hf_home"] / "hub"
    assert outcome["error"] == (
        f"{HUB_DRAFTER}: not in the cache at {cache} and HF_HUB_OFFLINE is set: unset it to download"
    )
    # A pull that does not finish in time (a slow link, a lost node) ends in one line, its tasks cancelled.
    with pytest.raises(ModelPullError, match=r"^pulling on 1 GPU nodes: .*") as caught:
        pull_on_gpu_nodes([str(local)], timeout_s=0.001)
    assert "\n" not in str(caught.value)


def _replica_environments(gcs_address: str, app: str) -> list[dict[str, str]]:
    """The environments of the application's live Serve replicas, found by the pids in Ray's actor table. (A scan
    of process titles under the temp dir found none once on a loaded CI host although the app was RUNNING: the
    actor table is where Ray itself records which process holds a replica.)"""
    import psutil
    from ray.util.state import list_actors

    alive = list_actors(address=gcs_address, filters=[("state", "=", "ALIVE")], limit=1000)
    # Serve names a replica's actor class ServeReplica:<application>:<deployment>.
    pids = [a.pid for a in alive if a.class_name.startswith(f"ServeReplica:{app}:")]
    return [psutil.Process(pid).environ() for pid in pids]


def _files_holding(root: Path, secret: str) -> list[str]:
    """Files under root whose bytes, or (Parquet, which compresses) whose decoded rows, contain the secret."""
    import pyarrow.parquet as pq

    found = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.suffix == ".parquet":
            data += json.dumps(pq.read_table(path).to_pylist(), default=str).encode()
        if secret.encode() in data:
            found.append(str(path.relative_to(root)))
    return found


@pytest.mark.vllm
def test_the_hf_token_reaches_every_replica_from_the_cluster_env_and_no_file(
    token_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """The token set where Ray runs (a Secret on KubeRay) is in the environment of a vLLM arm's replica (whose own
    engine.env becomes a runtime_env) and of a simulated arm's, and in no file of a run directory, nor in Ray's
    session logs (a token passed as runtime_env env_vars would be: Ray's runtime-env agent logs them)."""
    from orchestrator.execute.deploy import bring_up, teardown_arms
    from orchestrator.execute.ray_executor import run_campaign
    from orchestrator.plan.campaign import Campaign
    from tests.tiny_model import SHORT_FIXED_WORKLOAD

    token, temp_dir = token_cluster["token"], token_cluster["temp_dir"]
    port = free_port()  # Serve listens on one address per cluster: both campaigns use it
    vllm_run = tmp_path / "vllm-run"
    vllm_campaign = Campaign.model_validate(
        {
            "name": "tokenvllm",
            # The placement probe stands in for the engine: nothing is loaded or downloaded.
            "engine": {"kind": "vllm", "model": HUB_TARGET, "env": {"HF_HUB_OFFLINE": "1"}},
            "policies": {"off": "off"},
            "topologies": {"single": "single"},
            "resources": {"cpus_per_engine": 0.25, "gpus_per_engine": 1},
            "serve": {"host": "127.0.0.1", "port": port},
            "output": str(vllm_run),
        }
    )
    from orchestrator.rundir.layout import MANIFEST, RunStore
    from orchestrator.rundir.manifest import open_run

    store = RunStore(vllm_campaign.output_dir())
    store.write_json(MANIFEST, open_run(vllm_campaign, store))
    arms, _ = bring_up(vllm_campaign, address=None, timeout_s=180, only=None, probe=True)
    try:
        (env,) = _replica_environments(token_cluster["gcs_address"], arms[0].app_name)
    finally:
        teardown_arms([arms[0].app_name])
    assert env.get("HF_TOKEN") == token and env.get("HF_HUB_OFFLINE") == "1"

    sim_run = tmp_path / "sim-run"
    sim_campaign = Campaign.model_validate(
        {
            "name": "tokensim",
            "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle", "time_scale": 2.0},
            "policies": {"off": "off"},
            "topologies": {"single": "single"},
            "resources": {"cpus_per_engine": 0.25},
            "shapes": {"q": {"kind": "quiet", "rate": 4, "duration_s": 3}},
            # Short fixed answers: the built-in chat's (up to 1024 tokens at time_scale 2) kept the unit to drain_s.
            "mix": {"entries": [{"workload": SHORT_FIXED_WORKLOAD, "weight": 1}]},
            "load": {"workers": 1, "drain_s": 20, "flush_s": 0.5},
            "warmup": {"requests": 1},
            "serve": {"host": "127.0.0.1", "port": port},
            "output": str(sim_run),
        }
    )
    seen: list[dict[str, str]] = []
    gcs = token_cluster["gcs_address"]
    _, manifest = run_campaign(
        sim_campaign, on_unit=lambda *_: seen.extend(_replica_environments(gcs, "tokensim.off-single"))
    )
    teardown_arms([arm.app_name for arm in sim_campaign.arms()])
    assert manifest["units"], "the simulated run measured nothing"
    assert seen and all(e.get("HF_TOKEN") == token for e in seen)

    for run in (vllm_run, sim_run):
        assert any(run.rglob("*.json")), f"{run}: no run files to look in"
        assert _files_holding(run, token) == []
    assert _files_holding(Path(temp_dir), token) == []


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "S3_SECRET"])
def test_a_secret_in_engine_env_is_refused_before_it_reaches_a_manifest(name: str) -> None:
    from orchestrator.plan.campaign import Campaign, CampaignError

    data: dict[str, Any] = {
        "name": "secrettest",
        "engine": {"kind": "vllm", "model": HUB_TARGET, "env": {"HF_HUB_OFFLINE": "1", name: "hf_not_a_real_one"}},
        "policies": {"off": "off"},
        "topologies": {"single": "single"},
    }
    with pytest.raises((ValueError, CampaignError), match=rf"env may not carry {name}: it would be written"):
        Campaign.model_validate(data)
    data["engine"]["env"] = {"HF_HUB_OFFLINE": "1", "HF_TOKEN_PATH": "/secrets/hf-token"}  # a path, not a secret
    assert Campaign.model_validate(data).engine.env["HF_TOKEN_PATH"] == "/secrets/hf-token"
