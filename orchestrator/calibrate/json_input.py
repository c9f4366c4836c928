"""A JSON file calibrate imports from another tool (vLLM's dynamic-speculation profile, `vllm bench forward`
results), or one line naming the file and what is wrong with it: missing, unreadable, not JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: str, error: type[ValueError]) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
