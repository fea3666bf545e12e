"""MT-GRPO-style per-turn-index normalisation (``mtgrpo``), and the fix of verl RFC #7244.

Sources: the turn-level advantage of MT-GRPO (Zeng et al., "Reinforcing Multi-Turn Reasoning
in LLM Agents via Turn-Level Credit Assignment", arXiv 2505.11821, 2025; code
SiliangZeng/Multi-Turn-RL-Agent, ``verifiers/trainers/mt_grpo_env_trainer.py``), in the
general form verl RFC #7244 ("Per-turn reward support for multi-turn RL: a turn-level
baseline that stays unbiased under variable turn counts", lijuliana, 2026-08-03,
https://github.com/verl-project/verl/issues/7244) ports: each turn's reward is normalised
among the rollouts of the same group at the same turn index, and a turn's advantage is the
sum of the normalised rewards from that turn on.

``mtgrpo_baseline="own_turns"`` (default, the natural construction)::

    Ahat_k^i = (r_k^i - mean_{j alive at k} r_k^j) [/ (std_{j alive at k} r_k^j + eps)]
    A_t^i    = sum_{k=t}^{T_i - 1} gamma^(k-t) Ahat_k^i

The subtracted baseline sum_{k=t}^{T_i-1} gamma^(k-t) mean_k has as many terms as trajectory i
takes turns: it depends on the trajectory's own stopping turn, i.e. on its actions. The RFC's
closed form: the bias is the accumulated per-turn group mean, a hidden reward of -mean_k for
every turn taken (:func:`hgpo.closed_form_bias.mtgrpo_turn_weights` gives it exactly at finite
group size).

``mtgrpo_baseline="all_turns"`` (the fix): every trajectory's turn rewards are zero-padded to
its group's longest trajectory (H_g turns) and normalised among all N members at each turn
index, and the sum runs over every turn index to H_g - 1::

    Ahat_k^i = (r_k^i 1[k < T_i] - mean_j r_k^j 1[k < T_j]) [/ (std_j + eps)]
    A_t^i    = sum_{k=t}^{H_g - 1} gamma^(k-t) Ahat_k^i

so the baseline no longer depends on when trajectory i stops; with ``norm="mean"`` it equals
R_t^i - mean_j R_t^j (R_t^j the discounted return of j from turn index t, 0 if j ended before
t). With ``leave_one_out`` the mean is the other members' (n / (n - 1) times the centred value,
the std stays the whole group's, as for the other estimators), and the fix is then exactly
unbiased: the baseline does not depend on trajectory i at all. The RFC's own fix is described
at the bottom of its text, which the stored copy we could read does not include; this is our
construction of a baseline with the property its title names (docs/estimators.md, "mtgrpo").

Per-turn rewards are r_t - invalid_penalty * invalid_t (the reward the other estimators'
returns propagate, whatever ``penalty_mode``). A (group, turn) group of one member or of equal
values gives 0 (``norm``'s tie rule). No public code implements the RFC's variant for
variable turn counts (MT-GRPO's code has two fixed turns), so there is no golden case; the
tests use hand-worked batches.
"""

from __future__ import annotations

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs
from hgpo.groups import dense_rank, group_by, normalise
from hgpo.returns import check_finite, discounted_returns, penalised_rewards

__all__ = ["mtgrpo"]


def _turn_keys(batch: StepBatch) -> tuple[np.ndarray, int]:
    """Dense id of each step's (rollout group, turn index) and the number of ids."""
    g, _ = dense_rank(batch.group)
    return dense_rank(g * (int(batch.step.max()) + 1) + batch.step)


def _own_turns(batch: StepBatch, cfg: EstimatorConfig, r: np.ndarray) -> np.ndarray:
    ids, _ = _turn_keys(batch)
    gr = group_by(ids)
    a, _ = normalise(gr, r, cfg.norm, cfg.std, cfg.eps)
    if cfg.leave_one_out:
        n = gr.size_of_row().astype(np.float64)
        a = np.where(n > 1, a * n / np.maximum(n - 1.0, 1.0), a)
    return a


def _all_turns(batch: StepBatch, cfg: EstimatorConfig, r: np.ndarray) -> np.ndarray:
    """Per-step Ahat of the alive turns; the padded turns' sum added from a per-(group, turn)
    table (each group's turn indices 0..H_g-1 are all present: its longest trajectory)."""
    ids, m = _turn_keys(batch)
    g, n_groups = dense_rank(batch.group)
    starts = batch.traj_start
    n_g = np.bincount(g[starts], minlength=n_groups).astype(np.float64)
    tg = np.zeros(m, dtype=np.int64)
    tg[ids] = g
    tk = np.zeros(m, dtype=np.int64)
    tk[ids] = batch.step
    n = n_g[tg]
    alive = np.bincount(ids, minlength=m).astype(np.float64)
    lo = np.full(m, np.inf)
    hi = np.full(m, -np.inf)
    np.minimum.at(lo, ids, r)
    np.maximum.at(hi, ids, r)
    tied = (n < 2) | ((lo == hi) & ((alive == n) | (lo == 0.0)))
    # deviations from each (group, turn)'s minimum (an ended member's 0 included), as
    # hgpo.groups.segment_normalise takes them: exact for equal members, full precision on
    # near-ties
    base = np.where(alive < n, np.minimum(lo, 0.0), lo)
    d = r - base[ids]
    d_pad = -base
    mean_d = (np.bincount(ids, weights=d, minlength=m) + (n - alive) * d_pad) / n
    dev = d - mean_d[ids]
    dev_pad = d_pad - mean_d
    scale = np.ones(m)
    if cfg.norm == "mean_std":
        ddof = 1.0 if cfg.std == "sample" else 0.0
        ss = np.bincount(ids, weights=dev * dev, minlength=m) + (n - alive) * dev_pad**2
        sd = np.sqrt(np.where(n > 1, ss / np.maximum(n - ddof, 1.0), 0.0)) + cfg.eps
        scale = np.divide(1.0, sd, out=np.zeros(m), where=sd > 0)  # sd 0: tied, set 0 below
    if cfg.leave_one_out:
        scale = scale * np.where(n > 1, n / np.maximum(n - 1.0, 1.0), 1.0)
    scale = np.where(tied, 0.0, scale)
    a_alive = dev * scale[ids]
    pad = dev_pad * scale  # Ahat of a member that already ended
    C = _tail_sums(tg, tk, pad, cfg.gamma)  # C[(g, k)] = sum_{k' >= k} gamma^(k'-k) pad
    A = discounted_returns(batch, cfg.gamma, a_alive)
    last = starts + batch.traj_len - 1
    end_key = ids[last] + 1  # the (g, T_i) entry: next turn index of the same group
    nxt = np.minimum(end_key, m - 1)
    has_more = (end_key < m) & (tg[nxt] == g[last]) & (tk[nxt] == batch.step[last] + 1)
    tail = np.where(has_more, C[nxt], 0.0)
    dist = batch.traj_len[batch.traj_index] - (batch.step - batch.step[starts][batch.traj_index])
    with np.errstate(over="ignore", invalid="ignore"):
        A = A + cfg.gamma ** dist.astype(np.float64) * tail[batch.traj_index]
    return check_finite(batch, A, "mtgrpo advantage")


def _tail_sums(tg: np.ndarray, tk: np.ndarray, x: np.ndarray, gamma: float) -> np.ndarray:
    """Backward discounted sums of ``x`` over the turn index within each group (the table is
    sorted by (group, turn) with turns 0..H_g-1 contiguous)."""
    out = x.copy()
    by_k = np.argsort(tk, kind="stable")
    bounds = np.searchsorted(tk[by_k], np.arange(int(tk.max()) + 2))
    for k in range(int(tk.max()) - 1, -1, -1):
        rows = by_k[bounds[k] : bounds[k + 1]]  # the table rows of turn k (O(m) in all)
        nxt = rows + 1
        ok = nxt < tg.shape[0]
        rows, nxt = rows[ok], nxt[ok]
        same = (tg[nxt] == tg[rows]) & (tk[nxt] == k + 1)
        out[rows[same]] += gamma * out[nxt[same]]
    return out


def mtgrpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """MT-GRPO per-turn-index normalisation, aggregated over turns (verl RFC #7244):
    A_t^i = sum_{k >= t} gamma^(k-t) Ahat_k^i, Ahat_k^i the turn reward r_k^i normalised among
    the group's rollouts at turn index k; over the trajectory's own turns
    (``mtgrpo_baseline="own_turns"``, biased when the policy decides when to stop) or over
    every turn index of the group with ended members counting 0 (``"all_turns"``, the fix).
    Options: ``mtgrpo_baseline``, ``norm``, ``std``, ``eps``, ``leave_one_out``, ``gamma``,
    ``invalid_penalty``. ``returns`` holds the per-turn rewards r_t (module docstring)."""
    check_inputs("mtgrpo", batch, cfg)
    r = penalised_rewards(batch, cfg.invalid_penalty)
    if cfg.mtgrpo_baseline == "all_turns":
        A = _all_turns(batch, cfg, r)
    else:
        A = discounted_returns(batch, cfg.gamma, _own_turns(batch, cfg, r))
    return Advantages(A, r.copy())
