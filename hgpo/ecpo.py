"""ECPO (Evidence-Calibrated Policy Optimization): step credit at an anchor state from the
returns of each canonical action taken there, shrunk toward the anchor's mean where few
occurrences back it, and weighted by how much of the anchor's spread lies between actions.

Source: Li, Zhou, Duan, Chen, "When Denser Credit Is Not Enough: Evidence-Calibrated Policy
Optimization for Long-Horizon LLM Agent Training", arXiv 2606.05885 (2026). **No code is
public** (checked 2026-12-03: no repository under the title or the arXiv id in the public code
index, and the paper's summaries say "GitHub: none"); the equations below are the paper's as
its public summaries quote them (the full text of the method section could not be read here),
and what they leave open is chosen and named (``ecpo_*`` options; docs/estimators.md, "ecpo").

Notation: an *anchor* s is GiGPO's step group, the steps of one rollout group whose current
observation is the same (``StepBatch.state``); u = the step's canonical action
(``StepBatch.action``, the caller's canonical key: for an LLM agent the environment-parsed
action, so that surface variants of one action share a key); G = the step's discounted return
R_t (``gamma``, ``penalty_mode``), as GiGPO's step term compares; n_s the occurrences (steps)
at s, n_{s,u} those that took u; mu_s the mean of G over s, Gbar_{s,u} over (s, u).

Evidence-Calibrated Action Advantage (ECA)::

    mu~_{s,u}    = (n_{s,u} Gbar_{s,u} + kappa mu_s) / (n_{s,u} + kappa)
    A_act(s, u)  = (mu~_{s,u} - mu_s) / (sigma_s + eps)       (norm="mean": no division)
                 = n_{s,u} / (n_{s,u} + kappa) (Gbar_{s,u} - mu_s) / (sigma_s + eps)

with sigma_s the std of G over the anchor (``std``: population or sample) -- the standardisation
is our choice: the summaries say A_act is "standardised" without the formula; this one makes
kappa = 0 GiGPO's step advantage averaged over each action's occurrences. Every occurrence of
(s, u) gets the same A_act.

Variance-Gated Credit Weighting (VarGate), the decomposition of the anchor's spread::

    B_s = sum_u n_{s,u} (Gbar_{s,u} - mu_s)^2 / n_s                  (between actions)
    W_s = sum_u sum_{i in (s,u)} (G_i - Gbar_{s,u})^2 / n_s          (within actions)
    rho(s) = tanh(n_s / tau) B_s / (B_s + W_s + eps_g)               (0 where B_s + W_s + eps_g = 0)

The advantage of step (i, t) at anchor s taking u::

    A_{i,t} = A^GRPO_i + omega rho(s) A_act(s, u)

A^GRPO the episode advantage of Eq. (1) (``norm``, ``episode_std``, ``episode_pooling``,
``episode_singleton``, ``penalty_mode``). Options: ``ecpo_kappa`` (kappa, 2 as the summaries
quote), ``ecpo_tau`` (tau, 4: our choice, not in the text read), ``ecpo_omega`` (omega, 1 as
GiGPO's step weight: our choice), ``ecpo_gate_eps`` (eps_g, 0: ours; an anchor with no spread
gets rho = 0 exactly, so no epsilon is needed against 0/0, and 0 keeps the gate scale-free),
``ecpo_gate`` ("variance", or "none" for rho = 1: the paper's ECA-only ablation; kappa = 0 is
its VarGate-only one). ``leave_one_out``, ``K`` and the level options are not ECPO's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, episode_advantage, step_returns
from hgpo.groups import dense_rank

__all__ = ["ECPO_SOURCE", "Calibration", "calibrate", "check_actions", "ecpo"]

ECPO_SOURCE = "arXiv 2606.05885 (no public code)"
"""Where the method comes from: the paper only (no authors' code to record golden cases from)."""


@dataclass(frozen=True)
class Calibration:
    """The per-step quantities of ECPO (n steps; returns in the batch's reward units).

    Attributes:
        anchor: int64[n] dense anchor id (rollout group, state) of every step.
        n_anchor: int64[n] n_s, the occurrences at the step's anchor.
        n_action: int64[n] n_{s,u}, those of them that took the step's canonical action.
        shift: float64[n] Gbar_{s,u} - mu_s, the action's raw mean return less the anchor's.
        step_advantage: float64[n] A_act(s, u) (shrunk, standardised under "mean_std").
        between, within: float64[n] B_s and W_s of the step's anchor (squared return units;
            the gate itself is computed on the anchor scaled by a power of two).
        gate: float64[n] rho(s) (1 under ``ecpo_gate="none"``).
    """

    anchor: np.ndarray
    n_anchor: np.ndarray
    n_action: np.ndarray
    shift: np.ndarray
    step_advantage: np.ndarray
    between: np.ndarray
    within: np.ndarray
    gate: np.ndarray


def check_actions(batch: StepBatch) -> np.ndarray:
    """``batch.action`` (int64[n]); a ValueError naming the column when the batch has none."""
    if batch.action is None:
        raise ValueError(
            "estimator 'ecpo' needs StepBatch.action: the canonical action key of every step "
            "(equal actions, equal keys; hgpo.state_ids(canonical_actions) makes them)"
        )
    return batch.action


def _sorted_segments(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, seg) of rows sorted by int64 ``key``: seg[j] the segment of sorted row j."""
    order = np.argsort(key)  # (any order within a segment will do)
    ks = key[order]
    boundary = np.empty(ks.size, dtype=np.bool_)
    boundary[0] = True
    np.not_equal(ks[1:], ks[:-1], out=boundary[1:])
    return order, np.flatnonzero(boundary), np.cumsum(boundary) - 1


def calibrate(batch: StepBatch, cfg: EstimatorConfig, R: np.ndarray) -> Calibration:
    """ECA and VarGate (module docstring) of every step, from its returns ``R`` (float64[n]).

    One sort by (anchor, action) makes both the anchors and the (anchor, action) pairs
    contiguous; each anchor is scaled by the power of two of its largest |G| first (exact),
    so squares neither overflow nor underflow over the whole float64 range, and deviations
    are taken from the anchor's minimum, so an anchor of equal returns gives exactly 0."""
    action = check_actions(batch)
    g, _ = dense_rank(batch.group)
    s, m = dense_rank(batch.state)
    anchor, _ = dense_rank(g * m + s)
    u, n_u = dense_rank(action)
    order, p_starts, p_seg = _sorted_segments(anchor * n_u + u)
    a_sorted = anchor[order]
    a_first = np.empty(a_sorted.size, dtype=np.bool_)
    a_first[0] = True
    np.not_equal(a_sorted[1:], a_sorted[:-1], out=a_first[1:])
    a_starts = np.flatnonzero(a_first)
    a_seg = np.cumsum(a_first) - 1
    a_size = np.diff(np.append(a_starts, a_sorted.size))
    p_size = np.diff(np.append(p_starts, a_sorted.size))
    x = R[order]
    e = np.frexp(np.maximum.reduceat(np.abs(x), a_starts))[1]  # |x| 2^-e < 1 per anchor
    d = np.ldexp(x, -e[a_seg])
    d -= np.minimum.reduceat(d, a_starts)[a_seg]
    tied = np.maximum.reduceat(d, a_starts) == 0.0
    mu = np.add.reduceat(d, a_starts) / a_size
    gbar = np.add.reduceat(d, p_starts) / p_size
    shift_p = gbar - mu[a_seg[p_starts]]  # exactly 0 where the pair is its whole anchor
    shift = shift_p[p_seg]
    dev = d - mu[a_seg]
    within_dev = d - gbar[p_seg]
    between = np.add.reduceat(p_size * shift_p * shift_p, np.searchsorted(p_starts, a_starts))
    between /= a_size
    within = np.add.reduceat(within_dev * within_dev, a_starts) / a_size
    shrunk = shift * (p_size / (p_size + cfg.ecpo_kappa))[p_seg]
    if cfg.norm == "mean_std":
        ddof = 0 if cfg.std == "population" else 1
        ss = np.add.reduceat(dev * dev, a_starts)
        sd = np.sqrt(ss / np.maximum(a_size - ddof, 1))
        with np.errstate(over="ignore"):  # 2^-e eps may be inf (tiny returns): A_act -> 0
            den = sd + np.ldexp(cfg.eps, -e)
        step_adv = shrunk / np.where(tied | (den == 0.0), 1.0, den)[a_seg]
    else:
        with np.errstate(over="ignore"):  # past 1.8e308: compute_advantages names it
            step_adv = np.ldexp(shrunk, e[a_seg])
    gate = _gate(cfg, a_size, between, within, tied, e)
    with np.errstate(over="ignore"):  # (diagnostics back in return units; inf past 1.8e308)
        back = [np.ldexp(shift, e[a_seg]), np.ldexp(between, 2 * e)[a_seg]]
        back.append(np.ldexp(within, 2 * e)[a_seg])
    out = np.empty((4, batch.n_steps))
    out[:, order] = np.stack([back[0], step_adv, back[1], back[2]])
    rows = np.empty((3, batch.n_steps), dtype=np.int64)
    rows[:, order] = np.stack([a_size[a_seg], p_size[p_seg], a_seg])
    gate_rows = np.empty(batch.n_steps)
    gate_rows[order] = gate[a_seg]
    return Calibration(rows[2], rows[0], rows[1], out[0], out[1], out[2], out[3], gate_rows)


def _gate(
    cfg: EstimatorConfig,
    n_s: np.ndarray,
    between: np.ndarray,
    within: np.ndarray,
    tied: np.ndarray,
    e: np.ndarray,
) -> np.ndarray:
    """rho(s) per anchor: tanh(n_s / tau) B_s / (B_s + W_s + eps_g), 0 for an anchor of equal
    returns or where the denominator is 0; 1 everywhere under ``ecpo_gate="none"``. B and W
    are in the anchor's scaled units (divided by 4^e), so eps_g is scaled the same way."""
    if cfg.ecpo_gate == "none":
        return np.ones(n_s.shape[0])
    with np.errstate(over="ignore"):  # 4^-e eps_g may be inf: the gate is then 0
        den = between + within + np.ldexp(cfg.ecpo_gate_eps, -2 * e)
    ok = ~tied & (den > 0.0)
    share = np.where(ok, between / np.where(ok, den, 1.0), 0.0)
    return np.tanh(n_s / cfg.ecpo_tau) * share


def ecpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """ECPO (arXiv 2606.05885; no public code):

        A_{i,t} = A^GRPO_i + omega rho(s) A_act(s, u),
        A_act(s, u) = n_{s,u} / (n_{s,u} + kappa) (Gbar_{s,u} - mu_s) / (sigma_s + eps),
        rho(s) = tanh(n_s / tau) B_s / (B_s + W_s + eps_g),

    s the step's anchor (same rollout group, same ``state``), u its canonical action
    (``StepBatch.action``: required, a named error without it), G its discounted return
    (module docstring: every symbol, and which details are the paper's and which ours).
    Options: ``ecpo_kappa``, ``ecpo_tau``, ``ecpo_omega``, ``ecpo_gate``, ``ecpo_gate_eps``;
    the step term's ``norm``, ``std``, ``eps``, ``gamma``, ``penalty_mode``; the episode
    term's ``norm``, ``episode_std``, ``episode_pooling``, ``episode_singleton``.
    ``level_advantages`` holds the gated step term rho A_act ("step") and A^GRPO ("episode").
    """
    check_inputs("ecpo", batch, cfg)
    check_actions(batch)
    R = step_returns(batch, cfg)
    c = calibrate(batch, cfg, R)
    ep, _ = episode_advantage(batch, cfg)
    step = c.gate * c.step_advantage
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named by the registry
        A = ep + cfg.ecpo_omega * step
    groups = np.stack([c.anchor, np.full(batch.n_steps, -1, dtype=np.int64)])
    diagnostics = {
        "ecpo": {
            "anchor": c.anchor, "n_anchor": c.n_anchor, "n_action": c.n_action,
            "shift": c.shift, "step_advantage": c.step_advantage, "gate": c.gate,
            "between": c.between, "within": c.within,
        }
    }  # fmt: skip
    return Advantages(A, R, np.stack([step, ep]), groups, ("step", "episode"), diagnostics)
