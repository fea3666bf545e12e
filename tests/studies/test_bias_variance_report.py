"""studies.bias_variance_report on a synthetic results table (issue 27 items 4 and 16): the
report opens with a summary computed from the rows, Proposition 4.1's checks say "holds" only
when every step is significant, and the plots carry units, integer k ticks, told-apart lines
and legends that cover nothing."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest

from studies.bias_variance import StudyConfig
from studies.bias_variance_report import (
    figures,
    prop_checks,
    summary_lines,
    terminal_lines,
    write_results,
)

matplotlib.use("Agg")

ENV = "keydoor:size=4"
CELLS = [(K, stage) for K in (2, 4) for stage in ("untrained", "0.3")]


def _row(K: int, stage: str, est: str, norm: str, mse: float, bias2: float, cos: float) -> dict:
    """One estimator's figures on a cell, each with a 95% interval of +-0.1 (cosine +-0.01)."""
    return {"env": ENV, "family": "keydoor", "K": K, "stage": stage, "success": 0.3,
            "estimator": est, "norm": norm, "mse": mse, "mse_lo": mse - 0.1, "mse_hi": mse + 0.1,
            "bias2": bias2, "bias2_lo": bias2 - 0.1, "bias2_hi": bias2 + 0.1,
            "variance": mse - bias2, "sign": 0.6, "spearman": 0.3, "grad_cos": cos,
            "grad_cos_lo": cos - 0.01, "grad_cos_hi": cos + 0.01}  # fmt: skip


def _cell(K: int, stage: str, rises: bool) -> dict:
    """A cell: MSE lowest for oracle, but for hgpo at K=4 untrained; bias^2 lowest for gae,
    clear of the others' intervals only on the trained stage; hgpo's cosine the highest, clear;
    the level variances rising (significantly) with k when ``rises``, else falling."""
    hgpo_first = (K, stage) == (4, "untrained")
    trained = stage == "0.3"
    figs = {"grpo": (9.0, 2.0, 0.5), "oracle": (3.0, 0.5, 0.6),
            "hgpo": (2.0 if hgpo_first else 3.15, 0.6, 0.9),
            "gae": (4.0, 0.0 if trained else 0.45, 0.7)}  # fmt: skip
    rows = [_row(K, stage, e, n, *f) for e, f in figs.items() for n in ("mean", "mean_std")]
    rows += [_row(K, stage, f"alpha={a}", "mean", 3.2 - 0.1 * a, 0.6, 0.9) for a in (0, 0.5, 1, 2)]
    rows += [_row(K, stage, f"K={k}", "mean", 3.5 - 0.1 * k, 0.6, 0.9) for k in range(K + 1)]
    sign = 1 if rises else -1
    v = [1.0 + sign * 0.1 * k for k in range(K + 1)]
    levels = [{"env": ENV, "family": "keydoor", "K": K, "stage": stage, "level": k,
               "utilisation": 1 - 0.1 * k, "mean_group_size": 8 - k,
               "size_hist": [0.0, 0.5, 0.5], "bias2": 0.5 / (k + 1), "variance": v[k],
               "mse": v[k] + 0.5 / (k + 1), "bias2_all": 0.5, "variance_all": 1.0}
              for k in range(K + 1)]  # fmt: skip
    b = [float(np.sqrt(r["bias2"])) for r in levels]
    prop = {"env": ENV, "K": K, "stage": stage, "b": b, "v": v, "b_H": 0.6, "v_H": 1.0,
            "sum_w2": 0.4, "dvar": [[sign * 0.1, sign * 0.1 - 0.02, sign * 0.1 + 0.02]] * K}  # fmt: skip
    # hgpo minus grpo / gigpo, batch by batch: MSE lower (p = 0.001 each), the cosine within
    # noise; the sign against gigpo p = 0.02, significant alone but not after Holm
    versus = [{"env": ENV, "K": K, "stage": stage, "other": o, "figure": f, "norm": n, "diff": d,
               "lo": d - 0.1, "hi": d + 0.1, "p": pv, "n": 12}
              for o in ("grpo", "gigpo")
              for f, n, d, pv in (("mse_batch", "mean", -1.0, 0.001),
                                  ("sign", "mean", 0.05, 0.02 if o == "gigpo" else 0.5),
                                  ("grad_cos", "mean_std", 0.01, 0.6))]  # fmt: skip
    return {"rows": rows, "levels": levels, "prop41": prop, "versus": versus}


def _results(rising: tuple[int, str] | None = (2, "0.3")) -> list[dict]:
    return [_cell(K, stage, (K, stage) == rising) for K, stage in CELLS]


def _settings() -> dict:
    return {"envs": [ENV], "Ks": [2, 4], "stages": ["untrained", "0.3"], "n_batches": 12,
            "groups": 16, "rollouts": 8, "seed": 0, "policy": "tabular", "estimator_options": ""}  # fmt: skip


def test_report_opens_with_a_summary_computed_from_the_rows(tmp_path) -> None:
    """The summary opens with HGPO against GRPO and GiGPO (Holm over the whole family), says
    what a cell and a stage are, frames Proposition 4.1, says why a bias^2 can be < 0, and
    says that the best-estimator lines are uncorrected (issue 38 items 6 and 16)."""
    cfg = StudyConfig(envs=(ENV,), stages=("untrained", "0.3"), n_batches=12, out=str(tmp_path))
    write_results(cfg, _results())
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Bias/variance study\n\n## Summary\n\n4 cells. A cell is one "
                         "environment, memory length K and policy stage")  # fmt: skip
    summary = md[: md.index("## Settings")]
    assert "K = 2, 4 (the policy's memory and HGPO's hierarchy depth); policy stages untrained (uniform), success stage 0.3 (the policy whose advantages" in summary  # fmt: skip
    # HGPO against GRPO and GiGPO comes first, Holm over 4 cells x 2 estimators x 3 figures
    assert summary.index("### HGPO against GRPO and GiGPO") < summary.index("### Proposition 4.1") < summary.index("### Every estimator")  # fmt: skip
    assert "Holm correction over the family of all 24 such tests (4 cells x 2 estimators x 3 figures)" in summary  # fmt: skip
    assert ("- MSE per batch (norm = mean, reward^2; lower is better): vs grpo -1 [-1.05, -0.95]: "
            "hgpo better in 4 of 4 cells, worse in 0, within noise in 0; vs gigpo -1 [-1.05, "
            "-0.95]: hgpo better in 4 of 4 cells") in summary  # fmt: skip
    # p = 0.02 in each of 4 cells: significant alone, not after Holm over 24 tests
    assert "vs gigpo +0.05 [+0, +0.1]: hgpo better in 0 of 4 cells, worse in 0, within noise in 4" in summary  # fmt: skip
    assert "not corrected for multiplicity (4 estimators in each of 4 cells): a description, not a test" in summary  # fmt: skip
    assert ("- Lowest MSE: oracle in 3 of 4 cells, hgpo in 1 (its 95% interval clear of every "
            "other estimator's: oracle in 0, hgpo in 1).") in summary  # fmt: skip
    assert ("- Lowest bias^2: gae in 4 of 4 cells (its 95% interval clear of every other "
            "estimator's: gae in 2).") in summary  # fmt: skip
    assert "(norm = mean_std, the paper's default): hgpo in 4 of 4 cells (its 95% interval clear of every other estimator's: hgpo in 4)" in summary  # fmt: skip
    assert "an unbiased estimate of a squared bias, which can come out below 0" in summary
    assert "No row here has one." in summary
    assert "if |bias| falls and variance rises with the level k (its conditions)" in summary
    assert "of 4 cells: holds in 1, does NOT hold in 3." in summary
    assert 'Where it does not hold the proposition makes no claim; see docs/bias_variance.md, section "Proposition 4.1 with leave-one-out levels".' in summary  # fmt: skip
    assert "bias falls with k in 4 of 4 cells" in summary
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [c[1]["status"] for c in saved["prop41_checks"]] == ["does NOT hold", "holds", "does NOT hold", "does NOT hold"]  # fmt: skip
    assert len(saved["versus"]) == 24 and all("p_holm" in v for v in saved["versus"])
    # the per-cell comparisons are in the report, with both p-values
    assert "| keydoor | 2 | untrained | gigpo | sign (mean) | 0.05 [-0.05, 0.15] | 0.02 | 0.32 |" in md  # fmt: skip


def test_summary_says_when_the_variance_condition_fails_everywhere() -> None:
    res = _results(rising=None)
    rows = [r for x in res for r in x["rows"]]
    rows[0] = dict(rows[0], bias2=-0.004)  # grpo's on the first cell: below 0
    versus = [v for x in res for v in x["versus"]]
    lines = "\n".join(summary_lines(rows, [x["prop41"] for x in res], _settings(), versus))
    assert "of 4 cells: does NOT hold in 4." in lines
    assert ("So the proposition makes no claim in any of these 4 cells. This is expected: with "
            "group-mean baselines a step's own return is in its group's mean") in lines  # fmt: skip
    assert "docs/bias_variance.md" in lines
    assert "1 of 48 rows here have one (the lowest -0.004, grpo on keydoor K=2 untrained (uniform))" in lines  # fmt: skip


def test_terminal_lines_are_short_and_name_no_cell() -> None:
    """What the study prints: the HGPO comparisons and one line on Proposition 4.1, not every
    cell's checks (those are in report.md: issue 38 item 16)."""
    res = _results(rising=None)
    lines = terminal_lines([v for x in res for v in x["versus"]], [x["prop41"] for x in res])
    assert len(lines) == 5 and lines[0].startswith("HGPO against GRPO and GiGPO (4 cells)")
    assert lines[-1] == ("Proposition 4.1: its variance condition, of 4 cells: does NOT hold in 4; "
                         "where it does not hold the proposition makes no claim (expected with "
                         "group-mean baselines: a step's own return is in its group's mean); every "
                         "cell's checks are in report.md.")  # fmt: skip
    assert not any("variance rises with k:" in line for line in lines)
    assert terminal_lines([], [])[0].startswith("HGPO against GRPO and GiGPO: not measured")


def test_holm_and_p_from_interval() -> None:
    from statsmodels.stats.multitest import multipletests

    from studies.verdict import holm, p_from_interval

    ps = [0.01, 0.04, math.nan, 0.03]
    want = multipletests([0.01, 0.04, 0.03], method="holm")[1]
    got = holm(ps)
    assert math.isnan(got[2]) and np.allclose([got[0], got[1], got[3]], want)
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"p: each p-value must be in \[0, 1\] or NaN, got 1.5"):
        holm([1.5])
    # a 95% interval whose end touches 0 is p = 0.05
    assert p_from_interval(1.0, 0.0, 2.0) == pytest.approx(0.05)
    assert p_from_interval(0.0, 0.0, 0.0) == 1.0 and p_from_interval(1.0, 1.0, 1.0) == 0.0
    assert math.isnan(p_from_interval(math.nan, 0.0, 1.0))


def test_prop_checks_hold_only_on_significant_steps() -> None:
    """The variance condition with one step's interval across 0 is not significant (it said
    "holds" by the point figures before); the bias checks have no intervals: "untested"."""
    p = _cell(2, "0.3", rises=True)["prop41"]
    by = {c["check"]: c for c in prop_checks(p)}
    assert by["variance rises with k"]["status"] == "holds"
    p["dvar"][1] = [0.05, -0.01, 0.11]
    var = {c["check"]: c for c in prop_checks(p)}["variance rises with k"]
    assert var["status"] == "not significant"
    assert var["text"].endswith("v_2 > v_1 (+0.05, not significant, 95% CI [-0.01, +0.11])")
    bias = by["bias falls with k"]
    assert bias["status"] == "untested" and bias["met_by_point_figures"]
    assert bias["text"].startswith("untested: b_0 > b_1 (+0.") and "no test" in bias["text"]
    # v_H = 1.0 against sum w^2 v_K = 0.4 x 1.2 = 0.48: not met, with the numbers
    conc = by["sum w^2 v_0 <= v_H <= sum w^2 v_2"]
    assert not conc["met_by_point_figures"] and "sum w^2 v_2 < v_H (-0.52, no test)" in conc["text"]


def _visible_ticks(ax) -> list[float]:
    lo, hi = sorted(ax.get_xlim())
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_plots_have_units_integer_k_ticks_distinct_lines_and_legends_outside() -> None:
    res = _results()
    rows = [r for x in res for r in x["rows"]]
    levels = [r for x in res for r in x["levels"]]
    figs = figures(rows, levels)
    assert set(figs) == {"bias_variance_vs_k.png", "mse_and_gradient.png", "group_sizes.png",
                         "mse_vs_alpha_and_K.png"}  # fmt: skip
    vs_k = figs["bias_variance_vs_k.png"]
    for ax in vs_k.axes:
        assert ax.get_xlabel() == "level k of the hierarchy"
        assert "reward$^2$" in ax.get_ylabel()
        assert _visible_ticks(ax) and all(float(t).is_integer() for t in _visible_ticks(ax))
        # the two untrained lines (K = 2 and 4) lie on top of each other: told apart by
        # marker and line style
        untrained = [ln for ln in ax.get_lines() if "untrained" in ln.get_label()]
        assert len(untrained) == 2
        assert len({(ln.get_marker(), ln.get_linestyle()) for ln in untrained}) == 2
    legend = [t.get_text() for t in vs_k.axes[1].get_legend().get_texts()]
    assert legend == ["K=2, success stage 0.3", "K=2, untrained (uniform)",
                      "K=4, success stage 0.3", "K=4, untrained (uniform)"]  # fmt: skip
    depth = figs["mse_vs_alpha_and_K.png"].axes[1]
    assert all(float(t).is_integer() for t in _visible_ticks(depth))
    assert all("reward$^2$" in ax.get_ylabel() for ax in figs["mse_vs_alpha_and_K.png"].axes)
    bars = figs["mse_and_gradient.png"]
    assert "reward$^2$" in bars.axes[0].get_ylabel() and bars.axes[1].get_ylabel()
    assert "success stage 0.3" in bars.axes[0].get_xticklabels()[0].get_text()
    # no legend covers an axes (and so no bar or line)
    for fig in figs.values():
        fig.canvas.draw()
        for ax in fig.axes:
            if ax.get_legend() is None:
                continue
            box = ax.get_legend().get_window_extent()
            assert not any(box.overlaps(other.get_window_extent()) for other in fig.axes)


@pytest.mark.parametrize("stage, name", [("untrained", "untrained (uniform)"),
                                         ("0.7", "success stage 0.7"),
                                         ("runs/p.npz", "snapshot p.npz")])  # fmt: skip
def test_stage_names(stage: str, name: str) -> None:
    from studies.bias_variance_report import _stage_name

    assert _stage_name(stage) == name


def test_each_env_has_its_own_sweep_panels_and_a_missing_estimator_is_said() -> None:
    """mse_vs_alpha_and_K.png: household and keydoor lines of the same K and stage shared colour,
    marker and style on one panel; now each env has its own row of panels, named in the titles,
    and the lines within a panel are told apart. mse_and_gradient.png: an estimator with no bar
    on a panel (gae has no norm=mean_std row, so no cosine there) is said on it (issue 38 item
    17)."""
    other = "household:n_rooms=1,receptacles_per_room=5,n_tasks=4,horizon=8"
    res = _results()
    rows = [r for x in res for r in x["rows"]]
    rows += [dict(r, env=other, family="household") for r in rows]
    rows = [r for r in rows if not (r["estimator"] == "gae" and r["norm"] == "mean_std")]
    levels = [r for x in res for r in x["levels"]]
    levels += [dict(r, env=other, family="household") for r in levels]
    figs = figures(rows, levels)
    sweep = figs["mse_vs_alpha_and_K.png"]
    assert len(sweep.axes) == 4
    titles = [ax.get_title() for ax in sweep.axes]
    assert [t.split(":")[0] for t in titles] == ["household", "household", "keydoor", "keydoor"]
    for ax in sweep.axes:
        lines = ax.get_lines()
        assert len(lines) == 4  # (K, stage) of one env, not both envs' 8
        assert len({(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in lines}) == 4
    legend_titles = [ax.get_legend().get_title().get_text() for ax in sweep.axes[1::2]]
    assert [t.replace("\n", " ").replace(", ", ",") for t in legend_titles] == [other, ENV]
    bars = figs["mse_and_gradient.png"]
    cos_texts = [t.get_text() for t in bars.axes[1].texts]
    assert cos_texts == ["not shown (no bar):\ngae: not measured with norm=mean_std (n/a)"]
    assert len(bars.axes[0].texts) == 0  # every estimator has an MSE bar
    # a NaN in every cell is said too
    rows = [dict(r, grad_cos=math.nan) if r["estimator"] == "oracle" else r for r in rows]
    texts = [t.get_text() for t in figures(rows, levels)["mse_and_gradient.png"].axes[1].texts]
    assert "oracle: no finite grad_cos (NaN)" in texts[0]
