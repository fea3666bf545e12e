"""verl-agent's trainer glue before its advantage function, replayed without the authors' code.

The HGPO recipe's trainer (``recipe/hgpo/hgpo_ray_trainer.py`` of johnhaofu/verl-agent at
796ed31) computes, before ``compute_advantage``: the step returns
(``compute_step_discounted_returns``: ``R_t = r_t + gamma R_{t+1}`` in numpy float32, per
trajectory), the episode reward (the rollout loop's float32 running sum) at the last response
token of every step row (``reward_manager/episode.py``), then ``apply_invalid_action_penalty``
subtracting 0.1 x invalid from that token and from the step return. This module does the same
on a case of ``tests/hgpo/data/verl_agent_golden.json`` (as
``benchmarks/make_verl_agent_golden.py`` does with the authors' own function), in float32 as
published or, with ``float64=True``, in float64 (the golden file's ``reference_f64`` run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.make_verl_agent_golden import MODES  # the authors' mode per reference profile


@dataclass(frozen=True)
class AuthorsInputs:
    """What verl-agent's ``compute_advantage`` hands the estimator for one case."""

    token_level_rewards: torch.Tensor
    step_rewards: torch.Tensor
    response_mask: torch.Tensor
    anchor_obs: np.ndarray
    index: np.ndarray
    traj_index: np.ndarray


def _step_returns(rewards: np.ndarray, traj: np.ndarray, gamma: float, ndt: type) -> np.ndarray:
    """``compute_step_discounted_returns``'s recursion, with its numpy scalar types."""
    out = np.zeros_like(rewards)
    for uid in np.unique(traj):
        rows = np.flatnonzero(traj == uid)
        r = rewards[rows]
        ret = np.zeros_like(r)
        running = 0
        for t in reversed(range(len(r))):
            running = r[t] + gamma * running
            ret[t] = running
        out[rows] = ret
    return out.astype(ndt)


def authors_inputs(case: dict[str, Any], float64: bool = False) -> AuthorsInputs:
    fdt = torch.float64 if float64 else torch.float32
    ndt = np.float64 if float64 else np.float32
    n, L = len(case["group"]), max(case["resp_len"])
    rewards = np.asarray(case["reward"], dtype=ndt)
    traj = np.asarray(case["traj"])
    resp_len = np.asarray(case["resp_len"])
    mask = torch.zeros((n, L), dtype=fdt)
    for i, m in enumerate(resp_len):
        mask[i, :m] = 1.0
    step_rewards = torch.tensor(_step_returns(rewards, traj, case["gamma"], ndt), dtype=fdt)
    episode: dict[int, Any] = {}
    for t, r in zip(traj.tolist(), rewards, strict=True):
        episode[t] = ndt(episode.get(t, ndt(0.0)) + r)
    scores = torch.zeros((n, L), dtype=fdt)
    for i in range(n):
        scores[i, resp_len[i] - 1] = torch.tensor(episode[int(traj[i])], dtype=fdt)
        inv = torch.tensor(1 - np.float32(not case["invalid"][i]), dtype=fdt)
        scores[i, resp_len[i] - 1] -= 0.1 * inv
        step_rewards[i] -= 0.1 * inv
    return AuthorsInputs(
        token_level_rewards=scores,
        step_rewards=step_rewards,
        response_mask=mask,
        anchor_obs=np.array([f"obs {s}" for s in case["state"]], dtype=object),
        index=np.array([f"g{g}" for g in case["group"]], dtype=object),
        traj_index=np.array([f"t{t:04d}" for t in case["traj"]], dtype=object),
    )


def call_ours(module: Any, case: dict[str, Any], x: AuthorsInputs) -> tuple[torch.Tensor, ...]:
    """The case's estimator through ``module``'s verl-agent signatures, called as the HGPO
    recipe's ``compute_advantage`` calls the authors' functions."""
    est, mode = case["estimator"], MODES[case["env"]]
    common = dict(token_level_rewards=x.token_level_rewards, response_mask=x.response_mask,
                  index=x.index, traj_index=x.traj_index)  # fmt: skip
    if est == "hgpo":
        return module.compute_hgpo_outcome_advantage(
            **common, step_rewards=x.step_rewards, anchor_obs=x.anchor_obs,
            history_length=case["K"], mode=mode, length_weight_alpha=case["alpha"],
            base_group=case["base_group"],
        )  # fmt: skip
    if est == "gigpo":
        return module.compute_gigpo_outcome_advantage(
            **common, step_rewards=x.step_rewards, anchor_obs=x.anchor_obs,
            step_advantage_w=1.0, mode=mode,
        )  # fmt: skip
    if est == "grpo":
        return module.compute_grpo_outcome_advantage(
            **common, norm_adv_by_std_in_grpo=(mode == "mean_std_norm")
        )
    return module.compute_rloo_outcome_advantage(**common)
