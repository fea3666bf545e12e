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
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hgpo.config import EstimatorConfig
from hgpo.config import field_docs as dataclass_field_docs
from hgpo.estimators import ESTIMATORS
from hgpo.options import parse_name_values

__all__ = ["PRESETS", "TrainConfig", "build_parser", "field_docs", "parse_args", "resolve"]

ENVS = ("alfworld", "webshop")
TINY_MODEL = "tiny"
"""``model`` value that builds a tiny random Qwen2 and a locally trained tokenizer."""


class TrainConfigError(ValueError):
    """A setting that cannot work with this run (found once the ranks or the run folder are
    known); the CLI prints it as ``error: ...`` and exits with 2, like a bad flag."""


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run. Defaults follow the paper (ALFWorld, Qwen2.5-1.5B, K = 2)."""

    # --- task and model ---------------------------------------------------------------------
    env: str = "alfworld"
    """Benchmark: "alfworld", "webshop", or a toy POMDP "toy:FAMILY:param=value,..." (e.g.
    "toy:keydoor:size=4,horizon=20"; agentenvs.toytext)."""
    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    """Hugging Face id or local folder of the policy; "tiny" builds a tiny random Qwen2 and a
    byte-level BPE tokenizer trained on the spot (CPU tests)."""
    out_dir: str = "runs/hgpo"
    """Run folder: config.json, metrics.jsonl, checkpoints/, tensorboard/."""
    seed: int = 0
    """Seed of task sampling, generation and model initialisation (tiny model)."""
    # --- estimator ----------------------------------------------------------------------------
    estimator: str = "hgpo"
    """Advantage estimator by name (hgpo.ESTIMATORS); "gae" trains a critic."""
    estimator_options: str = ""
    """Extra EstimatorConfig options, "name=value,name=value" (e.g. "norm=mean,alpha=0")."""
    reference_options: bool = False
    """Start from hgpo.reference_config (the authors' public code) instead of the paper's."""
    history_length: int = 2
    """K: memory length of the prompt and depth of the HGPO hierarchy."""
    gamma: float = 0.95
    """Discount of the step return."""
    train_tasks: int = 0
    """Training tasks are drawn from the first n of the split (0 = all of them)."""
    # --- rollout -------------------------------------------------------------------------------
    groups_per_iter: int = 16
    """Tasks per iteration (rollout groups)."""
    group_size: int = 8
    """Rollouts per task (N)."""
    iterations: int = 160
    """Training iterations."""
    max_steps: int = 50
    """Environment steps per episode (50 ALFWorld, 15 WebShop)."""
    max_prompt_tokens: int = 2048
    """Prompt length limit; longer prompts are cut from the left."""
    max_response_tokens: int = 512
    """Response length limit of one step."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling of rollouts (1 = off)."""
    action_mode: str = "generate"
    """"generate": sample free text and parse the action (the paper); "score": score every
    admissible action's response ``<think>...</think><action>a</action>`` with the policy and
    sample one from the softmax of their log-probabilities at the rollout temperature (hf
    engine only; WebShop's ``search[<your query>]`` becomes ``search[<task text>]``)."""
    rollout_engine: str = "hf"
    """"hf" (transformers generate; CPU and GPU fallback) or "vllm" (GPU)."""
    rollout_batch_size: int = 64
    """Prompts per generate call of the hf engine."""
    vllm_gpu_memory_utilization: float = 0.35
    """Share of GPU memory vLLM may take (the rest is the trainer's)."""
    env_workers: int = 2
    """Worker processes of each BatchedEnv."""
    env_timeout_s: float = 300.0
    """Seconds an env worker may take for one step before it is restarted."""
    # --- PPO ---------------------------------------------------------------------------------------
    lr: float = 1e-6
    """Actor learning rate."""
    critic_lr: float = 1e-5
    """Critic learning rate (estimator "gae")."""
    weight_decay: float = 0.01
    """AdamW weight decay (actor and critic)."""
    clip_ratio: float = 0.2
    """PPO clip epsilon of the per-token ratio."""
    dual_clip: float = 3.0
    """Dual-clip constant c: a negative advantage's loss is capped at -c A (0 = off)."""
    kl_coef: float = 0.01
    """Coefficient of the k3 KL(pi || pi_ref) loss term (0 = no reference model)."""
    entropy_coef: float = 0.001
    """Coefficient of the entropy bonus."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    ppo_epochs: int = 1
    """Passes over the step samples per iteration."""
    mini_batch_size: int = 256
    """Step samples per optimizer step, over all ranks (256 ALFWorld, 64 WebShop)."""
    micro_batch_size: int = 4
    """Step samples per forward/backward on one rank."""
    value_clip: float = 0.2
    """Critic value clip around the rollout-time value (gae)."""
    # --- engines -----------------------------------------------------------------------------------
    zero_stage: int = 0
    """DeepSpeed ZeRO stage, 0-3."""
    precision: str = "auto"
    """"bf16", "fp32", or "auto" (bf16 on GPU, fp32 on CPU)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (long prompts on GPU)."""
    device: str = "auto"
    """"auto" (cuda when available), "cpu" or "cuda"."""
    # --- validation, checkpoints, logging ----------------------------------------------------------
    val_every: int = 10
    """Validate every n iterations (0 = never); also after the last iteration."""
    val_tasks: int = 128
    """Held-out tasks per validation split (128 ALFWorld, 256 WebShop)."""
    val_temperature: float = 0.4
    """Sampling temperature of validation."""
    save_every: int = 10
    """Checkpoint every n iterations (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted)."""
    resume: bool = False
    """Continue from the last checkpoint in out_dir."""
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = False
    """Log to Weights & Biases (opt-in; needs wandb and a login)."""
    wandb_project: str = "hgpo"
    """Weights & Biases project."""
    progress: bool = True
    """Show a tqdm progress bar."""
    # --- environments ------------------------------------------------------------------------------
    alfworld_games_dir: str = ""
    """Folder with train/, valid_seen/, valid_unseen/ game folders; empty = the official games
    under $ALFWORLD_DATA or generated ones."""
    alfworld_train_games: int = 512
    """Generated ALFWorld training games (when no games folder is given)."""
    webshop_products: int = 5000
    """Products of the generated WebShop catalog."""
    webshop_goals: int = 2000
    """Goals of the generated WebShop catalog (the first webshop_eval_goals are held out)."""
    webshop_eval_goals: int = 500
    """Held-out WebShop goals."""
    # --- tiny model (model = "tiny") ---------------------------------------------------------------
    tiny_hidden: int = 64
    """Hidden size of the tiny model."""
    tiny_layers: int = 2
    """Layers of the tiny model."""
    tiny_vocab: int = 1024
    """Vocabulary of the tiny tokenizer."""
    # --- exact truth on toy environments (hgpo.train.truth) -- issue 14 hook ---------------------
    truth_every: int = 0
    """Every n iterations compute the exact V, Q, A* of the current LLM policy (toy env, action
    mode "score") and log every estimator's bias^2, variance, MSE, sign agreement and gradient
    cosine against it as truth/<estimator>/<metric> (0 = never)."""
    truth_max_nodes: int = 200_000
    """Largest reachable (t, hidden state, K-step context) chain the exact truth may enumerate."""

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"TrainConfig.{name} must be {rule}, got {getattr(self, name)!r}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = _field_types()[f.name]
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
                ok = True
            if not ok:
                raise bad(f.name, f"of type {kind.__name__}")
        if not is_toy(self.env) and self.env not in ENVS:  # a toy spec is parsed below
            raise bad("env", f"one of {ENVS} or 'toy:FAMILY:param=value,...'")
        choices = {
            "rollout_engine": ("hf", "vllm"),
            "action_mode": ("generate", "score"),
            "precision": ("auto", "bf16", "fp32"),
            "device": ("auto", "cpu", "cuda"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(name, f"one of {allowed}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"TrainConfig.estimator: unknown estimator {self.estimator!r}; known "
                f"estimators: {', '.join(ESTIMATORS)}"
            )
        positive = [
            "groups_per_iter",
            "group_size",
            "iterations",
            "max_steps",
            "max_prompt_tokens",
            "max_response_tokens",
            "rollout_batch_size",
            "env_workers",
            "ppo_epochs",
            "mini_batch_size",
            "micro_batch_size",
            "val_tasks",
            "keep_checkpoints",
            "alfworld_train_games",
            "webshop_products",
            "webshop_goals",
            "webshop_eval_goals",
            "tiny_hidden",
            "tiny_layers",
            "tiny_vocab",
            "truth_max_nodes",
        ]
        for name in positive:
            if getattr(self, name) < 1:
                raise bad(name, ">= 1")
        for name in ("lr", "critic_lr", "temperature", "val_temperature", "env_timeout_s"):
            if not getattr(self, name) > 0:
                raise bad(name, "> 0")
        for name in ("weight_decay", "kl_coef", "entropy_coef", "grad_clip", "value_clip"):
            if not getattr(self, name) >= 0:
                raise bad(name, ">= 0")
        for name in ("history_length", "val_every", "save_every", "train_tasks", "truth_every"):
            if getattr(self, name) < 0:
                raise bad(name, ">= 0")
        if not 0 < self.clip_ratio < 1:
            raise bad("clip_ratio", "in (0, 1)")
        if self.dual_clip != 0 and self.dual_clip <= 1:
            raise bad("dual_clip", "0 (off) or > 1")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "in (0, 1]")
        if not 0 <= self.gamma <= 1:
            raise bad("gamma", "in [0, 1]")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise bad("vllm_gpu_memory_utilization", "in (0, 1)")
        if self.action_mode == "score" and self.rollout_engine != "hf":
            raise bad("action_mode", "'generate' with rollout_engine='vllm' ('score' needs 'hf')")
        if self.zero_stage not in (0, 1, 2, 3):
            raise bad("zero_stage", "0, 1, 2 or 3")
        if not self.webshop_eval_goals < self.webshop_goals:
            raise bad("webshop_eval_goals", f"< webshop_goals={self.webshop_goals}")
        if self.tiny_hidden % 64:
            raise bad("tiny_hidden", "a multiple of 64 (head size 64, as vLLM needs)")
        if not self.model:
            raise bad("model", "a Hugging Face id, a local folder or 'tiny'")
        self.estimator_config()  # validates estimator_options
        self._check_toy()

    def _check_toy(self) -> None:
        """A toy env spec parses (unknown family / parameter named); --truth-every needs it and
        score mode (issue 14 hook)."""
        if is_toy(self.env):
            from agentenvs.toytext import parse_toy_spec

            parse_toy_spec(self.env, where="TrainConfig.env")
        if self.truth_every:
            if self.action_mode != "score":
                raise ValueError(
                    f"TrainConfig.truth_every={self.truth_every} needs action_mode='score' (the "
                    f"exact truth needs pi(a | prompt) over the listed actions; free text has no "
                    f"finite action set), got action_mode={self.action_mode!r}"
                )
            if not is_toy(self.env):
                raise ValueError(
                    f"TrainConfig.truth_every={self.truth_every} needs a toy env "
                    f"('toy:FAMILY:...', whose hidden states are known), got env={self.env!r}"
                )

    # -- derived ----------------------------------------------------------------------------------
    def estimator_config(self) -> EstimatorConfig:
        """The EstimatorConfig of this run: paper (or reference) options, K, gamma, overrides."""
        from hgpo.config import reference_config

        est = "gigpo" if self.estimator == "gigpo" else "hgpo"
        base = reference_config(est, env=self.env) if self.reference_options else EstimatorConfig()
        try:
            opts = parse_options(self.estimator_options)
            return base.replace(K=self.history_length, gamma=self.gamma, **opts)
        except ValueError as e:
            raise ValueError(
                f"TrainConfig.estimator_options={self.estimator_options!r}: {e}"
            ) from None

    @property
    def use_critic(self) -> bool:
        """True when the estimator needs state values (gae)."""
        return self.estimator == "gae"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field."""
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the resolved config as JSON (atomically)."""
        from hgpo.train.checkpoint import atomic_write_text

        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainConfig:
        """Read a config written by :meth:`save` (unknown keys are an error)."""
        data = json.loads(Path(path).read_text())
        return with_overrides(cls(), data, source=str(path))


def is_toy(env: str) -> bool:
    """True for a toy POMDP spec "toy:FAMILY:param=value,..." (agentenvs.toytext)."""
    return isinstance(env, str) and env.startswith("toy:")


def parse_options(text: str, where: str = "--estimator-options") -> dict[str, Any]:
    """ "a=1,b=mean" -> {"a": 1, "b": "mean"}: the project's one parser (hgpo.options)."""
    return parse_name_values(text, where=where)


@functools.cache
def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


@functools.cache
def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body)."""
    return dataclass_field_docs(TrainConfig)


# --- presets ------------------------------------------------------------------------------------
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "alfworld": {
        "max_steps": 50,
        "max_prompt_tokens": 2048,
        "mini_batch_size": 256,
        "val_tasks": 128,
    },
    "webshop": {
        "max_steps": 15,
        "max_prompt_tokens": 4096,
        "mini_batch_size": 64,
        "val_tasks": 256,
    },
    "toy": {  # the toy env's own horizon ends its episodes; max_steps only caps it
        "max_steps": 100,
        "max_prompt_tokens": 2048,
        "mini_batch_size": 64,
        "val_tasks": 128,
    },
}
"""The paper's per-benchmark settings, applied before a preset."""

MODELS = {"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "7b": "Qwen/Qwen2.5-7B-Instruct"}


def _paper_presets() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for env in ENVS:
        for size, model in MODELS.items():
            for k in (2, 4):
                out[f"{env}-{size}-k{k}"] = {
                    "env": env,
                    "model": model,
                    "history_length": k,
                    "out_dir": f"runs/{env}-{size}-k{k}",
                    "zero_stage": 3 if size == "7b" else 2,
                    "gradient_checkpointing": True,
                }
    return out


PRESETS: dict[str, dict[str, Any]] = {
    **_paper_presets(),
    "tiny": {
        "model": TINY_MODEL,
        "out_dir": "runs/tiny",
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
}
"""Named settings: "{env}-{1.5b|7b}-k{2|4}" are the paper's runs; "tiny" runs on a CPU."""


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

    A paper preset carries its env; ``env`` (when given) wins over it. The result is validated.
    """
    overrides = dict(overrides or {})
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    layer = dict(PRESETS[preset]) if preset else {}
    env = env or overrides.get("env") or layer.get("env") or "alfworld"
    if env not in ENVS and not is_toy(env):
        raise ValueError(
            f"TrainConfig.env must be one of {ENVS} or 'toy:FAMILY:param=value,...', got {env!r}"
        )
    values: dict[str, Any] = {"env": env, **ENV_DEFAULTS["toy" if is_toy(env) else env]}
    values.update({k: v for k, v in layer.items() if k != "env"})
    values.update(overrides)
    values["env"] = env
    return with_overrides(TrainConfig(), values, source=f"preset {preset!r}" if preset else "cli")


# --- command line ---------------------------------------------------------------------------------
def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """The CLI: ``--preset``, ``--config`` and one ``--field-name`` per TrainConfig field."""
    p = argparse.ArgumentParser(
        prog="python -m hgpo.train",
        description="Train an LLM agent with HGPO (or any estimator) on ALFWorld, WebShop or a "
        "toy POMDP (--env toy:FAMILY:param=value,...).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", choices=list(PRESETS), default=None, help="named settings")
    p.add_argument("--config", default=None, help="a saved config.json to start from")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    # the deepspeed launcher appends --local_rank=N to the command (it sets LOCAL_RANK too)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    docs = field_docs()
    for f in dataclasses.fields(TrainConfig):
        kind = _field_types()[f.name]
        flag = "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "help": f"{docs.get(f.name, '')} (default {f.default!r}; env/preset may change it)",
        }
        if kind is bool:
            p.add_argument(flag, type=_bool, nargs="?", const=True, metavar="BOOL", **kw)
        else:
            p.add_argument(flag, type=kind, metavar=kind.__name__.upper(), **kw)
    return p


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
        if ns.config:
            cfg = with_overrides(TrainConfig.load(ns.config), overrides, source="cli")
        else:
            cfg = resolve(overrides.pop("env", None), ns.preset, overrides)
            saved = Path(cfg.out_dir) / "config.json"
            if cfg.resume and saved.exists():
                given = {k: v for k, v in vars(ns).items() if k in fields}
                cfg = with_overrides(TrainConfig.load(saved), given, source="cli")
    except ValueError as e:
        parser.error(str(e))
    return cfg, ns
