"""Hugging Face Hub data sets without the network: a Hub cache and a `datasets` cache laid out as the clients lay
them out after a download, holding small files in the data sets' own formats. With HF_HUB_OFFLINE=1 the clients
find them there, so specdrill's by-name path (loadshapes/datasets/hub.py) runs for real against them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadshapes.datasets.hub import BY_NAME, parse

# The shipped GPU campaign's data set (campaigns/gpu-llama3.1-8b-eagle.yaml).
SHAREGPT = "hf:anon8231489123/ShareGPT_Vicuna_unfiltered/ShareGPT_V3_unfiltered_cleaned_split.json"
_REVISION = "0123456789abcdef0123456789abcdef01234567"
_WORDS = [
    "the",
    "model",
    "drafts",
    "tokens",
    "that",
    "the",
    "target",
    "verifies",
    "in",
    "one",
    "forward",
    "pass",
    "when",
    "the",
    "batch",
    "allows",
]


def sharegpt_conversations(n: int) -> list[dict[str, Any]]:
    """n ShareGPT V3 entries (human, gpt, ...), lengths varied and every pair within vLLM's limits."""
    out = []
    for i in range(n):
        ask = " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(8 + (i * 37) % 200))
        answer = " ".join(_WORDS[(i * 3 + j) % len(_WORDS)] for j in range(6 + (i * 53) % 400))
        turns = [{"from": "human", "value": ask}, {"from": "gpt", "value": answer}]
        out.append({"id": f"t{i}_0", "conversations": turns})
    return out


def hub_file(hub_cache: Path, dataset: str, content: str) -> Path:
    """`content` as the Hub cache holds a downloaded file of a data set repository (hf:OWNER/NAME/FILE)."""
    name = parse(dataset)
    assert name.file is not None
    repo = hub_cache / f"datasets--{name.repo.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(_REVISION)
    path = repo / "snapshots" / _REVISION / name.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def offline_sharegpt(monkeypatch: pytest.MonkeyPatch, root: Path, n: int = 400) -> Path:
    """The shipped campaign's ShareGPT file (n small entries) in a Hub cache under `root`, the Hub offline."""
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_file(root / "hub", SHAREGPT, json.dumps(sharegpt_conversations(n), indent=2))


def datasets_cache(datasets_cache: Path, build: Path, repo: str, rows: list[dict[str, Any]]) -> None:
    """`rows` as the `datasets` library caches a Hub data set after load_dataset(repo, subset, split=split): built
    from a JSONL copy by its own JSON builder, then placed and named as its Hub download would be."""
    import datasets

    known = BY_NAME[repo]
    source = build / "rows.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = datasets.load_dataset("json", data_files={known.split: str(source)}, cache_dir=str(build / "cache"))
    folder = Path(built[known.split].cache_files[0]["filename"]).parent
    name = repo.split("/")[-1]
    dest = datasets_cache / repo.replace("/", "___") / (known.subset or "default") / "0.0.0" / folder.name
    dest.mkdir(parents=True)
    shutil.copy(folder / f"json-{known.split}.arrow", dest / f"{name}-{known.split}.arrow")
    info = json.loads((folder / "dataset_info.json").read_text())
    info.update(config_name=known.subset or "default", dataset_name=name, builder_name=name)
    info["splits"][known.split]["dataset_name"] = name
    (dest / "dataset_info.json").write_text(json.dumps(info))


def offline_env(root: Path) -> dict[str, str]:
    """A child process's environment: the Hub offline, every cache under `root`."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(root / "hf"),
        HF_DATASETS_CACHE=str(root / "hf" / "datasets"),
        HF_HUB_CACHE=str(root / "hf" / "hub"),
        SPECDRILL_CACHE=str(root / "specdrill"),
    )
    return env
