"""Files a campaign names (a replay shape's trace, a mix's dataset) are read relative to the campaign file's own
directory, so `specdrill simulate campaigns/x.yaml` reads the same files from any working directory. The campaign
loader (orchestrator.plan.campaign.load_campaign) passes that directory in pydantic's validation context; a model
validated without it (from a run's manifest, which records the resolved paths) keeps its paths as written."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pydantic import ValidationInfo

# The validation-context key: the absolute directory that relative paths in the file resolve against.
FILES_RELATIVE_TO = "files_relative_to"
# The validation-context key of a campaign read back from a run's manifest (report, recommend, tune, calibrate):
# its files were checked when the run started, and what the run measured lies in its trace. A data set moved,
# deleted or left on another machine must not stop a reader of the run, so such a campaign's files are not read.
RECORDED = "recorded"


def reads_files(info: ValidationInfo) -> bool:
    """Whether a validator may read the files the campaign names now: a new campaign's are read at once (a bad
    file is one line before anything is written); a recorded one's are not."""
    return not (info.context or {}).get(RECORDED, False)


def anchored(path: str, info: ValidationInfo) -> str:
    """`path` resolved against the campaign file's directory; an absolute path unchanged."""
    base = (info.context or {}).get(FILES_RELATIVE_TO)
    if base is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, path))


def file_identity(path: str) -> str:
    """What a named file contributes to a campaign's identity: its content's digest where it can be read, else
    its name. The resolved path is absolute, so two clones (or two machines) running the same campaign would
    otherwise count as different traffic, and a run could not be compared or resumed from another checkout."""
    if path.startswith("hf:"):  # a Hugging Face Hub data set (loadshapes/datasets/hub.py): its name, whole
        return f"name:{path}"
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return f"name:{os.path.basename(path)}"
    return f"sha256:{digest.hexdigest()[:16]}"


def located_files_replaced(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped campaign (model_dump(mode="json")) with every file it names (replay paths, the mix's dataset)
    replaced by file_identity: what makes traffic the same is the files' content, not where a checkout keeps them."""
    out = dict(dumped)
    shapes = out.get("shapes")
    if isinstance(shapes, dict):
        out["shapes"] = {name: _shape_files_replaced(shape) for name, shape in shapes.items()}
    mix = out.get("mix")
    if isinstance(mix, dict) and isinstance(mix.get("dataset"), str):
        out["mix"] = mix = {**mix, "dataset": file_identity(mix["dataset"])}
    if isinstance(mix, dict) and isinstance(mix.get("datasets"), list):
        out["mix"] = {**mix, "datasets": [_entry_file_replaced(e) for e in mix["datasets"]]}
    return out


def _entry_file_replaced(entry: Any) -> Any:
    if isinstance(entry, dict) and isinstance(entry.get("dataset"), str):
        return {**entry, "dataset": file_identity(entry["dataset"])}
    return entry


def _shape_files_replaced(shape: Any) -> Any:
    if not isinstance(shape, dict) or shape.get("kind") != "replay":
        return shape
    path = shape.get("path")
    if isinstance(path, str):
        return {**shape, "path": file_identity(path)}
    if isinstance(path, list | tuple):
        return {**shape, "path": [file_identity(p) for p in path]}
    return shape
