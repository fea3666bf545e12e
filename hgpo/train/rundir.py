"""The run folder: what an earlier run left there, ``--fresh``, and what ``--resume`` may change.

Before anything is written (:func:`check_run_dir`, called by preflight): a run without
``--resume`` or ``--fresh`` is refused in a folder that holds results or a config.json of other
settings; ``--resume`` is compared with the settings its checkpoint was made with, field by
field (:data:`RESUME_SHAPES`, :data:`RESUME_ALLOWED`; every other field is refused too); the
allowed changes are recorded in ``resumes.jsonl``. ``--fresh`` removes the run's files only
(:data:`RUN_FILES`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from hgpo.atomic import file_error_line
from hgpo.estimator_registry import ESTIMATORS
from hgpo.train import checkpoint as ckpt
from hgpo.train.train_config import TrainConfig, TrainConfigError, uses_critic

RUN_FILES = (
    "config.json", "metrics.jsonl", "resumes.jsonl", "checkpoints/", "tensorboard/",
    "tiny_model/", "tiny_model.tmp/",
)  # fmt: skip
"""What a run writes in its folder; --fresh removes these (and nothing else) first."""


RESUME_SHAPES = (
    "model", "tiny_hidden", "tiny_layers", "tiny_vocab", "tiny_arch", "lora_rank",
    "lora_targets", "lora_top_layers", "zero_stage", "precision",
)  # fmt: skip
"""Refused with --resume because they change the model's or the optimizer state's shapes (so
the checkpoint cannot be loaded as it was saved); so is a change of estimator to or from one
that reads state values (gae: it has a critic)."""

RESUME_ALLOWED = (
    # how long and how the run is watched
    "iterations", "val_every", "val_tasks", "val_temperature", "save_every",
    "keep_checkpoints", "tensorboard", "wandb", "wandb_project", "progress",
    "truth_every", "truth_max_nodes", "truth_max_prompts",
    # where it runs (the same computation, other engines or machines)
    "rollout_engine", "rollout_batch_size", "vllm_gpu_memory_utilization", "env_workers",
    "env_timeout_s", "env_backend", "device", "gradient_checkpointing", "shared_prefix_update",
    "max_crash_share",
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


class ConfigRecord(Protocol):
    """A config as a whole (diffed field by field): anything with ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]: ...


class RunDirSettings(ConfigRecord, Protocol):
    """The settings the run-folder checks read: where the run is, how it starts, and every
    field as a whole (``to_dict``), since a resumed run is compared with its checkpoint's
    settings field by field; a saved config.json is read back as a ``TrainConfig`` (its
    format)."""

    out_dir: str
    resume: bool
    fresh: bool


def config_changes(old: ConfigRecord, new: ConfigRecord) -> dict[str, tuple[Any, Any]]:
    """{field: (old value, new value)} of the fields that differ (NOT_COMPARED left out)."""
    a, b = old.to_dict(), new.to_dict()
    return {k: (a[k], b[k]) for k in a if k not in NOT_COMPARED and a[k] != b[k]}


def flag_of(name: str) -> str:
    """The CLI flag of a TrainConfig field."""
    return "--" + name.replace("_", "-")


def check_run_dir(cfg: RunDirSettings) -> None:
    """Nothing of another run is overwritten: without --resume or --fresh a folder that holds
    results (metrics.jsonl, checkpoints/) or a config.json of other settings is refused;
    with --resume, :func:`check_resume`. --fresh removes the earlier run's files later
    (:func:`clear_run`, before this run writes anything)."""
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
            f"or start anew there with --fresh (removes its {', '.join(RUN_FILES)})"
        )


def resume_checkpoint(out: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The checkpoint --resume loads: the newest intact one in ``out`` (None when there is
    none) and the damaged ones newer than it, each with what is wrong
    (:func:`hgpo.train.checkpoint.latest_good`). A TrainConfigError, one line naming the
    damaged file, when there are checkpoints and none is intact."""
    good, damaged = ckpt.latest_good(Path(out) / "checkpoints")
    if good is None and damaged:
        path, why = damaged[0]
        n = len(damaged) - 1
        older = f" (and the {n} older ones)" if n > 1 else " (and the older one)" if n else ""
        raise TrainConfigError(
            f"--resume: checkpoint {path} is damaged: {why}{older}; no intact checkpoint is "
            f"left to resume from: start anew with --fresh, or in another --out-dir"
        )
    return good, damaged


def resume_reference(cfg: RunDirSettings) -> tuple[TrainConfig, Path] | None:
    """The settings the run to resume was made with: the config.json of the checkpoint it
    resumes from (written with it; :func:`resume_checkpoint`), else the run folder's; None
    when there is neither."""
    out = Path(cfg.out_dir)
    latest, _ = resume_checkpoint(out)
    for path in (latest / "config.json" if latest else None, out / "config.json"):
        if path is not None and path.exists():
            try:
                return TrainConfig.load(path), path
            except ValueError as e:
                raise TrainConfigError(f"--resume: {path} cannot be read ({e})") from None
    return None


def _critic_change(was: Any, given: Any) -> bool:
    """Whether a change of estimator from ``was`` to ``given`` adds or drops the critic (an
    estimator no longer registered is not known to have one)."""

    def critic(name: Any) -> bool:
        return isinstance(name, str) and name in ESTIMATORS and uses_critic(name)

    return critic(was) != critic(given)


def check_resume(cfg: RunDirSettings) -> None:
    """--resume continues the run made with the checkpoint's settings: a flag that changes
    the model's shapes or what the run is (anything not in RESUME_ALLOWED) is refused, naming
    the flag, the checkpoint's value and the given one, before anything is written."""
    ref = resume_reference(cfg)
    if ref is None:
        return
    old, path = ref
    where = path.parent if path.parent.name.startswith("iter_") else path
    latest, _ = resume_checkpoint(Path(cfg.out_dir))
    for name, (was, given) in config_changes(old, cfg).items():
        if name in RESUME_ALLOWED:
            continue
        shapes = name in RESUME_SHAPES or (name == "estimator" and _critic_change(was, given))
        why = (
            "it changes the model's or the optimizer state's shapes"
            if shapes
            else "a resumed run keeps the settings it was made with"
        )
        weights = f" (from its weights: --model {latest / 'hf_model'})" if latest else ""
        raise TrainConfigError(
            f"TrainConfig.{name}: --resume with {flag_of(name)} {given!r}, but {where} was made "
            f"with {was!r} ({why}); resume without {flag_of(name)}, or start a new run in another "
            f"--out-dir{weights}"
        )


def resume_changes(cfg: RunDirSettings) -> dict[str, tuple[Any, Any]]:
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


def clear_run(out: Path) -> list[str]:
    """Remove what an earlier run left in ``out`` (RUN_FILES only: other files stay); returns
    the names removed."""
    removed = []
    for name in RUN_FILES:
        path = out / name.rstrip("/")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def kept_line(out: Path) -> str:
    """What a run stopped now leaves to go on from: its last published checkpoint."""
    latest = ckpt.latest(Path(out) / "checkpoints")
    if latest is None:
        return f"no checkpoint was written in {out} yet; --resume starts it again at iteration 1"
    return f"kept checkpoint {latest.name} in {latest.parent}; go on with --resume"


def stop_line(out: Path, e: BaseException) -> str:
    """The one line ``python -m hgpo.train`` prints when Ctrl-C or a write that failed for want
    of room or rights (:data:`hgpo.atomic.FILE_ERRNOS`) stops run ``out``."""
    if isinstance(e, OSError):
        return f"error: {file_error_line(e, out)}; {kept_line(out)}"
    return f"interrupted; {kept_line(out)}"
