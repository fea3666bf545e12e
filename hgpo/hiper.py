"""HiPER: hierarchical advantage estimation, HAE (a turn-level GAE inside each subgoal segment
and a segment-level SMDP GAE across segments), for LLM agents that plan and execute.

Source: J. Peng, Y. Liu, R. Zhou, C. Fleming, Z. Wang, A. Garcia, M. Hong, "HiPER: Hierarchical
Reinforcement Learning with Explicit Credit Assignment for Large Language Model Agents", arXiv
2602.16165 (2026), and the authors' code JonP07/HiPER-agent at commit
9d3c118bb38a690d41ec43fee70451af28b3affa (Apache-2.0),
``hiper_hae/core_hae.py`` (``compute_hae_advantage``, ``HAEConfig``; called from
``verl/trainer/ppo/ray_trainer.py`` with ``algorithm.adv_estimator=hae``).

Their setup: each turn's response holds a ``<switch>`` (KEEP or SWITCH), a ``<subgoal>`` and an
``<action>``; a SWITCH turn (and every trajectory's first turn) starts a new segment
k = [s_k, e_k] of d_k = e_k - s_k + 1 turns. With r_t the turn's reward (less the invalid
penalty, plus the KEEP penalty) and V_low, V_high a critic's two heads:

Low level (turn GAE within the segment; the action tokens get it)::

    delta_t = r_t + gamma V'_{t+1} - V_low(t),   V'_{t+1} = V_low(t+1) inside the segment,
              V_high(s_{k+1}) at its last turn (the next segment's first turn), 0 after the end
    A^low_t = delta_t + gamma lambda_turn A^low_{t+1}   (A^low_{t+1} = 0 past e_k)

High level (SMDP GAE over segments; the subgoal tokens of a segment's first turn get it)::

    R_k = sum_{j=s_k}^{e_k} gamma^(j - s_k) r_j
    delta_k = R_k + gamma^(d_k) V_high(s_{k+1}) - V_high(s_k)   (V_high = 0 after the end)
    A^high_k = delta_k + gamma^(d_k) lambda_seg A^high_{k+1}

and with ``norm_adv`` (their recipes) each of A^low (over all turns) and A^high (over the
segments' first turns) is whitened over the batch: (A - mean) / (population std + 1e-8). Here
``hiper_norm`` turns it on and ``norm``, ``std`` and ``eps`` say how (``norm="mean"``: A - mean);
``reference_config("hiper")`` sets theirs (population std, eps = 1e-8; the default eps is 1e-6).

How one batch maps onto it (docs/estimators.md, "hiper"):

- values: one critic, ``values`` = V(s_t), serves as both heads, V_low = V_high = V. This is
  their own single-head fallback (``v_high = v_low`` when the batch has no ``value_high``).
  Then V'_{t+1} = V(s_{t+1}) everywhere and delta_t is the ordinary TD error; the hierarchy
  acts through where the low-level sums are cut and through the segment-level GAE. Their third
  (termination) head and the advantage of the ``<switch>`` tokens it feeds are not reproduced
  (with two heads or one their code gives those tokens 0 too).
- segments: a StepBatch holds no ``<switch>`` decisions, so the segments come from the batch
  (``hiper_segments``): "reward" (default) starts a new segment after every step with a
  non-zero environment reward (a subgoal reached), "step" makes every step a segment (the
  high level is then one-step GAE on V), "trajectory" one segment per trajectory (the low level
  is then plain GAE). A trajectory's first step always starts a segment and is a SWITCH.
  Where the only reward is the episode's last (the toy envs, ALFWorld), "reward" gives one
  segment per trajectory. Their segments are the policy's SWITCH decisions: not reproduced.
- dones: a trajectory's last step ends the episode (V = 0 after it, as ``gae``); their
  ``bootstrap_truncated`` never applies.
- the KEEP penalty (``hiper_keep_penalty``, ``hiper_keep_penalty_mode``) follows their code;
  it is 0 by default, since here no policy chose to KEEP. Their subgoal-consistency penalty
  compares subgoal tokens, which a StepBatch does not hold: not reproduced.
- a branch (``StepBatch.parent``): its own rows are its episode, from its branch state (its
  first own step starts a segment), as ``gae`` treats it; the parent's prefix is the parent's.
- one advantage per step: ``hiper_assign="action"`` gives A^low (their action tokens' value);
  "sum" adds A^high on a segment's first step (what a token in both masks gets).
"""

from __future__ import annotations

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs
from hgpo.groups import segment_normalise
from hgpo.returns import check_finite, check_step_values

__all__ = ["HIPER_SOURCE", "hiper", "hiper_segments", "reverse_scan", "whiten"]

HIPER_SOURCE = "JonP07/HiPER-agent@9d3c118bb38a690d41ec43fee70451af28b3affa"
"""The commit of the authors' code this module follows (``hiper_hae/core_hae.py``)."""


def hiper_segments(batch: StepBatch, mode: str) -> np.ndarray:
    """bool[n] the steps that start a segment (their SWITCH turns): every trajectory's first
    step, and by ``mode`` ("reward": a step after one with a non-zero environment reward,
    "step": every step, "trajectory": no other)."""
    start = np.zeros(batch.n_steps, dtype=bool)
    if mode == "step":
        start[:] = True
    elif mode == "reward":
        start[1:] = batch.reward[:-1] != 0.0
    elif mode != "trajectory":
        raise ValueError(f"hiper_segments: must be reward, step or trajectory, got {mode!r}")
    start[batch.traj_start] = True
    return start


def reverse_scan(batch: StepBatch, d: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float64[n] x_t = d_t + c_t x_{t+1} within each trajectory (x = d at its last row), from
    each trajectory's end back: one vector operation per distance to the end, touching only
    the rows at it."""
    x = np.array(d, dtype=np.float64)
    last = batch.traj_start + batch.traj_len - 1
    to_end = last[batch.traj_index] - np.arange(batch.n_steps)
    T = int(batch.traj_len.max())
    order = np.argsort(to_end.astype(np.uint16) if T <= 1 << 16 else to_end, kind="stable")
    bounds = np.searchsorted(to_end[order], np.arange(T + 1))
    with np.errstate(over="ignore", invalid="ignore"):  # checked by the caller
        for dist in range(1, T):
            rows = order[bounds[dist] : bounds[dist + 1]]
            x[rows] += c[rows] * x[rows + 1]
    return x


def _rewards(batch: StepBatch, cfg: EstimatorConfig, start: np.ndarray) -> np.ndarray:
    """r_t: the environment reward plus the KEEP penalty (their order) less the invalid
    penalty."""
    r = batch.reward.copy()
    keep = ~start
    p = cfg.hiper_keep_penalty
    with np.errstate(over="ignore", invalid="ignore"):
        if p != 0.0 and cfg.hiper_keep_penalty_mode == "fixed":
            r = r + keep * p
        elif p != 0.0:  # "normalized": p keep_ratio / keep_count on each KEEP step, T > 1
            n_keep = np.bincount(batch.traj_index[keep], minlength=batch.n_traj)
            T = batch.traj_len
            safe = np.maximum(n_keep, 1)
            per = np.where((T > 1) & (n_keep > 0), p * (n_keep / T) / safe, 0.0)
            r = r + keep * per[batch.traj_index]
        if batch.invalid is not None and cfg.invalid_penalty > 0.0:
            r = r - cfg.invalid_penalty * batch.invalid
    return check_finite(batch, r, "HiPER reward")


def whiten(a: np.ndarray, norm: str, std: str, eps: float) -> np.ndarray:
    """Their ``norm_adv`` over all of ``a``: (a - mean) / (std + eps) ("mean_std", ``std``
    "population" or "sample") or a - mean ("mean"), as one group of the project's
    normalisation (:func:`hgpo.groups.segment_normalise`: exact over the float64 range; a
    single value, or values all equal, give 0)."""
    if a.size < 2:
        return np.zeros_like(a)
    one = np.zeros(1, dtype=np.int64)
    out, _ = segment_normalise(a, np.zeros(a.size, dtype=np.int64), one, one + a.size, norm, std,
                               eps)  # fmt: skip
    return out


def hiper(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """HiPER (arXiv 2602.16165; JonP07/HiPER-agent@9d3c118, hiper_hae/core_hae.py): the
    low-level advantage A^low_t = delta_t + gamma lambda_turn A^low_{t+1} inside the step's
    segment, delta_t = r_t + gamma V(s_{t+1}) - V(s_t), and on each segment's first step the
    segment-level A^high_k = R_k + gamma^d_k V(s_{k+1}) - V(s_k) + gamma^d_k lambda_seg
    A^high_{k+1} (module docstring). ``values`` = V(s_t) serves as both of their critic's heads.

    Options: ``gamma``, ``hiper_lam_turn`` (1.0), ``hiper_lam_seg`` (0.95), ``hiper_norm``
    (whiten each level over the batch, True, with ``norm``, ``std``, ``eps``; a level whose
    values are all equal gives 0), ``hiper_segments`` ("reward"),
    ``hiper_keep_penalty`` (0) and ``hiper_keep_penalty_mode``, ``hiper_assign`` ("action":
    A^low; "sum": A^low + A^high), ``invalid_penalty``. ``returns`` holds the low-level critic
    targets A^low + V before whitening; ``diagnostics["hiper"]`` the two levels and segments.
    """
    check_inputs("hiper", batch, cfg)
    if values is None:
        raise ValueError("estimator 'hiper' needs values: float64[n] state values V(s_t)")
    V = check_step_values(batch, values, "hiper: values")
    start = hiper_segments(batch, cfg.hiper_segments)
    r = _rewards(batch, cfg, start)
    n, g = batch.n_steps, cfg.gamma
    last = np.zeros(n, dtype=bool)
    last[batch.traj_start + batch.traj_len - 1] = True
    seg_end = last.copy()
    seg_end[:-1] |= start[1:]
    V_next = np.zeros(n)
    V_next[:-1] = np.where(last[:-1], 0.0, V[1:])
    with np.errstate(over="ignore", invalid="ignore"):
        delta = r + g * V_next - V
        low = reverse_scan(batch, delta, np.where(seg_end, 0.0, g * cfg.hiper_lam_turn))
        seg_return = reverse_scan(batch, r, np.where(seg_end, 0.0, g))
        seg_id = np.cumsum(start) - 1
        d_k = np.bincount(seg_id)[seg_id]  # the segment's length, on each of its rows
        g_d = g**d_k
        end_row = np.flatnonzero(start)[seg_id] + d_k - 1
        boot = np.where(last[end_row], 0.0, V[np.minimum(end_row + 1, n - 1)])
        delta_k = np.where(start, seg_return + g_d * boot - V, 0.0)
        coef = np.where(start, np.where(last[end_row], 0.0, g_d * cfg.hiper_lam_seg), 1.0)
        high = np.where(start, reverse_scan(batch, delta_k, coef), 0.0)
    returns = check_finite(batch, low + V, "HiPER low-level return")
    check_finite(batch, high, "HiPER segment advantage")
    if cfg.hiper_norm:
        low = whiten(low, cfg.norm, cfg.std, cfg.eps)
        high[start] = whiten(high[start], cfg.norm, cfg.std, cfg.eps)
    adv = low if cfg.hiper_assign == "action" else low + high
    diag = {"hiper": {"low": low, "high": high, "segment_start": start, "segment_return":
                      np.where(start, seg_return, 0.0), "reward": r}}  # fmt: skip
    return Advantages(check_finite(batch, adv, "HiPER advantage"), returns, diagnostics=diag)
