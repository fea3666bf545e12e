"""Summed response log-probs of many (prompt, response) pairs, batched across prompts.

:meth:`hgpo.train.hf_engine.HFEngine.score` runs one prompt at a time: one decoder pass over
the prompt, one over its candidates after the prompt's key/value cache (copied per
candidate). :func:`batched_score` computes the same figures, to float32 rounding, with fewer
calls and fewer tokens through the model:

0. each distinct (prompt, response) pair is scored once and its figures copied to its repeats
   (:func:`distinct_pairs`: a batch of episodes at the same states repeats whole steps);
1. pairs with consecutive equal prompts form one *run* (a prompt and its candidates);
2. runs are ordered by prompt length, then by tokens (neighbours share long prefixes), and cut
   into batches of prompts of one length (``pad_prompts=False``) or of neighbouring lengths
   (``pad_prompts=True``), within ``max_tokens`` (:func:`length_batches`);
3. the batch's common prompt prefix (c tokens) goes through the decoder once, in one row, and
   its cache is repeated for every row;
4. one more pass over a *token tree* per row (:class:`_Tree`): the prompt's own suffix, the
   candidates' common prefix (r tokens), then every candidate's own tail, right-padded, with
   explicit positions and a 4D additive mask: a token sees the cached prefix, and in its row
   the earlier tokens of segment 0 (prompt and shared prefix) and of its own tail.

Token m of candidate y after prompt x (P tokens) is predicted by the hidden state at the
position before it (the prompt's last for m = 0, the shared prefix's for m <= r, the tail's
after that):

    score(x, y) = sum_m log softmax(head(h_{P-1+m}))[y_m]   (temperature 1),

the same attention sets and positions as the one-prompt path, so the same numbers up to the
order of float32 sums (about 1e-7 relative).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "MAX_TOKENS",
    "batched_score",
    "batched_token_logprobs",
    "cache_key",
    "common_prefix",
    "distinct_pairs",
    "length_batches",
    "prompt_runs",
]

MAX_TOKENS = 8192
"""Tokens per batch: rows x longest prompt, and the sum over runs of prompt + candidates'
tokens (the tree pass's size; its logits are candidates x longest response x vocabulary)."""


def prompt_runs(prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive pairs that share a prompt."""
    runs: list[tuple[int, int]] = []
    s = 0
    while s < len(prompts):
        e, p = s + 1, list(prompts[s])
        while e < len(prompts) and list(prompts[e]) == p:
            e += 1
        runs.append((s, e))
        s = e
    return runs


def distinct_pairs(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
) -> tuple[list[int], list[int]]:
    """The distinct (prompt, response) pairs: the index of each one's first occurrence, in
    order, and for every pair the position of its distinct pair in that list. A batch of
    episodes often repeats pairs (episodes at the same state score the same candidates; the
    reference scores the same sampled step), and a pair's figures depend only on the pair."""
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    first: list[int] = []
    where: list[int] = []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        k = seen.setdefault((tuple(p), tuple(r)), len(first))
        if k == len(first):
            first.append(i)
        where.append(k)
    return first, where


def length_batches(
    order: Sequence[int],
    lengths: Sequence[int],
    widths: Sequence[int],
    max_tokens: int,
    same_length: bool,
) -> list[list[int]]:
    """Run indices in ``order`` (by prompt length, then tokens) cut into consecutive batches
    within ``max_tokens``: rows x the batch's longest prompt, and the sum of ``widths`` (run
    i's prompt + its candidates' tokens: its row of the tree) stay within it (a batch holds at
    least one run); ``same_length``: a batch holds prompts of one length only."""
    out: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in order:
        longest = max(lengths[i], max((lengths[j] for j in cur), default=0))
        new_width = width + widths[i]
        if cur and (
            (same_length and lengths[i] != lengths[cur[0]])
            or longest * (len(cur) + 1) > max_tokens
            or new_width > max_tokens
        ):
            out.append(cur)
            cur, new_width = [], widths[i]
        cur.append(i)
        width = new_width
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def batched_score(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    max_tokens: int = MAX_TOKENS,
    pad_prompts: bool = False,
    on_prompts: Callable[[int], None] | None = None,
) -> list[float]:
    """Sum of each response's token log-probs (temperature 1) after its prompt: the figures of
    :meth:`HFEngine.score` for the same pairs (see the module docstring for the method).

    ``on_prompts(n)`` is called after each batch with the number of prompts it scored (a
    progress bar).

    Raises:
        ValueError on unequal input lengths or an empty prompt.
    """
    sums = _batched(model, prompts, responses, pad_id, device, max_tokens, pad_prompts,
                    on_prompts, per_token=False)  # fmt: skip
    return [float(x) for x in sums]


@torch.no_grad()
def batched_token_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    max_tokens: int = MAX_TOKENS,
    pad_prompts: bool = True,
) -> list[list[float]]:
    """Each response's token log-probs (temperature 1, float32 figures) after its prompt, by
    the method of :func:`batched_score` (its sums are these lists' sums, to float32 rounding):
    the figures of the trainer's packed forward (:func:`hgpo.train.model.response_logprobs`)
    for the same pairs, to float32 rounding.

    Raises:
        ValueError on unequal input lengths or an empty prompt.
    """
    return _batched(model, prompts, responses, pad_id, device, max_tokens, pad_prompts,
                    None, per_token=True)  # fmt: skip


def _batched(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    max_tokens: int,
    pad_prompts: bool,
    on_prompts: Callable[[int], None] | None,
    per_token: bool,
) -> list[Any]:
    """Per pair, its summed log-prob (``per_token`` False) or its token log-probs (True)."""
    if len(prompts) != len(responses):
        raise ValueError(f"score: {len(prompts)} prompts but {len(responses)} responses (one each)")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("score: an empty prompt (at least one token is needed)")
    first, where = distinct_pairs(prompts, responses)
    if len(first) < len(prompts):  # each distinct pair scored once, its figures copied back
        sub_p, sub_r = [prompts[i] for i in first], [responses[i] for i in first]
        got = _batched(model, sub_p, sub_r, pad_id, device, max_tokens, pad_prompts, on_prompts,
                       per_token)  # fmt: skip
        if on_prompts is not None:  # the progress counts the caller's prompts
            on_prompts(len(prompt_runs(prompts)) - len(prompt_runs(sub_p)))
        return [list(got[k]) if per_token else got[k] for k in where]
    runs = prompt_runs(prompts)
    lengths = [len(prompts[s]) for s, _ in runs]
    widths = [len(prompts[s]) + sum(len(r) for r in responses[s:e]) for s, e in runs]
    out: list[Any] = [0.0] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        # by length, then by tokens: neighbours share the longest prompt prefixes
        order = sorted(range(len(runs)), key=lambda i: (lengths[i], list(prompts[runs[i][0]])))
        for batch in length_batches(order, lengths, widths, max_tokens, not pad_prompts):
            chosen = [runs[i] for i in batch]
            scores = _score_batch(model, prompts, responses, chosen, pad_id, device, per_token)
            for (s, e), sc in zip(chosen, scores, strict=True):
                out[s:e] = sc
            if on_prompts is not None:
                on_prompts(len(batch))
    finally:
        if was_training:
            model.train()
    return out


def cache_key(decoder: nn.Module) -> str:
    """transformers 5 names the cache "cache" (argument and output), earlier ones
    "past_key_values" (still accepted by 5.x with a FutureWarning)."""
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def common_prefix(seqs: Sequence[Sequence[int]], cap: int) -> int:
    """Length of the longest prefix every sequence of ``seqs`` shares, at most ``cap``."""
    first = seqs[0]
    n = min(cap, min(len(q) for q in seqs))
    for q in seqs[1:]:
        k = 0
        while k < n and q[k] == first[k]:
            k += 1
        n = k
    return n


@dataclass
class _Tree:
    """One batch laid out as a token tree per row, right-padded:
    [prompt after the common prefix][candidates' shared prefix][tail 1][tail 2]...[pads].

    ids, pos, seg: int64[B, L] tokens, positions, segments (0: prompt and shared prefix, k:
    candidate k's tail, -1: pad); row: int64[n] each candidate's row; pred: int64[n, R] the
    column whose hidden state predicts the candidate's token m; target, mask: [n, R].
    """

    ids: torch.Tensor
    pos: torch.Tensor
    seg: torch.Tensor
    row: torch.Tensor
    pred: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor

    def attention(self, cached: int, dtype: torch.dtype) -> torch.Tensor:
        """float[B, 1, L, cached + L] additive mask: every token sees the cached prefix; in
        the row, token i sees token j <= i of segment 0 or of its own segment; a pad sees
        only itself (a row with nothing to see would give NaN)."""
        seg, L = self.seg, self.seg.shape[1]
        i = torch.arange(L)
        causal = (i[None, :] <= i[:, None])[None]  # [1, Lq, Lk]
        kseg, qseg = seg[:, None, :], seg[:, :, None]
        ok = causal & (kseg >= 0) & (qseg >= 0) & ((kseg == 0) | (kseg == qseg))
        ok = ok | torch.eye(L, dtype=torch.bool)[None]
        ok = torch.cat([torch.ones((seg.shape[0], L, cached), dtype=torch.bool), ok], 2)
        out = torch.zeros(ok.shape, dtype=dtype)
        return out.masked_fill_(~ok, torch.finfo(dtype).min).unsqueeze(1)


def _tree(
    prompts: Sequence[Sequence[int]],
    cands: Sequence[Sequence[Sequence[int]]],
    c: int,
    r: int,
    pad_id: int,
) -> _Tree:
    """The :class:`_Tree` of ``prompts`` (after their common ``c``-token prefix) and each
    prompt's candidates ``cands[b]`` (after their common ``r``-token prefix)."""
    shared = list(cands[0][0][:r])
    rows, row, preds, targets = [], [], [], []
    for b, (p, cs) in enumerate(zip(prompts, cands, strict=True)):
        P = len(p)
        toks, pos, seg = list(p[c:]) + shared, list(range(c, P + r)), [0] * (P - c + r)
        last = P - c + r - 1  # predicts each candidate's first own token
        for k, y in enumerate(cs, start=1):
            tail, start = list(y[r:]), len(toks)
            toks += tail
            pos += range(P + r, P + r + len(tail))
            seg += [k] * len(tail)
            head = range(P - c - 1, P - c - 1 + min(r, len(y)))  # the prompt's last, shared
            preds.append([*head, *([last, *range(start, start + len(tail) - 1)] if tail else [])])
            targets.append(list(y))
            row.append(b)
        rows.append((toks, pos, seg))
    L = max(len(t) for t, _, _ in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    pos_t = torch.zeros((len(rows), L), dtype=torch.long)
    seg_t = torch.full((len(rows), L), -1, dtype=torch.long)
    for b, (t, q, g) in enumerate(rows):
        ids[b, : len(t)], pos_t[b, : len(t)], seg_t[b, : len(t)] = (torch.tensor(t),
                                                                    torch.tensor(q), torch.tensor(g))  # fmt: skip
    R = max(1, max(len(y) for y in targets))
    pred = torch.zeros((len(targets), R), dtype=torch.long)
    target = torch.full((len(targets), R), pad_id, dtype=torch.long)
    mask = torch.zeros((len(targets), R), dtype=torch.float32)
    for j, (pr, y) in enumerate(zip(preds, targets, strict=True)):
        pred[j, : len(pr)], target[j, : len(y)], mask[j, : len(y)] = (torch.tensor(pr, dtype=torch.long),
                                                                      torch.tensor(y, dtype=torch.long), 1.0)  # fmt: skip
    return _Tree(ids, pos_t, seg_t, torch.tensor(row), pred, target, mask)


def _score_batch(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    runs: Sequence[tuple[int, int]],
    pad_id: int,
    device: torch.device,
    per_token: bool = False,
) -> list[list[Any]]:
    """Per run of ``runs``, its candidates' summed log-probs (``per_token``: their token
    log-probs, a list per candidate): the batch's common prompt prefix once (one row, its cache
    repeated for every prompt), then one pass over every prompt's :class:`_Tree` (its own
    suffix, its candidates' common prefix, every candidate's tail)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    key = cache_key(decoder)
    batch_prompts = [list(prompts[s]) for s, _ in runs]
    cands = [[list(responses[i]) for i in range(s, e)] for s, e in runs]
    flat = [y for cs in cands for y in cs]
    c = common_prefix(batch_prompts, min(len(p) for p in batch_prompts) - 1)
    r = common_prefix(flat, max(0, min(len(y) for y in flat) - 1))
    tree = _tree(batch_prompts, cands, c, r, pad_id)
    extra: dict[str, Any] = {}
    if c:
        prefix = torch.tensor([batch_prompts[0][:c]], dtype=torch.long, device=device)
        cache = getattr(decoder(input_ids=prefix, use_cache=True), key)
        cache.batch_repeat_interleave(len(runs))
        extra = {key: cache, "use_cache": True}
    dtype = next(model.parameters()).dtype
    out = decoder(
        input_ids=tree.ids.to(device),
        position_ids=tree.pos.to(device),
        attention_mask=tree.attention(c, dtype).to(device),
        **extra,
    )
    hid = out.last_hidden_state[tree.row.to(device).unsqueeze(1), tree.pred.to(device)]
    logp = torch.log_softmax(head(hid).float(), dim=-1)
    target, mask = tree.target.to(device), tree.mask.to(device)
    tokens = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * mask
    if per_token:
        n = mask.sum(-1).long().tolist()
        rows = [row[:k] for row, k in zip(tokens.tolist(), n, strict=True)]
        return _split(rows, runs)
    return _split(tokens.sum(-1).tolist(), runs)


def _split(values: list[Any], runs: Sequence[tuple[int, int]]) -> list[list[Any]]:
    """``values`` cut into consecutive pieces of each run's size."""
    out, k = [], 0
    for s, e in runs:
        out.append(values[k : k + e - s])
        k += e - s
    return out
