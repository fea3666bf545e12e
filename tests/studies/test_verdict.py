"""studies.verdict: "holds" only when every step of an ordering is significant (issue 27 item 4),
by hand and through train_toy's report."""

from __future__ import annotations

import json
import math

import pytest

from studies.train_toy import TrainToyConfig
from studies.train_toy_report import write_results
from studies.verdict import (
    DOES_NOT_HOLD,
    HOLDS,
    NOT_SIGNIFICANT,
    UNTESTED,
    Step,
    ordering_verdict,
)


def test_one_step_at_p_081_is_not_an_ordering_that_holds() -> None:
    """a > b > c with Holm p = 0.01 and 0.81: the second step is within noise, so the ordering
    is not significant, and the text gives both steps' directions and p."""
    status, text = ordering_verdict([Step("a", "b", 0.1, 0.01), Step("b", "c", 0.05, 0.81)])
    assert status == NOT_SIGNIFICANT
    assert text == (
        "not significant: a > b (+0.100, significant, Holm p = 0.01); "
        "b > c (+0.050, not significant, Holm p = 0.81)"
    )


def test_every_status_by_hand() -> None:
    assert ordering_verdict([Step("a", "b", 0.1, 0.01), Step("b", "c", 0.2, 0.049)])[0] == HOLDS
    # the step is in the other direction but within noise: not significant, direction shown
    status, text = ordering_verdict([Step("a", "b", -0.008, 0.81)])
    assert (status, text) == (NOT_SIGNIFICANT, "not significant: a < b (-0.008, not significant, Holm p = 0.81)")  # fmt: skip
    # a significant step against the claim outweighs a significant one for it
    status, text = ordering_verdict([Step("a", "b", 0.3, 1e-4), Step("b", "c", -0.2, 0.003)])
    assert status == DOES_NOT_HOLD
    assert text.endswith("b < c (-0.200, significant, against the claim, Holm p = 0.003)")
    # p = 0.05 is not below 0.05
    assert ordering_verdict([Step("a", "b", 0.1, 0.05)])[0] == NOT_SIGNIFICANT
    # intervals: above 0 holds, across 0 not significant, below 0 against
    assert ordering_verdict([Step("v_1", "v_0", 0.61, ci=(0.57, 0.65))])[0] == HOLDS
    status, text = ordering_verdict([Step("v_1", "v_0", 0.06, ci=(-0.01, 0.14))], num="+.2f")
    assert (status, text) == (NOT_SIGNIFICANT, "not significant: v_1 > v_0 (+0.06, not significant, 95% CI [-0.01, +0.14])")  # fmt: skip
    assert ordering_verdict([Step("v_1", "v_0", -0.3, ci=(-0.34, -0.26))])[0] == DOES_NOT_HOLD
    # a step without a test is never evidence: the point figures' direction, "untested"
    status, text = ordering_verdict([Step("b_0", "b_1", 0.2), Step("b_1", "b_2", 0.1)])
    assert (status, text) == (UNTESTED, "untested: b_0 > b_1 (+0.200, no test); b_1 > b_2 (+0.100, no test)")  # fmt: skip
    assert ordering_verdict([Step("a", "b", 0.1, 0.01), Step("b", "c", 0.1)])[0] == UNTESTED
    assert ordering_verdict([Step("a", "b", 0.1, 0.5), Step("b", "c", 0.1)])[0] == NOT_SIGNIFICANT
    with pytest.raises(ValueError, match="steps: an ordering needs at least one step"):
        ordering_verdict([])


def _run(setting: str, seed: int, success: list[float]) -> dict:
    """A finished train_toy run of tmaze with the given train success at each evaluation."""
    its = [10 * i for i in range(len(success))]
    curve = [{"reward": 0.0, "kl": 0.0, "env_steps": 100, "success": s, "adv_abs": 0.0,
              "clip_frac": 0.0, "entropy": 0.0} for s in success for _ in range(10)][: its[-1]]  # fmt: skip
    return {"env": "tmaze:length=3", "setting": setting, "estimator": setting, "K": 2,
            "seed": seed, "seconds": 1.0,
            "evals": [{"iteration": i, "train_success": s, "heldout_success": math.nan}
                      for i, s in zip(its, success, strict=True)],
            "curve": curve}  # fmt: skip


def test_train_toy_report_says_not_significant_at_holm_p_081(tmp_path) -> None:
    """The issue's case through write_results: hgpo above gigpo above grpo by the means, the
    first step far within noise. Before the fix the report printed "HGPO > GiGPO > GRPO holds"."""
    auc = {"hgpo": [0.30, 0.50, 0.35, 0.45], "gigpo": [0.28, 0.52, 0.31, 0.45],
           "grpo": [0.10, 0.12, 0.11, 0.13]}  # fmt: skip
    results = [_run(s, i, [0.0, a, a]) for s, v in auc.items() for i, a in enumerate(v)]
    cfg = TrainToyConfig(envs=("tmaze:length=3",), settings=tuple(auc), seeds=4, out=str(tmp_path))
    summary = write_results(cfg, results)
    (o,) = [o for o in summary["orderings"] if o["metric"] == "auc_train"]
    assert o["verdict"] == NOT_SIGNIFICANT and not o["holds"]
    first, second = o["steps"]
    assert (first["high"], first["low"], first["significant"]) == ("hgpo", "gigpo", False)
    assert first["diff"] == pytest.approx(0.01) and first["p"] > 0.5
    assert second["significant"] and second["diff"] == pytest.approx(0.275)
    line = summary["orderings_text_auc"]
    assert "HGPO > GiGPO > GRPO is not significant: hgpo > gigpo (+0.010, not significant, Holm p = " in line  # fmt: skip
    assert "holds" not in line
    report = (tmp_path / "report.md").read_text()
    assert line in report and "holds only when each of its steps is significant" in report
    # the step's test is in tests.csv / results.json: grpo against gigpo, a family of one
    saved = json.loads((tmp_path / "results.json").read_text())
    (t,) = [t for t in saved["tests"] if t["baseline"] == "gigpo" and t["metric"] == "auc_train"]
    assert t["label"] == "grpo" and t["p_holm"] == t["p"] == pytest.approx(second["p"])
