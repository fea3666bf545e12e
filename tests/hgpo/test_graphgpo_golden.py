"""``graphgpo`` with ``reference_config("graphgpo", env)`` reproduces the GraphGPO authors' code
on frozen inputs (no torch needed).

``data/graphgpo_golden.json`` holds random batches (trajectories crossing in the group's
graph, failed trajectories ending in a seen or a new state, groups without a success, single-
trajectory groups, invalid actions, several rollout groups, both benchmarks' gammas, both
modes, ``normalize_distance``, the step/episode weights) and what verl-agent's
``recipe/GraphGPO/core_graph.py`` returned on them, as published (float32) and with float32
replaced by float64. ``benchmarks/make_graphgpo_golden.py`` made it and says which commit of
that code it ran and how.

Every row must equal the float32 output to 1e-6 x max(1, |A|), or, where float32 rounding
throws that code off (a tied group whose float32 mean is not the tied value, a group whose
small std magnifies float32 rounding), the float64 output to 1e-7 x max(1, |A|); the counts of
each kind of agreement must be those recorded when the file was made.
"""

from __future__ import annotations

import pytest

from benchmarks.make_graphgpo_golden import case_batch, case_config
from hgpo import compute_advantages
from tests.hgpo.golden_replay import check_rows, load_golden

GOLDEN = load_golden("graphgpo")


def test_golden_file_is_described():
    assert "234a913609ef820de826f2276b7b912e4b8b8410" in GOLDEN["reference"]
    assert len(GOLDEN["cases"]) >= 16


@pytest.mark.parametrize("estimator", ["graphgpo"])  # (so HGPO_ESTIMATOR selects it)
def test_graphgpo_reproduces_the_authors_code(estimator):
    for n, case in enumerate(GOLDEN["cases"]):
        a = compute_advantages(estimator, case_batch(case), config=case_config(case)).advantages
        check_rows(a, case, f"case {n}")


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    cases = GOLDEN["cases"]
    assert {c["env"] for c in cases} == {"alfworld", "webshop"}
    assert {c["mode"] for c in cases} == {"mean_std_norm", "mean_norm"}
    for key in ("normalize_distance", "with_next_state"):
        assert {c[key] for c in cases} == {True, False}
    assert {(c["step_weight"], c["episode_weight"]) for c in cases} == {
        (1.0, 1.0),
        (1.0, 0.0),
        (0.5, 2.0),
    }
    assert any(len(set(c["group"])) > 1 for c in cases)
    assert all(any(c["invalid"]) for c in cases[:3])

    def episodes(c):  # {(group, traj): (return, states, terminal)}
        out: dict = {}
        for g, t, r, s in zip(c["group"], c["traj"], c["reward"], c["state"], strict=True):
            ret, states = out.get((g, t), (0.0, []))
            out[g, t] = (ret + r, [*states, s])
        return {k: (r, s, c["terminal"][k[1]]) for k, (r, s) in out.items()}

    groups_without_success = reconnecting_ends = 0
    for c in cases:
        eps = episodes(c)
        for g in set(c["group"]):
            mine = {k: v for k, v in eps.items() if k[0] == g}
            seen = {s for _, states, _ in mine.values() for s in states}
            groups_without_success += all(r <= 0 for r, _, _ in mine.values())
            reconnecting_ends += c["with_next_state"] and any(
                r <= 0 and term in seen for r, _, term in mine.values()
            )
    assert groups_without_success and reconnecting_ends
