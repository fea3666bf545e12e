"""Run one estimator's share of the suite: ``HGPO_ESTIMATOR=gigpo pytest tests/hgpo``.

Tests parametrized over ``estimator`` (the fast-vs-reference equivalence, the verl-agent
golden comparison) keep only the case of that estimator; every other test is estimator-
independent and always runs. Without HGPO_ESTIMATOR nothing is deselected. tox's
``py-<estimator>`` envs set it (see tox.ini). Matching is on the parameter value, exactly, so
``hgpo`` does not select ``hgpo-nohog2`` and the folder name ``tests/hgpo`` plays no part.
"""

from __future__ import annotations

import os

import pytest

from hgpo import ESTIMATORS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = os.environ.get("HGPO_ESTIMATOR", "").strip()
    if not only:
        return
    if only not in ESTIMATORS:
        raise pytest.UsageError(
            f"HGPO_ESTIMATOR={only!r} is not an estimator; known: {', '.join(ESTIMATORS)}"
        )
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        est = callspec.params.get("estimator") if callspec is not None else None
        (drop if est is not None and est != only else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
