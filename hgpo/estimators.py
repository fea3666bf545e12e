"""The built-in advantage estimators: one signature, pure numpy (the registry that names
them is hgpo.estimator_registry).

Every estimator is ``f(batch, config, values=None) -> Advantages``. Equation numbers are the
HGPO paper's (hgpo-spec.md). Notation: step (i, t) of trajectory i in rollout group g, step
return R_t = sum_j gamma^j r_{t+j}, levels k = 0..K of the context hierarchy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.groups import dense_rank, group_by, normalise
from hgpo.keys import Hierarchy, hierarchy
from hgpo.returns import (
    check_finite,
    check_step_values,
    discounted_returns,
    episode_returns,
    penalised_rewards,
)

__all__ = [
    "Advantages",
    "check_inputs",
    "episode_advantage",
    "gae",
    "gigpo",
    "grpo",
    "hgpo",
    "hgpo_nohog2",
    "hgpo_uniform",
    "level_diagnostics",
    "level_weights",
    "oracle",
    "rloo",
    "step_returns",
    "stepwise",
]


@dataclass(frozen=True)
class Advantages:
    """What an estimator returns.

    Attributes:
        advantages: float64[n] the advantage of every step (never NaN).
        returns: float64[n] the step returns R_t the estimator compared.
        level_advantages: float64[L, n] or None, A_k of Eq. (6) for each level the estimator
            used (rows labelled by ``level_names``), 0 where a step is not in a level's group.
        level_groups: int64[L, n] or None, the dense group id of each step per level (-1: left out).
        level_names: the labels of the rows ("0".."K", "base").
        diagnostics: per-level group sizes, utilisation and weights (see ``_level_diagnostics``).
    """

    advantages: np.ndarray
    returns: np.ndarray
    level_advantages: np.ndarray | None = None
    level_groups: np.ndarray | None = None
    level_names: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- shared pieces

_BLOCK = 1 << 14  # columns per block of the (L, n) arithmetic of Eq. (7)


def step_returns(batch: StepBatch, cfg: EstimatorConfig) -> np.ndarray:
    """float64[n] R_t with the configured invalid-action penalty semantics."""
    if cfg.penalty_mode == "return":
        return discounted_returns(batch, cfg.gamma, penalised_rewards(batch, cfg.invalid_penalty))
    R = discounted_returns(batch, cfg.gamma)
    if batch.invalid is not None:
        with np.errstate(over="ignore"):
            R = check_finite(batch, R - cfg.invalid_penalty * batch.invalid, "return")
    return R


def _episode_units(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray | None, np.ndarray]:
    """The members of the episode-level groups and their scores.

    Returns (units, score): with ``episode_pooling="trajectory"`` units = int64[n] the
    trajectory of each step and score = float64[n_traj] the episode returns; with "steps"
    units = None and score = float64[n], every step row carrying its trajectory's return
    (with ``penalty_mode="after_discount"`` less its own penalty, as verl-agent's rows are).
    """
    if cfg.penalty_mode == "return":
        E = episode_returns(batch, penalised_rewards(batch, cfg.invalid_penalty))
    else:
        E = episode_returns(batch)
    if cfg.episode_pooling == "trajectory":
        return batch.traj_index, E
    score = E[batch.traj_index]
    if cfg.penalty_mode == "after_discount" and batch.invalid is not None:
        with np.errstate(over="ignore"):
            score = check_finite(batch, score - cfg.invalid_penalty * batch.invalid, "score")
    return None, score


def _episode_advantage(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (1): the episode return normalised within its rollout group, per step.

    Returns (float64[n] values, bool[n] informative: the group is not degenerate).

    With ``episode_pooling="steps"`` each step row carries its trajectory's score and all rows
    of the group are pooled (a long trajectory weighs more), as verl-agent's GiGPO code does;
    there, with ``penalty_mode="after_discount"``, a row's score also loses its own penalty.
    """
    units, score = _episode_units(batch, cfg)
    g, _ = dense_rank(batch.group if units is None else batch.group[batch.traj_start])
    vals, informative = normalise(
        group_by(g), score, cfg.norm, cfg.episode_std, cfg.eps, cfg.episode_singleton
    )
    if units is None:
        return vals, informative
    return vals[units], informative[units]


def episode_advantage(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (1), GRPO's episode advantage of every step: (float64[n] values, bool[n]
    informative: the step's episode group is not degenerate). See ``_episode_advantage``."""
    return _episode_advantage(batch, cfg)


def _levels(batch: StepBatch, cfg: EstimatorConfig, R: np.ndarray, K: int) -> Hierarchy:
    """G_k (Eq. 4) and A_k of Eq. (6) for k = 0..K: R_t normalised within G_k (or, with
    ``leave_one_out``, R_t less the mean of the other members' returns)."""
    return hierarchy(
        batch,
        K,
        R,
        include_actions=cfg.include_actions,
        early=cfg.early,
        norm=cfg.norm,
        std=cfg.std,
        eps=cfg.eps,
        leave_one_out=cfg.leave_one_out,
    )


def _level_diagnostics(
    names: list[str],
    levels: list[tuple[int, np.ndarray] | None],
    n: int,
    mean_w: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per level: groups, mean size, utilisation (share of all steps whose group has >= 2
    members), share of steps left out, the group-size histogram, and the mean weight used.

    levels: per level (n_groups, step_size_hist) with step_size_hist[s] the number of steps
        whose group has s members, or None for a level that is not a grouping.
    mean_w: float64[L] the mean over steps of each level's weight in Eq. (7), or None.
    """
    out: dict[str, Any] = {"levels": []}
    for j, (name, level) in enumerate(zip(names, levels, strict=True)):
        d: dict[str, Any] = {"level": name}
        if level is not None:
            n_groups, hist = level
            hist = np.trim_zeros(hist, "b")
            members = int(hist.sum())
            d["n_groups"] = int(n_groups)
            d["mean_group_size"] = members / n_groups if n_groups else 0.0
            d["utilisation"] = float((members - (hist[1] if hist.size > 1 else 0)) / n)
            d["left_out"] = float(1.0 - members / n)
            d["step_size_hist"] = hist
        if mean_w is not None:
            d["mean_weight"] = float(mean_w[j])
        out["levels"].append(d)
    return out


def _levels_of(h: Hierarchy) -> list[tuple[int, np.ndarray] | None]:
    return [(int(g), hist) for g, hist in zip(h.n_groups, h.step_size_hist, strict=True)]


def level_diagnostics(h: Hierarchy, n: int) -> dict[str, Any]:
    """The diagnostics of a step-level estimator's hierarchy ``h`` of a batch of ``n`` steps:
    per level "0".."K", groups, mean size, utilisation, share left out and the size histogram
    (as ``stepwise`` and ``oracle`` report them)."""
    names = [str(k) for k in range(h.ids.shape[0])]
    return _level_diagnostics(names, _levels_of(h), n)


def level_weights(cfg: EstimatorConfig, n_levels: int) -> np.ndarray:
    """float64[n_levels] raw weights (k + weight_offset)^alpha of Eq. (7), before normalising."""
    return (np.arange(n_levels, dtype=np.float64) + cfg.weight_offset) ** cfg.alpha


def check_inputs(name: str, batch: Any, config: Any) -> None:
    """ValueError unless ``batch`` is a StepBatch and ``config`` an EstimatorConfig."""
    if not isinstance(batch, StepBatch):
        raise ValueError(
            f"estimator {name!r}: batch must be a StepBatch (StepBatch(...) or "
            f"StepBatch.from_trajectories(...)), got {type(batch).__name__}"
        )
    if not isinstance(config, EstimatorConfig):
        raise ValueError(
            f"estimator {name!r}: config must be an EstimatorConfig (options as keywords: "
            f"compute_advantages(name, batch, K=2) or EstimatorConfig(**options)), got "
            f"{type(config).__name__}"
        )


def _checked(fn: Callable[..., Advantages]) -> Callable[..., Advantages]:
    """An estimator that first checks its batch and config types (a dict or None otherwise
    fails deep inside with an AttributeError)."""

    @functools.wraps(fn)
    def estimator(
        batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
    ) -> Advantages:
        check_inputs(fn.__name__, batch, cfg)
        return fn(batch, cfg, values)

    return estimator


# --------------------------------------------------------------------------- estimators


@_checked
def grpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """GRPO, Eq. (1): A(tau_i) = (R(tau_i) - mean_G R) / (std_G R + eps), broadcast to every step.

    R(tau) is the undiscounted total reward of the trajectory; G its rollout group. A group of
    one trajectory, or of equal returns, gives 0 (``episode_singleton="raw"``: passes through).
    """
    return Advantages(_episode_advantage(batch, cfg)[0], step_returns(batch, cfg))


@_checked
def rloo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """RLOO: A(tau_i) = R(tau_i) - mean_{j != i} R(tau_j), broadcast to every step.

    Equals N/(N-1) (R_i - mean_G R); with ``norm="mean_std"`` it is further divided by
    (std_G + eps). A group of one trajectory gives 0 (``episode_singleton="raw"``: R_i passes
    through, as verl's code does). With ``episode_pooling="steps"`` every step row is a member
    (N counts rows), as verl-agent's ``compute_rloo_outcome_advantage`` does.
    """
    units, score = _episode_units(batch, cfg)
    g, _ = dense_rank(batch.group if units is None else batch.group[batch.traj_start])
    gr = group_by(g)
    A, _ = normalise(gr, score, cfg.norm, cfg.episode_std, cfg.eps, cfg.episode_singleton)
    n_g = gr.size_of_row().astype(np.float64)
    A = np.where(n_g > 1, A * n_g / np.maximum(n_g - 1.0, 1.0), A)
    return Advantages(A if units is None else A[units], step_returns(batch, cfg))


@_checked
def stepwise(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """Step-level advantage, Eq. (2): R_t normalised within G_0, the steps of the same rollout
    group with the same current state. Singleton or tied groups give 0. ``leave_one_out``:
    the baseline is the mean of the group's other members (see ``hgpo``)."""
    R = step_returns(batch, cfg)
    h = _levels(batch, cfg, R, 0)
    A = h.advantages
    return Advantages(
        A[0], R, A, h.ids, ("0",), _level_diagnostics(["0"], _levels_of(h), batch.n_steps)
    )


@_checked
def gigpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """GiGPO: A = A^E (Eq. 1, episode term) + omega * A^S (Eq. 2, step term on G_0).

    Both terms use ``cfg.norm``; the episode term ``cfg.episode_std``, the step term ``cfg.std``.
    """
    R = step_returns(batch, cfg)
    h = _levels(batch, cfg, R, 0)
    A0 = h.advantages[0]
    ep, _ = _episode_advantage(batch, cfg)
    return Advantages(
        ep + cfg.omega * A0,
        R,
        np.stack([A0, ep]),
        np.stack([h.ids[0], np.full_like(h.ids[0], -1)]),
        ("0", "episode"),
        _level_diagnostics(["0", "episode"], [_levels_of(h)[0], None], batch.n_steps),
    )


@_checked
def oracle(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """Oracle ("w/o HoG-1"): R_t normalised within G_K only (identical K-step context).

    Steps whose G_K is a singleton (or, with ``early="drop"``, that have t < K) get 0.
    """
    R = step_returns(batch, cfg)
    h = _levels(batch, cfg, R, cfg.K)
    names = [str(k) for k in range(cfg.K + 1)]
    A = h.advantages
    return Advantages(
        A[cfg.K], R, A, h.ids, tuple(names), _level_diagnostics(names, _levels_of(h), batch.n_steps)
    )


@_checked
def hgpo_nohog2(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """HGPO without the hierarchy ("w/o HoG-2"): the oracle advantage A_K where |G_K| >= 2,
    the step-level advantage A_0 elsewhere."""
    R = step_returns(batch, cfg)
    h = _levels(batch, cfg, R, cfg.K)
    A = h.advantages
    use_oracle = h.size_of_row(cfg.K) >= 2
    names = [str(k) for k in range(cfg.K + 1)]
    return Advantages(
        np.where(use_oracle, A[cfg.K], A[0]),
        R,
        A,
        h.ids,
        tuple(names),
        _level_diagnostics(names, _levels_of(h), batch.n_steps),
    )


@_checked
def hgpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """HGPO, Eqs. (3)-(7): A^H(s_t) = sum_k w_k A_k(s_t), w_k = (k+1)^alpha / sum_k' (k'+1)^alpha.

    A_k (Eq. 6) is R_t normalised within the level-k group G_k (Eq. 4: same rollout group, same
    k-step context C_k of Eq. 3); G_0 contains G_1 contains ... G_K (Eq. 5). Levels that give no
    estimate are left out of both sums; ``zero_rule`` says which: "degenerate" (default: the
    step's group is a singleton or all its returns are equal, decided exactly), "value" (the
    public code: A_k == 0.0 in floating point, so a step that happens to sit at its group's mean,
    or within rounding of it, is dropped too) or "none" (every level the step belongs to). If no
    level is used, A^H = 0. ``weight_offset`` replaces the 1 in (k + 1); ``base_group`` adds the
    episode advantage as one more level of raw weight ``base_weight``. With ``leave_one_out``
    each level's baseline leaves the step out: A_k = (R_t - mean_{j in G_k, j != t} R_j)
    [/ (std_{G_k} + eps)] = |G_k| / (|G_k| - 1) (R_t - mean_{G_k} R) [/ ...].
    """
    R = step_returns(batch, cfg)
    h = _levels(batch, cfg, R, cfg.K)
    A, informative, keys = h.advantages, h.informative, h.ids
    names = [str(k) for k in range(cfg.K + 1)]
    raw = level_weights(cfg, cfg.K + 1)
    sizes: list[tuple[int, np.ndarray] | None] = _levels_of(h)
    if cfg.base_group:
        ep, ep_informative = _episode_advantage(batch, cfg)
        A = np.vstack([A, ep[None]])
        informative = np.vstack([informative, ep_informative[None]])
        keys = np.vstack([keys, np.full((1, batch.n_steps), -1, dtype=np.int64)])
        raw = np.append(raw, cfg.base_weight)
        names.append("base")
        sizes.append(None)
    adv, used, mean_w = _aggregate(A, informative, keys, raw, cfg, cfg.base_group)
    diag = _level_diagnostics(names, sizes, batch.n_steps, mean_w)
    diag["raw_weights"] = raw
    diag["used"] = used
    return Advantages(adv, R, A, keys, tuple(names), diag)


def _aggregate(
    A: np.ndarray,
    informative: np.ndarray,
    keys: np.ndarray,
    raw: np.ndarray,
    cfg: EstimatorConfig,
    base_group: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. (7): A^H = sum_k w_k A_k over the levels used, w_k = raw_k / (sum of used raw_k
    + weight_eps); 0 where no level is used.

    Returns (float64[n] A^H, bool[L, n] used, float64[L] mean weight per level). Works in
    blocks of columns so that the (L, block) temporaries stay in the caches.
    """
    L, n = A.shape
    if cfg.zero_rule == "degenerate":
        used = informative
    elif cfg.zero_rule == "value":
        used = A != 0
    else:
        used = keys >= 0
        if base_group:
            used[-1] = True
    adv = np.empty(n)
    w_sum = np.zeros(L)
    rw = raw[:, None]
    for lo in range(0, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        u = used[:, lo:hi]
        w = rw * u  # (L, block)
        den = w.sum(axis=0)
        den += cfg.weight_eps
        # den > 0 wherever a level is used, unless every used raw weight is 0 (base_weight 0).
        np.divide(w, np.where(u.any(axis=0) & (den > 0), den, 1.0), out=w)
        adv[lo:hi] = np.einsum("ln,ln->n", w, A[:, lo:hi])
        w_sum += w.sum(axis=1)
    return adv, used, w_sum / n


@_checked
def hgpo_uniform(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """HGPO with uniform level weights ("w/o adaptive weighting"): ``hgpo`` with alpha = 0."""
    return hgpo(batch, cfg.replace(alpha=0.0))


@_checked
def gae(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """GAE (Schulman et al. 2016) given state values: A_t = sum_j (gamma lambda)^j delta_{t+j},
    delta_t = r_t + gamma V(s_{t+1}) - V(s_t), V = 0 after a trajectory's last step.

    values: float64[n] V(s_t) of every step (a critic's output). Rewards include the invalid
    penalty (always propagated). ``returns`` holds the critic's targets A_t + V(s_t).
    """
    if values is None:
        raise ValueError("estimator 'gae' needs values: float64[n] state values V(s_t)")
    V = check_step_values(batch, values, "gae: values")
    r = penalised_rewards(batch, cfg.invalid_penalty)
    V_next = np.zeros_like(V)
    V_next[:-1] = V[1:]
    V_next[batch.traj_start + batch.traj_len - 1] = 0.0
    delta = r + cfg.gamma * V_next - V
    A = discounted_returns(batch, cfg.gamma * cfg.gae_lambda, delta)
    return Advantages(A, A + V)
