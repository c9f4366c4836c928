"""The same request in two arms: ids share (shape, repeat, index) after the arm part."""

from __future__ import annotations

import numpy as np

from orchestrator.analysis.frame import RequestFrame

_KEY_LIMIT = 1 << 62


def baseline_partners(frame: RequestFrame, baseline: int) -> np.ndarray:
    """Per row, the row of the same request in the baseline arm; -1 if it has none there."""
    partners = np.full(len(frame), -1, dtype=np.int64)
    parsed = (frame.index >= 0) & (frame.shape.codes >= 0)
    if not parsed.any():
        return partners
    repeats = int(frame.repeat.max()) + 1
    indices = int(frame.index.max()) + 1
    domain = (len(frame.shape.names) + 1) * repeats * indices
    if domain >= _KEY_LIMIT:
        return partners  # ids this large are not from specdrill's planner: compare unpaired
    key = (frame.shape.codes.astype(np.int64) * repeats + frame.repeat) * indices + frame.index
    base_rows = np.flatnonzero(parsed & (frame.arm.codes == baseline))
    if domain <= 4 * len(frame) + 4096:
        lookup = np.full(domain, -1, dtype=np.int64)
        lookup[key[base_rows]] = base_rows
        if parsed.all():
            found: np.ndarray = lookup[key]
            return found
        partners[parsed] = lookup[key[parsed]]
        return partners
    order = np.argsort(key[base_rows], kind="stable")
    sorted_keys = key[base_rows][order]
    rows = np.flatnonzero(parsed)
    at = np.minimum(np.searchsorted(sorted_keys, key[rows]), len(sorted_keys) - 1)
    found = sorted_keys[at] == key[rows]
    partners[rows[found]] = base_rows[order[at[found]]]
    return partners
