"""``python -m hgpo.train.plot RUN [RUN ...]``: training curves of runs from their metrics.jsonl.

Writes ``curve.png`` into the first run folder (or ``--out``): success rate, mean reward,
invalid-action rate and KL against the iteration, one line per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hgpo.train.metrics import read_metrics

PANELS = ("success_rate", "score_mean", "invalid_rate", "kl")


def plot(runs: list[str], out: str | None = None) -> Path:
    """Draw the curves of ``runs``; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for run in runs:
        rows = read_metrics(run)
        its = [r["iteration"] for r in rows]
        for ax, key in zip(axes, PANELS, strict=True):
            ax.plot(its, [r.get(key, float("nan")) for r in rows], marker=".", label=Path(run).name)
            ax.set_title(key)
            ax.set_xlabel("iteration")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(out) if out else Path(runs[0]) / "curve.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    ap = argparse.ArgumentParser(prog="python -m hgpo.train.plot", description=__doc__)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    print(plot(args.runs, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
