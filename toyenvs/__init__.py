"""Toy POMDPs with exact ground-truth advantages: the testbed for group-based estimators.

::

    import toyenvs
    env = toyenvs.make("keydoor", size=6, slip=0.0, horizon=30)
    pol = toyenvs.TabularPolicy(env, K=2)
    rb = toyenvs.rollout(env, pol, n_rollouts=8, seed=0)       # rb.batch: hgpo.StepBatch
    gt = toyenvs.exact_ground_truth(env, pol, gamma=0.95)
    gt.advantage(rb)                                           # A*(z_t, a_t) of every step
"""

from toyenvs.core import GOAL_REWARD, INVALID_PENALTY, POMDP, add_slip, mdp_optimal_values
from toyenvs.families import FAMILIES, household, keydoor, make, random_pomdp, shop, tmaze
from toyenvs.gym import POMDPEnv, make_gym
from toyenvs.policy import TabularPolicy, context_radix, decode_context, encode_context
from toyenvs.rollout import Rollouts, rollout, rollout_arrays
from toyenvs.truth import (
    ChainTooLarge,
    ExactGroundTruth,
    MCGroundTruth,
    exact_ground_truth,
    mc_ground_truth,
)


def __getattr__(name: str) -> object:
    # NeuralPolicy needs torch (the [llm] extra): imported on first use, not with toyenvs.
    if name == "NeuralPolicy":
        from toyenvs.neural import NeuralPolicy

        return NeuralPolicy
    raise AttributeError(f"module 'toyenvs' has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "GOAL_REWARD",
    "INVALID_PENALTY",
    "POMDP",
    "ChainTooLarge",
    "ExactGroundTruth",
    "MCGroundTruth",
    "NeuralPolicy",
    "POMDPEnv",
    "Rollouts",
    "TabularPolicy",
    "add_slip",
    "context_radix",
    "decode_context",
    "encode_context",
    "exact_ground_truth",
    "household",
    "keydoor",
    "make",
    "make_gym",
    "mc_ground_truth",
    "mdp_optimal_values",
    "random_pomdp",
    "rollout",
    "rollout_arrays",
    "shop",
    "tmaze",
]
