"""Independent whole-array steps run side by side: numpy, pyarrow and the id kernel release the GIL in their
loops, so on a 2-core machine two such steps take about the time of one."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_WORKERS = max(1, min(4, os.cpu_count() or 1))


def run_parallel(*steps: Callable[[], Any]) -> list[Any]:
    if _WORKERS == 1 or len(steps) == 1:
        return [step() for step in steps]
    with ThreadPoolExecutor(max_workers=min(_WORKERS, len(steps))) as pool:
        futures = [pool.submit(step) for step in steps]
        return [f.result() for f in futures]
