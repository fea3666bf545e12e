"""LoRA on the actor (peft): the adapters, the base model as the KL reference, merged weights.

With ``lora_rank > 0`` the actor is a ``peft`` model whose base weights are frozen; only the
adapters (A: r x d_in, B: d_out x r, B = 0 at the start) train, so the optimizer holds states
for them alone. The KL reference is the same module with the adapters switched off
(``disable_adapter``): no second copy of the model. Inference (the vLLM sync, ``hf_model/``)
gets merged weights W + (alpha / r) B A, computed on the side: merging in place and unmerging
would round the base weights, and with them the reference, a little at every sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

ADAPTER_DIR = "adapter"
"""The adapters inside a checkpoint (peft's ``save_pretrained``: adapter_config.json and
adapter_model.safetensors), loadable with ``PeftModel.from_pretrained(base, path)``."""


def add_adapters(model: nn.Module, cfg: Any) -> nn.Module:
    """``model`` with LoRA adapters on ``cfg.lora_targets`` (rank ``cfg.lora_rank``, scaling
    ``cfg.lora_alpha / cfg.lora_rank``, dropout ``cfg.lora_dropout``); base weights frozen."""
    from peft import LoraConfig, get_peft_model

    names = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    targets: str | list[str] = "all-linear" if names == ["all-linear"] else names
    lcfg = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:  # a target that matches no module
        raise ValueError(f"TrainConfig.lora_targets={cfg.lora_targets!r}: {e}") from None


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` is a peft model (LoRA on)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def merged_named_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the base model's parameters, under the base model's own names, with
    each adapted layer's weight replaced by W + (alpha / r) B A (the active adapter)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for mod_name, mod in base.named_modules():
        if isinstance(mod, LoraLayer):
            delta = None
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    d = mod.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                deltas[f"{mod_name}.base_layer.weight"] = delta
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        t = p.data.detach()
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        yield name.replace(".base_layer.", "."), t


def base_persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's persistent buffers under its own names."""
    from hgpo.train.model import persistent_buffers

    for name, b in persistent_buffers(model.get_base_model()):
        yield name.replace(".base_layer.", "."), b
