"""``reference_config`` reproduces the authors' public code on frozen inputs (no torch needed).

``data/verl_agent_golden.json`` holds random batches (tied and near-tied returns, singleton
and single-trajectory groups, revisited states, invalid actions, trajectories shorter than
K, several rollout groups) and what the public verl-agent code returned on them, as published
(float32) and with float32 replaced by float64. ``benchmarks/make_verl_agent_golden.py`` made
it and says which commit of that code it ran.

Every row must equal the float32 output to 1e-6 x max(1, |A|), or, where float32 rounding
throws that code off (a tied group whose float32 mean is not the tied value, a near-tie), the
float64 output to 1e-7 x max(1, |A|). For hgpo, whose "A_k == 0" test is decided by rounding
on a level where the step gives exactly 0 in a group of >= 2 members, a row may follow one
run and not the other; the test checks that this is the only reason, and that the counts of
each kind of agreement are those recorded when the file was made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.make_verl_agent_golden import case_batch
from hgpo import compute_advantages, reference_config
from tests.hgpo.golden_replay import cases_of, check_rows, load_golden

GOLDEN = load_golden("verl_agent")


def _config(case: dict[str, Any]):
    opts: dict[str, Any] = dict(K=case["K"], gamma=case["gamma"])
    if case["estimator"] == "hgpo":
        opts.update(alpha=case["alpha"], base_group=case["base_group"])
    return reference_config(case["estimator"], env=case["env"], **opts)


def _rounding_decided(case: dict[str, Any], out) -> np.ndarray:
    """Rows where some hgpo level gives exactly 0 although its group has >= 2 members."""
    if case["estimator"] != "hgpo":
        return np.zeros(len(case["group"]), dtype=bool)
    sizes = []
    for ids in out.level_groups[: case["K"] + 1]:
        counts = np.bincount(ids[ids >= 0], minlength=1)
        sizes.append(np.where(ids >= 0, counts[np.maximum(ids, 0)], 0))
    if case["base_group"]:
        _, inv, counts = np.unique(case["group"], return_inverse=True, return_counts=True)
        sizes.append(counts[inv])
    return ((out.level_advantages == 0) & (np.stack(sizes) >= 2)).any(axis=0)


def test_golden_file_is_described():
    assert GOLDEN["reference"].endswith("51c1a039c38f1af54b09c05b81b76ce52d72c383")
    assert {c["estimator"] for c in GOLDEN["cases"]} == {"hgpo", "gigpo", "grpo", "rloo"}


@pytest.mark.parametrize("estimator", ["hgpo", "gigpo", "grpo", "rloo"])
def test_reference_preset_reproduces_verl_agent(estimator):
    cases = cases_of(GOLDEN, estimator)
    assert cases
    for n, case in enumerate(cases):
        out = compute_advantages(estimator, case_batch(case), config=_config(case))
        label = f"{estimator} case {n}"
        check_rows(out.advantages, case, label, explained=_rounding_decided(case, out))


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    cases = GOLDEN["cases"]
    assert any(len(set(c["traj"])) > 1 and min(np.bincount(c["traj"])) < c["K"] for c in cases)
    assert all(any(c["invalid"]) for c in cases[:3])
    assert any(len(set(c["group"])) > 1 for c in cases)
    assert any(1.0001 in c["reward"] for c in cases)
    # a rollout group with one trajectory (a singleton episode group)
    assert any(
        any(
            len({t for t, g in zip(c["traj"], c["group"], strict=True) if g == g0}) == 1
            for g0 in set(c["group"])
        )
        for c in cases
    )
    assert {c["env"] for c in cases} == {"alfworld", "webshop"}
    assert any(c["base_group"] for c in cases) and not all(c["base_group"] for c in cases)
