"""Writes the train_toy study's results folder: tables, statistical tests, report and plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from studies.io import atomic_write_text, save_figure, write_csv
from studies.metrics import mean_ci
from studies.train_toy_settings import ABLATIONS, SETTING_NOTES
from studies.verdict import HOLDS, NOT_SIGNIFICANT, Step, ordering_verdict

__all__ = ["compare", "ordering_tests", "orderings", "summarise", "write_results"]

CURVE_PLOT_METRICS = (
    ("success", "rollout success", "share of episodes (T = 1)"),
    ("reward", "mean episode reward", "reward per episode"),
    ("adv_abs", "mean |advantage|", "|advantage| (as trained: normalised)"),
    ("kl", "KL to reference (k3)", "KL (nats per step)"),
    ("clip_frac", "clip fraction", "share of steps clipped"),
    ("entropy", "policy entropy", "entropy (nats per step)"),
)
"""training_metrics.png: (curves.csv column, panel title, y-axis label with its unit)."""


def _env_label(env: str, k: int, single_k: int | None) -> str:
    """The column an env's runs go to: the env, and with several Ks in the study, its K (so
    that every comparison and ordering is made within one K, as in the paper's Table 1)."""
    return env if single_k is not None else f"{env} K={k}"


def summarise(results: list[dict[str, Any]], default_K: int | None) -> list[dict[str, Any]]:
    """One row per run: final and mean-over-training success (train, held-out), and more."""
    rows = []
    for r in results:
        ev = r["evals"]
        tr = np.array([e["train_success"] for e in ev], dtype=np.float64)
        ho = np.array([e["heldout_success"] for e in ev], dtype=np.float64)
        last = r["curve"][-1]
        rows.append(
            {
                "env": _env_label(r["env"], r["K"], default_K),
                "env_spec": r["env"],
                "setting": r["setting"],
                "scheme": r.get("scheme", ""),
                "label": f"{r['setting']} [{r['scheme']}]" if "scheme" in r else r["setting"],
                "estimator": r["estimator"],
                "K": r["K"],
                "seed": r["seed"],
                "start_success": float(tr[0]),
                "final_train": float(tr[-1]),
                "final_heldout": float(ho[-1]),
                # Mean over the evaluations after iteration 0: the area under the learning
                # curve, i.e. how fast a setting learns, not only where it ends.
                "auc_train": float(tr[1:].mean()) if tr.size > 1 else float(tr[-1]),
                "auc_heldout": float(ho[1:].mean()) if ho.size > 1 else float(ho[-1]),
                "final_reward": float(np.mean([c["reward"] for c in r["curve"][-10:]])),
                "final_kl": float(last["kl"]),
                "seconds": float(r["seconds"]),
            }
        )
    return rows


STEP_GRID = 201
"""Points of the common env-step grid on which auc_steps averages the success curve."""


def _env_steps_at_evals(run: dict[str, Any]) -> np.ndarray:
    """Cumulative training env steps (batch rows) when each evaluation was taken."""
    cum = np.concatenate([[0], np.cumsum([c["env_steps"] for c in run["curve"]])])
    return cum[[e["iteration"] for e in run["evals"]]].astype(np.float64)


def add_step_auc(results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Set ``auc_steps`` and ``env_steps`` on every row; returns the step range S per env.

    auc_steps = (1 / S) int_0^S success(s) ds, with success(s) the train-task success at
    cumulative env step s (linear between evaluations, iteration 0 at s = 0) and S the fewest
    env steps any run of that env column used, so every run is measured over the same cost.
    """
    xs = [_env_steps_at_evals(r) for r in results]
    span: dict[str, float] = {}
    for row, x in zip(rows, xs, strict=True):
        span[row["env"]] = min(span.get(row["env"], math.inf), float(x[-1]))
    for row, run, x in zip(rows, results, xs, strict=True):
        y = np.array([e["train_success"] for e in run["evals"]], dtype=np.float64)
        grid = np.linspace(0.0, span[row["env"]], STEP_GRID)
        row["auc_steps"] = float(np.mean(np.interp(grid, x, y)))
        row["env_steps"] = float(x[-1])
    return span


def scheme_tests(rows: list[dict[str, Any]], metric: str = "auc_steps") -> list[dict[str, Any]]:
    """Welch + Holm on ``metric`` in two families: each scheme against ``independent`` per
    (env, setting), and gigpo / grpo against hgpo per (env, scheme)."""
    by_setting = [{**r, "env": f"{r['env']} / {r['setting']}", "label": r["scheme"]} for r in rows]
    by_scheme = [{**r, "env": f"{r['env']} / {r['scheme']}", "label": r["setting"]} for r in rows]
    return compare(by_setting, metric, "independent") + compare(by_scheme, metric, "hgpo")


def _scheme_section(
    rows: list[dict[str, Any]], tests: list[dict[str, Any]], span: dict[str, float]
) -> tuple[list[str], str]:
    """The report's scheme section (markdown lines) and its console text."""
    envs = list(span)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    md = [
        "## Learning speed per env step (--scheme)",
        "",
        "auc_steps: mean train-task success over the first S env steps of training (S per env: "
        + ", ".join(f"{_short(e)} {span[e]:.0f}" for e in envs)
        + ", the fewest any run used), percent, mean ± 95% t half-width over seeds; "
        "env steps: total training env steps of a run (thousands).",
        "",
        _md_table(rows, labels, envs, ("auc_steps",)),
        "",
        "| setting | " + " | ".join(f"{_short(e)} env steps (k)" for e in envs) + " |",
        "|---" * (len(envs) + 1) + "|",
    ]
    for lab in labels:
        md.append(f"| {lab} | " + " | ".join(
            f"{_mean(rows, e, lab, 'env_steps') / 1000:.1f}" for e in envs) + " |")  # fmt: skip
    md += ["", "Welch t-tests on auc_steps, Holm-corrected per (env, setting) for the schemes "
           "against independent, per (env, scheme) for gigpo / grpo against hgpo:", "",
           "| family | label | baseline | diff | p | p (Holm) |", "|---|---|---|---|---|---|"]  # fmt: skip
    text = []
    for t in tests:
        star = " *" if t["significant"] else ""
        md.append(f"| {_short(t['env'])} | {t['label']} | {t['baseline']} | {t['diff']:+.3f} | "
                  f"{t['p']:.2g} | {t['p_holm']:.2g}{star} |")  # fmt: skip
        text.append(f"- {_short(t['env'])}: {t['label']} vs {t['baseline']} {t['diff']:+.3f} "
                    f"(Holm p = {t['p_holm']:.2g}){star}")  # fmt: skip
    head = [f"{'setting':<32}" + "".join(f"{_short(e)[:20]:>22}" for e in envs)]
    for lab in labels:
        head.append(f"{lab:<32}" + "".join(
            f"{_mean(rows, e, lab, 'auc_steps'):>22.3f}" for e in envs))  # fmt: skip
    return [*md, ""], "\n".join(head + text)


def _ci(x: np.ndarray) -> tuple[float, float]:
    m, lo, hi = mean_ci(x)
    return m, (hi - lo) / 2 if np.isfinite(hi) else float("nan")


def compare(
    rows: list[dict[str, Any]], metric: str, baseline: str = "hgpo", suffix: str = ""
) -> list[dict[str, Any]]:
    """Welch t-tests (statsmodels) of each label against ``baseline`` per env, Holm-corrected
    over the labels of that env. Positive ``diff`` = the label beats the baseline. With
    ``suffix`` (e.g. ":norm=mean") only labels ending in it are compared."""
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttest_ind

    out = []
    for env in dict.fromkeys(r["env"] for r in rows):
        sub = [r for r in rows if r["env"] == env]
        base = np.array([r[metric] for r in sub if r["label"] == baseline], dtype=np.float64)
        tests = []
        for label in dict.fromkeys(r["label"] for r in sub):
            if label == baseline or (suffix and not label.endswith(suffix)):
                continue
            x = np.array([r[metric] for r in sub if r["label"] == label], dtype=np.float64)
            x, b = x[np.isfinite(x)], base[np.isfinite(base)]
            if x.size < 2 or b.size < 2:
                continue
            if np.ptp(np.concatenate([x, b])) == 0:
                p = 1.0  # every run scored the same: no difference to test
            elif np.ptp(x) == 0 and np.ptp(b) == 0:
                # no spread within either side but different values (e.g. 100 vs 0 in every
                # seed): Welch's t is infinite and statsmodels returns NaN, which would also
                # turn Holm's adjustment of the whole env into NaN; p -> 0 is its limit
                p = 0.0
            else:
                p = float(ttest_ind(x, b, usevar="unequal")[1])
            tests.append({"env": env, "metric": metric, "label": label, "baseline": baseline,
                          "diff": float(x.mean() - b.mean()), "p": p})  # fmt: skip
        if tests:
            adj = multipletests([t["p"] for t in tests], method="holm")[1]
            for t, q in zip(tests, adj, strict=True):
                t["p_holm"] = float(q)
                t["significant"] = bool(q < 0.05)
        out += tests
    return out


def _cell(rows: list[dict[str, Any]], env: str, label: str, metric: str) -> str:
    x = np.array([r[metric] for r in rows if r["env"] == env and r["label"] == label])
    x = x[np.isfinite(x)]
    if x.size == 0:
        return "-"
    m, h = _ci(x)
    return f"{100 * m:.1f} ± {100 * h:.1f}" if np.isfinite(h) else f"{100 * m:.1f}"


def _md_table(
    rows: list[dict[str, Any]], labels: list[str], envs: list[str], metrics: tuple[str, ...]
) -> str:
    heads = [f"{_short(e)} {m.replace('_', ' ')}" for e in envs for m in metrics]
    lines = ["| setting | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for lab in labels:
        note = SETTING_NOTES.get(lab.split(" [")[0], "")
        name = f"{lab} ({note})" if note else lab
        cells = [_cell(rows, e, lab, m) for e in envs for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _short(env: str) -> str:
    return env.replace(",", " ").replace(":", " ")


def _mean(rows: list[dict[str, Any]], env: str, label: str, metric: str) -> float:
    x = np.array([r[metric] for r in rows if r["env"] == env and r["label"] == label])
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


ORDERING_ALPHA = 0.05
"""An ordering holds when each of its steps is significant at this level (Holm-corrected)."""


def ordering_tests(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """The tests of the orderings' steps that are not against hgpo: grpo against gigpo (and
    grpo:norm=mean against gigpo:norm=mean) per env, Welch, each a family of one (so its Holm
    p is its p)."""
    out = []
    for sfx in ("", ":norm=mean"):
        pair = {"gigpo" + sfx, "grpo" + sfx}
        out += compare([r for r in rows if r["label"] in pair], metric, "gigpo" + sfx)
    return out


def orderings(
    rows: list[dict[str, Any]], tests: list[dict[str, Any]], metric: str
) -> list[dict[str, Any]]:
    """Per env: the paper's orderings on ``metric``, each a chain of steps (HGPO > GiGPO and
    GiGPO > GRPO; HGPO above each ablation; alpha = 1 above alpha = 0 and 2) with its Welch +
    Holm test from ``tests`` (:func:`compare` against hgpo, :func:`ordering_tests`). An
    ordering holds only when every step is significant (studies.verdict); otherwise the text
    gives each step's direction and p."""
    by = {(t["env"], t["label"], t["baseline"]): t for t in tests if t["metric"] == metric}
    out = []
    for env in dict.fromkeys(r["env"] for r in rows):
        have = {r["label"] for r in rows if r["env"] == env}
        m = {lab: _mean(rows, env, lab, metric) for lab in have}

        def step(high: str, low: str, env: str = env, m: dict[str, float] = m) -> Step:
            """high > low, from the test of one against the other (either way round)."""
            t = by.get((env, low, high))
            if t is not None:
                return Step(high, low, -t["diff"], t["p_holm"])
            t = by.get((env, high, low))
            if t is not None:
                return Step(high, low, t["diff"], t["p_holm"])
            return Step(high, low, m[high] - m[low])  # no test (fewer than 2 runs a side)

        checks = []
        for sfx in ("", ":norm=mean"):
            h, gi, gr = "hgpo" + sfx, "gigpo" + sfx, "grpo" + sfx
            if {h, gi, gr} <= have:
                checks.append((f"HGPO > GiGPO > GRPO{' (norm=mean)' if sfx else ''}",
                               [step(h, gi), step(gi, gr)], (h, gi, gr)))  # fmt: skip
        abl = [a for a in ("oracle", "hgpo-nohog2", "hgpo-uniform") if a in have]
        if "hgpo" in have and abl:
            checks.append(("ablations below HGPO", [step("hgpo", a) for a in abl],
                           ("hgpo", *abl)))  # fmt: skip
        alphas = ("hgpo", "hgpo-uniform", "hgpo:alpha=2")  # alpha = 1, 0, 2
        if all(v in have for v in alphas):
            checks.append(("alpha = 1 best of {0, 1, 2}",
                           [step("hgpo", "hgpo-uniform"), step("hgpo", "hgpo:alpha=2")], alphas))  # fmt: skip
        for name, steps, shown in checks:
            status, text = ordering_verdict(steps, ORDERING_ALPHA)
            out.append({"env": env, "metric": metric, "ordering": name, "verdict": status,
                        "holds": status == HOLDS, "text": text,
                        "steps": [{**asdict(s), "significant": s.significant(ORDERING_ALPHA)}
                                  for s in steps],
                        "detail": "means " + ", ".join(f"{lab} {m[lab]:.3f}" for lab in shown)})  # fmt: skip
    return out


def _orderings_text(ords: list[dict[str, Any]]) -> str:
    lines = []
    for o in ords:
        is_ = "is " if o["verdict"] == NOT_SIGNIFICANT else ""
        lines.append(
            f"- {_short(o['env'])} [{o['metric']}]: {o['ordering']} {is_}{o['text']}; {o['detail']}"
        )
    return "\n".join(lines)


def _console_table(rows: list[dict[str, Any]], labels: list[str], envs: list[str]) -> str:
    w = max(len(lab) for lab in labels) + 2
    head = f"{'setting':<{w}}" + "".join(f"{_short(e)[:26]:>28}" for e in envs)
    lines = [head, f"{'':<{w}}" + "".join(f"{'final train/held | auc':>28}" for _ in envs)]
    for lab in labels:
        cells = []
        for e in envs:
            ft = _mean(rows, e, lab, "final_train")
            fh = _mean(rows, e, lab, "final_heldout")
            au = _mean(rows, e, lab, "auc_train")
            fh_s = "  - " if math.isnan(fh) else f"{fh:.2f}"
            cells.append(
                f"{ft:>14.2f}/{fh_s:<4} | {au:.2f}" if not math.isnan(ft) else f"{'-':>28}"
            )
        lines.append(f"{lab:<{w}}" + "".join(f"{c:>28}" for c in cells))
    lines.append(
        "success rates at temperature 0.4; auc = mean training-task success over the evaluations"
    )
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], rows: list[dict[str, Any]], out: Path,
          labels: list[str], envs: list[str], name: str, title: str,
          temperature: float) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not labels:
        return
    runs_of = _runs_by_cell(results, rows)
    ncol = min(len(envs), 6)
    nrow = (len(envs) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow + 0.4), squeeze=False)
    for ax in axes.flat[len(envs) :]:
        ax.set_visible(False)
    for ax, env in zip(axes.flat, envs, strict=False):
        for lab in labels:
            runs = runs_of.get((env, lab), [])
            if not runs:
                continue
            its = np.array([e["iteration"] for e in runs[0]["evals"]])
            Y = np.array([[e["train_success"] for e in r["evals"]] for r in runs])
            ci = np.array([mean_ci(Y[:, j]) for j in range(Y.shape[1])])
            ax.plot(its, ci[:, 0], label=lab)
            ax.fill_between(its, ci[:, 1], ci[:, 2], alpha=0.15)
        ax.set_title(_short(env), fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel(f"train-task success (share, T = {temperature:g})")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 7), fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(names) - 1) // 7) / nrow, 1, 1))
    save_figure(fig, out / name, dpi=110)
    plt.close(fig)


def _runs_by_cell(
    results: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The finished runs of each (env label, setting label) cell of the report, in run order
    (``rows`` names each run's cell by its env spec, setting, K and seed)."""
    where = {(r["env_spec"], r["setting"], r["K"], r["seed"]): (r["env"], r["label"]) for r in rows}
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(where[(r["env"], r["setting"], r["K"], r["seed"])], []).append(r)
    return out


def _plot_metrics(results: list[dict[str, Any]], rows: list[dict[str, Any]], out: Path,
                  labels: list[str], env: str) -> None:  # fmt: skip
    import matplotlib.pyplot as plt

    fig = metrics_figure(results, rows, labels, env)
    save_figure(fig, out / "training_metrics.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def metrics_figure(results: list[dict[str, Any]], rows: list[dict[str, Any]],
                   labels: list[str], env: str) -> Any:  # fmt: skip
    """training_metrics.png's Figure: per metric of :data:`CURVE_PLOT_METRICS`, the mean over
    seeds per iteration, a line per setting; one legend below the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs_of = _runs_by_cell(results, rows)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (metric, title, unit) in zip(axes.flat, CURVE_PLOT_METRICS, strict=True):
        for lab in labels:
            runs = runs_of.get((env, lab), [])
            if not runs:
                continue
            Y = np.array([[c[metric] for c in r["curve"]] for r in runs], dtype=np.float64)
            ax.plot(np.arange(1, Y.shape[1] + 1), np.nanmean(Y, axis=0), label=lab)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel(unit, fontsize=8)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"training metrics (mean over seeds): {_short(env)}", fontsize=10)
    fig.tight_layout()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(max(len(names), 1), 7), fontsize=7)  # fmt: skip
    return fig


TRUTH_PLOT_METRICS = (
    ("truth_J", "exact J (train tasks)", "J (discounted return)"),
    ("truth_adv_mse", "advantage MSE vs A*", "MSE (reward$^2$)"),
    ("truth_grad_cos", "cos(batch gradient, dJ/dtheta)", "cosine (1 = same direction)"),
)


def _plot_truth(results: list[dict[str, Any]], rows: list[dict[str, Any]], out: Path,
                labels: list[str], envs: list[str]) -> bool:  # fmt: skip
    """truth_curves.png (--truth-every): per env, the exact figures over training, mean over
    seeds at the logged iterations. False when no run logged them."""
    if not any("truth_J" in r["curve"][0] for r in results):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs_of = _runs_by_cell(results, rows)
    fig, axes = plt.subplots(len(envs), 3, figsize=(12, 3.2 * len(envs)), squeeze=False)
    for row_axes, env in zip(axes, envs, strict=True):
        for ax, (metric, title, unit) in zip(row_axes, TRUTH_PLOT_METRICS, strict=True):
            for lab in labels:
                runs = runs_of.get((env, lab), [])
                if not runs:
                    continue
                Y = np.array([[c[metric] for c in r["curve"]] for r in runs], dtype=np.float64)
                its = np.arange(1, Y.shape[1] + 1)
                logged = np.isfinite(Y).any(axis=0)
                if logged.any():
                    ax.plot(its[logged], np.nanmean(Y[:, logged], axis=0), marker=".", label=lab)
            ax.set_title(f"{_short(env)}: {title}", fontsize=9)
            ax.set_xlabel("iteration")
            ax.set_ylabel(unit, fontsize=8)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(max(len(names), 1), 7), fontsize=7)  # fmt: skip
    save_figure(fig, out / "truth_curves.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def write_results(cfg: Any, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write curves.csv, evals.csv, final.csv, tests.csv, results.json, report.md and plots."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(results, cfg.Ks[0] if len(cfg.Ks) == 1 else None)
    envs = list(dict.fromkeys(r["env"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    _write_run_tables(out, results, rows)
    tests, scheme_md, schemes_text = _all_tests(results, rows)
    write_csv(out / "tests.csv", tests)
    ords_auc = orderings(rows, tests, "auc_train")
    ords = ords_auc + orderings(rows, tests, "final_train")
    abl_labels = [lab for lab in labels if lab.split(" [")[0] in ABLATIONS or lab == "hgpo"]
    main_labels = [lab for lab in labels if lab not in abl_labels or lab == "hgpo"]
    orderings_text = _orderings_text(ords)
    md = _report_lines(cfg, results, rows, tests, scheme_md, orderings_text, envs, labels,
                       main_labels, abl_labels)  # fmt: skip
    atomic_write_text(out / "report.md", "\n".join(md))
    summary = {
        "config": asdict(cfg), "final": rows, "tests": tests, "orderings": ords,
        "notes": SETTING_NOTES, "table": _console_table(rows, labels, envs),
        "orderings_text": orderings_text, "orderings_text_auc": _orderings_text(ords_auc),
        "schemes_text": schemes_text,
    }  # fmt: skip
    atomic_write_text(out / "results.json", json.dumps(summary, indent=1, default=float))
    _plot(results, rows, out, main_labels, envs, "learning_curves.png",
          "methods: mean ± 95% CI over seeds", cfg.eval_temperature)  # fmt: skip
    _plot(results, rows, out, abl_labels, envs, "ablations.png", "ablations of HGPO",
          cfg.eval_temperature)  # fmt: skip
    _plot_metrics(results, rows, out, main_labels, envs[0])
    _plot_truth(results, rows, out, labels, envs)
    return summary


def _write_run_tables(out: Path, results: list[dict[str, Any]], rows: list[dict]) -> None:
    """curves.csv and evals.csv (every run's logged rows, keyed), final.csv (one row a run)."""
    curve_rows, eval_rows = [], []
    for r in results:
        key = {"env": r["env"], "setting": r["setting"], "K": r["K"], "seed": r["seed"]}
        curve_rows += [{**key, **c} for c in r["curve"]]
        eval_rows += [{**key, **e} for e in r["evals"]]
    write_csv(out / "curves.csv", curve_rows)
    write_csv(out / "evals.csv", eval_rows)
    write_csv(out / "final.csv", rows)


def _all_tests(
    results: list[dict[str, Any]], rows: list[dict]
) -> tuple[list[dict], list[str], str]:
    """Welch + Holm against hgpo (and the :norm=mean settings against hgpo:norm=mean) on
    three metrics, the orderings' GiGPO > GRPO steps (:func:`ordering_tests`), then the rollout schemes' tests when the runs have schemes; with the
    schemes' report section and console text."""
    tests = []
    for metric in ("auc_train", "final_train", "final_heldout"):
        tests += compare(rows, metric)
        tests += compare(rows, metric, "hgpo:norm=mean", ":norm=mean")
        tests += ordering_tests(rows, metric)
    if not any("scheme" in r for r in results):
        return tests, [], ""
    span = add_step_auc(results, rows)
    s_tests = scheme_tests(rows)
    scheme_md, schemes_text = _scheme_section(rows, s_tests, span)
    return tests + s_tests, scheme_md, schemes_text


def _report_lines(
    cfg: Any, results: list[dict[str, Any]], rows: list[dict], tests: list[dict],
    scheme_md: list[str], orderings_text: str, envs: list[str], labels: list[str],
    main_labels: list[str], abl_labels: list[str],
) -> list[str]:  # fmt: skip
    """report.md: settings, Table 1, learning speed, Table 2, orderings, the tests."""
    secs = sum(r["seconds"] for r in rows)
    md = [
        "# train_toy: do better advantages train better policies?",
        "",
        f"Settings: {json.dumps(asdict(cfg))}",
        "",
        f"{len(results)} runs, {secs:.0f} s of run time (wall, summed over runs). Success rates are in percent at "
        f"temperature {cfg.eval_temperature}, mean ± 95% t-interval half-width over "
        f"{cfg.seeds} seeds; *final* = after the last iteration, *auc* = mean over the "
        "evaluations after iteration 0 (how fast a setting learns).",
        "",
        *scheme_md,
        "## Table 1: methods (final success, train tasks / held-out tasks)",
        "",
        _md_table(rows, main_labels, envs, ("final_train", "final_heldout")),
        "",
        "## Learning speed (auc, train tasks)",
        "",
        _md_table(rows, labels, envs, ("auc_train",)),
        "",
        "## Table 2: ablations",
        "",
        _md_table(rows, abl_labels, envs, ("final_train", "auc_train")),
        "",
        "## The paper's orderings",
        "",
        "An ordering holds only when each of its steps is significant (Welch, Holm-corrected "
        f"as in the tests below, p < {ORDERING_ALPHA}); otherwise each step's direction, "
        "difference and p are given. The GiGPO > GRPO steps are Welch tests of grpo against "
        "gigpo, each a family of one.",
        "",
        orderings_text,
        "",
        "## Welch t-tests against hgpo (the :norm=mean settings against hgpo:norm=mean; grpo "
        "against gigpo for the orderings), Holm-corrected per environment, metric and baseline",
        "",
        "| env | metric | setting | baseline | diff | p | p (Holm) |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in tests:
        md.append(
            f"| {_short(t['env'])} | {t['metric']} | {t['label']} | {t['baseline']} | {t['diff']:+.3f} | "
            f"{t['p']:.2g} | {t['p_holm']:.2g}{' *' if t['significant'] else ''} |"
        )
    truth = " truth_curves.png (--truth-every)." if getattr(cfg, "truth_every", 0) else ""
    md += ["", f"Plots: learning_curves.png, ablations.png, training_metrics.png.{truth}", ""]
    return md
