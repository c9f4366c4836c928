"""Small simulated campaigns, and the CLI called in-process, shared by the tests that need a finished virtual run
in seconds."""

from __future__ import annotations

import pytest

from orchestrator.cli import main

# Two units per arm (a ramp and a quiet hold), `off` against a dynamic schedule on one engine: ~200 requests.
TWO_SHAPES = """
name: {name}
engine: {{kind: simulated, profile: llama3.1-8b-h100-eagle}}
policies: {{"off": "off", dyn: "dynamic:3:1-4=3,5-12=1,13-512=0"}}
topologies: {{single: single}}
shapes:
  ramp: {{kind: ramp, rate_from: 1, rate_to: 8, duration_s: 6}}
  calm: {{kind: quiet, rate: 2, duration_s: 4}}
load: {{drain_s: 5}}
"""


def two_shapes(name: str) -> str:
    return TWO_SHAPES.format(name=name)


def cli_exit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`specdrill ARGS` in this process: its exit code and what it wrote to stderr."""
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    code = caught.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err
