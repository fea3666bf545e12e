"""``g2po`` with ``reference_config("g2po")`` reproduces the G2PO authors' code (Nala-YN/G2PO
g2po/core_g2po.py at b8ffaf5) on frozen random batches.

``data/g2po_golden.json`` holds random batches (trajectories crossing in the group's states,
successful and failed episodes, invalid actions, several rollout groups, both modes, step
weights) and what the authors' ``compute_group_aggregation_values`` and
``compute_g2po_outcome_advantage`` returned on them, as published (float32) and under
torch's float64 default dtype. ``benchmarks/make_g2po_golden.py`` made it and says which
commit of which file; each row must equal the float64 run to 1e-7, and the float32 run to 1e-6
wherever it did when the file was made (relative to max(1, |A|)).
"""

import pytest

from benchmarks.make_g2po_golden import case_batch, case_config
from hgpo import compute_advantages
from tests.hgpo.golden_replay import check_rows, load_golden

GOLDEN = load_golden("g2po")


def test_golden_file_is_described():
    assert "b8ffaf56ad241ce73507908e6ed30209cafd324d" in GOLDEN["reference"]
    assert len(GOLDEN["cases"]) >= 16


@pytest.mark.parametrize("estimator", ["g2po"])  # (so HGPO_ESTIMATOR selects it)
def test_g2po_reproduces_the_authors_code(estimator):
    for n, case in enumerate(GOLDEN["cases"]):
        a = compute_advantages(estimator, case_batch(case), config=case_config(case)).advantages
        check_rows(a, case, f"case {n}")


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    cases = GOLDEN["cases"]
    assert {c["mode"] for c in cases} == {"mean_std_norm", "mean_norm"}
    assert {c["step_weight"] for c in cases} >= {1.0, 0.5, 2.0}
    assert any(len(set(c["group"])) > 1 for c in cases)
    assert all(any(c["invalid"]) for c in cases[:3])
    shared = success = failure = revisit = 0
    for c in cases:
        trajs: dict = {}
        for g, t, r, s in zip(c["group"], c["traj"], c["reward"], c["state"], strict=True):
            _, ret, states = trajs.get(t, (g, 0.0, []))
            trajs[t] = (g, ret + r, [*states, s])
        for g, ret, states in trajs.values():
            success += ret == 10.0
            failure += ret != 10.0
            revisit += len(set(states)) < len(states)
            others = {s for g2, _, st in trajs.values() if g2 == g and st is not states for s in st}
            shared += bool(set(states) & others)
    assert min(shared, success, failure, revisit) > 0
