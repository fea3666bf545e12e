"""Policy, reference and critic models; prompt encoding; per-token log-probs.

The rollout engine on ``transformers`` is :class:`hgpo.train.hf_engine.HFEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hgpo.train.lora import (
    base_persistent_buffers,
    has_adapters,
    merged_named_parameters,
    persistent_buffers,
)
from hgpo.train.train_config import TrainConfigError

log = logging.getLogger(__name__)


def check_model(path_or_id: str, where: str = "TrainConfig.model") -> None:
    """Fail early and clearly (a ValueError naming ``where``) when the model can be neither
    found locally nor in the HF cache. A named pretrained model or a GGUF file is converted
    into its cache folder here, once (:func:`hgpo.train.pretrained.model_folder`)."""
    from hgpo.train.pretrained import converts, model_folder

    if converts(path_or_id):
        model_folder(path_or_id, where)
        return
    p = Path(path_or_id).expanduser()
    looks_local = path_or_id.startswith((".", "/", "~")) or p.exists()
    if looks_local:
        if not (p / "config.json").exists():
            raise ValueError(
                f"{where}: {path_or_id!r} is not a model folder (no config.json there)"
            )
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path_or_id)
    except Exception as e:  # OSError offline, HTTP errors online
        raise ValueError(
            f"{where}: cannot load {path_or_id!r} (not a local folder, and not "
            f"available from the Hugging Face hub or its cache: {type(e).__name__}); give a "
            "downloaded model's folder with --model PATH, or use --preset tiny (a small model "
            "built here, nothing to download)"
        ) from None


def load_tokenizer(path: str):
    """The tokenizer, left-padded, with a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_causal_lm(path: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """AutoModelForCausalLM from ``path`` in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device)


def stop_ids(tok: Any) -> list[int]:
    """Token ids that end a response (eos, ChatML's <|im_end|>, <|endoftext|>)."""
    ids = {tok.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>"):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id:
            ids.add(i)
    return sorted(i for i in ids if i is not None)


THINKING_SWITCH = "enable_thinking"
"""The variable by which a chat template (Qwen3's) switches the model's own thinking on or off."""


def check_thinking_switch(tok: Any, enable_thinking: bool) -> None:
    """Refuse ``enable_thinking`` for a chat template that never reads the switch (Qwen2.5's):
    the flag would change nothing, silently. Raises TrainConfigError (the CLI's exit 2)."""
    if enable_thinking and THINKING_SWITCH not in (tok.chat_template or ""):
        raise TrainConfigError(
            "TrainConfig.enable_thinking: must be false for this model, whose chat template "
            "has no enable_thinking switch, got True"
        )


def encode_prompt(tok: Any, text: str, max_tokens: int, enable_thinking: bool = False) -> list[int]:
    """The user message in the chat template, ready for the assistant; cut from the left.

    ``enable_thinking`` goes to the template, where Qwen3's reads it (false: the assistant turn
    starts with an empty think block); templates without the switch ignore it.
    """
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    return ids[-max_tokens:]


@dataclass
class Packed:
    """Prompts left-padded to P columns, responses right-padded to R columns after them.

    input_ids, attention_mask, position_ids: [B, P + R]; response_mask: [B, R] (1 on real
    response tokens); P: the prompt width (response token j sits at column P + j).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    P: int

    @property
    def responses(self) -> torch.Tensor:
        """[B, R] response token ids (pad where masked)."""
        return self.input_ids[:, self.P :]


def pack(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, device: Any
) -> Packed:
    """Lay out (prompt, response) pairs so every response starts at the same column."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(1, max(len(r) for r in responses))
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[b, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        att[b, P - len(p) : P] = 1
        if len(r):
            ids[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            att[b, P : P + len(r)] = 1
            rmask[b, : len(r)] = 1.0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return Packed(ids.to(device), att.to(device), pos.to(device), rmask.to(device), P)


def response_logprobs(
    model: nn.Module, batch: Packed, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, R] of the response tokens (and their entropies [B, R]).

    Only the response columns go through the output layer, so the [B, T, V] logits of the
    prompt are never formed. ``temperature`` divides the logits, as in sampling.
    """
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    hidden = decoder(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state  # (B, T, H)
    R = batch.response_mask.shape[1]
    h = hidden[:, batch.P - 1 : batch.P - 1 + R]  # position t predicts token t + 1
    return head_logprobs(head, h, batch.responses, temperature, with_entropy)


def head_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, R] of ``tokens`` [B, R] under the output layer ``head`` applied to
    the hidden states [B, R, H] that predict them (and the entropies [B, R]); ``temperature``
    divides the logits, as in sampling."""
    logp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)  # (B, R, V)
    lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return lp, ent


class Critic(nn.Module):
    """A value model: the policy's backbone (without its LM head) and a scalar head.

    V(s_t) is read at the last prompt token, so one value per step sample.
    """

    def __init__(self, path: str, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(path, dtype=dtype)
        self.head = nn.Linear(self.backbone.config.hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: Packed) -> torch.Tensor:
        """[B] state values."""
        hidden = self.backbone(
            input_ids=batch.input_ids[:, : batch.P],
            attention_mask=batch.attention_mask[:, : batch.P],
            position_ids=batch.position_ids[:, : batch.P],
            use_cache=False,
        ).last_hidden_state
        return self.head(hidden[:, -1]).squeeze(-1).float()


def gathered_named_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter; ZeRO-3 shards are gathered one at a time."""
    for name, p in module.named_parameters():
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                yield name, p.data.detach().clone()
        else:
            yield name, p.data.detach()


def inference_named_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of the weights an inference copy needs, under the base model's names:
    LoRA adapters merged in (``lora.merged_named_parameters``), ZeRO-3 shards gathered."""
    if has_adapters(module):
        return merged_named_parameters(module)
    return gathered_named_parameters(module)


def load_named(model: nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy (name, full tensor) pairs into ``model``'s parameters of the same names; every
    parameter must be given exactly once."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    with torch.no_grad():
        for name, t in named:
            if name not in params:
                raise KeyError(f"load_named: parameter {name!r} is not in the target model")
            if params[name].shape != t.shape:
                raise ValueError(
                    f"load_named: parameter {name!r} has shape {tuple(params[name].shape)} "
                    f"in the target model, got {tuple(t.shape)}"
                )
            params[name].data.copy_(t)
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise KeyError(f"load_named: parameters not given: {missing[:5]}")


HF_MODEL_DIR = "hf_model"
"""The consolidated model folder inside a checkpoint (``from_pretrained`` and vLLM load it)."""


def save_hf_model(module: nn.Module, tok: Any, path: Path, write: bool) -> None:
    """Save ``module`` as a full Hugging Face model folder (with ``tok``) at ``path``; a LoRA
    actor as its base model with the adapters merged.

    Under ZeRO-3 the parameters are gathered one at a time (a collective: every rank calls
    this, and only the rank with ``write`` keeps the tensors and writes them).
    """
    state: dict[str, torch.Tensor] = {}
    for name, t in inference_named_parameters(module):
        if write:
            state[name] = t.detach().to("cpu", copy=True)
    if not write:
        return
    lora = has_adapters(module)
    buffers = base_persistent_buffers(module) if lora else persistent_buffers(module)
    for name, b in buffers:
        state[name] = b.detach().to("cpu", copy=True)
    target = module.get_base_model() if lora else module  # a peft model saves adapters only
    target.save_pretrained(str(path), state_dict=state)
    tok.save_pretrained(str(path))


def grad_norm(module: nn.Module) -> float:
    """L2 norm of the module's gradients (before clipping)."""
    sq = [p.grad.detach().float().pow(2).sum() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(sq).sum().sqrt()) if sq else 0.0


__all__ = [
    "HF_MODEL_DIR",
    "Critic",
    "Packed",
    "check_model",
    "check_thinking_switch",
    "encode_prompt",
    "gathered_named_parameters",
    "head_logprobs",
    "inference_named_parameters",
    "load_causal_lm",
    "load_named",
    "load_tokenizer",
    "pack",
    "response_logprobs",
    "save_hf_model",
]
