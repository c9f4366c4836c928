"""A tiny random-weight Llama and a locally trained byte-level BPE tokenizer: a real model dir for vLLM, no download."""

from __future__ import annotations

from pathlib import Path

VOCAB_SIZE = 2048


def _corpus() -> list[str]:
    words = [
        "the",
        "a",
        "speculative",
        "decoding",
        "draft",
        "token",
        "verify",
        "batch",
        "queue",
        "engine",
        "load",
        "rate",
        "policy",
        "request",
    ]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) for i in range(400)]


def build_tiny_llama(target: Path, *, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(target, safe_serialization=True)

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(target)
    return target
