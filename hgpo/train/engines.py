"""The trainer's models in their DeepSpeed engines (actor, KL reference, critic) and its rollout
engine (:class:`hgpo.train.hf_engine.HFEngine` or :class:`hgpo.train.vllm_engine.VLLMEngine`).

:func:`build_engines` runs once per rank, right after the tokenizer is loaded and the torch
seed set; the order in which it builds the models is the order in which they draw from torch's
generator (LoRA adapters, critic head), so the same seed gives the same initial weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from hgpo.train.episodes import Engine
from hgpo.train.hf_engine import HFEngine
from hgpo.train.lora import add_adapters
from hgpo.train.model import Critic, load_causal_lm
from hgpo.train.train_config import TrainConfig

__all__ = ["Engines", "build_engines", "ds_config", "rollout_engine"]


@dataclass
class Engines:
    """The DeepSpeed engines of one rank."""

    actor: Any
    """The actor's DeepSpeed engine (its ``module`` is the policy, a peft model with LoRA)."""
    ref: nn.Module | None
    """The frozen KL reference (None without KL, or with LoRA: the actor without adapters)."""
    ref_engine: Any
    """ZeRO-3: the engine that owns the hooks gathering the reference's shards (else None)."""
    critic: Any
    """The critic's DeepSpeed engine (``gae``), else None."""


class DeepSpeedSettings(Protocol):
    """The settings :func:`ds_config` reads (``TrainConfig`` has them)."""

    grad_clip: float
    micro_batch_size: int
    zero_stage: int


def ds_config(cfg: DeepSpeedSettings, grad_accum: int, dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed config of every engine of the run."""
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": dtype == torch.bfloat16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_engines(
    cfg: TrainConfig, model_path: str, dtype: torch.dtype, device: torch.device, grad_accum: int
) -> Engines:
    """The actor (with LoRA adapters when asked), the KL reference and the critic (gae),
    each in a DeepSpeed engine.

    The reference is a frozen copy of the initial model (under ZeRO-3 sharded like the
    actor, forward only); with LoRA it is the actor itself with its adapters switched off.
    """
    import deepspeed

    lora, sharded = cfg.lora_rank > 0, cfg.zero_stage == 3
    ds_cfg = ds_config(cfg, grad_accum, dtype)
    actor = load_causal_lm(model_path, dtype, device)
    if cfg.gradient_checkpointing:
        actor.gradient_checkpointing_enable()
    ref_module = None
    ref_engine = None  # ZeRO-3: owns the hooks that gather the reference's shards
    if cfg.kl_coef > 0 and not lora:
        ref = load_causal_lm(model_path, dtype, device).eval()
        ref.requires_grad_(False)
        if sharded:
            ref_engine, *_ = deepspeed.initialize(model=ref, config=ds_cfg)
            ref = ref_engine.module.eval()
        ref_module = ref
    if lora:
        actor = add_adapters(actor, cfg)
        if cfg.gradient_checkpointing:  # frozen embeddings: checkpointed blocks need a grad input
            actor.enable_input_require_grads()
    trainable = [p for p in actor.parameters() if p.requires_grad]
    # A torch optimizer: DeepSpeed's own Adam would be compiled with g++ on first use.
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    actor_engine, *_ = deepspeed.initialize(model=actor, optimizer=opt, config=ds_cfg)
    critic_engine = None
    if cfg.use_critic:
        critic = Critic(model_path, dtype).to(device)
        copt = torch.optim.AdamW(
            critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay
        )
        critic_engine, *_ = deepspeed.initialize(model=critic, optimizer=copt, config=ds_cfg)
    return Engines(actor_engine, ref_module, ref_engine, critic_engine)


def rollout_engine(
    cfg: TrainConfig,
    tok: Any,
    model_path: str,
    actor_module: nn.Module,
    dtype: torch.dtype,
    device: torch.device,
) -> Engine:
    """The engine that plays the rollouts: vLLM (``--rollout-engine vllm``), else
    ``transformers`` on the actor itself, or under ZeRO-3 on a full copy of it."""
    if cfg.rollout_engine == "vllm":
        from hgpo.train.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, tok, cfg, actor_module)
    if cfg.zero_stage == 3:
        # A full copy of the actor to sample from: generating on the sharded module would
        # gather every layer for every token, in lockstep over the ranks.
        full = load_causal_lm(model_path, dtype, device).eval()
        full.requires_grad_(False)
        return HFEngine(full, tok, cfg.rollout_batch_size, device, copy=True)
    # sampling on the actor itself in fp32: generate keeps its tokens' log-probs, which are
    # the old log-probs (bf16 rounds differently per batch layout: the trainer re-scores)
    keep = dtype == torch.float32
    return HFEngine(actor_module, tok, cfg.rollout_batch_size, device, keep_logprobs=keep)
