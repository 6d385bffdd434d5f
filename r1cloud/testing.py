"""Tiny real models for tests and benchmarks: a Qwen2-architecture model with random weights and a
small BPE tokenizer trained on the spot, with a chat template. No Hub access needed.

head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    words = [
        "what",
        "is",
        "the",
        "answer",
        "think",
        "box",
        "plus",
        "minus",
        "equals",
        "number",
        "sum",
        "of",
        "and",
        "then",
        "so",
        "final",
        "result",
    ]
    lines = [
        f"What is {a} + {b}? The answer is \\boxed{{{a + b}}}." for a in range(30) for b in range(0, 30, 3)
    ]
    lines += [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += ["<think> reasoning </think> <answer> 3 </answer>", "user assistant system"]
    return lines


def make_tokenizer(path: str | Path, vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def make_tiny_model(
    path: str | Path, layers: int = 2, hidden: int = 128, seed: int = 0, tie: bool = False
) -> Path:
    """Write a random Qwen2 causal LM with its tokenizer to `path`; return the path."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    tok = make_tokenizer(path)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(path))
    return path
