"""Run metrics: each rank's figures of an iteration, merged on rank 0; written to JSONL always,
TensorBoard where installed, Weights & Biases when asked."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hgpo.train.checkpoint import atomic_write_text

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Writes one JSON object per iteration (and per validation) to ``{out_dir}/metrics.jsonl``.

    On resume from iteration ``start`` the lines of iterations >= ``start`` (written after the
    checkpoint by a run that was then killed) are dropped, so every iteration appears once.
    """

    def __init__(self, out_dir: Path, cfg: Any, start: int = 1) -> None:
        self.path = out_dir / METRICS_FILE
        if self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                if row.get("iteration", 0) < start:
                    keep.append(line)
            atomic_write_text(self.path, "".join(x + "\n" for x in keep))
        self._f = open(self.path, "a")  # noqa: SIM115 (open for the whole run)
        self.tb = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
                log.info("tensorboard is not installed: metrics go to %s only", self.path)
        self.wandb = None
        if cfg.wandb:
            import wandb  # opt-in: a missing package is an error the user asked for

            self.wandb = wandb.init(
                project=cfg.wandb_project,
                config=cfg.to_dict(),
                dir=str(out_dir),
                name=os.path.basename(os.path.abspath(out_dir)),
                resume="allow",
            )

    def log(self, iteration: int, metrics: dict[str, Any]) -> None:
        """Append ``metrics`` of ``iteration`` (flushed and fsynced: a kill loses no line)."""
        row = {"iteration": iteration, **metrics}
        self._f.write(json.dumps(row, sort_keys=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, iteration)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(
                {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=iteration
            )

    def close(self) -> None:
        """Flush and close every sink."""
        self._f.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every row of a run's metrics.jsonl.

    A last line without its newline that is not a whole JSON object is one the run was
    writing when it was killed (each row is written with its newline and fsynced): it is left
    out, as a resumed run drops it. Raises ValueError naming the folder when there is no
    metrics.jsonl, and the file and line for any other line that is not a JSON object.
    """
    path = Path(out_dir) / METRICS_FILE
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(
            f"{str(out_dir)!r} has no readable {METRICS_FILE} ({e.strerror or type(e).__name__}): "
            "not the folder of a python -m hgpo.train run"
        ) from None
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row = _json_object(line)
        if row is None and i == len(lines):  # (no newline after it: cut by a kill)
            break
        if row is None:
            raise ValueError(f"{path}: line {i} is not a JSON object: {line[:80]!r}")
        rows.append(row)
    return rows


def _json_object(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


@dataclass
class PhaseTimes:
    """Wall seconds of an iteration's phases on one rank."""

    rollout: float = 0.0
    score: float = 0.0
    """Old and reference log-probs, critic values."""
    advantage: float = 0.0
    update: float = 0.0
    """The PPO update and the weight sync."""
    truth: float = 0.0
    """The exact truth of --truth-every (toy envs; 0 in other iterations)."""

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Time the ``with`` block as ``phase``."""
        t = time.perf_counter()
        yield
        setattr(self, phase, time.perf_counter() - t)


class LevelFigures(NamedTuple):
    """One HGPO level's grouping figures on one rank (the estimator's diagnostics)."""

    level: str
    utilisation: float
    mean_group_size: float
    n_groups: int


@dataclass
class BranchFigures:
    """One rank's branched-rollout figures (``--rollout-scheme`` other than independent)."""

    env_steps: int
    """Env steps taken: every own row of every trajectory."""
    roots: int
    branch_success: list[bool]
    """Per branch: its episode (parent's prefix and its own steps) won."""
    branch_steps: list[int]
    """Per branch: its own steps."""


@dataclass
class RankFigures:
    """One rank's raw figures of an iteration; :func:`merge_metrics` combines the ranks'."""

    n_steps: int
    adv_sum: float
    adv_sq: float
    reward: list[float]
    """Each trajectory's summed env reward."""
    success: list[bool]
    score: list[float]
    length: list[int]
    invalid: int
    gen_tokens: int
    gen_s: float
    env_s: float
    lp_gap: tuple[float, int, float]
    """rollout.LogprobGap: (sum of |difference|, tokens, max)."""
    levels: list[LevelFigures]
    update: dict[str, float]
    """UpdateStats.metrics()."""
    times: PhaseTimes
    branching: BranchFigures | None = None
    """Branched rollouts only; then the episode figures above are the roots'."""
    crashed: int = 0
    """Episodes whose env crashed, left out of the batch (and of every figure above)."""
    dropped: int = 0
    """Trajectories left out: the crashed ones and (branched rollouts) their branches."""


def _mean(xs: list[Any]) -> float:
    return float(np.mean(xs)) if xs else 0.0


def merge_metrics(parts: list[RankFigures]) -> dict[str, Any]:
    """Combine the ranks' raw figures into the iteration's metrics."""
    n = sum(p.n_steps for p in parts)
    adv_mean = sum(p.adv_sum for p in parts) / max(1, n)
    adv_var = sum(p.adv_sq for p in parts) / max(1, n) - adv_mean**2
    gen_tokens = sum(p.gen_tokens for p in parts)
    success = [x for p in parts for x in p.success]
    m: dict[str, Any] = {
        "adv_mean": adv_mean,
        "adv_std": math.sqrt(max(0.0, adv_var)),
        "reward_mean": _mean([x for p in parts for x in p.reward]),
        "success_rate": _mean(success),
        "score_mean": _mean([x for p in parts for x in p.score]),
        "episode_length": _mean([x for p in parts for x in p.length]),
        "invalid_rate": sum(p.invalid for p in parts) / max(1, n),
        "n_steps": n,
        "n_trajectories": len(success),
        "rollout/crashed": sum(p.crashed for p in parts),
        "rollout/dropped": sum(p.dropped for p in parts),
        "gen_tokens": gen_tokens,
        "tokens_per_s": gen_tokens / max(1e-9, max(p.gen_s for p in parts)),
        "time/rollout": max(p.times.rollout for p in parts),
        "time/generate": max(p.gen_s for p in parts),
        "time/env": max(p.env_s for p in parts),
        "time/advantage": max(p.times.advantage for p in parts),
        "time/update": max(p.times.update for p in parts),
        "time/score": max(p.times.score for p in parts),
        "time/truth": max(p.times.truth for p in parts),
    }
    gap_n = sum(p.lp_gap[1] for p in parts)
    if gap_n:  # the rollout engine's log-probs (vLLM) against the trainer's: the sync check
        m["rollout/logprob_diff_mean"] = sum(p.lp_gap[0] for p in parts) / gap_n
        m["rollout/logprob_diff_max"] = max(p.lp_gap[2] for p in parts)
    for k in parts[0].update:
        m[k] = float(np.mean([p.update[k] for p in parts]))
    m.update(_merge_levels(parts, n))
    if parts[0].branching is not None:
        m.update(_merge_branching([p.branching for p in parts if p.branching is not None]))
    return m


def _merge_branching(parts: list[BranchFigures]) -> dict[str, float]:
    """rollout/env_steps, roots, branches, branch_success_rate, branch_steps (mean own steps)."""
    success = [x for p in parts for x in p.branch_success]
    return {
        "rollout/env_steps": sum(p.env_steps for p in parts),
        "rollout/roots": sum(p.roots for p in parts),
        "rollout/branches": len(success),
        "rollout/branch_success_rate": _mean(success),
        "rollout/branch_steps": _mean([x for p in parts for x in p.branch_steps]),
    }


def _merge_levels(parts: list[RankFigures], n: int) -> dict[str, float]:
    """Per level: utilisation weighted by steps, group size weighted by groups, groups summed."""
    by_level: dict[str, list[tuple[float, float, float]]] = {}
    for p in parts:
        for lv in p.levels:
            by_level.setdefault(lv.level, []).append(
                (lv.utilisation * p.n_steps, lv.mean_group_size * lv.n_groups, lv.n_groups)
            )
    m: dict[str, float] = {}
    for name, rows in by_level.items():
        m[f"level{name}/utilisation"] = sum(r[0] for r in rows) / max(1, n)
        g = sum(r[2] for r in rows)
        m[f"level{name}/mean_group_size"] = sum(r[1] for r in rows) / max(1, g)
        m[f"level{name}/n_groups"] = g
    return m
