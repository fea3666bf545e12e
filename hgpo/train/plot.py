"""``python -m hgpo.train.plot RUN [RUN ...]``: training curves of runs from their metrics.jsonl.

Writes ``curve.png`` into the first run folder (or ``--out``: a file, or a folder, meaning
an existing one or a path ending in ``/``, to hold ``curve.png``): one panel per metric
(default: success rate, mean reward, invalid-action rate and KL) against the iteration, one
line per run. ``--panels`` picks the metrics, e.g. ``success_rate,val/valid_seen/success``;
a metric logged only at some iterations (validation) is drawn at those iterations.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hgpo.atomic import atomic_open
from hgpo.options import ArgumentParser, check_writable_dir
from hgpo.train.run_metrics import METRICS_FILE, read_metrics

PANELS = ("success_rate", "score_mean", "invalid_rate", "kl")
PNG = "curve.png"
"""The file name written into a run folder, or into an ``--out`` folder."""


def png_path(runs: Sequence[str], out: str | None) -> Path:
    """Where the PNG goes: ``--out`` as a file, or :data:`PNG` inside ``--out`` when it is an
    existing folder or ends in a path separator, else :data:`PNG` in the first run folder."""
    if not out:
        return Path(runs[0]) / PNG
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        return Path(out) / PNG
    return Path(out)


def check_rows(run: str, rows: list[dict[str, Any]]) -> None:
    """The run has rows and each has an integer ``iteration``, else a ValueError naming the
    file and the row (an empty run would be an empty plot)."""
    where = os.path.join(run, METRICS_FILE)
    if not rows:
        raise ValueError(f"{where}: no rows (the run logged no iteration yet); nothing to plot")
    for n, row in enumerate(rows, start=1):
        if type(row.get("iteration")) is not int:
            got = f"iteration {row['iteration']!r}" if "iteration" in row else "no iteration"
            raise ValueError(f"{where}: row {n} has {got}; every row needs an integer iteration")


def check_values(run: str, rows: list[dict[str, Any]], panels: Sequence[str]) -> None:
    """Every drawn metric a row has is a number (NaN is a gap), else a ValueError naming the
    file, the row, the metric and the value."""
    for n, row in enumerate(rows, start=1):
        for key in panels:
            if key in row and type(row[key]) not in (int, float):
                raise ValueError(
                    f"{os.path.join(run, METRICS_FILE)}: row {n} (iteration {row['iteration']}): "
                    f"{key} must be a number, got {row[key]!r}"
                )


def plot(runs: list[str], out: str | None = None, panels: Sequence[str] | None = None) -> Path:
    """Draw the curves of ``runs``; returns the PNG's path.

    ``panels``: the metrics to draw (default :data:`PANELS`, where a metric a run lacks is an
    empty line). Raises ValueError, before drawing, when a run has no metrics or no rows, a row
    has no integer ``iteration`` or a drawn metric that is not a number, the given ``panels``
    are empty or name a metric that no run logged, or the PNG's folder is not writable.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {run: read_metrics(run) for run in runs}
    for run, rows in data.items():
        check_rows(run, rows)
    logged = {k for rows in data.values() for r in rows for k in r}
    if panels is not None and not list(panels):
        raise ValueError("panels: at least one metric is needed, got none")
    for key in panels or ():
        if key not in logged:
            raise ValueError(
                f"panels: no run logged the metric {key!r}; logged: {', '.join(sorted(logged))}"
            )
    panels = list(panels or PANELS)
    for run, rows in data.items():
        check_values(run, rows, panels)
    path = png_path(runs, out)
    check_writable_dir("--out", str(path.parent), "--out")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for n, (run, rows) in enumerate(data.items()):
        for ax, key in zip(axes[0], panels, strict=True):
            have = [r for r in rows if key in r]
            ax.plot(
                [r["iteration"] for r in have],
                [r[key] for r in have],
                marker=".",
                linestyle=("-", "--", ":", "-.")[n % 4],  # equal curves stay visible
                label=Path(run).name,
            )
            ax.set_title(key)
            ax.set_xlabel("iteration")
            if key.endswith("success") or key.endswith("success_rate"):
                ax.set_ylim(-0.05, 1.05)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:  # a kill or a full disk leaves no half figure
        fig.savefig(f, format=Path(path).suffix.lstrip(".") or None, dpi=110)  # atomic
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    ap = ArgumentParser(prog="python -m hgpo.train.plot", description=__doc__)
    ap.add_argument("runs", nargs="+")
    ap.add_argument(
        "--out",
        default=None,
        help=f"the PNG to write, or a folder (existing, or ending in /) to write {PNG} in "
        f"(default: {PNG} in the first run folder)",
    )
    ap.add_argument(
        "--panels",
        default=None,
        help=f"comma-separated metrics, one panel each (default {','.join(PANELS)})",
    )
    args = ap.parse_args(argv)
    panels = None
    if args.panels is not None:
        panels = [p.strip() for p in args.panels.split(",") if p.strip()]
    try:
        print(plot(args.runs, args.out, panels))
    except ValueError as e:  # bad data, not bad flags: no pointer to --help
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
