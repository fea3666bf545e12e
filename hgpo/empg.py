"""EMPG: Entropy-Modulated Policy Gradients (Wang et al., "Harnessing Uncertainty:
Entropy-Modulated Policy Gradients for Long-Horizon LLM Agents", arXiv 2509.09265).

Each step's episode advantage is scaled by how confident the policy was at that step, and a
bonus rewards the step for leading to a confident next step. The policy's entropy at every
step is an input (``entropy=``, :data:`hgpo.STEP_INPUTS`): for an LLM, the mean token entropy
of the step's response.
"""

from __future__ import annotations

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, episode_advantage, step_returns
from hgpo.returns import check_step_values

__all__ = ["check_entropy", "empg", "entropy_terms"]


def check_entropy(name: str, batch: StepBatch, entropy: object) -> np.ndarray:
    """``entropy`` as float64[n], finite and >= 0; a ValueError naming ``name`` otherwise
    (missing, another length, not real numbers, NaN, inf, a negative value)."""
    if entropy is None:
        raise ValueError(
            f"estimator {name!r} needs entropy: float64[n] >= 0, the policy's entropy at every "
            "step (for an LLM, the mean token entropy of the step's response)"
        )
    H = check_step_values(batch, entropy, f"{name}: entropy")
    if (H < 0).any():
        i = int(np.flatnonzero(H < 0)[0])
        raise ValueError(f"{name}: entropy[{i}] is {float(H[i])}; an entropy is >= 0")
    return H


def entropy_terms(
    batch: StepBatch, H: np.ndarray, cfg: EstimatorConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(H_norm, g, bonus), each float64[n], of EMPG (arXiv 2509.09265, Eqs. 10-12; Appendix
    Eqs. S22-S23):

        H_norm = (H - min_B H) / (max_B H - min_B H + eps)      (0 where max = min and eps = 0)
        g      = exp(-k H_norm) / (mean_B exp(-k H_norm) + eps)
        bonus  = zeta exp(-k' H_norm[next step of the same trajectory]), 0 at a last step

    min, max and mean run over every step of the batch B.
    """
    lo, hi = float(H.min()), float(H.max())
    den = (hi - lo) + cfg.empg_eps
    H_norm = (H - lo) / den if den > 0 else np.zeros_like(H)
    e = np.exp(-cfg.empg_k * H_norm)
    g = e / (float(np.mean(e)) + cfg.empg_eps)
    f = np.exp(-cfg.empg_k_future * H_norm)
    bonus = np.zeros_like(H)
    has_next = batch.traj_index[1:] == batch.traj_index[:-1]  # rows of a trajectory are contiguous
    bonus[:-1] = np.where(has_next, cfg.empg_zeta * f[1:], 0.0)
    return H_norm, g, bonus


def empg(
    batch: StepBatch,
    cfg: EstimatorConfig,
    values: np.ndarray | None = None,
    *,
    entropy: np.ndarray | None = None,
) -> Advantages:
    """EMPG (arXiv 2509.09265, Eq. 8 and Appendix A, Eqs. S21-S23):

        A_mod(i, t) = g(H_{i,t}) A(tau_i) + zeta f(H_{i,t+1})          (f = 0 at the last step)
        A(i, t)     = A_mod(i, t) - mean_{(j, t') in B} A_mod(j, t')     (empg_final_norm="mean")

    with H the policy's entropy at each step (``entropy``, float64[n] >= 0), g and f as in
    :func:`entropy_terms` (batch min-max normalised entropy, g's batch mean 1 up to eps),
    A(tau_i) the episode (GRPO) advantage of Eq. (1) under the config's ``norm``,
    ``episode_std``, ``episode_pooling``, ``episode_singleton`` and ``penalty_mode``, and B
    the whole batch. Options: ``empg_k`` (k), ``empg_k_future`` (k'), ``empg_zeta`` (zeta),
    ``empg_eps``, ``empg_final_norm``.

    Sources: the paper's equations; the authors' pseudocode on their project page
    (empgseed-seed.github.io: eps = 1e-8 in the min-max range and in g's denominator,
    "Final Advantage Normalization": the mean over steps subtracted); the third-party
    implementation for verl-agent step rows in WillDreamer/ARLArena at
    dc1da9f717d1238c49d6f538e5b5bb4b134e76ef, ``recipe/shop_agent/ppo/core_algos.py``
    (``compute_EMPG_advantage`` on top of ``compute_grpo_outcome_advantage``), which
    ``benchmarks/make_gigpo_variants_golden.py`` runs next to this one.
    """
    check_inputs("empg", batch, cfg)
    H = check_entropy("empg", batch, entropy)
    A_ep, _ = episode_advantage(batch, cfg)
    H_norm, g, bonus = entropy_terms(batch, H, cfg)
    A = g * A_ep + bonus
    mean = float(np.mean(A)) if cfg.empg_final_norm == "mean" else 0.0
    A -= mean
    diagnostics = {
        "entropy_norm": H_norm,
        "scale": g,
        "bonus": bonus,
        "episode_advantage": A_ep,
        "mean_removed": mean,
    }
    return Advantages(A, step_returns(batch, cfg), diagnostics=diagnostics)
