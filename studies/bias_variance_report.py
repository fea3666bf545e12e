"""Writes the bias/variance study's results folder: tables, report and plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from studies.io import write_csv

__all__ = ["write_results"]


def _fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def _table(rows: list[dict[str, Any]]) -> str:
    """The compact console table: one line per (cell, estimator), mean norm + grad cos."""
    by_key = {(r["env"], r["K"], r["stage"], r["estimator"], r["norm"]): r for r in rows}
    lines = [
        f"{'env':<10}{'K':>2} {'stage':<9}{'succ':>5}  {'estimator':<13}{'bias2':>8}{'var':>8}"
        f"{'mse':>8}{'sign':>6}{'rho':>6}{'cos':>6}{'cos*':>6}"
    ]
    seen = set()
    for r in rows:
        if r["norm"] != "mean" or "=" in r["estimator"]:
            continue
        k = (r["env"], r["K"], r["stage"], r["estimator"])
        if k in seen:
            continue
        seen.add(k)
        z = by_key.get((*k, "mean_std"), {})
        lines.append(
            f"{r['family']:<10}{r['K']:>2} {r['stage']:<9}{r['success']:>5.2f}  {r['estimator']:<13}"
            f"{r.get('bias2', np.nan):>8.3f}{r.get('variance', np.nan):>8.3f}{r.get('mse', np.nan):>8.3f}"
            f"{r.get('sign', np.nan):>6.2f}{r.get('spearman', np.nan):>6.2f}{r.get('grad_cos', np.nan):>6.2f}"
            f"{z.get('grad_cos', np.nan):>6.2f}"
        )
    lines.append(
        "bias2/var/mse: reward units, norm=mean; sign: sign agreement with A*; rho: Spearman; "
        "cos: gradient cosine (mean), cos*: (mean_std, the paper's default)"
    )
    return "\n".join(lines)


def _prop_text(props: list[dict[str, Any]]) -> str:
    out = ["Proposition 4.1 (per cell, on steps whose level-K group has >= 2 members):"]
    for p in props:
        if p is None:
            continue
        flags = []
        for key, label in (
            ("bias_falls", "bias falls with k"), ("variance_rises", "variance rises with k"),
            ("bias_between", "b_K <= b_H <= b_0"), ("variance_between", "var_H within sum w^2 v_0..v_K"),
        ):  # fmt: skip
            flags.append(f"{label}: {'holds' if p[key] else 'FAILS'}")
        b = ", ".join(f"{x:.3f}" for x in p["b"])
        v = ", ".join(f"{x:.3f}" for x in p["v"])
        out.append(
            f"  {p['env'].split(':')[0]} K={p['K']} {p['stage']}: b_k=[{b}] b_H={p['b_H']:.3f}; "
            f"v_k=[{v}] v_H={p['v_H']:.3f} (sum w^2={p['sum_w2']:.3f})\n    " + "; ".join(flags)
        )
        if p.get("dvar"):
            steps = ", ".join(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in p["dvar"])
            out.append(f"    v_k - v_(k-1), paired 95% intervals: {steps}")
        if (
            p["bias_falls"]
            and p["variance_rises"]
            and not (p["bias_between"] and p["variance_between"])
        ):
            out.append(
                "    conditions hold but a conclusion does not: the proposition treats levels as independent; they share samples"
            )
        elif not (p["bias_falls"] and p["variance_rises"]):
            out.append("    the proposition's conditions do not hold here, so it makes no claim")
    return "\n".join(out)


def _plots(out: Path, rows: list[dict[str, Any]], levels: list[dict[str, Any]]) -> list[str]:
    """The study's figures under ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    cells = sorted({(r["env"], r["K"], r["stage"]) for r in rows}, key=str)
    envs = sorted({c[0] for c in cells})
    return [
        _plot_vs_k(out, cells, envs, levels),
        _plot_mse_and_gradient(out, cells, rows),
        _plot_group_sizes(out, envs, levels),
        _plot_alpha_and_K(out, cells, rows),
    ]


def _save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _plot_vs_k(out: Path, cells: list[tuple], envs: list[str], levels: list[dict]) -> str:
    """bias^2 and variance against k (Prop 4.1's picture), per env and K, a line per stage."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), 2, figsize=(10, 3.2 * len(envs)), squeeze=False)
    for i, env in enumerate(envs):
        for K in sorted({c[1] for c in cells if c[0] == env}):
            for stage in sorted({c[2] for c in cells if c[0] == env and c[1] == K}):
                lv = [r for r in levels if r["env"] == env and r["K"] == K and r["stage"] == stage]
                ks = [r["level"] for r in lv]
                axes[i, 0].plot(ks, [r["bias2"] for r in lv], "o-", label=f"K={K} {stage}")
                axes[i, 1].plot(ks, [r["variance"] for r in lv], "o-", label=f"K={K} {stage}")
        axes[i, 0].set_title(f"{env.split(':')[0]}: bias$^2$ of $A_k$")
        axes[i, 1].set_title(f"{env.split(':')[0]}: variance of $A_k$")
        for ax in axes[i]:
            ax.set_xlabel("level k")
            ax.legend(fontsize=7)
    return _save(fig, out, "bias_variance_vs_k.png")


def _plot_mse_and_gradient(out: Path, cells: list[tuple], rows: list[dict]) -> str:
    """MSE and gradient cosine per estimator, per cell."""
    import matplotlib.pyplot as plt

    ests = [r["estimator"] for r in rows if r["norm"] == "mean" and "=" not in r["estimator"]]
    ests = list(dict.fromkeys(ests))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.2 * len(cells)), 7))
    width = 0.8 / max(len(ests), 1)
    index = {(r["env"], r["K"], r["stage"], r["estimator"], r["norm"]): r for r in rows}
    for j, est in enumerate(ests):
        mse = [index.get((*c, est, "mean"), {}).get("mse", np.nan) for c in cells]
        cos = [index.get((*c, est, "mean_std"), {}).get("grad_cos", np.nan) for c in cells]
        x = np.arange(len(cells)) + j * width
        axes[0].bar(x, mse, width, label=est)
        axes[1].bar(x, cos, width, label=est)
    labels = [f"{c[0].split(':')[0]}\nK={c[1]} {c[2]}" for c in cells]
    for ax, title in zip(
        axes,
        (
            "MSE against A* (norm=mean, reward units)",
            "cosine of batch gradient with the exact gradient (norm=mean_std)",
        ),
        strict=True,
    ):
        ax.set_xticks(np.arange(len(cells)) + 0.4 - width / 2, labels, fontsize=7)
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7, ncol=5)
    return _save(fig, out, "mse_and_gradient.png")


def _plot_group_sizes(out: Path, envs: list[str], levels: list[dict]) -> str:
    """The group-size distribution per level (share of steps in groups of each size)."""
    import matplotlib.pyplot as plt

    Kmax = max(r["K"] for r in levels) if levels else 0
    lv = [r for r in levels if r["K"] == Kmax]
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.5), squeeze=False)
    for i, env in enumerate(envs):
        stage = sorted({r["stage"] for r in lv if r["env"] == env})[0] if lv else None
        for r in (x for x in lv if x["env"] == env and x["stage"] == stage):
            h = np.asarray(r["size_hist"])
            axes[0, i].plot(
                np.arange(h.size),
                h,
                "o-",
                ms=3,
                label=f"level {r['level']} (util {r['utilisation']:.2f})",
            )
        axes[0, i].set_title(f"{env.split(':')[0]} K={Kmax} {stage}: group sizes")
        axes[0, i].set_xlabel("group size")
        axes[0, i].set_ylabel("share of steps")
        axes[0, i].legend(fontsize=7)
    return _save(fig, out, "group_sizes.png")


def _plot_alpha_and_K(out: Path, cells: list[tuple], rows: list[dict]) -> str:
    """MSE against alpha and against the depth HGPO uses (hgpo, norm=mean)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for c in cells:
        sub = {
            r["estimator"]: r.get("mse", np.nan)
            for r in rows
            if (r["env"], r["K"], r["stage"]) == c and r["norm"] == "mean"
        }
        al = sorted((float(k.split("=")[1]), v) for k, v in sub.items() if k.startswith("alpha="))
        ks = sorted((int(k.split("=")[1]), v) for k, v in sub.items() if k.startswith("K="))
        lab = f"{c[0].split(':')[0]} K={c[1]} {c[2]}"
        if al:
            axes[0].plot(*zip(*al, strict=True), "o-", label=lab)
        if ks:
            axes[1].plot(*zip(*ks, strict=True), "o-", label=lab)
    axes[0].set_xlabel("alpha")
    axes[1].set_xlabel("hierarchy depth used by HGPO")
    for ax in axes:
        ax.set_ylabel("MSE")
        ax.legend(fontsize=6)
    return _save(fig, out, "mse_vs_alpha_and_K.png")


def write_results(cfg: Any, results: list[dict[str, Any]]) -> dict[str, Any]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for res in results for r in res["rows"]]
    levels = [r for res in results for r in res["levels"]]
    props = [res["prop41"] for res in results]
    write_csv(out / "results.csv", rows)
    write_csv(out / "levels.csv", levels)
    settings = asdict(cfg)
    tmp = out / "results.json.tmp"
    tmp.write_text(
        json.dumps(
            {"settings": settings, "rows": rows, "levels": levels, "prop41": props},
            indent=1,
            default=float,
        )
    )
    tmp.replace(out / "results.json")
    table = _table(rows)
    prop_text = _prop_text(props)
    files = _plots(out, rows, levels)
    md = ["# Bias/variance study", "", "Settings: `" + json.dumps({k: v for k, v in settings.items() if k != "extra"}) + "`", "",
          "```", table, "```", "", "```", prop_text, "```", "", "## Per level (HGPO, norm=mean)", "",
          "| env | K | stage | level | utilisation | mean group size | bias2 | variance | mse | bias2 (all steps) | variance (all) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in levels:
        md.append(
            f"| {r['family']} | {r['K']} | {r['stage']} | {r['level']} | {r['utilisation']:.3f} | "
            f"{r['mean_group_size']:.2f} | {_fmt(r['bias2'])} | {_fmt(r['variance'])} | {_fmt(r['mse'])} | "
            f"{_fmt(r['bias2_all'])} | {_fmt(r['variance_all'])} |"
        )
    md += [""] + [f"![{f}]({f})" for f in files]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return {"table": table, "prop41_text": prop_text, "rows": rows, "levels": levels}
