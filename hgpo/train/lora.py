"""LoRA on the actor (peft): the adapters, the base model as the KL reference, merged weights.

With ``lora_rank > 0`` the actor is a ``peft`` model whose base weights are frozen; only the
adapters (A: r x d_in, B: d_out x r, B = 0 at the start) train, so the optimizer holds states
for them alone. The KL reference is the same module with the adapters switched off
(``disable_adapter``): no second copy of the model. Inference (the vLLM sync, ``hf_model/``)
gets merged weights W + (alpha / r) B A, computed on the side: merging in place and unmerging
would round the base weights, and with them the reference, a little at every sync.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

ADAPTER_DIR = "adapter"
"""The adapters inside a checkpoint (peft's ``save_pretrained``: adapter_config.json and
adapter_model.safetensors), loadable with ``PeftModel.from_pretrained(base, path)``."""


def add_adapters(model: nn.Module, cfg: Any) -> nn.Module:
    """``model`` with LoRA adapters on ``cfg.lora_targets`` (rank ``cfg.lora_rank``, scaling
    ``cfg.lora_alpha / cfg.lora_rank``, dropout ``cfg.lora_dropout``), in its last
    ``cfg.lora_top_layers`` decoder layers (0: all of them); base weights frozen."""
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = target_names(cfg.lora_targets)
    extra: dict[str, Any] = {}
    if cfg.lora_top_layers:
        # peft takes layers_to_transform with module names only, not "all-linear"
        layers = top_layer_indices(model, cfg.lora_top_layers)
        targets = sorted({k.rsplit(".", 1)[-1]
                          for k in adapted_layers(model, cfg.lora_targets, cfg.lora_top_layers)})  # fmt: skip
        extra["layers_to_transform"] = layers
    lcfg = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        **extra,
    )
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:  # a target that matches no module
        raise ValueError(f"TrainConfig.lora_targets={cfg.lora_targets!r}: {e}") from None


def decoder_layer_count(model: nn.Module) -> int:
    """The model's decoder layers (its config's ``num_hidden_layers``)."""
    n = getattr(model.config, "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the model's config has no decoder layer count (num_hidden_layers={n!r})")
    return n


def top_layer_indices(model: nn.Module, k: int) -> list[int]:
    """The indices of ``model``'s last ``k`` decoder layers; ValueError naming
    ``lora_top_layers`` when the model has fewer than k."""
    n = decoder_layer_count(model)
    if not 1 <= k <= n:
        raise ValueError(
            f"TrainConfig.lora_top_layers: must be in [1, {n}] (the model's decoder layers) or 0 "
            f"(every layer), got {k}; lower --lora-top-layers"
        )
    return list(range(n - k, n))


_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def layer_index(key: str) -> int | None:
    """The decoder layer a module key lies in ("model.layers.29.mlp.up_proj" -> 29; peft's
    rule: the first ".N." of the key), None outside the layer stack (embeddings, head)."""
    m = _LAYER_INDEX.search(key)
    return int(m.group(1)) if m else None


def target_names(text: str) -> str | list[str]:
    """``lora_targets`` as peft reads it: "all-linear", or the comma-separated module names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    return "all-linear" if names == ["all-linear"] else names


def adaptable() -> tuple[type, ...]:
    """The layer types a LoRA adapter can wrap (peft's LoRA layers; transformers' Conv1D is
    GPT-2's linear layer)."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention,
            Conv1D)  # fmt: skip


def check_targets(model: nn.Module, text: str) -> None:
    """ValueError naming ``lora_targets`` and the first name that matches no layer of ``model``,
    or that matches a module LoRA cannot wrap. peft itself only fails when no name matches
    anything: a misspelt name beside a right one would be dropped silently.

    A name matches module ``key`` when key == name or key ends with "." + name (peft's rule)."""
    names = target_names(text)
    if names == "all-linear":
        return
    modules = dict(model.named_modules())
    ok = adaptable()
    layers = sorted({k.rsplit(".", 1)[-1] for k, m in modules.items() if isinstance(m, ok)})
    for name in names:
        hits = [m for k, m in modules.items() if k == name or k.endswith("." + name)]
        if not hits:
            raise ValueError(
                f"TrainConfig.lora_targets: {name!r} matches no module of the model; the layers "
                f"LoRA can wrap are {', '.join(layers)} (or give all-linear)"
            )
        if not all(isinstance(m, ok) for m in hits):
            kind = next(type(m).__name__ for m in hits if not isinstance(m, ok))
            raise ValueError(
                f"TrainConfig.lora_targets: {name!r} names a {kind}, which LoRA cannot wrap; "
                f"name layers it can ({', '.join(layers)}) or give all-linear"
            )


def adapted_layers(model: nn.Module, text: str, top_layers: int = 0) -> dict[str, nn.Module]:
    """The modules LoRA adapts for ``lora_targets`` (peft's rule: "all-linear" is every linear
    layer but the output head; a name matches key == name or key ending in "." + name), in the
    last ``top_layers`` decoder layers only when it is > 0 (``lora_top_layers``)."""
    from transformers.pytorch_utils import Conv1D

    names = target_names(text)
    modules = dict(model.named_modules())
    if names == "all-linear":
        head = model.get_output_embeddings()
        found = {k: m for k, m in modules.items()
                 if isinstance(m, (nn.Linear, Conv1D)) and m is not head}  # fmt: skip
    else:
        ok = adaptable()
        found = {k: m for k, m in modules.items() if isinstance(m, ok) and
                 any(k == n or k.endswith("." + n) for n in names)}  # fmt: skip
    if not top_layers:
        return found
    keep = set(top_layer_indices(model, top_layers))
    return {k: m for k, m in found.items() if layer_index(k) in keep}


def layer_shape(module: nn.Module) -> tuple[int, int]:
    """(in, out) size of a layer LoRA wraps."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    w = getattr(module, "weight", None)
    if w is None or w.dim() < 2:
        return (0, 0)
    return int(w.shape[0]), int(w.shape[1])  # Conv1D (in, out); convolutions (out, in)


def max_rank(model: nn.Module, text: str, top_layers: int = 0) -> tuple[int, str, tuple[int, int]]:
    """The largest useful LoRA rank for ``lora_targets`` (in the last ``top_layers`` decoder
    layers, all when 0): min(in, out) over the adapted layers (rank(B A) <= min(in, out)), with
    the layer that sets it and its (in, out) size."""
    best: tuple[int, str, tuple[int, int]] | None = None
    for name, module in adapted_layers(model, text, top_layers).items():
        shape = layer_shape(module)
        if min(shape) and (best is None or min(shape) < best[0]):
            best = (min(shape), name, shape)
    if best is None:
        where = f" in its last {top_layers} decoder layers" if top_layers else ""
        raise ValueError(f"TrainConfig.lora_targets: {text!r} adapts no layer of the model{where}")
    return best


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` is a peft model (LoRA on)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def merged_named_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the base model's parameters, under the base model's own names, with
    each adapted layer's weight replaced by W + (alpha / r) B A (the active adapter).

    Lazy, one layer at a time: a layer's delta B A is formed when its weight is yielded, so a
    consumer that loads and drops each tensor (the vLLM sync) holds one merged weight at a
    time. Forming every delta first kept a full-size copy of every adapted weight alive
    beside the merged ones: about twice the model's linear weights during each sync."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {
        f"{mod_name}.base_layer.weight": mod
        for mod_name, mod in base.named_modules()
        if isinstance(mod, LoraLayer)
    }
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        t = p.data.detach()
        mod = adapted.get(name)
        if mod is not None:
            delta = None
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    d = mod.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                t = t + delta.to(t.dtype)
        yield name.replace(".base_layer.", "."), t


def persistent_buffers(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the buffers that belong in a state dict (not the non-persistent ones)."""
    for mod_name, mod in module.named_modules():
        for name, b in mod.named_buffers(recurse=False):
            if b is not None and name not in mod._non_persistent_buffers_set:
                yield (f"{mod_name}.{name}" if mod_name else name), b


def base_persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's persistent buffers under its own names."""
    for name, b in persistent_buffers(model.get_base_model()):
        yield name.replace(".base_layer.", "."), b
