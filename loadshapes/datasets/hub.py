"""Data sets named on the Hugging Face Hub, fetched once per machine and read as local files.

Two forms of `dataset:`:
- `hf:OWNER/NAME/PATH`: one file of a Hub data set repository (ShareGPT's
  `hf:anon8231489123/ShareGPT_Vicuna_unfiltered/ShareGPT_V3_unfiltered_cleaned_split.json`, the file vLLM's
  documentation downloads), through huggingface_hub's cache (`HF_HUB_CACHE`, `HF_HOME`): the same file
  `vllm bench serve --dataset-path` reads.
- `hf:OWNER/NAME`: a data set by name, as `vllm bench serve --dataset-name hf --dataset-path NAME` loads it
  (`datasets.load_dataset` with vLLM's subset and split for that name), its rows written once as JSONL under
  specdrill's cache and read there like a local copy.

The name, not the local path, is what a campaign (and a run's manifest) keeps: every machine that builds requests
(a load worker on another node) fetches or finds its own copy. A missing package, an unknown name or a name that
cannot be fetched (offline, not in the cache) is one line (DatasetError) before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loadshapes.datasets.formats import DatasetFormat
from loadshapes.datasets.reading import DatasetError

PREFIX = "hf:"
INSTALL = "pip install 'specdrill[datasets]'"


@dataclass(frozen=True)
class ByName:
    """How vLLM's bench loads a Hub data set it knows by name (vllm/benchmarks/datasets/datasets.py, its
    --hf-subset / --hf-split defaults), and the local-copy format its rows are."""

    fmt: DatasetFormat
    subset: str | None
    split: str


BY_NAME: dict[str, ByName] = {
    "philschmid/mt-bench": ByName("mt_bench", None, "train"),
    "openai/openai_humaneval": ByName("humaneval", None, "test"),
    "openai/gsm8k": ByName("gsm8k", "main", "test"),
    "likaixin/InstructCoder": ByName("instructcoder", None, "train"),
}


def is_hub_name(dataset: str) -> bool:
    return dataset.startswith(PREFIX)


@dataclass(frozen=True)
class HubName:
    repo: str  # OWNER/NAME
    file: str | None  # a path in the repository; None: the data set by name


def parse(dataset: str) -> HubName:
    parts = dataset.removeprefix(PREFIX).strip("/").split("/")
    if len(parts) < 2 or not all(parts):
        raise DatasetError(f"{dataset}: a Hub data set is hf:OWNER/NAME (by name) or hf:OWNER/NAME/FILE (one file)")
    repo = "/".join(parts[:2])
    return HubName(repo, "/".join(parts[2:]) or None)


def hub_format(dataset: str) -> DatasetFormat | None:
    """The format of a data set by name (None: a file, whose format is detected from its content)."""
    hub = parse(dataset)
    known = BY_NAME.get(hub.repo) if hub.file is None else None
    return known.fmt if known is not None else None


# Where each name was found, per cache setting: campaign validation asks again for every model that holds it.
_FOUND: dict[tuple[str | None, ...], str] = {}
_SETTINGS = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "SPECDRILL_CACHE", "XDG_CACHE_HOME")


def local_path(dataset: str) -> str:
    """The local file a Hub name reads (fetched on the first call on this machine, found in the cache after)."""
    key = (dataset, *(os.environ.get(name) for name in _SETTINGS))
    found = _FOUND.get(key)
    if found is None or not os.path.exists(found):
        hub = parse(dataset)
        found = _file(dataset, hub.repo, hub.file) if hub.file is not None else _by_name(dataset, hub.repo)
        _FOUND[key] = found
    return found


def cache_dir() -> str:
    """Where data sets by name are kept as JSONL: $SPECDRILL_CACHE, else $XDG_CACHE_HOME/specdrill."""
    root = os.environ.get("SPECDRILL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdrill"
    )
    return os.path.join(root, "hub")


def _offline() -> bool:
    # Read at each call (huggingface_hub reads it once, at import): an operator's HF_HUB_OFFLINE=1 means no
    # network is tried, and the refusal comes at once instead of after the client's retries.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """The Hub clients' retry warnings and progress messages held back: a refusal is one line."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def _why(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def _not_fetched(dataset: str, exc: BaseException, instead: str) -> DatasetError:
    return DatasetError(
        f"{dataset}: could not be fetched from the Hugging Face Hub, and this machine's cache does not hold it "
        f"({_why(exc)}); where the Hub is unreachable, {instead}"
    )


def _file(dataset: str, repo: str, filename: str) -> str:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise DatasetError(f"{dataset}: a Hub data set needs the huggingface_hub package: {INSTALL}") from None
    with _quiet("huggingface_hub"):
        try:
            path: str = hf_hub_download(
                repo,
                filename,
                repo_type="dataset",
                cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                local_files_only=_offline(),
            )
        except Exception as exc:  # the client's errors (offline, not found, HTTP, auth) are many types
            raise _not_fetched(dataset, exc, "download the file elsewhere and name its path") from None
    return path


def _by_name(dataset: str, repo: str) -> str:
    known = BY_NAME.get(repo)
    if known is None:
        raise DatasetError(
            f"{dataset}: not a data set vLLM's bench reads by name ({', '.join(BY_NAME)}); name one of its files "
            f"as hf:{repo}/FILE, or a local copy of its rows with `format:`"
        )
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"{dataset}: a Hugging Face data set by name needs the datasets package: {INSTALL}"
        ) from None
    with _quiet("datasets", "huggingface_hub"):
        bars = datasets.utils.are_progress_bars_disabled()
        datasets.disable_progress_bars()
        try:
            try:
                rows: Any = datasets.load_dataset(
                    repo, name=known.subset, split=known.split, cache_dir=os.environ.get("HF_DATASETS_CACHE") or None
                )
            except Exception as exc:  # ConnectionError offline, DatasetNotFoundError, HTTP errors, ...
                raise _not_fetched(dataset, exc, "name a local copy of its rows with `format:`") from None
            return _exported(repo, known, rows)
        finally:
            if not bars:
                datasets.enable_progress_bars()


def _exported(repo: str, known: ByName, rows: Any) -> str:
    """The rows as JSONL in specdrill's cache, written once per version of the Hub's copy (its Arrow files)."""
    version = hashlib.sha256("\n".join(sorted(f["filename"] for f in rows.cache_files)).encode()).hexdigest()[:16]
    folder = os.path.join(cache_dir(), repo.replace("/", "--"))
    path = os.path.join(folder, f"{known.subset or 'default'}-{known.split}-{version}.jsonl")
    if not os.path.isfile(path):
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"  # renamed whole: a reader never sees half a file
        rows.to_json(partial, lines=True, force_ascii=False)
        os.replace(partial, path)
    return path
