"""The trainer's checkpoint of a run: what one holds, how it is written and how ``--resume``
loads it back.

A checkpoint (an atomic folder, :mod:`hgpo.train.checkpoint`) holds the actor's DeepSpeed
checkpoint (with LoRA: the adapters and their optimizer state only, plus the adapters in
peft's format), the critic's, the policy as a ``transformers`` model (``hf_model``, loadable
with ``--model``), ``trainer_state.json`` (iteration, model path, ranks) and the run's
``config.json`` (the settings a resume is checked against).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hgpo.train import checkpoint as ckpt
from hgpo.train import dist
from hgpo.train.lora import ADAPTER_DIR
from hgpo.train.model import HF_MODEL_DIR, save_hf_model
from hgpo.train.rundir import record_resume, resume_checkpoint
from hgpo.train.train_config import TrainConfigError

__all__ = ["load_run", "save_run", "set_lr"]


def set_lr(optimizer: Any, lr: float, weight_decay: float) -> None:
    """Set every parameter group's learning rate and weight decay (DeepSpeed's ZeRO optimizers
    wrap the torch optimizer and share its ``param_groups``)."""
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = lr, weight_decay


class SaveRunSettings(Protocol):
    """What :func:`save_run` reads of the config: how many checkpoints to keep, and the whole
    config as JSON (``save``: the checkpoint's config.json, which ``--resume`` is checked
    against field by field, so it cannot be a slice)."""

    keep_checkpoints: int

    def save(self, path: str | os.PathLike[str]) -> None: ...


def save_run(
    out: Path,
    cfg: SaveRunSettings,
    iteration: int,
    *,
    rank: int,
    world: int,
    actor: Any,
    critic: Any,
    lora: bool,
    tok: Any,
    model_path: str,
    before_publish: Callable[[], None] = lambda: None,
) -> None:
    """Write checkpoint ``iteration`` of the run in ``out`` (a collective: every rank calls
    it) and publish it atomically; ``before_publish`` runs once every file is written (the
    trainer's kill hook for the tests). A file torch could not write (a full disk) is an
    OSError naming the checkpoint's folder (:func:`hgpo.train.checkpoint.write_error`), and
    the half-written folder is removed."""
    root = out / "checkpoints"
    if rank == 0:
        ckpt.tmp_dir(root, iteration)
    dist.barrier()
    tmp = root / f".tmp-iter_{iteration:06d}"
    try:
        _write_files(tmp, cfg, iteration, rank, world, actor, critic, lora, tok, model_path)
    except (OSError, RuntimeError) as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # (room for what the user does next)
        if isinstance(e, RuntimeError) and (err := ckpt.write_error(e, tmp)) is not None:
            raise err from e
        raise
    before_publish()
    dist.barrier()
    if rank == 0:
        ckpt.commit(root, tmp, iteration, cfg.keep_checkpoints)
    dist.barrier()


def _write_files(
    tmp: Path, cfg: SaveRunSettings, iteration: int, rank: int, world: int, actor: Any,
    critic: Any, lora: bool, tok: Any, model_path: str,
) -> None:  # fmt: skip
    """Every file of a checkpoint, into its temporary folder ``tmp``."""
    # LoRA: the actor's checkpoint holds the adapters and their optimizer state only
    actor.save_checkpoint(str(tmp), tag="actor", exclude_frozen_parameters=lora)
    if lora and rank == 0:
        actor.module.save_pretrained(str(tmp / ADAPTER_DIR))
    if critic is not None:
        critic.save_checkpoint(str(tmp), tag="critic")
    save_hf_model(actor.module, tok, tmp / HF_MODEL_DIR, rank == 0)
    if rank == 0:
        state = {
            "iteration": iteration,
            "model_path": model_path,
            "world_size": world,
        }
        # not a result: written in the checkpoint's temporary folder, published whole
        (tmp / "trainer_state.json").write_text(json.dumps(state) + "\n")  # not a result
        cfg.save(tmp / "config.json")  # the settings --resume is checked against


class LoadRunSettings(Protocol):
    """The settings :func:`load_run` reads (``TrainConfig`` has them)."""

    critic_lr: float
    lr: float
    weight_decay: float
    zero_stage: int


def load_run(
    out: Path,
    cfg: LoadRunSettings,
    world: int,
    actor: Any,
    critic: Any,
    lora: bool,
    resume_changes: dict[str, Any] | None = None,
) -> tuple[Path, int] | None:
    """Load the newest checkpoint of the run in ``out`` into the engines: (its folder, the
    next iteration), or None when there is none. ``resume_changes`` (rank 0: the settings
    --resume changed) go to resumes.jsonl. A checkpoint written by another number of ranks
    under ZeRO-1/2/3 is refused (TrainConfigError) before anything is loaded; damaged
    checkpoints are passed over (:func:`hgpo.train.rundir.resume_checkpoint`, which refuses
    when none is intact)."""
    path, _ = resume_checkpoint(out)
    if path is None:
        return None
    state = json.loads((path / "trainer_state.json").read_text())
    saved_world = int(state.get("world_size", world))
    if saved_world != world and cfg.zero_stage > 0:
        # DeepSpeed partitions ZeRO-1/2/3 optimizer states by rank and cannot re-partition
        # them; ZeRO-0 checkpoints resume on any number of ranks
        raise TrainConfigError(
            f"--resume: {path} was written by {saved_world} ranks under "
            f"TrainConfig.zero_stage={cfg.zero_stage}, this run has {world}; "
            f"resume with {saved_world} ranks, or start a new run from its weights with "
            f"--model {path / HF_MODEL_DIR}"
        )
    # LoRA: the base weights come from model_path, the checkpoint has the adapters
    actor.load_checkpoint(str(path), tag="actor", load_module_strict=not lora)
    if critic is not None:
        critic.load_checkpoint(str(path), tag="critic")
    # the optimizer states bring back the saved learning rates; the run's config (where
    # flags given with --resume may change them) decides
    set_lr(actor.optimizer, cfg.lr, cfg.weight_decay)
    if critic is not None:
        set_lr(critic.optimizer, cfg.critic_lr, cfg.weight_decay)
    start = int(state["iteration"]) + 1
    if resume_changes:  # rank 0 only (empty elsewhere)
        record_resume(out, start, resume_changes)
    return path, start
