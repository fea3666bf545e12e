"""The PPO update's training forward with the micro-batch's common prompt prefix computed once.

A micro-batch's samples mostly share a long prompt prefix (the env's instructions, the task,
the episode's earlier turns). :func:`shared_prefix_logprobs` gives the figures of the packed
forward (:func:`hgpo.train.model.response_logprobs`), with grad, from fewer tokens:

1. the common prefix of the rows' prompts (c tokens, at most the shortest prompt's length - 1)
   goes through the decoder once, in one row, with grad (:func:`prefix_cache`); its key/value
   cache is repeated for every row (``repeat_interleave``: autograd adds every row's
   contribution to the prefix's gradient);
2. one pass over every row's remaining prompt tokens and its response, right-padded, at
   positions c, c + 1, ... after the cache (:func:`suffix_batch`); a 2D mask of ones over the
   cache and the row's real tokens (causal attention keeps every real token off the pads);
3. response token j of a row with a P-token prompt is predicted by the hidden state of the
   suffix column P - c - 1 + j, as in the packed forward (position P - 1 + j).

Each token attends to the same tokens at the same positions as in the packed forward, so the
log-probs, entropies and gradients agree to float32 rounding (the order of sums).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hgpo.train.batched_score import cache_key, common_prefix

__all__ = [
    "MIN_SHARED_PREFIX",
    "Suffixes",
    "has_cache_api",
    "has_dropout",
    "prefix_cache",
    "prefix_pays",
    "shared_prefix_length",
    "shared_prefix_logprobs",
    "suffix_batch",
]

MIN_SHARED_PREFIX = 16
"""Fewest common prompt tokens for which the update computes the prefix once (below it, the
second decoder call costs more than the tokens it saves; the plain packed forward is used)."""


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """c: the tokens every prompt of ``prompts`` starts with, at most the shortest prompt's
    length - 1 (every row keeps its last prompt token, whose hidden state predicts the
    response's first token)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("shared prefix: an empty prompt list or an empty prompt")
    return common_prefix(prompts, min(len(p) for p in prompts) - 1)


def prefix_pays(prompts: Sequence[Sequence[int]], min_prefix: int = MIN_SHARED_PREFIX) -> bool:
    """Whether the shared-prefix forward saves work: two rows or more sharing at least
    ``min_prefix`` prompt tokens."""
    return len(prompts) >= 2 and shared_prefix_length(prompts) >= min_prefix


def has_cache_api(model: nn.Module) -> bool:
    """Whether the model's decoder takes a key/value cache (``cache`` or ``past_key_values``)."""
    try:
        params = inspect.signature(model.get_decoder().forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return "cache" in params or "past_key_values" in params


def has_dropout(model: nn.Module) -> bool:
    """Whether a forward of ``model`` in training mode draws dropout: a dropout layer (LoRA's
    included) or an attention dropout of p > 0. Sharing the prefix would share its draws."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0


@dataclass(frozen=True)
class Suffixes:
    """The rows after their common c-token prefix, right-padded to L columns.

    ids, position: int64[B, L] tokens (pad where none) and positions (c, c + 1, ...);
    attention: int64[B, c + L], 1 on the cache and on the row's real tokens; pred: int64[B, R]
    the suffix column whose hidden state predicts response token j (0 where no token);
    target: int64[B, R] the response, right-padded with the pad id; mask: float32[B, R], 1 on
    real response tokens (the packed forward's ``response_mask``).
    """

    ids: torch.Tensor
    position: torch.Tensor
    attention: torch.Tensor
    pred: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor


def suffix_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], c: int, pad_id: int
) -> Suffixes:
    """The :class:`Suffixes` of (prompt, response) pairs after their first ``c`` prompt tokens
    (``c`` below every prompt's length)."""
    if len(prompts) != len(responses):
        raise ValueError(f"shared prefix: {len(prompts)} prompts but {len(responses)} responses")
    if any(len(p) <= c for p in prompts):
        raise ValueError(f"shared prefix: c={c} leaves a prompt without a token of its own")
    rows = [list(p[c:]) + list(r) for p, r in zip(prompts, responses, strict=True)]
    B, L = len(rows), max(len(t) for t in rows)
    R = max(1, max(len(r) for r in responses))
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, c + L), dtype=torch.long)
    att[:, :c] = 1
    pred = torch.zeros((B, R), dtype=torch.long)
    target = torch.full((B, R), pad_id, dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.float32)
    for b, (p, r, t) in enumerate(zip(prompts, responses, rows, strict=True)):
        ids[b, : len(t)] = torch.tensor(t, dtype=torch.long)
        att[b, c : c + len(t)] = 1
        first = len(p) - c - 1  # the row's last prompt token: predicts response token 0
        pred[b, : len(r)] = torch.arange(first, first + len(r))
        if len(r):
            target[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            mask[b, : len(r)] = 1.0
    position = (c + torch.arange(L)).unsqueeze(0).expand(B, L).contiguous()
    return Suffixes(ids, position, att, pred, target, mask)


def prefix_cache(decoder: nn.Module, prefix: Sequence[int], rows: int, device: Any) -> Any:
    """The decoder's key/value cache of ``prefix`` (one row, with grad where grad is on),
    repeated for ``rows`` rows. Raises TypeError if the decoder's cache cannot be repeated."""
    key = cache_key(decoder)
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    cache = getattr(decoder(input_ids=ids, use_cache=True), key)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        raise TypeError(
            f"shared prefix: the decoder returned no repeatable cache ({type(cache).__name__}); "
            "turn shared_prefix_update off"
        )
    cache.batch_repeat_interleave(rows)
    return cache


def shared_prefix_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    device: Any,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs [B, R] of the response tokens (their entropies [B, R] with ``with_entropy``)
    and the response mask [B, R]: the figures and gradients of ``response_logprobs(model,
    pack(prompts, responses, pad_id, device))`` to float32 rounding, with the prompts' common
    prefix through the decoder once (see the module docstring). With no common prefix it is
    one pass over the whole rows."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    c = shared_prefix_length(prompts)
    s = suffix_batch(prompts, responses, c, pad_id)
    extra: dict[str, Any] = {"use_cache": False}
    if c:
        cache = prefix_cache(decoder, prompts[0][:c], len(prompts), device)
        extra = {cache_key(decoder): cache, "use_cache": True}
    hidden = decoder(
        input_ids=s.ids.to(device),
        attention_mask=s.attention.to(device),
        position_ids=s.position.to(device),
        **extra,
    ).last_hidden_state  # (B, L, H)
    rows = torch.arange(len(prompts), device=device).unsqueeze(1)
    h = hidden[rows, s.pred.to(device)]  # (B, R, H)
    logp = torch.log_softmax(head(h).float() / temperature, dim=-1)
    lp = logp.gather(-1, s.target.to(device).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return lp, ent, s.mask.to(device)
