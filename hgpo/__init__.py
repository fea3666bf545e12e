"""HGPO: Hierarchy-of-Groups Policy Optimization, and every group-based advantage estimator.

The core is numpy (plus scipy for graphgpo's shortest paths and rapidfuzz for gigpo_similarity's
pre-filter): build a :class:`StepBatch`, pick an estimator by name::

    from hgpo import StepBatch, compute_advantages
    adv = compute_advantages("hgpo", batch, K=2).advantages
"""

from hgpo.batch import StateIndexer, StepBatch, state_ids
from hgpo.config import EstimatorConfig, reference_config
from hgpo.estimator_registry import (
    ESTIMATORS,
    STEP_INPUTS,
    EstimatorError,
    EstimatorSpec,
    EstimatorWriteError,
    compute_advantages,
    estimator_reads,
    get_estimator,
    register_estimator,
    unregister_estimator,
)
from hgpo.estimators import Advantages, step_returns
from hgpo.keys import context_keys
from hgpo.returns import discounted_returns, episode_returns

__all__ = [
    "ESTIMATORS",
    "STEP_INPUTS",
    "Advantages",
    "EstimatorConfig",
    "EstimatorError",
    "EstimatorSpec",
    "EstimatorWriteError",
    "StateIndexer",
    "StepBatch",
    "compute_advantages",
    "context_keys",
    "discounted_returns",
    "episode_returns",
    "estimator_reads",
    "get_estimator",
    "reference_config",
    "register_estimator",
    "state_ids",
    "step_returns",
    "unregister_estimator",
]
__version__ = "0.1.0"
