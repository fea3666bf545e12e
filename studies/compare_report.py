"""Writes studies.compare's results folder: the one table, the differences to the baseline, the
training tests, the plain summary that opens report.md, and the plots.

How the figures are made:

- **bias^2, variance, MSE, sign agreement, gradient cosine** of a table or network policy: the
  bias/variance study's per-cell figures (norm = mean: reward units; gradient cosine of the
  batch gradient with the exact undiscounted one), each with its 95% interval, averaged over
  the cells: mean m = (1/C) sum_c m_c with the half-width h = sqrt(sum_c h_c^2) / C (the
  cells are independent draws). An estimator's difference to the baseline is averaged the
  same way, per cell d_c = m_c - b_c with h_c = sqrt(h_{m,c}^2 + h_{b,c}^2): both are measured
  on the same batches, whose positive correlation this ignores, so the difference's interval
  is conservative (too wide, never too narrow). A cell counts for an estimator's figure only
  where the figure is finite and its advantages were not all zero (:func:`all_zero`: e.g.
  gigpo_dynamic's filter dropping every group of an untrained cell); the summary names such
  cells, table.csv gives each figure's count (``{m}_n`` of ``units``), and an estimator is
  ranked only when measured in every cell where any was, so that every mean ranked, and every
  lead (paired over cells), is over the same cells;
- the **LLM policy**'s figures are every truth batch's (hgpo.train's truth monitor) pooled over
  the batches of every run, mean and 95% t-interval; its differences are paired batch by batch;
- **auc** (learning speed): per run the mean train-task success over the evaluations after
  iteration 0 (studies.train_toy_report.summarise); per seed the mean over the environments;
  mean and 95% t-interval over seeds; each estimator against the baseline by Welch's t-test,
  Holm-corrected over the estimators (studies.train_toy_report.compare: statsmodels), also per
  environment.

A claim "holds" only when significant (studies.verdict): an interval of the difference clear
of 0, or a Holm-corrected p < 0.05.

**Units.** bias^2, variance and MSE compare an estimate with A* in reward units, which is fair
only for an estimator whose advantages are deviations of the env's own step returns. Some are
not: GraphGPO's returns are 10 gamma^d of a graph distance, 3SPO's a shaped reward. Each
estimator is probed once (:func:`in_reward_units`: are its ``returns`` the env's
``hgpo.step_returns`` on a small toy batch?); the summary ranks bias^2, variance and MSE among
the estimators in reward units only and names the others, whose scale-free figures (sign
agreement, gradient cosine) are the ones to compare. The table shows every figure.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hgpo import compute_advantages, step_returns
from hgpo.estimator_registry import get_spec
from studies.bias_variance_report import base_rows, best_counts
from studies.compare_guard import CellTimeout, EstimatorError, bounded
from studies.io import atomic_write_text, write_csv
from studies.metrics import mean_ci
from studies.train_toy_report import compare
from studies.verdict import (
    DOES_NOT_HOLD,
    HOLDS,
    NOT_SIGNIFICANT,
    UNTESTED,
    Step,
    holm,
    ordering_verdict,
    p_from_interval,
)

__all__ = ["METRICS", "RESULTS", "Figure", "write_report"]

RESULTS = ("table.csv", "table.md", "diffs.csv", "tests.csv", "results.json", "report.md")
"""Files of a results folder that another run would replace (the sub-studies' folders are
keyed by their settings)."""

METRICS = (
    ("bias2", "bias²", True),
    ("variance", "variance", True),
    ("mse", "MSE", True),
    ("sign", "sign agreement", False),
    ("grad_cos", "gradient cosine", False),
)
"""(column, name, lower is better) of the bias/variance figures."""

UNIT_METRICS = ("bias2", "variance", "mse")
"""The figures in reward units, ranked among the estimators in reward units only."""


@functools.cache
def in_reward_units(name: str) -> bool:
    """Whether estimator ``name``'s advantages are deviations of the env's step returns: its
    ``returns`` equal ``hgpo.step_returns`` (norm = mean, gae_lambda = 1 as the studies run
    it) on a fixed toy batch (keydoor 4x4, a random table policy, 4 groups x 4 rollouts), with
    the inputs it reads from studies.step_inputs (values 0)."""
    import toyenvs
    from hgpo import EstimatorConfig
    from studies.step_inputs import StepInputs

    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=0)
    rb = toyenvs.rollout(env, pol, env.tasks[:4], 4, 0)
    cfg = EstimatorConfig(K=2, norm="mean", gae_lambda=1.0)
    inputs = StepInputs(env, rb, np.zeros(rb.n_steps), lambda: pol.probs(rb.context))
    what = f"the reward-units probe of estimator {name!r}"
    try:
        out = bounded(functools.partial(compute_advantages, **inputs.of(name)), what, name,
                      rb.batch, cfg)  # fmt: skip
    except CellTimeout:
        raise
    except Exception as exc:
        raise EstimatorError(f"estimator {name!r} raised {type(exc).__name__}: {exc}") from exc
    return bool(np.allclose(out.returns, step_returns(rb.batch, cfg), rtol=1e-9, atol=1e-12))


ALPHA = 0.05


@dataclass(frozen=True)
class Figure:
    """A mean with its 95% interval, from ``n`` cells, batches or seeds."""

    value: float
    lo: float
    hi: float
    n: int

    def text(self, num: str = ".3g") -> str:
        if not math.isfinite(self.value):
            return "-"
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return f"{self.value:{num}}"
        return f"{self.value:{num}} [{self.lo:{num}}, {self.hi:{num}}]"

    @property
    def significant(self) -> bool:
        """The interval is clear of 0 (for a difference)."""
        return bool(self.lo > 0 or self.hi < 0)


NAN = Figure(math.nan, math.nan, math.nan, 0)


# ----------------------------------------------------------------------------- pooling


def _half(r: dict[str, Any], m: str) -> float:
    lo, hi = r.get(f"{m}_lo", math.nan), r.get(f"{m}_hi", math.nan)
    return (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else math.nan


def _pool(pairs: list[tuple[float, float]]) -> Figure:
    """The mean of independent figures (value, half-width): half-width sqrt(sum h^2) / n."""
    if not pairs:
        return NAN
    v = np.array([p[0] for p in pairs])
    h = np.array([p[1] for p in pairs])
    m = float(v.mean())
    hw = float(np.sqrt((h**2).sum()) / v.size) if np.isfinite(h).all() else math.nan
    return Figure(m, m - hw, m + hw, int(v.size))


def all_zero(r: dict[str, Any]) -> bool:
    """Whether a cell's (or a truth batch's) figures say the estimator's advantages were 0 at
    every step: variance exactly 0 and no batch with a policy gradient (its gradient cosine is
    NaN: the mean over no batch). gigpo_dynamic's filter does this where every group's returns
    tie (an untrained policy that never succeeds): such a cell is not a measurement of its
    error, and it is left out of the estimator's figures and reported as such."""
    return r.get("variance") == 0 and not math.isfinite(r.get("grad_cos", math.nan))


def _cells(rows: list[dict[str, Any]], est: str) -> dict[tuple, dict[str, Any]]:
    """(env, K, stage) -> the estimator's norm = mean row."""
    return {(r["env"], r["K"], r["stage"]): r for r in rows
            if r["estimator"] == est and r["norm"] == "mean"}  # fmt: skip


def cell_units(rows: list[dict[str, Any]], est: str, m: str) -> dict[tuple, tuple[float, float]]:
    """The cells where ``est``'s figure ``m`` was measured: finite, and not a cell of all-zero
    advantages (:func:`all_zero`); cell -> (value, half-width)."""
    return {c: (r[m], _half(r, m)) for c, r in _cells(rows, est).items()
            if math.isfinite(r.get(m, math.nan)) and not all_zero(r)}  # fmt: skip


def cell_figure(rows: list[dict[str, Any]], est: str, m: str) -> Figure:
    """``m`` of ``est`` averaged over the cells where it was measured (:func:`cell_units`; n
    says how many; see the module docstring)."""
    return _pool(list(cell_units(rows, est, m).values()))


def cell_diff(rows: list[dict[str, Any]], est: str, base: str, m: str) -> Figure:
    """``m`` of ``est`` minus the baseline's, averaged over the cells where both were measured
    (paired: the same cells on both sides; n says how many), with the conservative interval of
    the module docstring."""
    a, b = cell_units(rows, est, m), cell_units(rows, base, m)
    return _pool([(a[c][0] - b[c][0], math.hypot(a[c][1], b[c][1])) for c in a if c in b])


def _batches(llm: dict[str, Any]) -> list[dict[str, Any]]:
    """Every logged truth row of every LLM run."""
    return [r for seeds in llm["data"].values() for rows in seeds for r in rows if "truth/J" in r]


def _ci(x: list[float]) -> Figure:
    a = np.asarray([v for v in x if math.isfinite(v)], dtype=np.float64)
    if a.size == 0:
        return NAN
    m, lo, hi = mean_ci(a)
    return Figure(m, lo, hi, int(a.size))


def _llm_row(r: dict[str, Any], est: str) -> dict[str, float]:
    return {m: r.get(f"truth/{est}/{m}", math.nan) for m, _, _ in METRICS}


def llm_units(batches: list[dict[str, Any]], est: str, m: str) -> dict[int, float]:
    """The truth batches (by index) where ``est``'s figure ``m`` was measured: finite, and not
    all-zero advantages (:func:`all_zero`); batch -> value."""
    out = {}
    for i, r in enumerate(batches):
        row = _llm_row(r, est)
        if math.isfinite(row[m]) and not all_zero(row):
            out[i] = row[m]
    return out


def llm_figure(batches: list[dict[str, Any]], est: str, m: str) -> Figure:
    return _ci(list(llm_units(batches, est, m).values()))


def llm_diff(batches: list[dict[str, Any]], est: str, base: str, m: str) -> Figure:
    """Paired batch by batch over the batches where both were measured: mean and 95%
    t-interval of est's figure minus the baseline's."""
    a, b = llm_units(batches, est, m), llm_units(batches, base, m)
    return _ci([a[i] - b[i] for i in a if i in b])


def units(p: str, bv: dict, batches: list[dict[str, Any]], est: str, m: str) -> set:
    """The cells (toy policy ``p``) or truth batches (``p`` = "llm") where ``est``'s ``m`` was
    measured."""
    return set(llm_units(batches, est, m) if p == "llm" else cell_units(bv[p], est, m))


def zero_units(p: str, bv: dict, batches: list[dict[str, Any]], est: str) -> int:
    """How many cells (truth batches) held all-zero advantages of ``est``."""
    if p == "llm":
        return sum(all_zero(_llm_row(r, est)) for r in batches)
    return sum(all_zero(r) for r in _cells(bv[p], est).values())


def n_units(p: str, bv: dict, batches: list[dict[str, Any]]) -> int:
    """The policy's cells (or the LLM's truth batches): what "measured in n of N" counts."""
    if p == "llm":
        return len(batches)
    return len({(r["env"], r["K"], r["stage"]) for r in bv[p] if r["norm"] == "mean"})


# ----------------------------------------------------------------------------- learning speed


def _seed_auc(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (estimator, seed): auc averaged over the environments, env "all envs"."""
    acc: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        acc.setdefault((r["label"], r["seed"]), []).append(r["auc_train"])
    return [{"env": "all envs", "label": lab, "seed": s, "auc_train": float(np.mean(v))}
            for (lab, s), v in acc.items()]  # fmt: skip


def auc_tests(rows: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    """Welch + Holm of every estimator against ``base``: pooled over the environments (per
    seed), then per environment (when there are several)."""
    pooled = compare(_seed_auc(rows), "auc_train", base)
    return pooled + (compare(rows, "auc_train", base) if len({r["env"] for r in rows}) > 1 else [])


def auc_figure(rows: list[dict[str, Any]], est: str, env: str = "all envs") -> Figure:
    src = _seed_auc(rows) if env == "all envs" else rows
    return _ci([r["auc_train"] for r in src if r["label"] == est and r["env"] == env])


# ----------------------------------------------------------------------------- the table


def _policy_label(policy: str, cfg: Any) -> str:
    return f"llm ({cfg.llm_env})" if policy == "llm" else policy


def build_table(cfg: Any, bv: dict, tt: dict, llm: dict | None) -> tuple[list[dict], list[dict],
                                                                        list[dict]]:  # fmt: skip
    """(table rows, difference rows, auc tests): one row per (policy, estimator)."""
    ests, base = cfg.estimator_names(), cfg.baseline
    batches = _batches(llm) if llm else []
    policies = [*cfg.policies, *(["llm"] if llm else [])]
    table, diffs, tests = [], [], []
    for p in policies:
        t_tests = auc_tests(tt[p], base) if p in tt else []
        tests += [{"policy": p, **t} for t in t_tests]
        pooled = {t["label"]: t for t in t_tests if t["env"] == "all envs"}
        for e in ests:
            table.append(_table_row(cfg, p, e, bv, batches))
            row = table[-1]
            for m, _, _ in METRICS:
                if e == base:
                    continue
                d = llm_diff(batches, e, base, m) if p == "llm" else cell_diff(bv[p], e, base, m)
                diffs.append({"policy": row["policy"], "estimator": e, "baseline": base,
                              "metric": m, "diff": d.value, "lo": d.lo, "hi": d.hi,
                              "n": d.n, "significant": d.significant,
                              "evidence": "paired 95% t-interval over batches" if p == "llm"
                              else "conservative 95% interval over cells"})  # fmt: skip
            if p in tt:
                f = auc_figure(tt[p], e)
                t = pooled.get(e, {})
                row.update(auc=f.value, auc_lo=f.lo, auc_hi=f.hi, seeds=f.n,
                           auc_diff=t.get("diff", math.nan), auc_p=t.get("p", math.nan),
                           auc_p_holm=t.get("p_holm", math.nan))  # fmt: skip
    _holm_by_policy(diffs)
    return table, diffs, tests


def _holm_by_policy(diffs: list[dict[str, Any]]) -> None:
    """Each difference's p (two-sided, read off its 95% interval: studies.verdict.p_from_interval)
    and its Holm-adjusted p over its policy's family (every estimator x metric against the
    baseline); ``significant`` is the Holm p < ALPHA, not the bare interval clear of 0."""
    for policy in dict.fromkeys(d["policy"] for d in diffs):
        fam = [d for d in diffs if d["policy"] == policy]
        ps = [p_from_interval(d["diff"], d["lo"], d["hi"]) for d in fam]
        for d, p, q in zip(fam, ps, holm(ps), strict=True):
            d.update(
                p=p,
                p_holm=q,
                family=len([x for x in ps if not math.isnan(x)]),
                significant=bool(q < ALPHA),
            )  # a NaN p is never significant


def _table_row(cfg: Any, p: str, e: str, bv: dict, batches: list[dict]) -> dict[str, Any]:
    """One estimator's figures on policy ``p``, each over the cells (truth batches) where it was
    measured: ``{m}_n`` of them for figure m, ``n`` for all (the cells of its row), of
    ``units`` in all; ``zero_cells`` of them held all-zero advantages (left out)."""
    spec = get_spec(e) if _registered(e) else None
    row: dict[str, Any] = {"policy": _policy_label(p, cfg), "estimator": e,
                           "origin": spec.origin if spec else "?",
                           "reads": " ".join(spec.reads) if spec else "",
                           "reward_units": in_reward_units(e)}  # fmt: skip
    every: set | None = None
    for m, _, _ in METRICS:
        f = llm_figure(batches, e, m) if p == "llm" else cell_figure(bv[p], e, m)
        row.update({m: f.value, f"{m}_lo": f.lo, f"{m}_hi": f.hi, f"{m}_n": f.n})
        u = units(p, bv, batches, e, m)
        every = u if every is None else every & u
    row.update(n=len(every or ()), units=n_units(p, bv, batches),
               zero_cells=zero_units(p, bv, batches, e))  # fmt: skip
    return row


def _registered(name: str) -> bool:
    try:
        get_spec(name)
    except ValueError:
        return False
    return True


def _fig(r: dict[str, Any], m: str) -> Figure:
    return Figure(r.get(m, math.nan), r.get(f"{m}_lo", math.nan), r.get(f"{m}_hi", math.nan), 0)


def _of(n: int | None, r: dict[str, Any]) -> str:
    """`` (n = 10 of 12)`` after a figure measured in fewer than all of the policy's cells."""
    total = r.get("units")
    return f" (n = {n} of {total})" if n is not None and total and n < total else ""


def _row(r: dict[str, Any], cells: list[str]) -> str:
    """A markdown row: policy, estimator (with † when not in reward units, ‡ with all-zero
    advantages in some cell), the cells."""
    mark = ("" if r.get("reward_units", True) else " †") + (" ‡" if r.get("zero_cells") else "")
    return f"| {r['policy']} | {r['estimator']}{mark} | " + " | ".join(cells) + " |"


def _dagger_note(table: list[dict[str, Any]]) -> list[str]:
    """The footnotes for † and ‡ rows, when there are any."""
    notes = []
    if not all(r.get("reward_units", True) for r in table):
        notes.append("† not in reward units: its bias², variance and MSE are not comparable "
                     "with the others' (see the summary).")  # fmt: skip
    zero = [f"{r['estimator']} ({r['policy']}: {r['zero_cells']} of {r['units']})" for r in table
            if r.get("zero_cells")]  # fmt: skip
    if zero:
        notes.append("‡ all-zero advantages (0 at every step: no error or gradient to measure) "
                     f"in some cells or truth batches, left out of its figures: {', '.join(zero)}"
                     "; n = the cells a figure is over, where fewer than all.")  # fmt: skip
    return ["", *notes] if notes else []


def table_md(table: list[dict[str, Any]], base: str) -> str:
    heads = [name for _, name, _ in METRICS] + ["auc", f"auc − {base} (Holm p)"]
    lines = ["| policy | estimator | " + " | ".join(heads) + " |",
             "|---" * (len(heads) + 2) + "|"]  # fmt: skip
    for r in table:
        cells = [_fig(r, m).text() + _of(r.get(f"{m}_n"), r) for m, _, _ in METRICS]
        cells.append(_fig(r, "auc").text(".3f") if "auc" in r else "-")
        if "auc" in r and r["estimator"] != base and math.isfinite(r["auc_diff"]):
            star = " *" if r["auc_p_holm"] < ALPHA else ""
            cells.append(f"{r['auc_diff']:+.3f} ({r['auc_p_holm']:.2g}){star}")
        else:
            cells.append("-")
        lines.append(_row(r, cells))
    return "\n".join(lines + _dagger_note(table))


def diffs_md(table: list[dict], diffs: list[dict], base: str) -> str:
    """Each estimator minus the baseline, per metric; * = Holm p < 0.05 over the policy's
    family (every estimator x metric), the p read off the 95% interval."""
    by = {(d["policy"], d["estimator"], d["metric"]): d for d in diffs}
    heads = [f"Δ {name}" for _, name, _ in METRICS] + ["Δ auc (Welch p, Holm p)"]
    lines = ["| policy | estimator | " + " | ".join(heads) + " |",
             "|---" * (len(heads) + 2) + "|"]  # fmt: skip
    for r in table:
        if r["estimator"] == base:
            continue
        cells = []
        for m, _, _ in METRICS:
            d = by.get((r["policy"], r["estimator"], m))
            f = Figure(d["diff"], d["lo"], d["hi"], d["n"]) if d else NAN
            cells.append(f.text("+.3g") + (" *" if d and d["significant"] else "")
                         + _of(d["n"] if d else None, r))  # fmt: skip
        if "auc" in r and math.isfinite(r["auc_diff"]):
            star = " *" if r["auc_p_holm"] < ALPHA else ""
            cells.append(f"{r['auc_diff']:+.3f} ({r['auc_p']:.2g}, {r['auc_p_holm']:.2g}){star}")
        else:
            cells.append("-")
        lines.append(_row(r, cells))
    return "\n".join(lines + _dagger_note(table))


def tests_md(tests: list[dict[str, Any]], tt: dict) -> str:
    lines = ["| policy | environment | estimator | auc (95% CI) | baseline | diff | p | "
             "p (Holm) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in tests:
        f = auc_figure(tt[t["policy"]], t["label"], t["env"])
        star = " *" if t["significant"] else ""
        lines.append(f"| {t['policy']} | {t['env']} | {t['label']} | {f.text('.3f')} | "
                     f"{t['baseline']} | {t['diff']:+.3f} | {t['p']:.2g} | "
                     f"{t['p_holm']:.2g}{star} |")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the summary


def _diff(p: str, bv: dict, batches: list[dict], a: str, b: str, m: str) -> Figure:
    return llm_diff(batches, a, b, m) if p == "llm" else cell_diff(bv[p], a, b, m)


_WORDS = {
    HOLDS: "significant",
    DOES_NOT_HOLD: "significant the other way",
    NOT_SIGNIFICANT: "not significant",
    UNTESTED: "untested (no interval)",
}
"""How a lead reads, by studies.verdict's status of ``best > next``."""


def _winner_line(p: str, rows: list[dict], bv: dict, batches: list[dict], m: str, name: str,
                 lower: bool, ests: tuple[str, ...]) -> str:  # fmt: skip
    """``MSE: lowest oracle 3.2 [..], next hgpo 3.4 [..]; the lead 0.19 [..] is not
    significant; per cell: ...; not ranked: ...``. Only the estimators measured in every cell
    (truth batch) where any was are ranked, so that every mean ranked and every lead is over
    the same cells; the others are named with their count of cells."""
    cands = [r for r in rows if _comparable(r, m)]
    held = {r["estimator"]: units(p, bv, batches, r["estimator"], m) for r in cands}
    every = set().union(*held.values())
    full = [r for r in cands if every and held[r["estimator"]] == every]
    ranked = sorted(full, key=lambda r: r[m], reverse=not lower)
    missing = [r["estimator"] for r in cands if every and r not in full]
    short = _short_note(p, bv, batches, missing, held, len(every))
    if len(ranked) < 2:
        return f"{name}: fewer than two estimators measured in every cell{short}."
    best, nxt = ranked[0], ranked[1]
    d = _diff(p, bv, batches, best["estimator"], nxt["estimator"], m)
    lead = Figure(-d.value, -d.hi, -d.lo, d.n) if lower else d
    ci = (lead.lo, lead.hi) if math.isfinite(lead.lo) and math.isfinite(lead.hi) else None
    status, _ = ordering_verdict([Step(best["estimator"], nxt["estimator"], lead.value, ci=ci)],
                                 ALPHA)  # fmt: skip
    line = (f"{name}: {'lowest' if lower else 'highest'} **{best['estimator']}** "
            f"{_fig(best, m).text()}, next {nxt['estimator']} {_fig(nxt, m).text()}; the lead "
            f"{lead.text('.3g')} is **{_WORDS[status]}**")  # fmt: skip
    if p != "llm":
        names = {r["estimator"] for r in ranked}
        cells = {k: [r for r in v if r["estimator"] in ests and r["estimator"] in names]
                 for k, v in base_rows(bv[p], "mean").items()}  # fmt: skip
        line += f"; per cell: {best_counts(cells, m, lower)}"
    return line + short + "."


def _short_note(p: str, bv: dict, batches: list[dict], names: list[str], held: dict[str, set],
                n: int) -> str:  # fmt: skip
    """``; not ranked (not measured in every cell): a (10 of 12 cells; all-zero advantages in
    2)``, or nothing."""
    if not names:
        return ""
    what = "truth batches" if p == "llm" else "cells"
    parts = []
    for e in names:
        z = zero_units(p, bv, batches, e)
        parts.append(f"{e} ({len(held[e])} of {n} {what}" + (f"; all-zero advantages in {z}"
                     if z else "") + ")")  # fmt: skip
    return f"; not ranked (not measured in every {what[:-1]}): {', '.join(parts)}"


def _vs_base_line(p: str, rows: list[dict], diffs: list[dict], m: str, name: str, lower: bool,
                  base: str) -> str:  # fmt: skip
    """``Against hgpo on MSE: lower (better): a (-0.3 [..]); higher (worse): b; within noise: c``."""
    by = {d["estimator"]: d for d in diffs if d["policy"] == rows[0]["policy"] and d["metric"] == m}
    own = {r["estimator"] for r in rows if not _comparable(r, m)}
    total = rows[0].get("units")
    what = "truth batches" if rows[0]["policy"].startswith("llm") else "cells"
    better, worse, noise = [], [], []
    for e, d in by.items():
        f = Figure(d["diff"], d["lo"], d["hi"], d["n"])
        if not math.isfinite(f.value) or e in own:
            continue
        good = (f.value < 0) == lower
        sig = bool(d.get("significant", f.significant))  # Holm over the policy's family
        # a difference over fewer cells than the policy's says over how many (paired: both
        # estimators on the same ones)
        few = f"{f.n} of {total} {what}" if total and f.n < total else ""
        holm_p = f"Holm p = {d['p_holm']:.2g}" if sig and "p_holm" in d else ""
        fig = ", ".join(x for x in (f.text("+.3g") if sig else "", holm_p, few) if x)
        (noise if not sig else better if good else worse).append(f"{e} ({fig})" if fig else e)
    lo, hi = ("lower", "higher") if lower else ("higher", "lower")
    line = (f"against {base} on {name}: {lo} (better): {', '.join(better) or 'none'}; "
            f"{hi} (worse): {', '.join(worse) or 'none'}; within noise: "
            f"{', '.join(noise) or 'none'}")  # fmt: skip
    return line + (f"; not in reward units: {', '.join(sorted(own))}." if own else ".")


def _comparable(row: dict[str, Any], m: str) -> bool:
    """Whether ``row``'s figure ``m`` can be ranked against the others': a scale-free one, or
    one in reward units from an estimator in reward units (:func:`in_reward_units`)."""
    return m not in UNIT_METRICS or bool(row.get("reward_units", True))


def _units_note(table: list[dict[str, Any]]) -> list[str]:
    """The sentence naming the estimators whose advantages are not in reward units."""
    own = sorted({r["estimator"] for r in table if not r.get("reward_units", True)})
    if not own:
        return []
    names = ", ".join(own)
    return [
        f"Not in reward units (the returns they compare are not the env's step returns): "
        f"{names}; their bias², variance and MSE are in the table but not ranked against the "
        "others: compare them on sign agreement and gradient cosine."
    ]


def _auc_line(rows: list[dict], tests: list[dict], p: str, base: str, n_envs: int) -> str:
    """Learning speed: the highest auc, and each estimator against the baseline (Welch + Holm)."""
    ranked = sorted((r for r in rows if math.isfinite(r.get("auc", math.nan))),
                    key=lambda r: -r["auc"])  # fmt: skip
    if not ranked:
        return "learning speed: no training runs"
    best = ranked[0]
    pooled = [t for t in tests if t["policy"] == p and t["env"] == "all envs"]
    up = [f"{t['label']} ({t['diff']:+.3f}, Holm p = {t['p_holm']:.2g})" for t in pooled
          if t["significant"] and t["diff"] > 0]  # fmt: skip
    down = [f"{t['label']} ({t['diff']:+.3f}, Holm p = {t['p_holm']:.2g})" for t in pooled
            if t["significant"] and t["diff"] < 0]  # fmt: skip
    same = [t["label"] for t in pooled if not t["significant"]]
    return (f"learning speed (auc, mean train success over training; {best.get('seeds', 0)} "
            f"seeds, mean over {n_envs} environment{'s' if n_envs > 1 else ''}): highest **{best['estimator']}** "
            f"{_fig(best, 'auc').text('.3f')}; against {base} (Welch + Holm): significantly "
            f"faster: {', '.join(up) or 'none'}; significantly slower: {', '.join(down) or 'none'}; "
            f"not significant: {', '.join(same) or 'none'}.")  # fmt: skip


def summary_lines(cfg: Any, table: list[dict], diffs: list[dict], tests: list[dict], bv: dict,
                  tt: dict, llm: dict | None) -> list[str]:  # fmt: skip
    """The report's opening: which estimator wins where, by how much, and whether it is
    significant (computed from the tables below)."""
    ests, base = cfg.estimator_names(), cfg.baseline
    batches = _batches(llm) if llm else []
    md = ["## Summary", "",
          f"{len(ests)} estimators ({', '.join(ests)}), baseline {base}. Figures are means with "
          "95% intervals; a lead is called significant only when its interval is clear of 0; a "
          f"difference to {base} only when its Holm-corrected p < 0.05 over the policy's family "
          "(every estimator x metric; p read off the 95% interval: bias/variance figures, "
          "conservative intervals over the cells; LLM, paired over batches) and, for auc, its "
          "Holm-corrected Welch p < 0.05. bias², variance and MSE are in squared reward units "
          "(norm = mean).", *_units_note(table), *_inputs_note(table),
          ""]  # fmt: skip
    for p in [*cfg.policies, *(["llm"] if llm else [])]:
        label = _policy_label(p, cfg)
        rows = [r for r in table if r["policy"] == label]
        n = n_units(p, bv, batches)
        where = f"{n} truth batches of {len(llm['runs'])} runs" if p == "llm" else f"{n} cells"
        md.append(f"**{label} policy** ({where}):")
        zero = [f"{r['estimator']} in {r['zero_cells']}" for r in rows if r.get("zero_cells")]
        if zero:
            md.append(f"- all-zero advantages (0 at every step: no error or gradient to measure; "
                      f"left out of the estimator's figures, which are over its other "
                      f"{'batches' if p == 'llm' else 'cells'}): {', '.join(zero)} of {n}.")  # fmt: skip
        for m, name, lower in METRICS:
            md.append("- " + _winner_line(p, rows, bv, batches, m, name, lower, ests))
        for m, name, lower in (METRICS[2], METRICS[4]):
            md.append("- " + _vs_base_line(p, rows, diffs, m, name, lower, base))
        if p in tt:
            n_envs = len({r["env"] for r in tt[p]})
            md.append("- " + _auc_line(rows, tests, p, base, n_envs))
        md.append("")
    return md


# ----------------------------------------------------------------------------- the folder


def _console(table: list[dict[str, Any]], base: str) -> str:
    """The table as the console shows it: point figures, auc's Holm p against the baseline."""
    w = max(len(r["estimator"]) for r in table) + 4
    pw = max(len(r["policy"]) for r in table) + 2
    lines = [f"{'policy':<{pw}}{'estimator':<{w}}{'bias2':>9}{'var':>9}{'mse':>9}{'sign':>7}"
             f"{'cos':>7}{'auc':>7}{'Holm p':>8}"]  # fmt: skip
    for r in table:
        p = r.get("auc_p_holm", math.nan)
        name = r["estimator"] + (" ‡" if r.get("zero_cells") else "")
        lines.append(f"{r['policy']:<{pw}}{name:<{w}}{r['bias2']:>9.3g}"
                     f"{r['variance']:>9.3g}{r['mse']:>9.3g}{r['sign']:>7.2f}{r['grad_cos']:>7.2f}"
                     f"{_num(r.get('auc', math.nan), '.3f'):>7}"
                     f"{'' if r['estimator'] == base or not math.isfinite(p) else f'{p:.2g}':>8}")  # fmt: skip
    lines.append(f"bias2/var/mse: reward units (norm = mean), mean over cells; cos: gradient "
                 f"cosine; auc: mean train success over training; Holm p: auc against {base}")  # fmt: skip
    if any(r.get("zero_cells") for r in table):
        lines.append("‡ all-zero advantages in some cells, left out of its figures (table.md)")
    return "\n".join(lines)


def _num(x: float, fmt: str) -> str:
    return f"{x:{fmt}}" if math.isfinite(x) else "-"


def _parts(cfg: Any, llm: dict | None) -> list[str]:
    """The report's list of the sub-studies' folders, each with its own report."""
    md = ["## The sub-studies (each folder has its own report.md, tables and plots)", ""]
    for p in cfg.policies:
        md.append(f"- [bias_variance/{p}/report.md](bias_variance/{p}/report.md): every cell, "
                  "Proposition 4.1, the per-level figures")  # fmt: skip
        md.append(f"- [train_toy/{p}/report.md](train_toy/{p}/report.md): learning curves, "
                  "final success, the paper's orderings")  # fmt: skip
    if llm:
        md.append(f"- llm/: the runs of hgpo.train ({', '.join(Path(r).name for r in llm['runs'])})"
                  ", each with its metrics.jsonl and log")  # fmt: skip
    return [*md, ""]


def write_report(cfg: Any, bv: dict, tt: dict, llm: dict | None) -> dict[str, Any]:
    """Write table.csv / table.md, diffs.csv, tests.csv, results.json, report.md, metrics.png and
    diffs.png into ``cfg.out``; returns {"summary": lines, "table_text": console table, ...}."""
    from studies.compare_plots import plot_diffs, plot_metrics

    out = Path(cfg.out)
    base = cfg.baseline
    table, diffs, tests = build_table(cfg, bv, tt, llm)
    write_csv(out / "table.csv", table)
    write_csv(out / "diffs.csv", diffs)
    write_csv(out / "tests.csv", tests)
    tmd = table_md(table, base)
    atomic_write_text(out / "table.md", tmd + "\n")
    summary = summary_lines(cfg, table, diffs, tests, bv, tt, llm)
    plots = [plot_metrics(table, base, out).name, plot_diffs(table, diffs, base, out).name]
    md = ["# Every estimator compared against the exact truth", "", *summary,
          "## The table", "",
          "Per policy kind and estimator: bias², variance and MSE of the advantage against the "
          "exact A* (norm = mean, squared reward units), sign agreement with A*, cosine of the "
          "batch policy gradient with the exact one; mean [95% interval] over the cells (LLM: "
          "over the truth batches). auc: mean train-task success over training, mean [95% "
          f"interval] over seeds (each seed's runs averaged over the environments); its "
          f"difference to {base} with the Holm-corrected Welch p (* < 0.05).", "",
          tmd, "",
          f"## Each estimator against {base}", "",
          "Differences (estimator − baseline) with their 95% intervals (* = Holm-corrected p < "
          "0.05 over the policy's family of every estimator x metric, the p read off the "
          "interval by a normal approximation). "
          "Lower bias², variance and MSE and higher sign agreement, gradient cosine and auc are "
          "better. Toy policies: conservative intervals averaged over the cells (module "
          "docstring of studies/compare_report.py); LLM: paired over the truth batches.", "",
          diffs_md(table, diffs, base), "",
          "## Learning speed per environment (Welch + Holm)", "",
          "Holm-corrected over the estimators within each (policy, environment); \"all envs\" is "
          "the per-seed mean over the environments.", "",
          tests_md(tests, tt), "",
          *_parts(cfg, llm),
          "## Settings", "", "`" + json.dumps(cfg.settings()) + "`", "",
          *[f"![{p}]({p})" for p in plots], ""]  # fmt: skip
    atomic_write_text(out / "report.md", "\n".join(md))
    text = _console(table, base)
    result = {"settings": cfg.settings(), "table": table, "diffs": diffs, "tests": tests,
              "summary": summary, "table_text": text}  # fmt: skip
    atomic_write_text(out / "results.json", json.dumps(result, indent=1, default=float))
    return result


_INPUT_NOTES = {
    "values": "the exact V as its critic in the bias/variance figures (an unbiased reference, "
    "not a critic-free method) and a learned value table in training",
    "entropy": "the policy's exact entropy at each step's context (LLM: of pi(. | prompt) over "
    "the listed actions)",
    "observations": "each step's observation text as the toy text env renders it "
    "(agentenvs.toytext)",
}


def _inputs_note(table: list[dict[str, Any]]) -> list[str]:
    """One sentence per per-step input some compared estimator reads: who, and what it gets."""
    readers: dict[str, list[str]] = {}
    for r in table:
        for key in r["reads"].split():
            if r["estimator"] not in readers.setdefault(key, []):
                readers[key].append(r["estimator"])
    return [f"{', '.join(names)} {'reads' if len(names) == 1 else 'read'} {key}: "
            f"{_INPUT_NOTES.get(key, 'supplied by studies/step_inputs.py')}."
            for key, names in readers.items()]  # fmt: skip
