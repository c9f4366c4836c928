from __future__ import annotations

import pytest

from serve_apps.sim.profile import Profile, load_profile


@pytest.fixture(scope="session")
def eagle_profile() -> Profile:
    return load_profile("llama3.1-8b-h100-eagle")


@pytest.fixture(scope="session")
def ngram_profile() -> Profile:
    return load_profile("llama3.1-8b-h100-ngram")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A smaller random Llama with the target's tokenizer: vLLM's draft_model drafter, exactly k drafts a step."""
    from pathlib import Path

    from tests.tiny_model import build_tiny_draft

    return str(build_tiny_draft(tmp_path_factory.mktemp("tiny-draft"), Path(tiny_model_dir)))
