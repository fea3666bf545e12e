"""gigpo_similarity, gigpo_dynamic and empg reproduce public code on frozen inputs (no torch).

``data/gigpo_variants_golden.json`` holds random batches (tied and near-tied returns, singleton
and one-trajectory groups, invalid actions, several rollout groups, near-copy observation texts
some past 200 characters, tied entropies) and what the public code returned on them, as
published (float32) and with float32 replaced by float64: verl-agent's GiGPO with
``enable_similarity=True`` and its dynamic-sampling filter ``filter_group_data``, and
ARLArena's ``compute_EMPG_advantage`` (a third party's EMPG). ``benchmarks/
make_gigpo_variants_golden.py`` made it and names the commits.

Every row must equal the float32 output to 1e-6 x max(1, |A|), or, where float32 rounding
throws that code off, the float64 output to 1e-7 x max(1, |A|); the counts of each kind are
those recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.make_gigpo_variants_golden import ESTIMATORS, ours, rounding_decided
from tests.hgpo.golden_replay import cases_of, check_rows, load_golden

GOLDEN = load_golden("gigpo_variants")


def test_golden_file_names_its_sources():
    ref = GOLDEN["reference"]
    assert ref["gigpo_similarity"].endswith("d0b97244c50f17fb43a6ef0a15bca0e95a044ff7")
    assert ref["gigpo_dynamic"].endswith("d0b97244c50f17fb43a6ef0a15bca0e95a044ff7")
    assert ref["empg"].endswith("dc1da9f717d1238c49d6f538e5b5bb4b134e76ef")
    assert {c["estimator"] for c in GOLDEN["cases"]} == set(ESTIMATORS)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_reproduces_the_public_code(estimator):
    cases = cases_of(GOLDEN, estimator)
    assert cases
    for n, case in enumerate(cases):
        check_rows(ours(case), case, f"{estimator} case {n}", explained=rounding_decided(case))


def test_golden_covers_what_it_is_about():
    """Dropped and kept groups, clusters of texts that are not identical, EMPG bonuses."""
    by = {e: [c for c in GOLDEN["cases"] if c["estimator"] == e] for e in ESTIMATORS}
    dyn = [np.asarray(c["reference_f64"]) for c in by["gigpo_dynamic"]]
    assert any((d == 0).any() and (d != 0).any() for d in dyn)
    sim = by["gigpo_similarity"]
    assert any(len(set(c["observations"])) > 1 and c["thresh"] <= 0.8 for c in sim)
    assert any(max(map(len, c["observations"])) > 200 for c in sim)
    assert any(max(c["step"]) > 0 and c["zeta"] > 0 for c in by["empg"])
    assert {c["env"] for c in GOLDEN["cases"]} == {"alfworld", "webshop"}
