"""A pytest plugin (`-p tests.no_vllm`) that makes `import vllm` fail as on a machine without the vLLM CPU build:
tests/test_tiers.py collects the suite under it to prove that `-m "not vllm"` works there."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


class _NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (tests/no_vllm.py)", name=fullname)
        return None


for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
    del sys.modules[name]
sys.meta_path.insert(0, _NoVllm())
