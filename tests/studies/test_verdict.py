"""studies.verdict: "holds" only when every step of an ordering is significant (issue 27 item 4),
by hand (train_toy's report: tests/studies/test_train_toy_report.py)."""

from __future__ import annotations

import pytest

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


def test_equal_means_summed_in_other_orders_are_a_tie() -> None:
    """Two AUCs of 0.146 that differ by -2.8e-17 (studies.real_model's ALFWorld report once
    printed "hgpo < grpo (-0.000, ...)") are equal."""
    assert Step("hgpo", "grpo", -2.7755575615628914e-17, 1.0).text() == (
        "hgpo = grpo (+0.000, not significant, Holm p = 1)"
    )
    assert Step("a", "b", -1e-9, 1.0).text().startswith("a < b (-0.000")
