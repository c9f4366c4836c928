"""The locustfile holds only what Locust looks for; importing it creates nothing (no worker, thread, file or
process-wide setting), and the worker is made when Locust fires init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.shapes import Quiet
from orchestrator.execute.load_workers import LOCUSTFILE
from tests.loadshapes.worker.test_load_worker import CHAT

# Runs in a fresh interpreter: Locust monkey-patches it with gevent, as in a load worker process.
PROBE = """
import gc, json, os, sys, threading
import importlib.util
import locust
from locust import events
from locust.env import Environment

def counts():
    from loadshapes.worker.progress import Progress
    from loadshapes.worker.rows import RowKeeper
    from loadshapes.worker.sending import Sender
    from loadshapes.worker.state import WorkerState
    kinds = (WorkerState, Sender, RowKeeper, Progress)
    gc.unfreeze()  # the worker freezes what is alive once its schedule is built: frozen objects are not listed
    return {kind.__name__: sum(isinstance(o, kind) for o in gc.get_objects()) for kind in kinds}

hooks = ("init", "test_start", "quitting", "request")
listeners = {name: len(getattr(events, name)._handlers) for name in hooks}
threads, interval, files = threading.active_count(), sys.getswitchinterval(), sorted(os.listdir("."))
spec = importlib.util.spec_from_file_location("locustfile", sys.argv[1])
module = sys.modules["locustfile"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
imported = {
    "objects": counts(),
    "threads": threading.active_count() - threads,
    "switch_interval_changed": sys.getswitchinterval() != interval,
    "new_files": sorted(set(os.listdir(".")) - set(files)),
    "new_listeners": {name: len(getattr(events, name)._handlers) - listeners[name] for name in hooks},
}
os.environ["SPECDRILL_LOAD_PLAN"] = sys.argv[2]
events.init.fire(environment=Environment(events=events), runner=None, web_ui=None)
print(json.dumps({"imported": imported, "initialised": counts()}))
"""


def _plan(tmp_path: Path, **extra: str) -> WorkerPlan:
    return WorkerPlan.model_validate(
        {"campaign": "t", "run": "r1", "arm": "a", "shape_name": "s", "shape": Quiet(rate=5, duration_s=1),
         "mix": CHAT, "target": Target(base_url="http://127.0.0.1:9", model="null"),
         "trace_root": str(tmp_path / "traces"), "ready_file": str(tmp_path / "ready"), **extra}
    )  # fmt: skip


def _probe(tmp_path: Path, plan: WorkerPlan, script: str = PROBE) -> Any:
    """Run `script` on the locustfile and the plan in a fresh interpreter (no SPECDRILL_ / LOCUST_ variables, an
    empty working directory); its last stdout line, as JSON."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan.model_dump_json(), encoding="utf-8")
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECDRILL_", "LOCUST_"))}
    result = subprocess.run(
        [sys.executable, "-c", script, str(LOCUSTFILE), str(plan_path)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_locustfile_creates_nothing_until_init(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    report = _probe(tmp_path, plan)
    imported = report["imported"]
    assert imported["objects"] == {"WorkerState": 0, "Sender": 0, "RowKeeper": 0, "Progress": 0}
    assert imported["threads"] == 0
    assert not imported["switch_interval_changed"]
    assert imported["new_files"] == []
    # Locust needs one listener to hand over: init, where the worker registers the rest on the environment.
    assert imported["new_listeners"] == {"init": 1, "test_start": 0, "quitting": 0, "request": 0}
    assert report["initialised"] == {"WorkerState": 1, "Sender": 1, "RowKeeper": 1, "Progress": 1}
    ready = (tmp_path / "ready").read_text(encoding="utf-8")
    assert ready == str(len(open_loop_schedule(plan)))  # the schedule is built at init


def test_a_plan_with_a_tokenizer_builds_its_schedule_in_the_worker_without_transformers(tmp_path: Path) -> None:
    from loadshapes.tokens import tokenizer_json
    from tests.tiny_model import build_tiny_tokenizer

    tokenizer = str(build_tiny_tokenizer(tmp_path / "tokenizer", style="metaspace"))
    plan = _plan(tmp_path, tokenizer=tokenizer, tokenizer_json=tokenizer_json(tokenizer))
    probe = PROBE + "\nprint(json.dumps({'transformers': 'transformers' in sys.modules}))"
    # The worker counts with the tokenizer its plan carries: the tokenizers library, not transformers.
    assert _probe(tmp_path, plan, probe) == {"transformers": False}
    assert (tmp_path / "ready").read_text(encoding="utf-8") == str(len(open_loop_schedule(plan)))
