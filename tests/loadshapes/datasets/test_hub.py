"""Hugging Face Hub data sets named in a mix (hf:OWNER/NAME/FILE, hf:OWNER/NAME): found in the clients' caches
as a download leaves them, and refused in one line (exit 2, nothing written) where a package is missing, the name
is unknown or the Hub cannot be reached. The network is never used: the machine that runs the suite has none."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from loadshapes.datasets import hub
from loadshapes.mixes import RequestMix
from tests import REPO
from tests.hub_cache import SHAREGPT, datasets_cache, offline_env, offline_sharegpt, sharegpt_conversations
from tests.loadshapes.datasets.test_dataset_refusals import simulate


def test_a_hub_file_is_read_from_the_hub_cache_and_the_mix_keeps_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = offline_sharegpt(monkeypatch, tmp_path, n=50)
    mix = RequestMix.model_validate({"dataset": SHAREGPT}, context={"files_relative_to": str(tmp_path)})
    (source,) = mix.sources
    assert source.dataset == SHAREGPT and source.path == str(path)  # the name travels; each machine finds its copy
    local = RequestMix.model_validate({"dataset": str(path)})
    assert mix.sample(30, seed=3) == local.sample(30, seed=3)  # the same requests as the file named by its path
    assert {r.category for r in mix.sample(30, seed=3)} == {"sharegpt"}


def test_a_hub_name_identifies_the_campaign_by_its_name() -> None:
    from loadshapes.campaign_files import file_identity

    assert file_identity(SHAREGPT) == f"name:{SHAREGPT}"


def test_a_hub_file_not_in_the_cache_offline_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = simulate(tmp_path, {"dataset": SHAREGPT}, capsys)
    assert (
        line.startswith("specdrill: error: ") and f"{SHAREGPT}: could not be fetched from the Hugging Face Hub" in line
    )
    assert "download the file elsewhere and name its path" in line


def test_without_huggingface_hub_the_extra_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as where it is not installed
    monkeypatch.setenv("SPECDRILL_CACHE", str(tmp_path / "fresh"))  # not found earlier in this process
    line = simulate(tmp_path, {"dataset": SHAREGPT}, capsys)
    assert f"{SHAREGPT}: a Hub data set needs the huggingface_hub package: pip install 'specdrill[datasets]'" in line


def test_without_datasets_a_name_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    line = simulate(tmp_path, {"dataset": "hf:openai/gsm8k"}, capsys)
    assert (
        "hf:openai/gsm8k: a Hugging Face data set by name needs the datasets package: pip install "
        "'specdrill[datasets]'" in line
    ), line


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("hf:someone/else", "not a data set vLLM's bench reads by name (philschmid/mt-bench, openai/openai_humaneval"),
        ("hf:gsm8k", "a Hub data set is hf:OWNER/NAME (by name) or hf:OWNER/NAME/FILE (one file)"),
    ],
)
def test_an_unknown_or_malformed_name_is_one_line(
    name: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert said in simulate(tmp_path, {"dataset": name}, capsys)


def test_the_names_vllm_reads_keep_its_subset_and_split() -> None:
    assert {n: (b.fmt, b.subset, b.split) for n, b in hub.BY_NAME.items()} == {
        "philschmid/mt-bench": ("mt_bench", None, "train"),
        "openai/openai_humaneval": ("humaneval", None, "test"),
        "openai/gsm8k": ("gsm8k", "main", "test"),
        "likaixin/InstructCoder": ("instructcoder", None, "train"),
    }


def _campaign(tmp_path: Path, dataset: str) -> Path:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "hub", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 4, "duration_s": 5}}, "mix": {"dataset": dataset},
        "output": str(tmp_path / "run"),
    }))  # fmt: skip
    return campaign


def _specdrill(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A child process: the `datasets` library reads HF_HUB_OFFLINE once, at import, as an operator's shell sets it.
    return subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
        env=offline_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_a_data_set_by_name_is_loaded_by_the_datasets_library_from_its_cache(tmp_path: Path) -> None:
    """hf:openai/gsm8k through datasets.load_dataset(name, 'main', split='test'), as vLLM's bench loads it, from
    the library's own cache offline; its rows are written once as JSONL under specdrill's cache and sent."""
    rows = [{"question": f"How many apples does person {i} hold?", "answer": f"#### {i}"} for i in range(12)]
    datasets_cache(tmp_path / "hf" / "datasets", tmp_path / "build", "openai/gsm8k", rows)
    started = time.monotonic()
    done = _specdrill(tmp_path, "simulate", str(_campaign(tmp_path, "hf:openai/gsm8k")), "--no-report")
    assert done.returncode == 0, done.stderr[-2000:]
    (copy,) = (tmp_path / "specdrill" / "hub" / "openai--gsm8k").glob("main-test-*.jsonl")
    assert [json.loads(line) for line in copy.read_text().splitlines()] == rows
    import pyarrow.dataset as ds

    table = ds.dataset(tmp_path / "run" / "traces", format="parquet", partitioning="hive").to_table()
    assert set(table.column("category").to_pylist()) == {"gsm8k"} and table.num_rows > 0
    print(f"by name from the datasets cache: {time.monotonic() - started:.1f} s")


def test_a_data_set_by_name_offline_and_not_cached_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = _specdrill(tmp_path, "simulate", str(_campaign(tmp_path, "hf:philschmid/mt-bench")))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "hf:philschmid/mt-bench: could not be fetched from the Hugging Face Hub" in line, line
    assert "name a local copy of its rows with `format:`" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "specdrill").exists()


def test_the_test_conversations_are_sharegpt_v3_entries() -> None:
    entry = sharegpt_conversations(1)[0]
    assert [t["from"] for t in entry["conversations"]] == ["human", "gpt"] and entry["id"] == "t0_0"


@pytest.mark.slow  # the Hub client's own retries: ~23 s, mostly asleep
def test_a_hub_file_with_no_network_is_one_line_after_the_clients_retries(tmp_path: Path) -> None:
    """No HF_HUB_OFFLINE: the client tries the Hub and retries; its retry warnings are held back, so the refusal is
    still one line, and nothing is written. The Hub is a loopback port nothing listens on (HF_ENDPOINT), so a host
    that does reach huggingface.co neither downloads the file nor passes by luck."""
    with socket.socket() as probe:  # a free port, closed again: connections to it are refused
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {k: v for k, v in offline_env(tmp_path).items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed}"
    done = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "simulate",
         str(_campaign(tmp_path, SHAREGPT))],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{SHAREGPT}: could not be fetched from the Hugging Face Hub" in line, line
    assert not (tmp_path / "run").exists() and not (tmp_path / "hf").exists()
