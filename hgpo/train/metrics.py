"""Run metrics: JSONL always, TensorBoard where installed, Weights & Biases when asked."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

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
    """Every row of a run's metrics.jsonl."""
    path = Path(out_dir) / METRICS_FILE
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
