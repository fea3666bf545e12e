"""Report of LLM training runs on a toy env with ``--truth-every``: learning curves and every
estimator's error against the exact advantage of the LLM policy.

    python -m studies.llm_truth_report runs/toy-demo/*-s* --out docs/img/toy_llm

Run folders are named ``<estimator>-s<seed>`` (the trained estimator). Writes
``<out>_success.png`` (success rate and the exact J of the trained policy against the
iteration, mean over seeds with the min-max band, per trained estimator), ``<out>_truth.png``
(per registered estimator: bias^2, variance, MSE, sign agreement and gradient cosine, pooled
over every truth iteration of every run, with 95% t intervals over those batches) and prints
the Markdown tables of both.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from hgpo.options import ArgumentParser, check_writable_dir
from hgpo.train.run_metrics import read_metrics
from studies.cli import one_line_stops
from studies.io import save_figure
from studies.metrics import mean_ci

METRICS = ("bias2", "variance", "mse", "mse_all", "sign", "grad_cos")


def load(runs: list[str]) -> dict[str, list[list[dict]]]:
    """Rows of every run, grouped by the trained estimator (folder name ``<est>-s<seed>``);
    ValueError naming a run that is not such a folder or logged no truth."""
    out: dict[str, list[list[dict]]] = defaultdict(list)
    for run in runs:
        m = re.fullmatch(r"(.+)-s(\d+)", Path(run).name)
        if not m:
            raise ValueError(f"runs: folder {run!r} is not named <estimator>-s<seed>")
        rows = read_metrics(run)
        for key, why in (("success_rate", "no finished iteration"),
                         ("truth/J", "no truth/ metrics; train it with --truth-every N")):  # fmt: skip
            if not any(key in r for r in rows):
                raise ValueError(f"runs: {run!r} logged {why}")
        out[m.group(1)].append(rows)
    return dict(out)


def curve(rows_per_seed: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(iterations, float64[seeds, iterations]) of ``key`` where every seed logged it."""
    its = sorted(set.intersection(*({r["iteration"] for r in rows if key in r}
                                    for rows in rows_per_seed)))  # fmt: skip
    vals = np.array([[next(r[key] for r in rows if r["iteration"] == i) for i in its]
                     for rows in rows_per_seed])  # fmt: skip
    return np.array(its), vals


def learning_table(data: dict[str, list[list[dict]]], last: int = 10) -> str:
    """Success over the last ``last`` iterations and the first iteration where the seed-mean
    success reaches 0.75, per trained estimator."""
    lines = [f"| trained with | seeds | success, last {last} it. (95% CI over seeds) | "
             "first it. with mean success >= 0.75 | exact J at the end (mean over seeds) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for est, seeds in data.items():
        its, s = curve(seeds, "success_rate")
        m, lo, hi = mean_ci(s[:, -last:].mean(axis=1))
        reach = its[np.flatnonzero(s.mean(axis=0) >= 0.75)]
        _, J = curve(seeds, "truth/J")
        lines.append(f"| {est} | {len(seeds)} | {m:.2f} [{lo:.2f}, {hi:.2f}] | "
                     f"{reach[0] if reach.size else '-'} | {J[:, -1].mean():.2f} |")  # fmt: skip
    return "\n".join(lines)


def truth_table(data: dict[str, list[list[dict]]]) -> tuple[str, dict[str, dict[str, tuple]]]:
    """Every registered estimator's figures pooled over all truth iterations of all runs."""
    pooled: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for seeds in data.values():
        for rows in seeds:
            for r in rows:
                for k, v in r.items():
                    parts = k.split("/")
                    if len(parts) == 3 and parts[0] == "truth" and parts[2] in METRICS:
                        pooled[parts[1]][parts[2]].append(v)
    stats = {e: {m: mean_ci(np.array(v[m])) for m in METRICS} for e, v in pooled.items()}
    n = len(next(iter(pooled.values()))["bias2"]) if pooled else 0
    lines = [f"| estimator | {' | '.join(METRICS)} |", "|---" * (len(METRICS) + 1) + "|"]
    for e, st in sorted(stats.items(), key=lambda kv: kv[1]["bias2"][0]):
        cells = [f"{st[m][0]:.3g} [{st[m][1]:.3g}, {st[m][2]:.3g}]" for m in METRICS]
        lines.append(f"| {e} | {' | '.join(cells)} |")
    return f"{n} batches pooled\n\n" + "\n".join(lines), stats


def plot(data: dict[str, list[list[dict]]], stats: dict, out: str) -> list[Path]:
    """The two figures (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for est, seeds in data.items():
        for ax, key in zip(axes, ("success_rate", "truth/J"), strict=True):
            its, v = curve(seeds, key)
            ax.plot(its, v.mean(axis=0), marker=".", label=f"{est} ({len(seeds)} seeds)")
            ax.fill_between(its, v.min(axis=0), v.max(axis=0), alpha=0.15)
            ax.set_title(key if key != "truth/J" else "exact J of the LLM policy")
            ax.set_xlabel("iteration")
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    p1 = Path(f"{out}_success.png")
    save_figure(fig, p1, dpi=100)
    plt.close(fig)
    shown = ("bias2", "variance", "mse", "sign", "grad_cos")
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.4))
    names = sorted(stats, key=lambda e: stats[e]["bias2"][0])
    for ax, m in zip(axes, shown, strict=True):
        mid = np.array([stats[e][m][0] for e in names])
        err = np.array([[mid[i] - stats[e][m][1], stats[e][m][2] - mid[i]]
                        for i, e in enumerate(names)]).T  # fmt: skip
        ax.barh(names, mid, xerr=err, color="tab:blue", alpha=0.7)
        ax.set_title(m)
        ax.axvline(0, color="k", lw=0.5)
    fig.tight_layout()
    p2 = Path(f"{out}_truth.png")
    save_figure(fig, p2, dpi=100)
    plt.close(fig)
    return [p1, p2]


@one_line_stops("the figures written before it are whole (each is written atomically)")
def main(argv: list[str] | None = None) -> int:
    """Command line."""
    ap = ArgumentParser(prog="python -m studies.llm_truth_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default="toy_llm", help="prefix of the PNG files")
    args = ap.parse_args(argv)
    try:
        data = load(args.runs)
        check_writable_dir("--out", str(Path(args.out).parent), "--out")
    except ValueError as e:
        ap.error(str(e))
    print(learning_table(data))
    text, stats = truth_table(data)
    print()
    print(text)
    for p in plot(data, stats, args.out):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
