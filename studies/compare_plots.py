"""studies.compare's plots: every estimator's figures, and its differences to the baseline."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from studies.io import save_figure

__all__ = ["plot_diffs", "plot_metrics"]

PANELS = (
    ("bias2", "bias² (reward²)", True),
    ("variance", "variance (reward²)", True),
    ("mse", "MSE (reward²)", True),
    ("sign", "sign agreement (share)", False),
    ("grad_cos", "gradient cosine", False),
    ("auc", "auc (train success)", False),
)
"""(column, panel title with its unit, lower is better)."""


def _bars(ax: Any, names: list[str], mid: np.ndarray, lo: np.ndarray, hi: np.ndarray,
          colors: list[str]) -> None:  # fmt: skip
    ok = np.isfinite(mid)
    err = np.vstack([mid - lo, hi - mid])
    err = np.where(np.isfinite(err), err, 0.0)
    y = np.arange(len(names))
    ax.barh(y[ok], mid[ok], xerr=err[:, ok], color=[c for c, k in zip(colors, ok, strict=True)
                                                    if k], alpha=0.75)  # fmt: skip
    ax.set_yticks(y, names, fontsize=7)
    ax.axvline(0, color="k", lw=0.5)
    ax.invert_yaxis()


def plot_metrics(table: list[dict[str, Any]], base: str, out: Path) -> Path:
    """metrics.png: a row of panels per policy kind (bias², variance, MSE, sign agreement,
    gradient cosine, auc), a bar per estimator with its 95% interval, the baseline in orange."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r["policy"] for r in table))
    fig, axes = plt.subplots(len(policies), len(PANELS), squeeze=False,
                             figsize=(3.0 * len(PANELS), 0.25 * len(table) + 1.6 * len(policies)))  # fmt: skip
    for row_axes, p in zip(axes, policies, strict=True):
        rows = [r for r in table if r["policy"] == p]
        names = [r["estimator"] for r in rows]
        colors = ["tab:orange" if n == base else "tab:blue" for n in names]
        for ax, (m, title, _) in zip(row_axes, PANELS, strict=True):
            get = lambda k, rows=rows: np.array([r.get(k, math.nan) for r in rows], float)  # noqa: E731
            _bars(ax, names, get(m), get(f"{m}_lo"), get(f"{m}_hi"), colors)
            ax.set_title(f"{p}: {title}", fontsize=8)
    fig.tight_layout()
    path = out / "metrics.png"
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path


def plot_diffs(table: list[dict[str, Any]], diffs: list[dict[str, Any]], base: str,
               out: Path) -> Path:  # fmt: skip
    """diffs.png: each estimator minus the baseline per policy kind and metric, with the
    interval of the difference (auc: the pooled difference, no interval; its test is Welch's,
    Holm-corrected), coloured by whether it is significantly better or worse."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r["policy"] for r in table))
    by = {(d["policy"], d["estimator"], d["metric"]): d for d in diffs}
    fig, axes = plt.subplots(len(policies), len(PANELS), squeeze=False,
                             figsize=(3.0 * len(PANELS), 0.25 * len(table) + 1.6 * len(policies)))  # fmt: skip
    for row_axes, p in zip(axes, policies, strict=True):
        rows = [r for r in table if r["policy"] == p and r["estimator"] != base]
        names = [r["estimator"] for r in rows]
        for ax, (m, title, lower) in zip(row_axes, PANELS, strict=True):
            if m == "auc":
                mid = np.array([r.get("auc_diff", math.nan) for r in rows], float)
                lo = hi = mid
                sig = [r.get("auc_p_holm", 1.0) < 0.05 for r in rows]
            else:
                ds = [by.get((p, n, m), {}) for n in names]
                mid, lo, hi = (np.array([d.get(k, math.nan) for d in ds], float)
                               for k in ("diff", "lo", "hi"))  # fmt: skip
                sig = [bool(d.get("significant")) for d in ds]
            better = (mid < 0) if lower else (mid > 0)
            colors = ["tab:gray" if not s else "tab:green" if b else "tab:red"
                      for s, b in zip(sig, better, strict=True)]  # fmt: skip
            _bars(ax, names, mid, lo, hi, colors)
            ax.set_title(f"{p}: {title} − {base}", fontsize=8)
    fig.suptitle(
        "difference to the baseline (green: significantly better, red: significantly "
        "worse, grey: within noise)",
        fontsize=9,
    )
    fig.tight_layout()
    path = out / "diffs.png"
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path
