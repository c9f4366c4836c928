from __future__ import annotations

import json
import subprocess
import sys


def test_json_lines_when_not_a_tty() -> None:
    code = (
        "from orchestrator.logs import configure_logging, get_logger\n"
        "configure_logging('INFO')\n"
        "configure_logging('DEBUG')  # configured once: the second call changes nothing\n"
        "get_logger('t').info('hello', rate=5.0)\n"
        "get_logger('t').debug('hidden')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "hello" and event["rate"] == 5.0 and event["level"] == "info" and "timestamp" in event
