"""A tiny Qwen2-architecture model and a byte-level BPE tokenizer trained on the spot.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on the environments' own
prompt text, wrapped in ``PreTrainedTokenizerFast`` with Qwen's special tokens and a ChatML chat
template; the model is a randomly initialised ``Qwen2ForCausalLM``. Both are saved with
``save_pretrained`` so that every engine (and a resumed run) loads them from a folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""Qwen2.5's chat format without its default system prompt."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

DEFAULT_CORPUS = [
    "<think>I should look for the object first.</think><action>go to countertop 1</action>",
    "<think>The goal is on the page.</think><action>click[buy now]</action>",
    "<action>search[red cotton shirt]</action> <action>take apple 1 from fridge 1</action>",
    "You are an expert agent operating in the ALFRED Embodied Environment.",
    "You are an expert autonomous agent operating in the WebShop e-commerce environment.",
]


def train_tokenizer(
    out_dir: str | os.PathLike[str], corpus: Iterable[str] = (), vocab_size: int = 1024
):
    """Train a byte-level BPE on ``corpus`` (plus a few action examples), save it to ``out_dir``.

    Returns the ``PreTrainedTokenizerFast`` (pad = ``<|endoftext|>``, eos = ``<|im_end|>``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*DEFAULT_CORPUS, *corpus], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_model(
    vocab_size: int, hidden: int = 64, layers: int = 2, seed: int = 0, tie_embeddings: bool = True
):
    """A randomly initialised Qwen2ForCausalLM (head size 64, 2 KV heads per 4 query heads)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = max(1, hidden // 64)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
        max_position_embeddings=8192,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def build_tiny(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Train a tokenizer and build a tiny model in ``out_dir`` (reused when already there)."""
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(tmp, corpus, vocab_size)
    model = tiny_model(len(tok), hidden, layers, seed)
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(str(tmp))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
