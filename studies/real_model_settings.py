"""The settings of studies.real_model: the checked command line (:class:`Study`, where each run
and its record live) and each run's ``hgpo.train`` arguments, in one place.

``studies.real_model`` (the command), ``studies.real_model_run`` (one run) and
``studies.real_model_report`` (the report) import from here, so none imports another's caller.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ACTION_MODES",
    "NAME",
    "PRESETS",
    "STUDY",
    "STUDY_SETS",
    "UNKEYED",
    "Study",
    "train_argv",
]

PRESETS = ("smol-cpu", "tiny")
"""``hgpo.train`` presets a study runs: the real SmolLM2 on a CPU, or the tiny random model."""

UNKEYED = ("out_dir", "resume", "fresh", "progress")
"""TrainConfig fields that say where and how a run is invoked, not what it computes."""

NAME = re.compile(r"[A-Za-z0-9_.=+-]+")
"""An estimator name the study can use in a folder name."""

STUDY = "studies.real_model"

ACTION_MODES = ("score", "generate")
"""``--action-mode`` of the runs: the model scores the admissible actions, or writes free text."""

STUDY_SETS = {
    "env": "--env", "model": "--model", "action_mode": "--action-mode",
    "history_length": "--history-length", "max_steps": "--max-steps",
    "groups_per_iter": "--groups-per-iter", "group_size": "--group-size",
    "iterations": "--iterations", "truth_every": "--truth-every", "lr": "--lr",
    "mini_batch_size": "--mini-batch-size", "ppo_epochs": "--ppo-epochs", "estimator": "--estimators",
    "seed": "--seeds", "out_dir": "--out", "resume": "--fresh", "fresh": "--fresh",
    "val_every": "", "save_every": "", "keep_checkpoints": "", "progress": "",
}  # fmt: skip
"""The TrainConfig fields the study sets itself (no ``--override``), with the study's flag that
sets each ("": fixed by the study: no validation, a checkpoint every iteration, one kept)."""


@dataclass(frozen=True)
class Study:
    """The checked command line."""

    out: Path
    preset: str
    env: str
    estimators: tuple[str, ...]
    seeds: int
    iterations: int
    truth_every: int
    groups_per_iter: int
    group_size: int
    history_length: int
    max_steps: int | None
    """``--max-steps`` of the runs; None: the preset's (or the benchmark's)."""
    lr: float | None
    model: str | None
    """``--model`` of the runs (a warm-started model folder, a GGUF file); None: the preset's."""
    threads: int
    run_timeout: float
    fresh: bool
    config: dict[str, Any]
    """The runs' resolved TrainConfig without the estimator, the seed and :data:`UNKEYED`."""
    mini_batch_size: int | None = None
    """``--mini-batch-size`` of the runs (step samples per optimizer step); None: the preset's."""
    ppo_epochs: int | None = None
    """``--ppo-epochs`` of the runs (passes over an iteration's samples); None: the preset's."""
    action_mode: str = "score"
    """``--action-mode`` of the runs (:data:`ACTION_MODES`)."""
    overrides: tuple[tuple[str, str], ...] = ()
    """``--override FIELD=VALUE`` of the runs, in order: (TrainConfig field, its value as given),
    passed to ``hgpo.train`` as ``--field-name=VALUE``."""

    @property
    def truth(self) -> bool:
        """Whether the runs measure the exact truth (``--truth-every`` > 0, a toy env)."""
        return self.truth_every > 0

    def name(self, estimator: str, seed: int) -> str:
        """``<estimator>-s<seed>``: the run's folder name (studies.llm_truth_report reads it)."""
        return f"{estimator}-s{seed}"

    def run_dir(self, estimator: str, seed: int) -> Path:
        return self.out / "runs" / self.name(estimator, seed)

    def record_path(self, estimator: str, seed: int) -> Path:
        return self.out / "results" / f"{self.name(estimator, seed)}.json"

    def train_seed(self, estimator: str, seed: int) -> int:
        """``hgpo.train``'s ``--seed`` of run ``seed`` of ``estimator``: CRC-32 of the name mod
        10^6, plus ``seed``. Distinct estimators get distinct seeds, so their runs are
        independent, as Welch's test and the pooling of the truth batches assume: with one
        seed, every estimator's first batch would be the same batch (the same pretrained policy,
        the same random numbers), and the later ones nearly so at a small lr."""
        return zlib.crc32(estimator.encode()) % 1_000_000 + seed

    def run_config(self, estimator: str, seed: int) -> dict[str, Any]:
        """The resolved TrainConfig of one run (what its record is checked against)."""
        return {**self.config, "estimator": estimator, "seed": self.train_seed(estimator, seed)}

    def settings(self) -> dict[str, Any]:
        """What ``settings.json`` keeps: every setting that changes a run's result (not the
        estimators and seeds, each run being its own: more of them reuse the finished ones;
        not the threads or the timeout). The overrides as given are kept too (when any): a
        study with other overrides is refused even where they resolve to the same config."""
        extra = {"overrides": dict(self.overrides)} if self.overrides else {}
        return {"preset": self.preset, **self.config, **extra}


def train_argv(
    s: Study, estimator: str, seed: int, start: str = "--resume", out_dir: Path | None = None
) -> list[str]:
    """``python -m hgpo.train``'s arguments of one run; ``start`` is ``--resume`` (go on from
    its checkpoint, or from iteration 1 without one) or ``--fresh``; ``out_dir`` replaces the
    run's folder."""
    out_dir = s.run_dir(estimator, seed) if out_dir is None else out_dir
    lr = [] if s.lr is None else ["--lr", repr(s.lr)]
    model = [] if s.model is None else ["--model", s.model]
    mb = [] if s.mini_batch_size is None else ["--mini-batch-size", str(s.mini_batch_size)]
    ep = [] if s.ppo_epochs is None else ["--ppo-epochs", str(s.ppo_epochs)]
    steps = [] if s.max_steps is None else ["--max-steps", str(s.max_steps)]
    # --field-name=VALUE: a value may start with "-"
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in s.overrides]
    return [
        "--preset", s.preset, *model, "--env", s.env, "--action-mode", s.action_mode,
        "--history-length", str(s.history_length), *steps, *extra,
        "--groups-per-iter", str(s.groups_per_iter), "--group-size", str(s.group_size),
        "--iterations", str(s.iterations), "--truth-every", str(s.truth_every), *lr, *mb, *ep,
        "--val-every", "0", "--save-every", "1", "--keep-checkpoints", "1", "--progress", "false",
        "--estimator", estimator, "--seed", str(s.train_seed(estimator, seed)), "--out-dir", str(out_dir), start,
    ]  # fmt: skip
