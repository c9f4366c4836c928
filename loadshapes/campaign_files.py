"""Files a campaign names (a replay shape's trace, a mix's dataset) are read relative to the campaign file's own
directory, so `specdrill simulate campaigns/x.yaml` reads the same files from any working directory. The campaign
loader (orchestrator.campaign.load_campaign) passes that directory in pydantic's validation context; a model
validated without it (from a run's manifest, which records the resolved paths) keeps its paths as written."""

from __future__ import annotations

import os

from pydantic import ValidationInfo

# The validation-context key: the absolute directory that relative paths in the file resolve against.
FILES_RELATIVE_TO = "files_relative_to"


def anchored(path: str, info: ValidationInfo) -> str:
    """`path` resolved against the campaign file's directory; an absolute path unchanged."""
    base = (info.context or {}).get(FILES_RELATIVE_TO)
    if base is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, path))
