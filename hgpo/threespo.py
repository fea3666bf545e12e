"""3SPO (State-Score-Supervised Policy Optimization): a state score from visit and success
counts shapes the step reward, normalised within the steps of the same state.

Source: Han, Li, Jiao, Dai, Fu, Zhuo, Qian, "3SPO: State-Score-Supervised Policy Optimization
for LLM Agents", arXiv 2606.09961 (2026), and the authors' code genalyu/3SPO at commit
da38445778f859b0e7e3a740cc5afa92540b47c7, ``gigpo/core_3spo.py`` (``StateScoreManager``,
``compute_3spo_step_reward``, ``compute_3spo_advantage``); the equation numbers are those the
code's docstrings cite (its README prints the same equations).

Notation: N(s) = N_total(s) the trajectories that visited observation s (each counts a state
once however often it visits it), W(s) = N_success(s) those of them that succeeded (their last
reward > 0), N_fail = N - W, t = 1 + the trajectories counted.

Eq. 1, the state score::

    S(s) = exp(-lambda(t) W(s) / (N(s) + eps)) * 1{N_fail(s) < xi  or  W(s) / (N(s) + eps) > zeta}
    lambda(t) = alpha log t;   S(s) = 1 for a state never counted (N(s) = 0).

Eq. 2, the shaped step reward of the transition s_t -> s_{t+1} with env reward r_t::

    R_3SPO = w(N(s_t)) R_novel + (0.5 - w(N(s_t))) (S(s_t) - S(s_{t+1})) + 0.5 r_t,
    w(N) = 0.5 exp(-omega_k N),   R_novel = 1 if s_{t+1} != s_t else 0.

Eq. 3, the rollout allocation (used by the ``branch:3spo`` rollout scheme, not by the
estimator)::

    n(s) = ceil(G_max S(s)).

The advantage (``compute_3spo_advantage`` = GiGPO's ``step_norm_reward``): R_3SPO normalised
within the steps of the same rollout group and the same current observation,
A_t = (R_t - mean_G R) [/ (std_G R + eps)] (``norm``, ``std``, ``eps``; a singleton or tied
group gives 0).

How a per-batch estimator maps the authors' online statistics (docs/estimators.md, "3spo"):
their StateScoreManager keeps N, W and t across all tasks and all training iterations (on
disk), and scores a step before its own trajectory is counted. Here the counts come from the
batch itself: every trajectory of the batch (``spo3_count_scope="batch"``, states shared
across tasks as theirs are) or of the step's rollout group ("group"), the step's own
trajectory included, and t = 1 + those trajectories, which is what their manager holds after
counting exactly those trajectories from a fresh start. A branch (``StepBatch.parent``) visits
its parent's prefix too: it counts the states of its whole virtual trajectory, as their DFS
counts the whole path. The observation after a trajectory's last step is ``next_state`` when
the batch has that column (its score from its counts; they count only states acted from, so
the terminal observation has counts only if some trajectory acted from it), else a new,
never-counted observation; a never-counted one scores ``spo3_terminal_score`` (1 by default,
what their code gives it) and a missing one has R_novel = 1. The invalid-action penalty is subtracted
from the shaped reward (``penalty_mode`` as for the step returns when ``spo3_target="return"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, level_diagnostics
from hgpo.groups import dense_rank
from hgpo.keys import hierarchy
from hgpo.options import bad, check_choice, check_int
from hgpo.returns import check_finite, discounted_returns

__all__ = [
    "SPO3_SOURCE",
    "Visits",
    "rollout_allocation",
    "shaped_rewards",
    "state_score",
    "state_visits",
    "threespo",
    "trajectory_success",
]

SPO3_SOURCE = "genalyu/3SPO@da38445778f859b0e7e3a740cc5afa92540b47c7"
"""The commit of the authors' code this module follows (``gigpo/core_3spo.py``)."""


@dataclass(frozen=True)
class Visits:
    """The visit statistics of every step's current observation (n steps).

    Attributes:
        n_total: int64[n] N(s_t), the counted trajectories whose (virtual) path visits s_t.
        n_success: int64[n] W(s_t), those of them that succeeded.
        t: int64[n] 1 + the trajectories counted in the step's scope (lambda's t).
        last_total, last_success: int64[n_traj] or None, N and W of the observation after
            each trajectory's last step (``StepBatch.next_state``; None without that column).
    """

    n_total: np.ndarray
    n_success: np.ndarray
    t: np.ndarray
    last_total: np.ndarray | None = None
    last_success: np.ndarray | None = None


def trajectory_success(batch: StepBatch) -> np.ndarray:
    """bool[n_traj] the trajectory succeeded: its last reward is > 0 (the authors'
    ``is_success = rewards[...] > 0`` at the step that ends the episode)."""
    return batch.reward[batch.traj_start + batch.traj_len - 1] > 0.0


def state_visits(
    batch: StepBatch,
    scope: str = "batch",
    counted: np.ndarray | None = None,
    success: np.ndarray | None = None,
) -> Visits:
    """N(s_t), W(s_t) and t of every step, counted over the batch's trajectories.

    Args:
        batch: the steps; ``state`` is the observation key s_t.
        scope: "batch" (every trajectory counts for every step) or "group" (the trajectories
            of the step's rollout group).
        counted: bool[n_traj] or None, the trajectories to count (None: all; the branching
            rule counts finished ones only).
        success: bool[n_traj] or None, which trajectories succeeded (None:
            :func:`trajectory_success`).

    A trajectory counts each observation of its virtual full trajectory once (a branch: its
    parent's prefix and its own rows); the observation after its last step (``next_state``) is
    not visited (the authors count the states acted from), but with that column its N and W
    are looked up too. Cost: three sorts of n integers at most.
    """
    check_choice("spo3_count_scope", scope, ("batch", "group"))
    n, n_traj = batch.n_steps, batch.n_traj
    counted = _traj_flags(batch, counted, "counted")
    success = (
        trajectory_success(batch) if success is None else _traj_flags(batch, success, "success")
    )
    last = batch.traj_start + batch.traj_len - 1
    states, groups = batch.state, batch.group
    if batch.next_state is not None:  # the observations after the last steps, looked up too
        states = np.concatenate([states, batch.next_state[last]])
        groups = np.concatenate([groups, groups[last]])
    if scope == "batch":
        key, n_keys = dense_rank(states)
        scope_of_traj = np.zeros(n_traj, dtype=np.int64)
    else:
        g, _ = dense_rank(groups)
        s, m = dense_rank(states)
        key, n_keys = dense_rank(g * m + s)
        scope_of_traj = g[batch.traj_start]
    key, last_key = key[:n], key[n:]
    if batch.branches is None:
        ti, pk = batch.traj_index, key
    else:  # [branching] a trajectory visits the states of its virtual full trajectory
        vr = batch.branches.virtual_rows
        ti, col = np.nonzero(vr >= 0)
        pk = key[vr[ti, col]]
    if counted is not None:
        keep = counted[ti]
        ti, pk = ti[keep], pk[keep]
    pairs = np.unique(pk * n_traj + ti)  # each (state, trajectory) once
    pair_key = pairs // n_traj
    pair_traj = pairs - pair_key * n_traj
    n_total = np.bincount(pair_key, minlength=n_keys)
    n_success = np.bincount(pair_key[success[pair_traj]], minlength=n_keys)
    per_scope = np.bincount(
        scope_of_traj if counted is None else scope_of_traj[counted],
        minlength=int(scope_of_traj.max(initial=0)) + 1,
    )
    t = 1 + per_scope[scope_of_traj[batch.traj_index]]
    if batch.next_state is None:
        return Visits(n_total[key], n_success[key], t)
    return Visits(n_total[key], n_success[key], t, n_total[last_key], n_success[last_key])


def _traj_flags(batch: StepBatch, flags: np.ndarray | None, name: str) -> np.ndarray | None:
    if flags is None:
        return None
    arr = np.asarray(flags)
    if arr.dtype != np.bool_ or arr.shape != (batch.n_traj,):
        raise ValueError(
            f"{name}: must be bool[{batch.n_traj}], one flag per trajectory, got "
            f"{arr.dtype}{list(arr.shape)}"
        )
    return arr


def state_score(
    n_total: np.ndarray,
    n_success: np.ndarray,
    t: np.ndarray | int,
    cfg: EstimatorConfig,
) -> np.ndarray:
    """Eq. 1, S(s) = exp(-alpha log(t) W / (N + eps)) 1{N - W < xi or W / (N + eps) > zeta},
    1 where N = 0; float64 in [0, 1] (``cfg.spo3_alpha``, ``spo3_xi``, ``spo3_zeta``,
    ``spo3_eps``). The operations are the authors' ``get_score``'s, in their order."""
    N = np.asarray(n_total, dtype=np.float64)
    W = np.asarray(n_success, dtype=np.float64)
    rate = W / (N + cfg.spo3_eps)
    lam = cfg.spo3_alpha * np.log(np.asarray(t, dtype=np.float64))
    n_fail = N - W
    keep = (n_fail < cfg.spo3_xi) | (rate > cfg.spo3_zeta)
    with np.errstate(under="ignore"):
        score = np.where(keep, np.exp(-lam * rate), 0.0)
    return np.where(N == 0, 1.0, score)


def rollout_allocation(score: np.ndarray, g_max: int) -> np.ndarray:
    """Eq. 3, n(s) = ceil(G_max S(s)) as int64 (0: the authors truncate there, 1: no
    alternative is tried)."""
    g_max = check_int("spo3_g_max", g_max, lo=1, hi=4096)
    arr = np.asarray(score, dtype=np.float64)
    out = ~((arr >= 0.0) & (arr <= 1.0))  # (NaN too)
    if out.any():
        raise bad(f"score[{int(np.flatnonzero(out.ravel())[0])}]", "a state score in [0, 1]",
                  float(arr.ravel()[out.ravel()][0]))  # fmt: skip
    return np.ceil(g_max * arr).astype(np.int64)


def shaped_rewards(
    batch: StepBatch, cfg: EstimatorConfig, visits: Visits | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. 2 for every step: (float64[n] R_3SPO, float64[n] S(s_t), float64[n] S(s_{t+1})).

    s_{t+1} is the next own row of the step's trajectory. After its last row it is
    ``next_state`` when the batch has that column (R_novel = 1{s' != s_t}; S(s') by Eq. 1 from
    its counts, ``cfg.spo3_terminal_score`` if no counted trajectory visited s'), else a new,
    never-counted observation: R_novel = 1, S = ``cfg.spo3_terminal_score``. The env reward
    r_t enters without the invalid-action penalty (the estimator applies it).
    """
    check_inputs("3spo", batch, cfg)
    v = state_visits(batch, cfg.spo3_count_scope) if visits is None else visits
    S = state_score(v.n_total, v.n_success, v.t, cfg)
    last = batch.traj_start + batch.traj_len - 1
    S_next = np.empty_like(S)
    S_next[:-1] = S[1:]
    novel = np.ones(batch.n_steps)
    novel[:-1] = batch.state[:-1] != batch.state[1:]
    if v.last_total is None:
        S_next[last] = cfg.spo3_terminal_score
        novel[last] = 1.0
    else:
        seen = state_score(v.last_total, v.last_success, v.t[last], cfg)
        S_next[last] = np.where(v.last_total > 0, seen, cfg.spo3_terminal_score)
        novel[last] = batch.next_state[last] != batch.state[last]
    w = 0.5 * np.exp(-cfg.spo3_omega_k * v.n_total.astype(np.float64))
    with np.errstate(over="ignore"):
        R = w * novel + (0.5 - w) * (S - S_next) + 0.5 * batch.reward
    return check_finite(batch, R, "3SPO shaped reward"), S, S_next


def threespo(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """3SPO (arXiv 2606.09961; genalyu/3SPO@da38445, gigpo/core_3spo.py):
    A_t = (R_3SPO(s_t, s_{t+1}) - mean_G R_3SPO) [/ (std_G R_3SPO + eps)], G the steps of the
    same rollout group with the same observation s_t (GiGPO's step groups), with

        R_3SPO = w(N(s_t)) R_novel + (0.5 - w(N(s_t))) (S(s_t) - S(s_{t+1})) + 0.5 r_t,
        w(N) = 0.5 exp(-omega_k N),   R_novel = 1{s_{t+1} != s_t},
        S(s) = exp(-alpha log(t) W(s) / (N(s) + eps')) 1{N(s) - W(s) < xi or W/(N + eps') > zeta},

    N(s), W(s) the trajectories of the batch (or of the step's group: ``spo3_count_scope``)
    that visited s and those of them whose last reward is > 0, t = 1 + those trajectories
    (module docstring: how the authors' cross-iteration counts map to one batch). Options:
    ``spo3_alpha`` (50), ``spo3_xi`` (10), ``spo3_zeta`` (0.1), ``spo3_omega_k`` (0.1),
    ``spo3_eps`` (eps' = 1e-6), ``spo3_count_scope``, ``spo3_terminal_score``,
    ``spo3_target`` ("reward": normalise R_3SPO - penalty x invalid; "return": its discounted
    return with ``gamma`` and ``penalty_mode``), and the group normalisation's ``norm``,
    ``std``, ``eps``, ``leave_one_out``. ``returns`` holds what was normalised.
    """
    check_inputs("3spo", batch, cfg)
    v = state_visits(batch, cfg.spo3_count_scope)
    R, S, S_next = shaped_rewards(batch, cfg, v)
    target = _target(batch, cfg, R)
    h = hierarchy(batch, 0, target, norm=cfg.norm, std=cfg.std, eps=cfg.eps,
                  leave_one_out=cfg.leave_one_out)  # fmt: skip
    diag = level_diagnostics(h, batch.n_steps)
    diag["spo3"] = {
        "shaped_reward": R, "state_score": S, "next_score": S_next, "n_total": v.n_total,
        "n_success": v.n_success, "t": v.t,
    }  # fmt: skip
    return Advantages(h.advantages[0], target, h.advantages, h.ids, ("0",), diag)


def _target(batch: StepBatch, cfg: EstimatorConfig, R: np.ndarray) -> np.ndarray:
    """What is normalised: R_3SPO less the invalid penalty, or its discounted return."""
    pen = None
    if batch.invalid is not None and cfg.invalid_penalty > 0.0:
        pen = cfg.invalid_penalty * batch.invalid
    if cfg.spo3_target == "reward" or cfg.penalty_mode == "after_discount":
        out = R if cfg.spo3_target == "reward" else discounted_returns(batch, cfg.gamma, R)
        if pen is None:
            return out
        with np.errstate(over="ignore"):
            return check_finite(batch, out - pen, "3SPO target")
    if pen is not None:
        with np.errstate(over="ignore"):
            R = check_finite(batch, R - pen, "penalised 3SPO reward")
    return discounted_returns(batch, cfg.gamma, R)
