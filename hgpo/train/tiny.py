"""A tiny Qwen2- or Qwen3-architecture model and a byte-level BPE tokenizer trained on the spot.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on the environments' own
prompt text, wrapped in ``PreTrainedTokenizerFast`` with Qwen's special tokens and a ChatML chat
template; the model is a randomly initialised ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM``. Both
are saved with ``save_pretrained`` so that every engine (and a resumed run) loads them from a
folder.

The Qwen3 tokenizer mirrors what the trainer meets in the real Qwen3 tokenizers (Qwen3-1.7B, 4B):
``<think>`` and ``</think>`` are single added tokens that are not special (decoding with
``skip_special_tokens`` keeps them, so the action parser still sees the think block), and the
chat template's generation prompt takes the ``enable_thinking`` switch: switched off, the
assistant turn opens with an empty think block ``<think>\n\n</think>\n\n``; on or not given,
nothing is added and the model opens its own.
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

QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{% endif %}{% endif %}"
)
"""Qwen3's chat format for system and user turns, with its thinking switch: the real template
(Qwen/Qwen3-1.7B, Qwen/Qwen3-4B) adds the empty think block only when ``enable_thinking`` is
given and false. Past assistant turns (whose think blocks the real template strips) never occur
in the trainer's prompts, which hold one user turn."""

THINK_TOKENS = ["<think>", "</think>"]
"""Qwen3's think tags: one added, non-special token each."""

ARCHS = ("qwen2", "qwen3")
"""Architectures of the tiny model."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

DEFAULT_CORPUS = [
    "<think>I should look for the object first.</think><action>go to countertop 1</action>",
    "<think>The goal is on the page.</think><action>click[buy now]</action>",
    "<action>search[red cotton shirt]</action> <action>take apple 1 from fridge 1</action>",
    "You are an expert agent operating in the ALFRED Embodied Environment.",
    "You are an expert autonomous agent operating in the WebShop e-commerce environment.",
]


def check_arch(arch: str) -> None:
    """Refuse an architecture the tiny model does not have."""
    if arch not in ARCHS:
        raise ValueError(f"tiny model: arch must be one of {ARCHS}, got {arch!r}")


def train_tokenizer(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    arch: str = "qwen2",
):
    """Train a byte-level BPE on ``corpus`` (plus a few action examples), save it to ``out_dir``.

    Returns the ``PreTrainedTokenizerFast`` (pad = ``<|endoftext|>``, eos = ``<|im_end|>``);
    ``arch="qwen3"`` adds the think tokens and Qwen3's chat template with its thinking switch.
    """
    check_arch(arch)
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
    if arch == "qwen3":
        fast.add_tokens(THINK_TOKENS)  # AddedToken(special=False), as in Qwen3's tokenizer
    fast.chat_template = QWEN3_CHAT_TEMPLATE if arch == "qwen3" else CHATML_TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_config(
    vocab_size: int, hidden: int = 64, layers: int = 2, tie_embeddings: bool = True,
    arch: str = "qwen2",
):  # fmt: skip
    """The transformers config of :func:`tiny_model` (a Qwen2Config or Qwen3Config)."""
    from transformers import Qwen2Config, Qwen3Config

    check_arch(arch)
    config_cls = Qwen3Config if arch == "qwen3" else Qwen2Config
    heads = max(1, hidden // 64)
    extra = {"head_dim": 64} if arch == "qwen3" else {}
    return config_cls(
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
        **extra,
    )


def tiny_model(
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    tie_embeddings: bool = True,
    arch: str = "qwen2",
):
    """A randomly initialised Qwen2ForCausalLM or Qwen3ForCausalLM (head size 64, as vLLM needs;
    2 KV heads per 4 query heads). Qwen3 adds a per-head RMSNorm of queries and keys and has no
    attention bias; its head size is a config field (128 in the real models), set to 64 here."""
    import torch
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    cfg = tiny_config(vocab_size, hidden, layers, tie_embeddings, arch)
    model_cls = Qwen3ForCausalLM if arch == "qwen3" else Qwen2ForCausalLM
    torch.manual_seed(seed)
    return model_cls(cfg)


def build_tiny(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    arch: str = "qwen2",
) -> Path:
    """Train a tokenizer and build a tiny model in ``out_dir`` (reused when already there, if
    it has the asked architecture and sizes; a ValueError names the difference otherwise)."""
    check_arch(arch)
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        _check_existing(out, arch, hidden, layers)
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(tmp, corpus, vocab_size, arch)
    model = tiny_model(len(tok), hidden, layers, seed, arch=arch)
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


def _check_existing(out: Path, arch: str, hidden: int, layers: int) -> None:
    """A tiny model left in ``out`` by an earlier run must be the one asked for: reusing one of
    another architecture or size would silently train a different model."""
    import json

    saved = json.loads((out / "config.json").read_text())
    want = {"model_type": arch, "hidden_size": hidden, "num_hidden_layers": layers}
    diff = {k: saved.get(k) for k, v in want.items() if saved.get(k) != v}
    if diff:
        raise ValueError(
            f"tiny model: {out} holds a model with {diff}, this run asks for "
            f"{ {k: want[k] for k in diff} }; use another --out-dir or delete {out}"
        )
