"""The report of studies.real_model: learning with intervals over seeds, Welch's tests between
estimators with Holm's correction, the exact truth on the model's own batches, time and memory.

Figures per run (from its record, studies/real_model_run.py): ``final`` the success rate of the
last iteration, ``auc`` the mean success over all iterations, ``J_last`` the exact J of the
policy at the last truth iteration (measured before that iteration's update), ``J_change``
that J minus the first truth iteration's (the exact learning, free of the episodes' sampling
noise), seconds per iteration (the run's wall time over its iterations, start-up included),
the trainer's mean phase times, the run's peak RSS, ``valid`` the valid-action rate (1 - the
trainer's ``invalid_rate``: the share of the steps whose response held a parseable admissible
action) averaged over the run's iterations. Per estimator: mean and 95% t interval
over seeds. Between two estimators: Welch's t-test on each figure, Holm-corrected over every
pair x figure (studies.verdict; without the truth: the two success figures). The truth: every ``truth/<estimator>/<metric>`` pooled over
the truth iterations of all runs (every estimator is measured on every batch, whichever one
trained), mean and 95% t interval over batches, and the differences between the study's
estimators paired batch by batch (t-test, Holm over those).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studies.io import atomic_write_text, save_figure, write_csv
from studies.metrics import mean_ci
from studies.real_model_settings import Study
from studies.verdict import Step, holm

__all__ = [
    "LEARNING",
    "TRUTH",
    "VALID",
    "learning_keys",
    "run_figures",
    "truth_batches",
    "welch_tests",
    "write_report",
]

LEARNING = {
    "final": "success, last iteration",
    "auc": "success, mean over iterations (AUC)",
    "J_last": "exact J, last truth iteration",
    "J_change": "exact J change (last - first truth iteration)",
}
"""The per-run learning figures compared between estimators, and their names in the report."""

VALID = "valid-action rate, mean over iterations"
"""The report's name of the per-run figure ``valid`` (shown with its interval, not tested)."""

TRUTH = ("bias2", "variance", "mse", "sign", "grad_cos", "coverage")
"""The truth monitor's per-batch figures of each estimator that the report pools."""

PAIRED = ("bias2", "variance", "mse")

Records = dict[tuple[str, int], dict[str, Any]]


def learning_keys(s: Study) -> tuple[str, ...]:
    """The :data:`LEARNING` figures of study ``s``: the exact J ones only with the truth."""
    return tuple(LEARNING) if s.truth else ("final", "auc")


def run_figures(rec: dict[str, Any], seed: int) -> dict[str, Any]:
    """The figures of one run's record (see the module docstring)."""
    rows = rec["rows"]
    success = np.array([r.get("success_rate", math.nan) for r in rows], dtype=float)
    J = [r["truth/J"] for r in rows if "truth/J" in r]
    valid = [1.0 - r["invalid_rate"] for r in rows if "invalid_rate" in r]
    cfg = rec["config"]
    ran = len(rows) - rec.get("iterations_before", 0)  # (a resumed run: its own iterations)

    def phase(key: str, only_truth: bool = False) -> float:
        vals = [r[key] for r in rows if key in r and (not only_truth or "truth/J" in r)]
        return float(np.mean(vals)) if vals else math.nan

    return {
        "estimator": cfg["estimator"], "seed": seed, "train_seed": cfg["seed"], "final": float(success[-1]),
        "auc": float(success.mean()), "J_last": J[-1] if J else math.nan,
        "J_change": J[-1] - J[0] if len(J) > 1 else math.nan,
        "valid": float(np.mean(valid)) if valid else math.nan,
        "s_per_iteration": rec["wall_s"] / ran if ran else math.nan, "wall_s": rec["wall_s"],
        "cpu_s": rec["cpu_s"], "rollout_s": phase("time/rollout"), "score_s": phase("time/score"),
        "update_s": phase("time/update"), "truth_s": phase("time/truth", only_truth=True),
        "peak_rss_gib": rec["peak_rss_bytes"] / 2**30, "kl_last": rows[-1].get("kl", math.nan),
        "load_before": rec["load_before"][0], "load_after": rec["load_after"][0],
    }  # fmt: skip


def _by_estimator(figs: list[dict[str, Any]], key: str) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {}
    for f in figs:
        out.setdefault(f["estimator"], []).append(f[key])
    return {e: np.array(v, dtype=float) for e, v in out.items()}


def _finite_mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def _welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Welch's two-sided p (scipy); NaN with fewer than 2 finite values a side or no spread."""
    from scipy import stats

    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return math.nan
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p if math.isfinite(p) else math.nan


def welch_tests(
    figs: list[dict[str, Any]], estimators: Sequence[str], keys: Sequence[str] = tuple(LEARNING)
) -> list[dict[str, Any]]:
    """Every pair of ``estimators`` (in their order) on every figure of ``keys``: the
    difference of the means, Welch's p and the Holm p over the whole family, and the verdict
    text (``hgpo > grpo (+0.050, not significant, Holm p = 0.81)``)."""
    tests = []
    for key in keys:
        vals = _by_estimator(figs, key)
        for a, b in itertools.combinations(estimators, 2):
            x, y = vals[a], vals[b]
            diff = _finite_mean(x) - _finite_mean(y)
            tests.append({"figure": key, "a": a, "b": b, "n_a": int(np.isfinite(x).sum()),
                          "n_b": int(np.isfinite(y).sum()), "diff": diff, "p": _welch_p(x, y)})  # fmt: skip
    for t, q in zip(tests, holm([t["p"] for t in tests]), strict=True):
        t["p_holm"] = q
        t["text"] = Step(t["a"], t["b"], t["diff"], p=q).text(num="+.3f")
    return tests


def truth_batches(records: Records) -> dict[str, dict[str, np.ndarray]]:
    """``{estimator: {metric: float64[batches]}}`` over every truth iteration of every run, the
    same batch at the same index for every estimator (NaN where a batch has no figure: no
    coverage, or the estimator failed on it)."""
    rows = [r for rec in records.values() for r in rec["rows"] if "truth/J" in r]
    names = sorted({k.split("/")[1] for r in rows for k in r if k.count("/") == 2
                    and k.startswith("truth/") and k.split("/")[2] in TRUTH})  # fmt: skip
    return {e: {m: np.array([r.get(f"truth/{e}/{m}", math.nan) for r in rows], dtype=float)
                for m in TRUTH} for e in names}  # fmt: skip


def paired_truth(
    batches: dict[str, dict[str, np.ndarray]], estimators: Sequence[str]
) -> list[dict]:
    """Between every pair of the study's estimators, on the batches where both have the figure:
    the mean difference with its 95% t interval and the paired t-test's p, Holm over all."""
    from scipy import stats

    out = []
    for m in PAIRED:
        for a, b in itertools.combinations([e for e in estimators if e in batches], 2):
            d = batches[a][m] - batches[b][m]
            d = d[np.isfinite(d)]
            mean, lo, hi = mean_ci(d)
            spread = d.size > 1 and not np.allclose(d, d[0], rtol=1e-9, atol=0.0)
            p = float(stats.ttest_1samp(d, 0.0).pvalue) if spread else math.nan
            out.append({"metric": m, "a": a, "b": b, "n": int(d.size), "diff": mean, "lo": lo,
                        "hi": hi, "p": p if math.isfinite(p) else math.nan})  # fmt: skip
    for t, q in zip(out, holm([t["p"] for t in out]), strict=True):
        t["p_holm"] = q
    return out


def _ci(x: np.ndarray, fmt: str = ".3g") -> str:
    m, lo, hi = mean_ci(x)
    if not math.isfinite(m):
        return "-"
    return f"{m:{fmt}}" if lo == hi else f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def learning_md(
    figs: list[dict[str, Any]], estimators: Sequence[str], keys: Sequence[str] = tuple(LEARNING)
) -> str:
    """Per estimator: the seeds and every figure of ``keys``, then the valid-action rate when
    the runs logged it, mean [95% t interval]."""
    keys = list(keys)
    if any(math.isfinite(f["valid"]) for f in figs):
        keys.append("valid")
    names = {**LEARNING, "valid": VALID}
    head = "| estimator | seeds | " + " | ".join(names[k] for k in keys) + " |"
    lines = [head, "|---|---|" + "---|" * len(keys)]
    cols = {k: _by_estimator(figs, k) for k in keys}
    for e in estimators:
        cells = [_ci(cols[k][e]) for k in keys]
        lines.append(f"| {e} | {cols['final'][e].size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tests_md(tests: list[dict[str, Any]]) -> str:
    """Every test's verdict, then one plain line: which differences are significant."""
    if not tests:
        return "One estimator: nothing to compare."
    lines = [f"- {LEARNING[t['figure']]}: {t['text']}" for t in tests]
    sig = [t for t in tests if t["p_holm"] < 0.05]
    untested = sum(math.isnan(t["p_holm"]) for t in tests)
    tested = len(tests) - untested
    if sig:
        what = "; ".join(f"{LEARNING[t['figure']]}: {t['a']} vs {t['b']}" for t in sig)
        lines.append(f"\nSignificant after Holm over {tested} tests: {what}.")
    else:
        lines.append(f"\n**Not significant**: no difference between the estimators is significant "
                     f"(Holm-corrected Welch p < 0.05) in any of the {tested} tested comparisons.")  # fmt: skip
    if untested:
        lines.append(f"{untested} comparisons are untested (fewer than 2 seeds a side, or no "
                     "spread): their directions are no evidence.")  # fmt: skip
    return "\n".join(lines)


def truth_md(batches: dict[str, dict[str, np.ndarray]], estimators: Sequence[str]) -> str:
    """Every measured estimator's pooled truth figures (sorted by MSE; the trained ones *)."""
    if not batches:
        return "No truth iteration was logged."
    n = len(next(iter(batches.values()))["bias2"])
    cov = batches[next(iter(batches))]["coverage"]
    lines = [f"{n} batches (truth iterations of every run); coverage (share of a batch's steps "
             f"whose (task, z, a) two groups met) {_ci(cov, '.2f')}.\n",
             "| estimator | " + " | ".join(TRUTH[:5]) + " |", "|---" * 6 + "|"]  # fmt: skip
    for e in _by_mse(batches):
        mark = " *" if e in estimators else ""
        cells = [_ci(batches[e][m]) for m in TRUTH[:5]]
        lines.append(f"| {e}{mark} | " + " | ".join(cells) + " |")
    if not np.isfinite(cov).any() or not np.nansum(cov):
        lines.append("\nbias2, variance and MSE need a (task, z, a) met by two rollout groups of "
                     "one batch: no batch had one (each group played another task; raise "
                     "--groups-per-iter above the env's training tasks).")  # fmt: skip
    return "\n".join(lines)


def paired_md(pairs: list[dict[str, Any]]) -> str:
    """The paired differences (those with at least one batch)."""
    pairs = [t for t in pairs if t["n"]]
    if not pairs:
        return "No batch has these figures for two of the study's estimators."
    lines = ["| figure | a - b | batches | difference [95% CI] | Holm p |", "|---|---|---|---|---|"]
    for t in pairs:
        q = "-" if math.isnan(t["p_holm"]) else f"{t['p_holm']:.2g}"
        lines.append(f"| {t['metric']} | {t['a']} - {t['b']} | {t['n']} | {t['diff']:+.3g} "
                     f"[{t['lo']:+.3g}, {t['hi']:+.3g}] | {q} |")  # fmt: skip
    sig = sum(t["p_holm"] < 0.05 for t in pairs)
    lines.append(f"\n{sig} of {len(pairs)} paired differences significant (Holm p < 0.05).")
    return "\n".join(lines)


def cost_md(figs: list[dict[str, Any]], estimators: Sequence[str], truth: bool = True) -> str:
    """Seconds per iteration, the trainer's phase times (the truth's with it), the KL to the base
    and peak RSS per estimator."""
    names = {"s_per_iteration": "s per iteration (wall, start-up included)",
             "rollout_s": "rollout s", "score_s": "score s", "update_s": "update s",
             "truth_s": "truth s (per pass)", "kl_last": "KL to the base, last it."}  # fmt: skip
    keys = [k for k in names if truth or k != "truth_s"]
    lines = ["| estimator | " + " | ".join(names[k] for k in keys) + " | peak RSS GiB (max) |",
             "|---" * (len(keys) + 2) + "|"]  # fmt: skip
    cols = {k: _by_estimator(figs, k) for k in (*keys, "peak_rss_gib")}
    for e in estimators:
        cells = [_ci(cols[k][e]) for k in keys]
        lines.append(f"| {e} | " + " | ".join(cells) + f" | {cols['peak_rss_gib'][e].max():.2f} |")
    return "\n".join(lines)


def _curve(runs: list[list[dict[str, Any]]], key: str) -> tuple[list[int], np.ndarray]:
    """The iterations where the first run has ``key`` and the (mean, lo, hi) over the runs of
    ``key`` at each (``valid``: 1 - ``invalid_rate``)."""
    src = "invalid_rate" if key == "valid" else key
    its = sorted({r["iteration"] for r in runs[0] if src in r})
    v = np.array([[next((r[src] for r in rows if r["iteration"] == i and src in r), math.nan)
                   for i in its] for rows in runs])  # fmt: skip
    if key == "valid":
        v = 1.0 - v
    return its, np.array([mean_ci(v[:, j]) for j in range(len(its))]).reshape(-1, 3)


def plot_learning(
    records: Records, estimators: Sequence[str], path: Path, truth: bool = True
) -> None:
    """Success per iteration and, with the truth, the exact J at the truth iterations, else the
    valid-action rate (when logged): mean over seeds with a 95% t band (none for one seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for rec in records.values() for r in rec["rows"]]
    second = "truth/J" if truth else "valid" if any("invalid_rate" in r for r in rows) else None
    keys = ("success_rate",) if second is None else ("success_rate", second)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.3), squeeze=False)
    axes = axes[0]
    for e in estimators:
        runs = [rec["rows"] for (est, _), rec in sorted(records.items()) if est == e]
        for ax, key in zip(axes, keys, strict=True):
            its, stats = _curve(runs, key)
            line = ax.plot(its, stats[:, 0], marker=".", label=f"{e} ({len(runs)} seeds)")[0]
            ax.fill_between(its, stats[:, 1], stats[:, 2], alpha=0.15, color=line.get_color())
    axes[0].set(
        title="success rate (95% t band over seeds)", xlabel="iteration", ylim=(-0.05, 1.05)
    )
    if second == "truth/J":
        axes[1].set(title="exact J of the LLM policy", xlabel="iteration (before its update)")
    elif second == "valid":
        axes[1].set(title="valid-action rate (share of steps)", xlabel="iteration",
                    ylim=(-0.05, 1.05))  # fmt: skip
    for ax in axes:  # iterations are whole numbers
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def _by_mse(batches: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """The estimators by their mean MSE over batches, those without one last."""

    def key(e: str) -> float:
        m = batches[e]["mse"]
        return float(m[np.isfinite(m)].mean()) if np.isfinite(m).any() else math.inf

    return sorted(batches, key=key)


def plot_truth(batches: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    """bias², variance, MSE, sign agreement and gradient cosine of every measured estimator
    with 95% t intervals over batches (an estimator without a figure left out of its panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = TRUTH[:5]
    order = _by_mse(batches)
    fig, axes = plt.subplots(1, len(shown), figsize=(2.9 * len(shown), 0.3 * len(order) + 1.4))
    for ax, m in zip(axes, shown, strict=True):
        names = [e for e in order if np.isfinite(batches[e][m]).any()]
        ax.set_title(m)
        if not names:
            ax.text(0.5, 0.5, "no batch had two\ngroups of a task", ha="center",
                    transform=ax.transAxes)  # fmt: skip
            continue
        st = np.array([mean_ci(batches[e][m]) for e in names]).reshape(-1, 3)
        err = np.abs(np.vstack([st[:, 0] - st[:, 1], st[:, 2] - st[:, 0]]))
        ax.barh(names, st[:, 0], xerr=err, color="tab:blue", alpha=0.7)
        ax.axvline(0, color="k", lw=0.5)
        ax.invert_yaxis()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def scope_md(s: Study, n_batches: int) -> str:
    """What the run's size can and cannot show, in numbers."""
    c = s.config
    n = c["groups_per_iter"] * c["group_size"]
    batches = f"{n_batches} truth batches" if s.truth else "no truth batches"
    return (
        f"{len(s.estimators)} estimators x {s.seeds} seeds x {s.iterations} iterations of {n} "
        f"episodes; {batches}. One iteration's success rate over {n} episodes "
        f"has a standard error of up to {0.5 / n**0.5:.2f}; with {s.seeds} seeds the 95% t "
        f"interval of a mean is ±{_t975(s.seeds):.1f} standard errors of it. A difference "
        "between estimators is claimed only where its Holm-corrected p < 0.05; any other "
        "direction above is no evidence. KL to the base model (Time and memory) says how far "
        "the runs moved at all."
    )


def _t975(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1)) if n > 1 else math.inf


def _header(s: Study, records: Records, command: str) -> str:
    recs = list(records.values())
    loads = [x for r in recs for x in (r["load_before"][0], r["load_after"][0])]
    m = recs[0]["machine"]
    c = s.config
    return "\n".join([
        "# Learning with a real model (studies.real_model)\n", f"`{command}`\n",
        f"- model `{c['model']}`, preset `{s.preset}`, env `{s.env}`, action mode "
        f"{c.get('action_mode', s.action_mode)}, {c['groups_per_iter']} groups x "
        f"{c['group_size']} episodes per iteration, {s.iterations} iterations, {_truth_text(s)}, "
        f"lr {c['lr']:g}, LoRA rank {c['lora_rank']}, K = {c['history_length']}, max steps "
        f"{c['max_steps']}" + "".join(f", {k} = {v}" for k, v in s.overrides),
        f"- {len(recs)} runs, {min(r['started'] for r in recs)} to "
        f"{max(r['finished'] for r in recs)}; machine: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB; {recs[0]['threads']} torch thread(s) per run, one run at a "
        f"time; load average (1 min) at the runs' starts and ends {min(loads):.1f}-{max(loads):.1f}",
    ])  # fmt: skip


def _truth_text(s: Study) -> str:
    """The header's words for the truth: how often, or plainly why there is none."""
    from agentenvs.registry import benchmark

    if s.truth:
        return f"exact truth every {s.truth_every}"
    if not benchmark(s.env).exact_truth:
        return f"no exact truth: --env {s.env} has none"
    return "no exact truth (--truth-every 0)"


def _n_batches(batches: dict[str, dict[str, np.ndarray]]) -> int:
    return len(next(iter(batches.values()))["bias2"]) if batches else 0


def write_report(s: Study, records: Records, command: str) -> list[Path]:
    """Write report.md, runs.csv, curves.csv, tests.csv, learning.png and, with the truth,
    truth.csv and truth.png into ``s.out`` (atomically); returns their paths."""
    est, keys = s.estimators, learning_keys(s)
    figs = [run_figures(records[(e, seed)], seed) for seed in range(s.seeds) for e in est]
    tests = welch_tests(figs, est, keys)
    batches = truth_batches({k: records[k] for k in records if k[0] in est})
    pairs = paired_truth(batches, est)
    truth = [
        "## The exact truth on the model's own batches (mean [95% t interval over batches]; "
        "* = trained with)", truth_md(batches, est), "### Paired on the same batches",
        paired_md(pairs),
    ] if s.truth else []  # fmt: skip
    md = "\n\n".join([
        _header(s, records, command), "## Learning (mean [95% t interval over seeds])",
        learning_md(figs, est, keys), "## Between estimators (Welch's t-test, Holm-corrected)",
        tests_md(tests), *truth, "## Time and memory (mean [95% t interval over seeds])",
        cost_md(figs, est, s.truth), "## What this size can show",
        scope_md(s, _n_batches(batches)),
    ]) + "\n"  # fmt: skip
    out = s.out
    paths = [out / n for n in ("report.md", "runs.csv", "curves.csv", "tests.csv", "learning.png")]
    atomic_write_text(paths[0], md)
    write_csv(paths[1], figs)
    write_csv(paths[2], [{"estimator": e, "seed": seed, "iteration": r["iteration"],
                          "success_rate": r.get("success_rate"),
                          "valid_rate": 1.0 - r["invalid_rate"] if "invalid_rate" in r else "",
                          **({"truth_J": r.get("truth/J", "")} if s.truth else {}),
                          "kl": r.get("kl")} for (e, seed), rec in sorted(records.items())
                         if e in est and seed < s.seeds for r in rec["rows"]])  # fmt: skip
    write_csv(paths[3], tests + [{"figure": t["metric"], **t} for t in pairs])
    plot_learning({k: records[k] for k in records if k[0] in est}, est, paths[4], s.truth)
    if s.truth:
        paths += [out / "truth.csv", out / "truth.png"]
        write_csv(paths[5], [{"estimator": e, "metric": m, "batches": int(np.isfinite(v).sum()),
                              **dict(zip(("mean", "lo", "hi"), mean_ci(v), strict=True))}
                             for e, ms in batches.items() for m, v in ms.items()])  # fmt: skip
        if batches:
            plot_truth(batches, paths[6])
        else:
            paths.pop()
    print(md)
    return paths
