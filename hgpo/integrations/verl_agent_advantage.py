"""verl-agent's advantage functions, computed by this project's estimator registry.

verl-agent (the GiGPO authors' fork of verl, which also carries the HGPO recipe) computes its
advantages in ``gigpo/core_gigpo.py`` and ``recipe/hgpo/core_hgpo.py`` (johnhaofu/verl-agent at
commit 796ed31). This module has functions with exactly their signatures and outputs:

- :func:`compute_gigpo_outcome_advantage` (``gigpo.core_gigpo``);
- :func:`compute_hgpo_outcome_advantage` (``recipe.hgpo.core_hgpo``);
- :func:`compute_grpo_outcome_advantage`, :func:`compute_rloo_outcome_advantage` (verl-agent's
  ``verl/trainer/ppo/core_algos.py``, which take a ``traj_index`` that upstream verl's do not);

and :func:`compute_step_advantage` for the registry's step-return estimators verl-agent lacks.
(Every other registered estimator runs on verl-agent's batch itself, with each step's env
reward: ``hgpo.integrations.verl_agent.compute_contract_advantage``.)
``hgpo.integrations.verl_agent`` re-exports them with ``install()``, which routes verl-agent's
``compute_advantage`` to them by name.

Inputs, as verl-agent's trainer hands them over (one row = one agent step):
``token_level_rewards`` [n, L] (the episode reward at the step's last response token, less the
invalid-action penalty), ``step_rewards`` [n] (the discounted step return R_t, less the same
penalty), ``response_mask`` [n, L], and numpy object arrays ``anchor_obs`` (the observation the
step was taken from), ``index`` (the rollout group, ``uid``) and ``traj_index`` (``traj_uid``).
The rows of a trajectory need not be contiguous; their order in the batch is their step order.

How they reach the registry. The registry derives both the step returns and the episode
scores from one reward column, while these functions receive the two as separate inputs
(the trainer computed them already). So two :class:`hgpo.StepBatch` es are built:

- the *step batch*: groups from ``index``, trajectories from (``index``, ``traj_index``),
  steps in batch order, states from ``anchor_obs`` (dense ids of the authors' ``to_hashable``
  keys, first seen = 0, as ``hgpo.state_ids`` makes them), reward = ``step_rewards`` with
  gamma = 0, so that R_t is exactly the given step return;
- the *episode batch*: every row its own one-step trajectory with reward
  S_i = ``token_level_rewards[i].sum()`` (verl-agent pools every step row of a rollout group).

Then, with ``cfg = reference_config(name, ...)``:
GiGPO  A = grpo(episode batch) + step_advantage_w * stepwise(step batch), Eq. (8) of GiGPO;
       with ``enable_similarity`` the step batch's states are gigpo_similarity's clusters of
       the ``anchor_obs`` texts (see :func:`compute_gigpo_outcome_advantage`);
HGPO   A = hgpo(step batch), and with ``base_group`` Eq. (7) over the levels of hgpo(step batch)
       plus the base level grpo(episode batch) of raw weight 1 (see :func:`with_base_level`);
GRPO / RLOO  A = grpo / rloo(episode batch).
Outputs are ``A[row] * response_mask`` in the dtype and on the device the authors' code gives,
returned twice ``(advantages, returns)``, as theirs are.

An option the registry does not have (an unknown ``mode``, ``compute_mean_std_cross_steps=False``)
is a ValueError naming it: never a different estimator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo import StepBatch, compute_advantages, reference_config
from hgpo.config import EstimatorConfig
from hgpo.estimators import level_weights
from hgpo.extras import MissingExtraError, installed
from hgpo.gigpo_variants import similarity_clusters
from hgpo.options import OptionError, bad, check_bool, check_int, check_number

if not installed("torch"):  # pragma: no cover - CI installs the extras
    raise MissingExtraError(
        "hgpo.integrations.verl_agent needs torch (the [llm] extra); install it with pip "
        'install -e ".[llm]"'
    )
import torch

__all__ = [
    "MODES",
    "compute_gigpo_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_hgpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_step_advantage",
    "with_base_level",
]

MODES = {"mean_std_norm": "mean_std", "mean_norm": "mean"}
"""verl-agent's ``mode`` -> ``EstimatorConfig.norm``."""


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class _Rows:
    """verl-agent's per-row inputs as the registry's arrays (n rows, batch order)."""

    group: np.ndarray  # int64[n] dense rollout-group id (from index)
    traj: np.ndarray  # int64[n] dense trajectory id (from (index, traj_index))
    state: np.ndarray  # int64[n] dense observation key (from anchor_obs)
    R: np.ndarray | None  # float64[n] step_rewards
    S: np.ndarray  # float64[n] token_level_rewards summed per row
    next_state: np.ndarray | None = None  # int64[n] key of next_obs, the keys of state


def _obs_key(x: Any, where: str) -> Any:
    """The key verl-agent's ``to_hashable`` makes of observation ``where`` (``anchor_obs[i]``;
    the same equalities: numbers by value, arrays by their flattened values, lists as tuples)."""
    if isinstance(x, int | float | str | bool):
        return x
    if isinstance(x, np.integer | np.floating):
        return x.item()
    if isinstance(x, np.ndarray):
        return tuple(x.flatten())
    if isinstance(x, list | tuple):
        return tuple(_obs_key(e, where) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _obs_key(v, where)) for k, v in x.items()))
    raise bad(where, "a str, number, numpy array, list, tuple or dict", x)


def _obs_keys(name: str, value: Any, n: int) -> list[Any]:
    """The observation keys of column ``name`` (``anchor_obs``, ``next_obs``)."""
    keys = _object_column(name, value, n).tolist()
    if not all(type(o) is str for o in keys):  # text observations (the usual) are keys
        keys = [_obs_key(o, f"{name}[{i}]") for i, o in enumerate(keys)]
    return keys


def _object_column(where: str, value: Any, n: int) -> np.ndarray:
    """``value`` as a one-dimensional object array of length n (a named error otherwise).

    A torch tensor (any dtype, bf16 included) gives its values as Python numbers
    (``tolist``): the same keys, and so the same grouping, as a numpy array of the same ids
    (the tensor's elements themselves are hashed by identity, each row its own key)."""
    if isinstance(value, torch.Tensor):
        if value.ndim != 1:
            raise OptionError(
                f"{where}: must be one-dimensional (one value per row), got a tensor of shape "
                f"{tuple(value.shape)}"
            )
        value = value.detach().cpu().tolist()
    try:
        arr = np.empty(len(value), dtype=object)
        arr[:] = list(value)
    except (TypeError, ValueError):
        raise bad(where, f"a sequence of {n} values, one per row", value) from None
    if arr.shape != (n,):
        raise OptionError(f"{where}: must have one value per row ({n}), got {arr.shape[0]}")
    return arr


def _tensor(where: str, value: Any, ndim: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise bad(where, "a torch.Tensor", type(value).__name__)
    if value.ndim != ndim:
        raise OptionError(f"{where}: must be {ndim}-dimensional, got shape {tuple(value.shape)}")
    return value


def _finite(where: str, x: np.ndarray) -> np.ndarray:
    ok = np.isfinite(x)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise OptionError(f"{where}[{i}] is {float(x[i])}; every value must be finite")
    return x


def _rows(
    token_level_rewards: Any,
    step_rewards: Any,
    response_mask: Any,
    anchor_obs: Any,
    index: Any,
    traj_index: Any,
    next_obs: Any = None,
) -> _Rows:
    """Check the inputs (named errors, before any work) and turn them into :class:`_Rows`.
    ``step_rewards`` and ``anchor_obs`` may be None (GRPO, RLOO); ``next_obs`` (the
    observation each step led to) is keyed with ``anchor_obs``'s keys when given."""
    tlr = _tensor("token_level_rewards", token_level_rewards, 2)
    mask = _tensor("response_mask", response_mask, 2)
    if tuple(mask.shape) != tuple(tlr.shape):
        raise OptionError(
            f"response_mask: must have the shape of token_level_rewards {tuple(tlr.shape)}, got "
            f"{tuple(mask.shape)}"
        )
    n = tlr.shape[0]
    R = None
    if step_rewards is not None:
        sr = _tensor("step_rewards", step_rewards, 1)
        if sr.shape[0] != n:
            raise OptionError(f"step_rewards: must have one value per row ({n}), got {sr.shape[0]}")
        R = _finite("step_rewards", sr.detach().to("cpu", torch.float64).numpy())
    # The episode score exactly as the authors' code sums it (in the tensor's own dtype).
    S = _finite(
        "token_level_rewards.sum(-1)", tlr.detach().sum(dim=-1).to("cpu", torch.float64).numpy()
    )
    idx = _object_column("index", index, n).tolist()
    traj = _object_column("traj_index", traj_index, n).tolist()
    state = np.zeros(n, dtype=np.int64)
    next_state = None
    if anchor_obs is not None:
        ids: dict[Any, int] = {}
        state = _dense("anchor_obs", _obs_keys("anchor_obs", anchor_obs, n), ids)
        if next_obs is not None:
            next_state = _dense("next_obs", _obs_keys("next_obs", next_obs, n), ids)
    return _Rows(
        group=_dense("index", idx),
        traj=_dense("traj_index", list(zip(idx, traj, strict=True))),
        state=state,
        R=R,
        S=S,
        next_state=next_state,
    )


def _dense(where: str, keys: list[Any], ids: dict[Any, int] | None = None) -> np.ndarray:
    """int64 dense ids of hashable keys, first seen = 0 (equal keys, equal ids); ``ids``: the
    ids given so far, to extend (for a second column with the same keys)."""
    ids = {} if ids is None else ids
    try:
        out = [ids.setdefault(k, len(ids)) for k in keys]
    except TypeError:
        i = next(i for i, k in enumerate(keys) if not _hashable(k))
        raise bad(f"{where}[{i}]", "a hashable value (a str or a number)", keys[i]) from None
    return np.asarray(out, dtype=np.int64)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _step_batch(rows: _Rows) -> tuple[StepBatch, np.ndarray]:
    """The step batch (trajectories made contiguous, steps in batch order) and the order:
    row ``order[j]`` of the inputs is row j of the batch."""
    order = np.argsort(rows.traj, kind="stable")
    traj = rows.traj[order]
    counts = np.bincount(traj)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    step = np.arange(traj.shape[0], dtype=np.int64) - starts[traj]
    if rows.R is None:  # (the callers of the step batch always pass step_rewards)
        raise OptionError("step_rewards: needed for the step batch")
    batch = StepBatch(
        group=rows.group[order], traj=traj, step=step, reward=rows.R[order], state=rows.state[order]
    )
    if rows.next_state is not None:
        try:
            batch = dataclasses.replace(batch, next_state=rows.next_state[order])
        except ValueError as exc:
            raise OptionError(
                f"next_obs: must be the observation each step led to (the next step's "
                f"anchor_obs within a trajectory, rows in step order): {exc}"
            ) from None
    return batch, order


def _episode_batch(rows: _Rows) -> StepBatch:
    """Every row its own one-step trajectory, reward = its episode score S."""
    n = rows.S.shape[0]
    zeros = np.zeros(n, dtype=np.int64)
    return StepBatch(group=rows.group, traj=np.arange(n), step=zeros, reward=rows.S, state=zeros)


def _unsorted(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[order] = values
    return out


def _broadcast(A: np.ndarray, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``A[row] * response_mask`` (verl-agent's broadcast to the response tokens)."""
    a = torch.as_tensor(A, dtype=torch.float64).to(device=response_mask.device, dtype=dtype)
    return a.unsqueeze(-1) * response_mask


# --------------------------------------------------------------------------- options


def _norm(where: str, mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise bad(where, "'mean_std_norm' or 'mean_norm'", mode)
    return MODES[mode]


def _number(where: str, value: Any, lo: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise bad(where, "a number", value)
    v = float(value)
    if not math.isfinite(v) or (lo is not None and v < lo):
        raise bad(where, "a finite number" + ("" if lo is None else f" >= {lo:g}"), value)
    return v


def _hgpo_config(
    name: str, history_length: Any, epsilon: Any, mode: Any, alpha: Any, base_group: Any
) -> EstimatorConfig:
    """reference_config(name) for the step batch (gamma 0: R_t is given)."""
    K = check_int("history_length", history_length, lo=0)
    eps = _number("epsilon", epsilon, lo=0.0)
    norm = _norm("mode", mode)
    a = _number("length_weight_alpha", alpha, lo=0.0)
    check_bool("base_group", base_group)
    return reference_config(
        name, K=K, gamma=0.0, alpha=a, norm=norm, eps=eps, weight_eps=eps, base_group=False
    )


def _check_cross_steps(value: Any) -> None:
    if check_bool("compute_mean_std_cross_steps", value) is not True:
        raise OptionError(
            "compute_mean_std_cross_steps: only True (every step row of a rollout group is a "
            "member, verl-agent's default) is supported, got False"
        )


# --------------------------------------------------------------------------- estimators


def with_base_level(levels: np.ndarray, base: np.ndarray, cfg: EstimatorConfig) -> np.ndarray:
    """Eq. (7) with HGPO's base level, as ``compute_advantages("hgpo", base_group=True)``:
    A = sum_j w_j A_j over the levels j = 0..K and the base level, w_j = raw_j u_j /
    (sum_j raw_j u_j + weight_eps), raw_j = (j + weight_offset)^alpha, raw_base =
    base_weight, u_j = [A_j != 0] (``zero_rule="value"``, the public code's test); 0 where
    no level is used.

    levels: float64[K + 1, n] ``level_advantages`` of hgpo without the base level;
    base: float64[n] the episode advantage (grpo of the episode batch)."""
    if cfg.zero_rule != "value":
        raise OptionError(f"with_base_level: zero_rule must be 'value', got {cfg.zero_rule!r}")
    A = np.vstack([levels, base[None]])
    raw = np.append(level_weights(cfg, levels.shape[0]), cfg.base_weight)[:, None]
    w = raw * (A != 0)
    den = w.sum(axis=0) + cfg.weight_eps
    used = (A != 0).any(axis=0) & (den > 0)
    return np.where(used, (w * A).sum(axis=0) / np.where(used, den, 1.0), 0.0)


def _hgpo_family(name: str, rows: _Rows, cfg: EstimatorConfig, base_group: bool) -> np.ndarray:
    """float64[n] hgpo / hgpo-uniform (with the base level), stepwise, oracle, hgpo-nohog2."""
    batch, order = _step_batch(rows)
    if name == "hgpo-uniform":
        name, cfg = "hgpo", cfg.replace(alpha=0.0)
    out = compute_advantages(name, batch, config=cfg)
    if not (base_group and name == "hgpo"):
        return _unsorted(out.advantages, order)
    base = compute_advantages("grpo", _episode_batch(rows), config=cfg).advantages
    return _unsorted(with_base_level(out.level_advantages, base[order], cfg), order)


def compute_hgpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    anchor_obs: np.array,
    index: np.array,
    traj_index: np.array,
    history_length: int,
    epsilon: float = 1e-6,
    mode: str = "mean_std_norm",
    length_weight_alpha: float = 1.0,
    base_group: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HGPO's step advantages, as ``recipe/hgpo/core_hgpo.compute_hgpo_outcome_advantage``.

    ``compute_advantages("hgpo", step batch, reference_config("hgpo", K=history_length,
    alpha=length_weight_alpha, norm=mode, eps=weight_eps=epsilon))``; with ``base_group`` the
    episode advantage of the episode batch joins Eq. (7) as a level of raw weight 1
    (:func:`with_base_level`). Returns ``(A * response_mask,) * 2`` of dtype
    promote(float32, response_mask.dtype) (the authors' code works in float32; this one in
    float64, cast at the end)."""
    cfg = _hgpo_config("hgpo", history_length, epsilon, mode, length_weight_alpha, base_group)
    rows = _rows(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index)
    dtype = torch.promote_types(torch.float32, response_mask.dtype)
    if rows.S.shape[0] == 0:
        empty = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
        return empty, empty
    adv = _broadcast(_hgpo_family("hgpo", rows, cfg, base_group), response_mask, dtype)
    return adv, adv


def compute_gigpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    anchor_obs: np.array,
    index: np.array,
    traj_index: np.array,
    epsilon: float = 1e-6,
    step_advantage_w: float = 1.0,
    mode: str = "mean_norm",
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO's advantages, as ``gigpo/core_gigpo.compute_gigpo_outcome_advantage``:
    A = A^E + step_advantage_w * A^S (Eq. 8 of GiGPO), A^E = grpo(episode batch), A^S =
    stepwise(step batch) with ``reference_config("gigpo", norm=mode, eps=epsilon)`` (sample
    std in both terms, a one-row episode group passes through).

    ``enable_similarity=True`` is our ``gigpo_similarity``: the step groups are, within each
    rollout group, the greedy clusters of the ``anchor_obs`` texts whose difflib ratio with a
    cluster's representative is >= ``similarity_thresh`` (in (0, 1), read only then, as in the
    authors' code), :func:`hgpo.gigpo_variants.similarity_clusters`, taken in the order of
    the rows as given, as the authors' ``build_step_group`` takes them (their order decides
    the clusters); ``anchor_obs`` must then be str (a named error otherwise, as theirs
    raises). Returns ``(A * response_mask,) * 2`` in the dtype torch gives the authors' sum of
    ``token_level_rewards * response_mask`` and ``step_rewards * response_mask``."""
    similar = check_bool("enable_similarity", enable_similarity)
    if similar:
        thresh = check_number("similarity_thresh", similarity_thresh, lo=0.0, hi=1.0,
                              lo_open=True, hi_open=True)  # fmt: skip
    norm = _norm("mode", mode)
    eps = _number("epsilon", epsilon, lo=0.0)
    w = _number("step_advantage_w", step_advantage_w)
    rows = _rows(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index)
    texts = None
    if similar:
        texts = _texts(anchor_obs, rows.S.shape[0], "enable_similarity=True compares the texts")
    dtype = torch.promote_types(
        torch.promote_types(token_level_rewards.dtype, response_mask.dtype),
        torch.promote_types(step_rewards.dtype, response_mask.dtype),
    )
    if rows.S.shape[0] == 0:
        empty = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
        return empty, empty
    cfg = reference_config("gigpo", norm=norm, eps=eps, gamma=0.0)
    if texts is not None:  # the rows' order, as build_step_group meets them
        clusters = similarity_clusters(_episode_batch(rows), texts, thresh)
        rows = dataclasses.replace(rows, state=clusters)
    adv = _broadcast(_gigpo(rows, cfg, w), response_mask, dtype)
    return adv, adv


def _texts(anchor_obs: Any, n: int, why: str) -> list[str]:
    """``anchor_obs`` as n str (the observation texts), or a named error at the first that is
    not one."""
    obs = _object_column("anchor_obs", anchor_obs, n).tolist()
    for i, o in enumerate(obs):
        if not isinstance(o, str):
            raise bad(f"anchor_obs[{i}]", f"a str ({why})", o)
    return obs


def _gigpo(rows: _Rows, cfg: EstimatorConfig, w: float) -> np.ndarray:
    ep = compute_advantages("grpo", _episode_batch(rows), config=cfg).advantages
    batch, order = _step_batch(rows)
    step = _unsorted(compute_advantages("stepwise", batch, config=cfg).advantages, order)
    return ep + w * step


def _episode_estimator(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    traj_index: np.ndarray,
    epsilon: Any,
    norm: str,
    cross_steps: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    eps = _number("epsilon", epsilon, lo=0.0)
    _check_cross_steps(cross_steps)
    rows = _rows(token_level_rewards, None, response_mask, None, index, traj_index)
    dtype = torch.promote_types(token_level_rewards.dtype, response_mask.dtype)
    if rows.S.shape[0] == 0:
        empty = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
        return empty, empty
    cfg = reference_config(name, norm=norm, eps=eps)
    A = compute_advantages(name, _episode_batch(rows), config=cfg).advantages
    adv = _broadcast(A, response_mask, dtype)
    return adv, adv


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    traj_index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: str = True,
    compute_mean_std_cross_steps: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-agent's ``core_algos.compute_grpo_outcome_advantage``: grpo(episode batch) with
    ``reference_config("grpo")``, mean_std if ``norm_adv_by_std_in_grpo`` else mean."""
    norm = "mean_std" if check_bool("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo) else "mean"
    return _episode_estimator("grpo", token_level_rewards, response_mask, index, traj_index,
                              epsilon, norm, compute_mean_std_cross_steps)  # fmt: skip


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    traj_index: np.ndarray,
    epsilon: float = 1e-6,
    compute_mean_std_cross_steps: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-agent's ``core_algos.compute_rloo_outcome_advantage``: rloo(episode batch) with
    ``reference_config("rloo")`` (never divided by a std)."""
    return _episode_estimator("rloo", token_level_rewards, response_mask, index, traj_index,
                              epsilon, "mean", compute_mean_std_cross_steps)  # fmt: skip


def compute_step_advantage(
    name: str,
    token_level_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    anchor_obs: np.ndarray,
    index: np.ndarray,
    traj_index: np.ndarray,
    history_length: int = 2,
    epsilon: float = 1e-6,
    mode: str = "mean_std_norm",
    length_weight_alpha: float = 1.0,
    base_group: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step-return estimator of the registry that verl-agent lacks ("stepwise", "oracle",
    "hgpo-nohog2", "hgpo-uniform"), on verl-agent's inputs and with the HGPO recipe's options
    and ``reference_config(name)``; ``base_group`` only for "hgpo-uniform"."""
    if name not in ("stepwise", "oracle", "hgpo-nohog2", "hgpo-uniform", "hgpo"):
        raise bad("compute_step_advantage: name", "stepwise, oracle, hgpo-nohog2 or "
                  "hgpo-uniform", name)  # fmt: skip
    if base_group and name not in ("hgpo", "hgpo-uniform"):
        raise OptionError(f"base_group: True is an option of hgpo and hgpo-uniform, not {name!r}")
    cfg = _hgpo_config(name, history_length, epsilon, mode, length_weight_alpha, base_group)
    rows = _rows(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index)
    dtype = torch.promote_types(torch.float32, response_mask.dtype)
    if rows.S.shape[0] == 0:
        empty = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
        return empty, empty
    adv = _broadcast(_hgpo_family(name, rows, cfg, base_group), response_mask, dtype)
    return adv, adv
