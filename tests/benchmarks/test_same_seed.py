"""benchmarks.same_seed names the first phase where two processes' records differ."""

from __future__ import annotations

import copy

from benchmarks.same_seed import first_difference

RECORD = {
    "resp": [[5, 6, 2], [7, 2]],
    "old": [[-0.5, -0.25, -0.125], [-1.0, -0.5]],
    "ref": [[-0.5, -0.25, -0.125], [-1.0, -0.5]],
    "figures": {"pg_loss": -0.0012, "grad_norm": 0.5366},
}


def test_the_same_records_have_no_difference():
    assert first_difference(RECORD, copy.deepcopy(RECORD)) is None


def test_the_first_differing_phase_is_named_with_its_samples():
    other = copy.deepcopy(RECORD)
    other["ref"][1][0] = -1.0000001
    other["figures"]["grad_norm"] = 0.539
    assert first_difference(RECORD, other) == (
        "reference log-probs differ (the reference's scoring pass differs): 1 of 2 samples, "
        "first #[1]"
    )
    other["resp"][0] = [5, 7, 2]
    assert first_difference(RECORD, other).startswith("responses differ (the rollout sampled")


def test_figures_alone_point_at_the_update():
    other = copy.deepcopy(RECORD)
    other["figures"]["grad_norm"] = 0.539
    assert first_difference(RECORD, other) == (
        "figures differ (only the update (or the figures' sums) differs): grad_norm 0.5366 vs 0.539"
    )
