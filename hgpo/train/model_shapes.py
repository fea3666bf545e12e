"""The shape of a decoder-only policy (Qwen2 / Qwen3 families) and its parameter count.

Pure arithmetic, no torch: :func:`model_shape` reads a local model folder's ``config.json`` or
takes the built-in :data:`SHAPES` (nothing is downloaded). The memory plan
(:mod:`hgpo.train.memory_plan`) is computed from it.

Parameters of one decoder layer (h hidden, q = heads x head_dim, k = kv_heads x head_dim,
i intermediate):

    attention  h q + 2 h k + q h   (+ q + 2 k biases on Qwen2's q/k/v; + 2 head_dim for Qwen3's
                                    q_norm / k_norm)
    MLP        3 h i               (gate, up, down)
    norms      2 h

and the model: V h (embeddings) + L x layer + h (final norm) + V h (LM head, untied only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "ModelConfigError", "ModelShape", "model_shape"]


class ModelConfigError(ValueError):
    """A model whose shape cannot be read (no config.json, not JSON, a missing key)."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2/Qwen3-style decoder (what the memory plan needs)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    """Tied input and output embeddings (one V x h matrix)."""
    qkv_bias: bool = True
    """Biases on q/k/v (Qwen2, Qwen2.5); Qwen3 has none."""
    qk_norm: bool = False
    """RMSNorm on q and k per head (Qwen3)."""

    @property
    def q_dim(self) -> int:
        """heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """kv_heads x head_dim (one of k, v)."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer (module docstring)."""
        h, q, k, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * k + q * h
        if self.qkv_bias:
            attn += q + 2 * k
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn + 3 * h * i + 2 * h

    def params(self) -> int:
        """Every parameter of the model (tied embeddings counted once)."""
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(d_in, d_out) of one layer's linear modules (q, k, v, o, gate, up, down): LoRA's
        "all-linear" targets (the LM head excluded)."""
        h, q, k, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return [(h, q), (h, k), (h, k), (q, h), (h, i), (h, i), (i, h)]

    def lora_params(self, rank: int, layers: int = 0) -> int:
        """Adapter parameters at rank r on every linear layer of ``layers`` decoder layers (0:
        all L of them): layers x sum r (d_in + d_out)."""
        return (layers or self.layers) * sum(rank * (a + b) for a, b in self.linear_shapes())

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache of one token: 2 (k and v) x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def _qwen2(layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int, tied: bool):
    return ModelShape(layers, hidden, inter, heads, kv, hidden // heads, vocab, tied)


def _qwen3(layers: int, hidden: int, inter: int, heads: int, kv: int, tied: bool = True):
    return ModelShape(layers, hidden, inter, heads, kv, 128, 151936, tied, False, True)


SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B-Instruct": _qwen2(24, 896, 4864, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": _qwen2(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": _qwen2(28, 3584, 18944, 28, 4, 152064, False),
    "Qwen/Qwen3-0.6B": _qwen3(28, 1024, 3072, 16, 8),
    "Qwen/Qwen3-1.7B": _qwen3(28, 2048, 6144, 16, 8),
    "Qwen/Qwen3-4B": _qwen3(36, 2560, 9728, 32, 8),
    # Llama: no q/k/v biases (attention_bias false)
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelShape(30, 576, 1536, 9, 3, 64, 49152, True, False),
}
"""The published configs (each model's config.json on the Hugging Face hub:
num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
head_dim (Qwen3; Qwen2.5: hidden / heads = 64 or 128), vocab_size, tie_word_embeddings):

    model              L   hidden  inter  heads kv  head  vocab   tied  params
    Qwen2.5-0.5B       24    896    4864   14    2   64  151936  yes   494,032,768
    Qwen2.5-1.5B       28   1536    8960   12    2  128  151936  yes   1,543,714,304
    Qwen2.5-7B         28   3584   18944   28    4  128  152064  no    7,615,616,512
    Qwen3-0.6B         28   1024    3072   16    8  128  151936  yes   596,049,920
    Qwen3-1.7B         28   2048    6144   16    8  128  151936  yes   1,720,574,976
    Qwen3-4B           36   2560    9728   32    8  128  151936  yes   4,022,468,096
    SmolLM2-135M       30    576    1536    9    3   64   49152  yes   134,515,008

The parameter counts are ModelShape.params(); tests/train/test_memory_plan.py checks them
against the model transformers builds from the same config (on the meta device). The base
models (Qwen/Qwen2.5-1.5B, ...) have the same shapes as their -Instruct versions."""


def _size(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """``cfg[key]`` (``default`` when absent or null) as a positive integer: a ModelConfigError
    naming the key and the value otherwise, a KeyError when absent without a default."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _shape_from_config(cfg: dict[str, Any], where: str) -> ModelShape:
    """A ModelShape from a Hugging Face config.json's keys (every size a positive integer)."""
    try:
        heads = _size(cfg, "num_attention_heads", where)
        hidden = _size(cfg, "hidden_size", where)
        qwen3 = str(cfg.get("model_type", "")).startswith("qwen3")
        if "head_dim" not in cfg and hidden % heads:
            raise ModelConfigError(
                f"{where}: hidden_size={hidden} is not a multiple of num_attention_heads={heads} "
                "(and no head_dim is given)"
            )
        return ModelShape(
            layers=_size(cfg, "num_hidden_layers", where),
            hidden=hidden,
            intermediate=_size(cfg, "intermediate_size", where),
            heads=heads,
            kv_heads=_size(cfg, "num_key_value_heads", where, heads),
            head_dim=_size(cfg, "head_dim", where, hidden // heads),
            vocab=_size(cfg, "vocab_size", where),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", not qwen3)),  # Qwen2's config has no key
            qk_norm=qwen3,
        )
    except KeyError as e:
        raise ModelConfigError(f"{where}: no {e.args[0]!r} key (not a decoder config?)") from None


def model_shape(model: str, where: str = "TrainConfig.model") -> ModelShape:
    """The shape of ``model``: a local folder's config.json, else the built-in :data:`SHAPES`.

    Raises :class:`ModelConfigError` (one line naming ``where``, the model and the reason)
    for a folder whose config.json is missing or unreadable, and for a hub id that is not
    built in (nothing is downloaded).
    """
    base = model.removesuffix("-Instruct")
    for name, shape in SHAPES.items():
        if base == name.removesuffix("-Instruct"):
            return shape
    path = Path(model)
    if not path.exists():
        raise ModelConfigError(
            f"{where}={model!r}: cannot read the model's config (not a local folder, and not "
            f"one of the built-in shapes: {', '.join(SHAPES)}); give a folder with a "
            "config.json"
        )
    cfg_file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(cfg_file.read_text())
    except OSError as e:
        raise ModelConfigError(
            f"{where}={model!r}: cannot read {str(cfg_file)!r} ({e.strerror or type(e).__name__})"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{where}={model!r}: {str(cfg_file)!r} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{where}={model!r}: {str(cfg_file)!r} is not a JSON object")
    return _shape_from_config(data, f"{where}={model!r} ({cfg_file})")
