"""Writes the bias/variance study's results folder: tables, report and plots."""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from hgpo import ESTIMATORS, estimator_reads
from studies.io import atomic_write_text, save_figure, write_csv
from studies.verdict import DOES_NOT_HOLD, HOLDS, NOT_SIGNIFICANT, Step, holm, ordering_verdict

__all__ = [
    "base_rows",
    "best_counts",
    "figures",
    "prop_checks",
    "summary_lines",
    "terminal_lines",
    "versus_lines",
    "write_results",
]

ALPHA = 0.05
"""Significance level of the Holm-corrected comparisons."""

VERSUS_NAMES = {
    "mse_batch": ("MSE per batch (norm = mean, reward^2; lower is better)", True),
    "sign": ("sign agreement with A* (norm = mean; higher is better)", False),
    "grad_cos": ("gradient cosine (norm = mean_std, the paper's default; higher is better)", False),
}
"""Per-batch figure of the HGPO comparisons -> (how it reads, lower is better)."""

NAMES = {"grpo": "GRPO", "gigpo": "GiGPO"}
"""How the estimators HGPO is compared with are named in prose."""


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


LOO_DOC = 'docs/bias_variance.md, section "Proposition 4.1 with leave-one-out levels"'
"""Where the docs explain why the variance condition fails with group-mean baselines."""


def prop_checks(p: dict[str, Any]) -> list[dict[str, str]]:
    """Proposition 4.1's two conditions and two conclusions on one cell, each a chain of steps
    with its verdict (studies.verdict): the variance steps v_k - v_(k-1) carry paired 95%
    intervals, so "variance rises with k" holds only when every interval is above 0; the bias
    figures and HGPO's come without intervals on their differences, so those checks are
    "untested" (point figures only), with the measured direction of each step."""
    b, v, bH, vH, s = p["b"], p["v"], p["b_H"], p["v_H"], p["sum_w2"]
    K = len(b) - 1
    if K < 1:
        return []
    dvar = p.get("dvar") or []
    var_steps = (
        [Step(f"v_{k}", f"v_{k - 1}", d, ci=(lo, hi)) for k, (d, lo, hi) in enumerate(dvar, 1)]
        if len(dvar) == K
        else [Step(f"v_{k}", f"v_{k - 1}", v[k] - v[k - 1]) for k in range(1, K + 1)]
    )
    checks = [
        ("bias falls with k", [Step(f"b_{k - 1}", f"b_{k}", b[k - 1] - b[k]) for k in range(1, K + 1)]),
        ("variance rises with k", var_steps),
        (f"b_{K} <= b_H <= b_0", [Step("b_H", f"b_{K}", bH - b[K]), Step("b_0", "b_H", b[0] - bH)]),
        (f"sum w^2 v_0 <= v_H <= sum w^2 v_{K}",
         [Step("v_H", "sum w^2 v_0", vH - s * v[0]), Step(f"sum w^2 v_{K}", "v_H", s * v[K] - vH)]),
    ]  # fmt: skip
    out = []
    for name, steps in checks:
        status, text = ordering_verdict(steps, num="+.3g")
        out.append({"check": name, "status": status, "text": text,
                    "met_by_point_figures": all(st.diff >= 0 for st in steps)})  # fmt: skip
    return out


def _prop_consequence(checks: list[dict[str, Any]]) -> str:
    """What the proposition says about a cell, given its checks."""
    bias, var, *conclusions = checks
    if var["status"] == DOES_NOT_HOLD:
        return ("the variance condition does not hold (a step falls significantly), so the "
                "proposition makes no claim here")  # fmt: skip
    if var["status"] != HOLDS:
        return ("the variance condition is not shown (a step within noise or untested), so the "
                "proposition makes no claim here")  # fmt: skip
    if not bias["met_by_point_figures"]:
        return "the bias condition is not met by the point figures, so the proposition makes no claim here"  # fmt: skip
    if all(c["met_by_point_figures"] for c in conclusions):
        return "conditions met; both conclusions met by the point figures"
    return ("conditions met but a conclusion is not, by the point figures: the proposition treats "
            "the levels as independent; they share samples")  # fmt: skip


def _prop_text(props: list[dict[str, Any] | None]) -> str:
    out = [
        "Proposition 4.1 (per cell, on steps whose level-K group has >= 2 members). A check "
        "holds only when every step of it is significant: the variance steps have paired 95% "
        "intervals; the bias steps and HGPO's bounds have none (untested: point figures only). "
        f"Why the variance condition fails with group-mean baselines: {LOO_DOC}."
    ]
    for p in props:
        if p is None:
            continue
        b = ", ".join(f"{x:.3f}" for x in p["b"])
        v = ", ".join(f"{x:.3f}" for x in p["v"])
        out.append(
            f"  {p['env'].split(':')[0]} K={p['K']} {p['stage']}: b_k=[{b}] b_H={p['b_H']:.3f}; "
            f"v_k=[{v}] v_H={p['v_H']:.3f} (sum w^2={p['sum_w2']:.3f})"
        )
        checks = prop_checks(p)
        out += [f"    {c['check']}: {c['text']}" for c in checks]
        if checks:
            out.append(f"    {_prop_consequence(checks)}")
    return "\n".join(out)


def base_rows(rows: list[dict[str, Any]], norm: str) -> dict[tuple, list[dict[str, Any]]]:
    """Per cell (env, K, stage): the estimators' rows with ``norm``, without the alpha and depth
    sweeps (estimator names with "=")."""
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r["norm"] == norm and "=" not in r["estimator"]:
            out.setdefault((r["env"], r["K"], r["stage"]), []).append(r)
    return out


def best_counts(cells: dict[tuple, list[dict]], metric: str, lowest: bool) -> str:
    """Per estimator, e.g. "oracle in 3 of 4 cells, gae in 1 (its 95% interval clear of every
    other estimator's: oracle in 2, gae in 1)": the cells where its ``metric`` is the lowest (or
    highest), and in how many of them its interval overlaps no other estimator's (unpaired
    intervals: a conservative check)."""
    wins: dict[str, list[int]] = {}
    n = 0
    for rs in cells.values():
        rs = [r for r in rs if np.isfinite(r.get(metric, np.nan))]
        if len(rs) < 2:
            continue
        n += 1
        best = (min if lowest else max)(rs, key=lambda r: r[metric])
        others = [r for r in rs if r is not best]
        if lowest:
            clear = all(best[f"{metric}_hi"] < r[f"{metric}_lo"] for r in others)
        else:
            clear = all(best[f"{metric}_lo"] > r[f"{metric}_hi"] for r in others)
        w = wins.setdefault(best["estimator"], [0, 0])
        w[0] += 1
        w[1] += bool(clear)
    if not n:
        return "no cell with two estimators measured"
    order = sorted(wins.items(), key=lambda kv: -kv[1][0])
    head = ", ".join(f"{e} in {c}" + (f" of {n} cells" if i == 0 else "")
                     for i, (e, (c, _)) in enumerate(order))  # fmt: skip
    clear = ", ".join(f"{e} in {k}" for e, (_, k) in order)
    return f"{head} (its 95% interval clear of every other estimator's: {clear})"


def summary_lines(rows: list[dict[str, Any]], props: list[dict[str, Any] | None],
                  settings: dict[str, Any], versus: list[dict[str, Any]]) -> list[str]:  # fmt: skip
    """The report's opening: what the run found, computed from its rows, the HGPO comparisons
    (``versus``, :func:`versus_lines`) and Proposition 4.1's checks (a plain reading of the
    tables below)."""
    mean_cells = base_rows(rows, "mean")
    cells = sorted({(r["env"], r["K"], r["stage"]) for r in rows}, key=str)
    ests = list(dict.fromkeys(r["estimator"] for rs in mean_cells.values() for r in rs))
    md = [
        "## Summary",
        "",
        f"{len(cells)} cells. A cell is one environment, memory length K and policy stage: "
        f"environments {', '.join(settings['envs'])}; K = "
        f"{', '.join(str(k) for k in settings['Ks'])} (the policy's memory and HGPO's hierarchy "
        f"depth); policy stages {', '.join(_stage_name(x) for x in settings['stages'])} (the "
        "policy whose advantages are estimated: uniform, or one that imitates an expert until "
        f"it succeeds at that rate). {settings['n_batches']} batches of {settings['groups']} "
        f"groups x {settings['rollouts']} rollouts per cell, seed {settings['seed']}, "
        f"{settings['policy']} policy; {len(ests)} estimators. bias^2, variance and MSE are in "
        "squared reward units (norm = mean); intervals are 95%.",
        "",
        "### HGPO against GRPO and GiGPO",
        "",
        *versus_lines(versus),
        "",
        "### Proposition 4.1",
        "",
        *_prop_summary([p for p in props if p is not None], settings),
        "",
        "### Every estimator",
        "",
        f"The next three lines compare unpaired 95% intervals, not corrected for multiplicity "
        f"({len(ests)} estimators in each of {len(mean_cells)} cells): a description, not a test.",
        "",
        f"- Lowest MSE: {best_counts(mean_cells, 'mse', True)}.",
        f"- Lowest bias^2: {best_counts(mean_cells, 'bias2', True)}.",
        "- Highest gradient cosine (norm = mean_std, the paper's default): "
        f"{best_counts(base_rows(rows, 'mean_std'), 'grad_cos', False)}.",
        _negative_bias2_line(rows),
    ]
    critics = [e for e in ests if e in ESTIMATORS and "values" in estimator_reads(e)]
    if critics:
        one = len(critics) == 1
        md.append(f"- {', '.join(critics)} {'uses' if one else 'use'} the exact V as "
                  f"{'its' if one else 'their'} critic: an unbiased reference, not a critic-free "
                  f"method.")  # fmt: skip
    return [*md, ""]


PROP_CLAIM = (
    "Proposition 4.1: if |bias| falls and variance rises with the level k (its conditions), "
    "HGPO's bias lies between its deepest and its shallowest level's (b_K <= b_H <= b_0) and "
    "its variance between sum w_k^2 v_0 and sum w_k^2 v_K (its conclusions); checked per cell "
    "on the steps whose level-K group has >= 2 members."
)

GROUP_MEAN_REASON = (
    "with group-mean baselines a step's own return is in its group's mean, so the smaller deep "
    "groups shrink (x - mean) and the variance falls with k instead of rising"
)


def _var_counts(props: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """(cells checked, the variance condition's status in each)."""
    checks = [c for c in (prop_checks(p) for p in props) if c]
    return len(checks), [c[1]["status"] for c in checks]


def _status_counts(status: list[str]) -> str:
    """How many checks have each status, e.g. "holds in 1, does NOT hold in 3" (a status no
    check has is left out)."""
    return ", ".join(f"{w} in {status.count(w)}" for w in (HOLDS, NOT_SIGNIFICANT, DOES_NOT_HOLD)
                     if status.count(w))  # fmt: skip


def _prop_summary(props: list[dict[str, Any]], settings: dict[str, Any]) -> list[str]:
    """The summary's lines on Proposition 4.1 (see :func:`prop_checks`)."""
    checks = [c for c in (prop_checks(p) for p in props) if c]
    n, var = _var_counts(props)
    if not n:
        return ["- Proposition 4.1: no cell with K >= 1 and HGPO measured on the common support."]
    counts = _status_counts(var)
    md = [f"- {PROP_CLAIM}",
          "- Its variance condition (the variance of A_k rises with k; paired 95% intervals of "
          f"each step v_k - v_(k-1)), of {n} cells: {counts}."]  # fmt: skip
    loo = (
        "leave_one_out=true" in str(settings.get("estimator_options", "")).replace(" ", "").lower()
    )
    if var.count(DOES_NOT_HOLD) == n and not loo:
        md.append(f"  So the proposition makes no claim in any of these {n} cells. This is "
                  f"expected: {GROUP_MEAN_REASON}. It says nothing against HGPO's estimate (its "
                  f"MSE is compared above); see {LOO_DOC}.")  # fmt: skip
    elif var.count(HOLDS) < n:
        md.append(f"  Where it does not hold the proposition makes no claim; see {LOO_DOC}.")
    met = [sum(c[i]["met_by_point_figures"] for c in checks) for i in (0, 2, 3)]
    md.append(f"- By the point figures (no interval): bias falls with k in {met[0]} of {n} cells; "
              f"HGPO's bias lies between b_K and b_0 in {met[1]}; its variance within "
              f"sum w^2 v_0 .. sum w^2 v_K in {met[2]}. Every cell's checks: the section "
              f"Proposition 4.1 below.")  # fmt: skip
    return md


def terminal_lines(versus: list[dict[str, Any]], props: list[dict[str, Any] | None]) -> list[str]:
    """What the study prints when it ends: the HGPO comparisons and one line on Proposition
    4.1 (its per-cell checks are in report.md only)."""
    n, var = _var_counts([p for p in props if p is not None])
    lines = versus_lines(versus)
    if not n:
        return [*lines, "Proposition 4.1: not checked (no cell with K >= 1 and hgpo measured)."]
    line = f"Proposition 4.1: its variance condition, of {n} cells: {_status_counts(var)}"
    if var.count(HOLDS) < n:
        line += ("; where it does not hold the proposition makes no claim (expected with "
                 "group-mean baselines: a step's own return is in its group's mean)")  # fmt: skip
    return [*lines, line + "; every cell's checks are in report.md."]


def _versus_family(versus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons of every cell with their Holm-adjusted p ("p_holm"), Holm over the
    whole family (every cell x estimator x figure with a test)."""
    adj = holm([v["p"] for v in versus])
    return [dict(v, p_holm=q) for v, q in zip(versus, adj, strict=True)]


def versus_lines(versus: list[dict[str, Any]]) -> list[str]:
    """How HGPO compares with GRPO and GiGPO (studies.bias_variance: ``_versus``): per figure
    and estimator, hgpo minus it averaged over the cells (the cells are independent: half-width
    sqrt(sum h_c^2) / C), and the cells where it is significantly better, worse or within
    noise by the paired t-test of the cell's batches, Holm-corrected over the whole family."""
    fam = _versus_family(versus)
    if not fam:
        return ["HGPO against GRPO and GiGPO: not measured in this run (it needs hgpo and grpo "
                "or gigpo in --estimators)."]  # fmt: skip
    cells = {(v["env"], v["K"], v["stage"]) for v in fam}
    tested = sum(1 for v in fam if not math.isnan(v["p_holm"]))
    others = list(dict.fromkeys(v["other"] for v in fam))
    figs = list(dict.fromkeys(v["figure"] for v in fam))
    lines = [
        f"HGPO against {' and '.join(NAMES.get(o, o) for o in others)} ({len(cells)} cells): "
        "hgpo minus the other, batch by batch in each cell (both ran on "
        "the same batches); the mean over the cells with its 95% interval; a cell counts as "
        f"better or worse when its paired t-test over the batches has p < {ALPHA} after a Holm "
        f"correction over the family of all {tested} such tests ({len(cells)} cells x "
        f"{len(others)} estimators x {len(figs)} figures)."
    ]
    for fig in figs:
        name, lower = VERSUS_NAMES[fig]
        parts = []
        for other in others:
            sub = [v for v in fam if v["figure"] == fig and v["other"] == other]
            parts.append(f"vs {other} {_pooled(sub).strip()}: {_cell_counts(sub, lower)}")
        lines.append(f"- {name}: " + "; ".join(parts) + ".")
    return lines


def _pooled(sub: list[dict[str, Any]]) -> str:
    """The mean of the cells' differences with its 95% interval, e.g. "-1.2 [-1.4, -1.0]"."""
    d = np.array([v["diff"] for v in sub], dtype=np.float64)
    h = np.array([(v["hi"] - v["lo"]) / 2 for v in sub], dtype=np.float64)
    ok = np.isfinite(d)
    if not ok.any():
        return "not measured"
    m = float(d[ok].mean())
    if not np.isfinite(h[ok]).all():
        return f"{m:+.3g} (no interval)"
    hw = float(np.sqrt((h[ok] ** 2).sum()) / ok.sum())
    return f"{m:+.3g} [{m - hw:+.3g}, {m + hw:+.3g}]"


def _cell_counts(sub: list[dict[str, Any]], lower: bool) -> str:
    """E.g. "hgpo better in 8 of 12 cells, worse in 0, within noise in 4" (by Holm p < ALPHA)."""
    better = worse = noise = untested = 0
    for v in sub:
        if math.isnan(v["p_holm"]):
            untested += 1
        elif v["p_holm"] >= ALPHA:
            noise += 1
        elif (v["diff"] < 0) == lower:
            better += 1
        else:
            worse += 1
    text = f"hgpo better in {better} of {len(sub)} cells, worse in {worse}, within noise in {noise}"
    return text + (f", untested in {untested}" if untested else "")


def _versus_table(fam: list[dict[str, Any]]) -> list[str]:
    """The report's per-cell table of the HGPO comparisons (``fam``: with their Holm p)."""
    if not fam:
        return []
    md = ["## HGPO against GRPO and GiGPO, per cell", "",
          "hgpo minus the other, mean over the cell's batches with its paired 95% t interval; "
          "p: paired t-test; Holm p: corrected over every row of this table (* < 0.05).", "",
          "| env | K | stage | against | figure (norm) | hgpo - other | p | Holm p |",
          "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in fam:
        star = " *" if v["p_holm"] < ALPHA else ""
        md.append(f"| {v['env'].split(':')[0]} | {v['K']} | {v['stage']} | {v['other']} | "
                  f"{v['figure']} ({v['norm']}) | {_fmt(v['diff'])} [{_fmt(v['lo'])}, "
                  f"{_fmt(v['hi'])}] | {v['p']:.2g} | {v['p_holm']:.2g}{star} |")  # fmt: skip
    return [*md, ""]


def _negative_bias2_line(rows: list[dict[str, Any]]) -> str:
    """What a bias^2 below 0 means, with how many rows have one."""
    neg = [r for r in rows if r["norm"] == "mean" and r.get("bias2", math.nan) < 0]
    head = ("- bias^2 is the MSE minus the unbiased variance: an unbiased estimate of a squared "
            "bias, which can come out below 0 when the true bias is about 0; read such a value as "
            "0 within its interval.")  # fmt: skip
    if not neg:
        return head + " No row here has one."
    low = min(neg, key=lambda r: r["bias2"])
    return (f"{head} {len(neg)} of {sum(r['norm'] == 'mean' for r in rows)} rows here have one "
            f"(the lowest {low['bias2']:.2g}, {low['estimator']} on {low['env'].split(':')[0]} "
            f"K={low['K']} {_stage_name(low['stage'])}).")  # fmt: skip


def _stage_name(stage: Any) -> str:
    """How a policy stage reads in a legend: "untrained (uniform)", "success stage 0.3" (the
    success rate the imitation targeted), or "snapshot NAME"."""
    text = str(stage)
    if text == "untrained":
        return "untrained (uniform)"
    try:
        float(text)
    except ValueError:
        return f"snapshot {Path(text).name}"
    return f"success stage {text}"


LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))
"""(marker, linestyle) of each K, so that lines of the same stage at different K (e.g. the
untrained ones, which lie on top of each other) stay apart."""


def _line_style(cells: list[tuple], K: int, stage: Any) -> dict[str, Any]:
    """Colour per stage, marker and line style per K (open markers: overlaps stay visible)."""
    Ks = sorted({c[1] for c in cells})
    stages = sorted({str(c[2]) for c in cells})
    marker, ls = LINE_STYLES[Ks.index(K) % len(LINE_STYLES)]
    return {"color": f"C{stages.index(str(stage)) % 10}", "marker": marker, "linestyle": ls,
            "markerfacecolor": "none", "label": f"K={K}, {_stage_name(stage)}"}  # fmt: skip


def _y_scale(ax: Any, values: list[float], what: str) -> None:
    """A log y axis when every value is > 0 (the untrained cells' figures are ~100x smaller
    than the trained ones' and would lie flat on 0), linear otherwise; the label says which."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    log = v.size > 0 and bool((v > 0).all())
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(f"{what} ({'log scale' if log else 'linear scale: a value <= 0'})")


def _legend_outside(ax: Any, **kw: Any) -> None:
    """The legend to the right of ``ax``, so that it covers no line or bar."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def _integer_x(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def figures(rows: list[dict[str, Any]], levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The study's figures (file name -> matplotlib Figure), not yet saved."""
    import matplotlib

    matplotlib.use("Agg")
    cells = sorted({(r["env"], r["K"], r["stage"]) for r in rows}, key=str)
    envs = sorted({c[0] for c in cells})
    return {
        "bias_variance_vs_k.png": _fig_vs_k(cells, envs, levels),
        "mse_and_gradient.png": _fig_mse_and_gradient(cells, rows),
        "group_sizes.png": _fig_group_sizes(envs, levels),
        "mse_vs_alpha_and_K.png": _fig_alpha_and_K(cells, rows),
    }


def _plots(out: Path, rows: list[dict[str, Any]], levels: list[dict[str, Any]]) -> list[str]:
    """The study's figures under ``out``; returns their file names."""
    import matplotlib.pyplot as plt

    names = []
    for name, fig in figures(rows, levels).items():
        fig.tight_layout()
        save_figure(fig, out / name, dpi=110, bbox_inches="tight")  # the legends outside included
        plt.close(fig)
        names.append(name)
    return names


def _fig_vs_k(cells: list[tuple], envs: list[str], levels: list[dict]) -> Any:
    """bias^2 and variance against k (Prop 4.1's picture), per env, a line per (K, stage)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.4 * len(envs)), squeeze=False)
    for i, env in enumerate(envs):
        for K in sorted({c[1] for c in cells if c[0] == env}):
            for stage in sorted({c[2] for c in cells if c[0] == env and c[1] == K}, key=str):
                lv = [r for r in levels if r["env"] == env and r["K"] == K and r["stage"] == stage]
                ks = [r["level"] for r in lv]
                style = _line_style(cells, K, stage)
                axes[i, 0].plot(ks, [r["bias2"] for r in lv], **style)
                axes[i, 1].plot(ks, [r["variance"] for r in lv], **style)
        mine = [r for r in levels if r["env"] == env]
        for ax, key, what in (
            (axes[i, 0], "bias2", "bias$^2$"),
            (axes[i, 1], "variance", "variance"),
        ):
            ax.set_title(f"{env.split(':')[0]}: {what} of $A_k$ (common support)", fontsize=10)
            ax.set_xlabel("level k of the hierarchy")
            _integer_x(ax)
            _y_scale(ax, [r[key] for r in mine], f"{what} (reward$^2$)")
        _legend_outside(axes[i, 1])
    return fig


def _fig_mse_and_gradient(cells: list[tuple], rows: list[dict]) -> Any:
    """MSE and gradient cosine per estimator, per cell."""
    import matplotlib.pyplot as plt

    ests = [r["estimator"] for r in rows if r["norm"] == "mean" and "=" not in r["estimator"]]
    ests = list(dict.fromkeys(ests))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.4 * len(cells)) + 1.5, 7.5))
    width = 0.8 / max(len(ests), 1)
    index = {(r["env"], r["K"], r["stage"], r["estimator"], r["norm"]): r for r in rows}
    for j, est in enumerate(ests):
        mse = [index.get((*c, est, "mean"), {}).get("mse", np.nan) for c in cells]
        cos = [index.get((*c, est, "mean_std"), {}).get("grad_cos", np.nan) for c in cells]
        x = np.arange(len(cells)) + j * width
        axes[0].bar(x, mse, width, label=est)
        axes[1].bar(x, cos, width, label=est)
    labels = [f"{c[0].split(':')[0]} K={c[1]}\n{_stage_name(c[2])}" for c in cells]
    for ax in axes:
        ax.set_xticks(np.arange(len(cells)) + 0.4 - width / 2, labels, fontsize=7)
        ax.set_xlabel("cell (environment, K, policy stage)")
    axes[0].set_title("MSE of each estimator against A* (norm=mean)", fontsize=10)
    _y_scale(axes[0], [r.get("mse", np.nan) for r in rows if r["norm"] == "mean"],
             "MSE (reward$^2$)")  # fmt: skip
    axes[1].set_title("cosine of the batch gradient with the exact gradient (norm=mean_std)",
                      fontsize=10)  # fmt: skip
    axes[1].set_ylabel("cosine (1 = same direction)")
    _legend_outside(axes[0], title="estimator")
    for ax, metric, norm in ((axes[0], "mse", "mean"), (axes[1], "grad_cos", "mean_std")):
        missing = _missing(ests, [r for r in rows if r["norm"] == norm], metric, norm)
        if missing:  # said on the panel, to the right of it (where axes[0] has its legend)
            ax.text(1.01, 0.0 if ax is axes[0] else 1.0, "not shown (no bar):\n" + "\n".join(missing),
                    transform=ax.transAxes, va="bottom" if ax is axes[0] else "top",
                    fontsize=7)  # fmt: skip
    return fig


def _missing(ests: list[str], rows: list[dict], metric: str, norm: str) -> list[str]:
    """A line such as "gae: not measured with norm=mean_std (n/a)" for each estimator of
    ``ests`` with no finite ``metric`` among ``rows`` (those of one norm)."""
    out = []
    for est in ests:
        mine = [r for r in rows if r["estimator"] == est]
        if not mine:
            out.append(f"{est}: not measured with norm={norm} (n/a)")
        elif not any(np.isfinite(r.get(metric, np.nan)) for r in mine):
            out.append(f"{est}: no finite {metric} (NaN)")
    return out


def _fig_group_sizes(envs: list[str], levels: list[dict]) -> Any:
    """The group-size distribution per level (share of steps in groups of each size)."""
    import matplotlib.pyplot as plt

    Kmax = max(r["K"] for r in levels) if levels else 0
    lv = [r for r in levels if r["K"] == Kmax]
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 3.6), squeeze=False)
    for i, env in enumerate(envs):
        stage = sorted({r["stage"] for r in lv if r["env"] == env}, key=str)[0] if lv else None
        for r in (x for x in lv if x["env"] == env and x["stage"] == stage):
            h = np.asarray(r["size_hist"])
            axes[0, i].plot(np.arange(h.size), h, "o-", ms=3,
                            label=f"level {r['level']} (utilisation {r['utilisation']:.2f})")  # fmt: skip
        axes[0, i].set_title(f"{env.split(':')[0]} K={Kmax}, {_stage_name(stage)}: group sizes",
                             fontsize=10)  # fmt: skip
        axes[0, i].set_xlabel("group size (steps sharing the level's key)")
        axes[0, i].set_ylabel("share of steps")
        _integer_x(axes[0, i])
        _legend_outside(axes[0, i])
    return fig


def _fig_alpha_and_K(cells: list[tuple], rows: list[dict]) -> Any:
    """HGPO's MSE against alpha and against the depth it uses (norm=mean): a row of panels per
    environment (its name in each title), a line per (K, stage) as in bias_variance_vs_k.png,
    so that no two environments' lines share a panel, a colour or a legend entry."""
    import matplotlib.pyplot as plt

    envs = sorted({c[0] for c in cells})
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.8 * len(envs)), squeeze=False)
    for i, env in enumerate(envs):
        shown: list[float] = []
        for c in (c for c in cells if c[0] == env):
            sub = {r["estimator"]: r.get("mse", np.nan) for r in rows
                   if (r["env"], r["K"], r["stage"]) == c and r["norm"] == "mean"}  # fmt: skip
            al = sorted(
                (float(k.split("=")[1]), v) for k, v in sub.items() if k.startswith("alpha=")
            )
            ks = sorted((int(k.split("=")[1]), v) for k, v in sub.items() if k.startswith("K="))
            style = _line_style(cells, c[1], c[2])
            if al:
                axes[i, 0].plot(*zip(*al, strict=True), **style)
            if ks:
                axes[i, 1].plot(*zip(*ks, strict=True), **style)
            shown += [v for _, v in al + ks]
        name = env.split(":")[0]
        axes[i, 0].set_xlabel("alpha (HGPO's level weights (k + 1)^alpha)")
        axes[i, 1].set_xlabel("hierarchy depth k' used by HGPO (levels 0..k')")
        _integer_x(axes[i, 1])
        for ax in axes[i]:
            _y_scale(ax, shown, "MSE of HGPO (reward$^2$)")
        axes[i, 0].set_title(f"{name}: HGPO's MSE against alpha (norm=mean)", fontsize=10)
        axes[i, 1].set_title(f"{name}: HGPO's MSE against its depth (norm=mean)", fontsize=10)
        _legend_outside(axes[i, 1], title="\n".join(textwrap.wrap(env.replace(",", ", "), 34)))
    return fig


def write_results(cfg: Any, results: list[dict[str, Any]]) -> dict[str, Any]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for res in results for r in res["rows"]]
    levels = [r for res in results for r in res["levels"]]
    props = [res["prop41"] for res in results]
    versus = _versus_family([v for res in results for v in res["versus"]])
    write_csv(out / "results.csv", rows)
    write_csv(out / "levels.csv", levels)
    settings = asdict(cfg)
    atomic_write_text(
        out / "results.json",
        json.dumps(
            {
                "settings": settings,
                "rows": rows,
                "levels": levels,
                "prop41": props,
                "prop41_checks": [None if p is None else prop_checks(p) for p in props],
                "versus": versus,
            },
            indent=1,
            default=float,
        ),
    )
    table = _table(rows)
    prop_text = _prop_text(props)
    files = _plots(out, rows, levels)
    md = ["# Bias/variance study", "", *summary_lines(rows, props, settings, versus),
          "## Settings", "", "`" + json.dumps({k: v for k, v in settings.items() if k != "extra"}) + "`", "",
          "## Every estimator (norm=mean; cos* = norm=mean_std)", "",
          "```", table, "```", "", *_versus_table(versus),
          "## Proposition 4.1", "", "```", prop_text, "```", "", "## Per level (HGPO, norm=mean)", "",
          "| env | K | stage | level | utilisation | mean group size | bias2 | variance | mse | bias2 (all steps) | variance (all) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in levels:
        md.append(
            f"| {r['family']} | {r['K']} | {r['stage']} | {r['level']} | {r['utilisation']:.3f} | "
            f"{r['mean_group_size']:.2f} | {_fmt(r['bias2'])} | {_fmt(r['variance'])} | {_fmt(r['mse'])} | "
            f"{_fmt(r['bias2_all'])} | {_fmt(r['variance_all'])} |"
        )
    md += [""] + [f"![{f}]({f})" for f in files]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return {"table": table, "prop41_text": prop_text, "rows": rows, "levels": levels,
            "terminal": "\n".join(terminal_lines(versus, props))}  # fmt: skip
