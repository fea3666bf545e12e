"""Rollout engine on ``transformers.generate`` and the model's own forward (the CPU engine, and
the GPU fallback when vLLM is not installed); :mod:`hgpo.train.vllm_engine` holds the vLLM one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hgpo.train import memory_plan
from hgpo.train.batched_score import batched_score, batched_token_logprobs
from hgpo.train.model import inference_named_parameters, load_named, pack, stop_ids

__all__ = ["HFEngine", "sampled_logprobs"]


def sampled_logprobs(logits: Sequence[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """float32[B, S]: log softmax(logits[j][b])[tokens[b, j]], each sampled token's log-prob
    at temperature 1 from the raw logits [B, V] of generation step j (one step at a time:
    never a [B, S, V] copy)."""
    cols = []
    for j, step in enumerate(logits):
        x = step.float()
        cols.append(x.gather(1, tokens[:, j : j + 1]).squeeze(1) - torch.logsumexp(x, dim=-1))
    return torch.stack(cols, dim=1) if cols else torch.zeros((tokens.shape[0], 0))


class HFEngine:
    """Rollout engine on ``transformers.generate`` (CPU, or GPU fallback).

    By default it samples from the training module itself (no copy). With ``copy=True``
    (ZeRO-3: the training module is sharded, and ranks would have to run every forward pass
    in lockstep) ``model`` is a plain full model of its own, and ``sync(actor)`` gathers the
    actor's parameters into it one at a time.
    """

    def __init__(
        self,
        model: nn.Module,
        tok: Any,
        batch_size: int,
        device: torch.device,
        copy: bool = False,
        keep_logprobs: bool = False,
    ) -> None:
        self.model, self.tok, self.batch_size, self.device = model, tok, batch_size, device
        self.copy = copy
        self.keep_logprobs = keep_logprobs
        """``generate`` keeps each sampled token's log-prob at temperature 1 (from the model's
        raw logits, before temperature and top-p): :meth:`token_logprobs`."""
        self.stop = stop_ids(tok)
        self._token_logprobs: list[list[float] | None] = []

    def sync(self, model: nn.Module) -> None:
        """Sample from ``model`` (the training module); with ``copy``, load its (gathered)
        parameters into the engine's own model. A collective under ZeRO-3: every rank calls it."""
        if not self.copy:
            self.model = model
            return
        load_named(self.model, inference_named_parameters(model))

    def generated_logprobs(self) -> None:
        """None: no second engine's figures to compare (the rollout/trainer gap is vLLM's);
        the hf engine's own log-probs, where kept, are :meth:`token_logprobs`."""
        return None

    def token_logprobs(self) -> list[list[float] | None] | None:
        """Per response of the last :meth:`generate` call, its tokens' log-probs at
        temperature 1 under the weights that sampled them, computed from the raw logits of
        the sampling passes themselves (None for a chunk whose logits would have taken more
        than ``memory_plan.MAX_KEPT_LOGITS`` bytes); None without ``keep_logprobs``. The trainer
        reuses them as PPO's old log-probs where they are its own forward's figures
        (:meth:`hgpo.train.trainer.Trainer._score`)."""
        return list(self._token_logprobs) if self.keep_logprobs else None

    def close(self) -> None:
        """Nothing to free: the model belongs to the trainer."""

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], temperature: float, top_p: float, max_new: int
    ) -> list[list[int]]:
        """Sample one response per prompt; each ends at (and keeps) its first stop token."""
        out: list[list[int]] = []
        self._token_logprobs = []
        was_training = self.model.training
        self.model.eval()
        pad = self.tok.pad_token_id
        vocab = self.model.get_output_embeddings().weight.shape[0] if self.keep_logprobs else 0
        for s in range(0, len(prompts), self.batch_size):
            chunk = prompts[s : s + self.batch_size]
            packed = pack(chunk, [[]] * len(chunk), pad, self.device)
            keep = (
                self.keep_logprobs and memory_plan.kept_logits_bytes(len(chunk), max_new, vocab) > 0
            )
            gen = self.model.generate(
                input_ids=packed.input_ids[:, : packed.P],
                attention_mask=packed.attention_mask[:, : packed.P],
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_new,
                eos_token_id=self.stop,
                pad_token_id=pad,
                output_logits=keep,
                return_dict_in_generate=True,
            )
            new = gen.sequences[:, packed.P :]
            lps = sampled_logprobs(gen.logits, new).tolist() if keep else None
            for b, row in enumerate(new.tolist()):
                cut = len(row)
                for j, t in enumerate(row):
                    if t in self.stop:
                        cut = j + 1
                        break
                out.append(row[:cut])
                self._token_logprobs.append(lps[b][:cut] if lps is not None else None)
        if was_training:
            self.model.train()
        return out

    @torch.no_grad()
    def score(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> list[float]:
        """Sum of the response tokens' log-probabilities (temperature 1) given each prompt.

        Consecutive entries with the same prompt (the candidates of one step in
        action_mode="score") share one pass over that prompt: its key/value cache is computed
        once and repeated for up to ``batch_size`` responses at a time.
        """
        if len(prompts) != len(responses):
            raise ValueError(
                f"score: {len(prompts)} prompts but {len(responses)} responses (one each)"
            )
        out: list[float] = []
        was_training = self.model.training
        self.model.eval()
        s = 0
        while s < len(prompts):
            e = s + 1
            while e < len(prompts) and list(prompts[e]) == list(prompts[s]):
                e += 1
            for c in range(s, e, self.batch_size):
                out.extend(
                    self._score_shared(prompts[s], responses[c : min(e, c + self.batch_size)])
                )
            s = e
        if was_training:
            self.model.train()
        return out

    def score_batched(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        on_prompts: Callable[[int], None] | None = None,
    ) -> list[float]:
        """:meth:`score`'s figures (to float32 rounding) with prompts batched by length and
        shared prefixes computed once (:func:`hgpo.train.batched_score.batched_score`): the
        exact truth's scorer."""
        return batched_score(self.model, prompts, responses, self.tok.pad_token_id,
                             self.device, on_prompts=on_prompts)  # fmt: skip

    def score_tokens(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Each response's token log-probs (temperature 1) given its prompt, all pairs in a few
        batched passes (:func:`hgpo.train.batched_score.batched_token_logprobs`: prompts of
        neighbouring lengths batched, shared prefixes computed once): the per-token figures
        of the trainer's packed forward, to float32 rounding; their sums are :meth:`score`'s.
        action_mode="score" scores every candidate of every env of a step this way."""
        return batched_token_logprobs(self.model, prompts, responses, self.tok.pad_token_id,
                                      self.device)  # fmt: skip

    def _score_shared(
        self, prompt: Sequence[int], responses: Sequence[Sequence[int]]
    ) -> list[float]:
        """Summed response log-probs of ``responses`` after one shared ``prompt`` (KV cache)."""
        if not prompt:
            raise ValueError("score: an empty prompt (at least one token is needed)")
        decoder = self.model.get_decoder()
        head = self.model.get_output_embeddings()
        P = len(prompt)
        first = decoder(
            input_ids=torch.tensor([list(prompt)], dtype=torch.long, device=self.device),
            use_cache=True,
        )
        n, R = len(responses), max(1, max(len(r) for r in responses))
        ids = torch.full((n, R), self.tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, R), dtype=torch.float32)
        for b, r in enumerate(responses):
            if len(r):
                ids[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
                mask[b, : len(r)] = 1.0
        ids, mask = ids.to(self.device), mask.to(self.device)
        # transformers 5 names the cache "cache" (argument and output), earlier ones
        # "past_key_values" (still accepted by 5.x with a FutureWarning)
        params = inspect.signature(decoder.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        cache = getattr(first, key)
        cache.batch_repeat_interleave(n)
        # responses are right-padded: a real token never attends to a later pad (causal), so
        # no attention mask is needed; the pads' log-probs are masked out below.
        pos = torch.arange(P, P + R, device=self.device).unsqueeze(0).expand(n, R)
        rest = decoder(input_ids=ids, position_ids=pos, use_cache=True, **{key: cache})
        h = torch.cat(
            [first.last_hidden_state[:, -1:].expand(n, 1, -1), rest.last_hidden_state[:, :-1]], 1
        )  # position t predicts token t + 1
        logp = torch.log_softmax(head(h).float(), dim=-1)
        lp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return (lp * mask).sum(-1).tolist()
