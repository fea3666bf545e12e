"""The PPO update's training forward with shared prompt tokens computed once.

A micro-batch's samples mostly share a long prompt prefix (the env's instructions, the task),
and often whole prompts (a group's episodes at the same state). :func:`shared_prefix_logprobs`
gives the figures of the packed forward (:func:`hgpo.train.model.response_logprobs`), with grad,
from fewer tokens, in three decoder passes:

1. the rows' common prompt prefix (c tokens, at most the shortest prompt's length - 1) once,
   in one row, with grad (:func:`prefix_cache`); its key/value cache is repeated for every
   distinct prompt;
2. every distinct prompt's tokens after the prefix once (:func:`prompt_pass`), right-padded, at
   positions c, c + 1, ..., with a 2D mask over the cache and the prompt's real tokens; its
   cache is then selected for every row (a row per sample, ``batch_select_indices``);
3. every row's response after its prompt's cache (:func:`response_pass`): positions P, P + 1,
   ... for a P-token prompt, the prompt's pads masked out.

Response token 0 of a row is predicted by its prompt's last hidden state (pass 2), token j > 0
by the response's token j - 1 (pass 3), as in the packed forward. Repeating or selecting a
cache row is an indexing op, so autograd adds every row's gradient through the shared tokens.
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
from hgpo.train.model import head_logprobs

__all__ = [
    "MIN_SAVED_TOKENS",
    "PromptPass",
    "ResponsePass",
    "has_cache_api",
    "has_dropout",
    "prefix_cache",
    "prefix_pays",
    "prompt_pass",
    "response_pass",
    "saved_tokens",
    "shared_prefix_length",
    "shared_prefix_logprobs",
    "unique_prompts",
]

MIN_SAVED_TOKENS = 16
"""Fewest prompt tokens the shared passes must save (over the packed forward's rows) for the
update to take them: below it, the extra decoder calls cost more than they save, and the plain
packed forward runs."""


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """c: the tokens every prompt of ``prompts`` starts with, at most the shortest prompt's
    length - 1 (every row keeps its last prompt token, whose hidden state predicts the
    response's first token)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("shared prefix: an empty prompt list or an empty prompt")
    return common_prefix(prompts, min(len(p) for p in prompts) - 1)


def saved_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Prompt tokens the shared passes do not run, against the packed forward: every row's
    prompt, less the common prefix once and each distinct prompt's tokens after it once."""
    c = shared_prefix_length(prompts)
    uniq, _ = unique_prompts(prompts)
    return sum(len(p) for p in prompts) - c - sum(len(u) - c for u in uniq)


def prefix_pays(prompts: Sequence[Sequence[int]], min_saved: int = MIN_SAVED_TOKENS) -> bool:
    """Whether the shared passes save at least ``min_saved`` prompt tokens."""
    return saved_tokens(prompts) >= min_saved


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


def unique_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts (in order of first appearance) and each row's index among them."""
    index: dict[tuple[int, ...], int] = {}
    inverse = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], inverse


@dataclass(frozen=True)
class PromptPass:
    """The distinct prompts after their common c-token prefix, right-padded to L columns.

    ids, position: int64[U, L] tokens (pad where none) and positions (c, c + 1, ...);
    attention: int64[U, c + L], 1 on the cached prefix and on the prompt's real tokens;
    last: int64[U] the column of each prompt's last token (it predicts response token 0).
    """

    ids: torch.Tensor
    position: torch.Tensor
    attention: torch.Tensor
    last: torch.Tensor


@dataclass(frozen=True)
class ResponsePass:
    """Every row's response, right-padded to R columns, after its prompt's cache.

    ids, position: int64[B, R] the response (pad where none) at positions P_b, P_b + 1, ...;
    attention: int64[B, c + L + R], the row's prompt cache (its prompt's real tokens) and its
    real response tokens; mask: float32[B, R], 1 on real response tokens (the packed forward's
    ``response_mask``).
    """

    ids: torch.Tensor
    position: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor


def prompt_pass(prompts: Sequence[Sequence[int]], c: int, pad_id: int) -> PromptPass:
    """The :class:`PromptPass` of distinct ``prompts`` after their first ``c`` tokens (``c``
    below every prompt's length)."""
    if any(len(p) <= c for p in prompts):
        raise ValueError(f"shared prefix: c={c} leaves a prompt without a token of its own")
    U, L = len(prompts), max(len(p) for p in prompts) - c
    ids = torch.full((U, L), pad_id, dtype=torch.long)
    att = torch.zeros((U, c + L), dtype=torch.long)
    att[:, :c] = 1
    for u, p in enumerate(prompts):
        ids[u, : len(p) - c] = torch.tensor(list(p[c:]), dtype=torch.long)
        att[u, c : len(p)] = 1
    position = (c + torch.arange(L)).unsqueeze(0).expand(U, L).contiguous()
    last = torch.tensor([len(p) - c - 1 for p in prompts], dtype=torch.long)
    return PromptPass(ids, position, att, last)


def response_pass(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    prompt_att: torch.Tensor,
    pad_id: int,
) -> ResponsePass:
    """The :class:`ResponsePass` of each row's response after its prompt; ``prompt_att``:
    int64[B, c + L] each row's prompt cache mask (its :class:`PromptPass` row)."""
    if len(prompts) != len(responses):
        raise ValueError(f"shared prefix: {len(prompts)} prompts but {len(responses)} responses")
    B, R = len(responses), max(1, max(len(r) for r in responses))
    ids = torch.full((B, R), pad_id, dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.float32)
    for b, r in enumerate(responses):
        if len(r):
            ids[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            mask[b, : len(r)] = 1.0
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    position = lengths[:, None] + torch.arange(R)[None, :]
    attention = torch.cat([prompt_att, mask.long()], dim=1)
    return ResponsePass(ids, position, attention, mask)


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
    prefix and every distinct prompt through the decoder once (see the module docstring)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    key = cache_key(decoder)
    c = shared_prefix_length(prompts)
    uniq, inverse = unique_prompts(prompts)
    pp = prompt_pass(uniq, c, pad_id)
    extra: dict[str, Any] = {}
    if c:
        extra = {key: prefix_cache(decoder, prompts[0][:c], len(uniq), device)}
    out = decoder(input_ids=pp.ids.to(device), attention_mask=pp.attention.to(device),
                  position_ids=pp.position.to(device), use_cache=True, **extra)  # fmt: skip
    inv = torch.tensor(inverse, dtype=torch.long, device=device)
    first = out.last_hidden_state[inv, pp.last.to(device)[inv]]  # (B, H): response token 0
    rp = response_pass(prompts, responses, pp.attention[inverse], pad_id)
    n = rp.ids.shape[1] - 1  # the last response token is predicted, never an input
    h = first.unsqueeze(1)
    if n:
        cache = getattr(out, key)
        if len(uniq) != len(prompts):
            cache.batch_select_indices(inv)
        cols = rp.attention.shape[1] - 1
        hidden = decoder(input_ids=rp.ids[:, :n].to(device),
                         attention_mask=rp.attention[:, :cols].to(device),
                         position_ids=rp.position[:, :n].to(device), use_cache=True,
                         **{key: cache}).last_hidden_state  # fmt: skip
        h = torch.cat([h, hidden], dim=1)  # (B, R, H)
    lp, ent = head_logprobs(head, h, rp.ids.to(device), temperature, with_entropy)
    return lp, ent, rp.mask.to(device)
