"""A tiny random Qwen2 and its HF rollout engine, built here for the tests that play envs;
and two stand-ins for score mode: a character tokenizer and an engine with fixed scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_engine(folder: Path, corpus: list[str], vocab: int, seed: int) -> tuple[Any, Any]:
    """(tokenizer, HFEngine) of a tiny random Qwen2 whose tokenizer is trained on ``corpus``,
    on the CPU, 64 prompts a batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from hgpo.train.hf_engine import HFEngine
    from hgpo.train.model import load_tokenizer
    from hgpo.train.tiny import build_tiny

    path = build_tiny(folder / "tiny", corpus, vocab, seed=seed)
    tok = load_tokenizer(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    return tok, HFEngine(model, tok, 64, torch.device("cpu"))


class CharTokenizer:
    """One token per character (its code point); eos 0."""

    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


class FixedScores:
    """An engine whose ``score`` returns the given log-probs, one per (prompt, response)."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def score(self, prompts: list[Any], responses: list[Any]) -> list[float]:
        assert len(prompts) == len(responses) == len(self.scores)
        return list(self.scores)
