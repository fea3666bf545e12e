"""Discounted step returns and episode returns, vectorised over every trajectory of a batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hgpo.batch import StepBatch
from hgpo.branched_batch import virtual_episode_returns
from hgpo.options import OptionError, check_number

__all__ = [
    "check_batch",
    "check_finite",
    "check_step_values",
    "discounted_returns",
    "episode_returns",
    "penalised_rewards",
]


def check_finite(
    batch: StepBatch, values: np.ndarray, what: str, too_large: str = "to add up", where: str = ""
) -> np.ndarray:
    """``values`` (float64[n], one per step) if all are finite; else a ValueError naming the
    first step's trajectory: finite rewards whose sum passes float64's 1.8e308 overflow.

    ``where`` prefixes the message (e.g. the estimator's name); ``too_large`` says what the
    rewards are too large for."""
    finite = np.isfinite(values)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise ValueError(
            f"{where}the {what} of step {int(batch.step[i])} of trajectory {int(batch.traj[i])} "
            f"(row {i}) overflows float64 ({float(values[i])}): the rewards are too large "
            f"{too_large}; scale them down"
        )
    return values


def check_batch(batch: object) -> StepBatch:
    """``batch`` if it is a StepBatch, else an OptionError naming its type."""
    if not isinstance(batch, StepBatch):
        raise OptionError(f"batch: must be a StepBatch, got {type(batch).__name__}")
    return batch


def check_step_values(batch: StepBatch, values: object, name: str) -> np.ndarray:
    """``values`` as float64[n], one finite real number per step of ``batch``; a ValueError
    naming ``name`` otherwise (another length or shape, booleans, complex numbers, strings,
    NaN or inf)."""
    check_batch(batch)
    arr = np.asarray(values)
    n = batch.n_steps
    if arr.dtype.kind not in "iuf":
        raise OptionError(f"{name}: must be {n} real numbers, one per step, got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise OptionError(
            f"{name}: must be one value per step, shape ({n},), got shape {arr.shape}"
        )
    arr = np.asarray(arr, dtype=np.float64)
    finite = np.isfinite(arr)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{name}[{i}] is {float(arr[i])}; every value must be finite")
    return arr


def check_step_texts(batch: StepBatch, texts: object, name: str) -> list[str]:
    """``texts`` as a list of str, one per step of ``batch`` (e.g. the observation text of
    every step); a ValueError naming ``name`` otherwise (one str, another length, a non-str)."""
    n = batch.n_steps
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence | np.ndarray):
        raise ValueError(
            f"{name}: must be a sequence of {n} str, one per step, got {type(texts).__name__}"
        )
    out = list(texts)
    if len(out) != n:
        raise ValueError(f"{name}: must be one str per step, {n}, got {len(out)}")
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ValueError(f"{name}[{i}] is {t!r}; every observation must be a str")
    return out


def penalised_rewards(batch: StepBatch, invalid_penalty: float) -> np.ndarray:
    """float64[n] r_t - penalty * invalid_t (the reward the paper's return propagates)."""
    invalid_penalty = check_number("invalid_penalty", invalid_penalty, lo=0.0)
    if batch.invalid is None or invalid_penalty == 0.0:
        return batch.reward
    with np.errstate(over="ignore"):
        r = batch.reward - invalid_penalty * batch.invalid
    return check_finite(batch, r, "penalised reward")


_BLOCK_ROWS = 1 << 16  # rows per block of whole trajectories (keeps the work in the caches)


def discounted_returns(
    batch: StepBatch, gamma: float, rewards: np.ndarray | None = None
) -> np.ndarray:
    """Step returns R_t = sum_{j >= t} gamma^(j - t) r_j of every step, Eq. (2)'s R.

    Args:
        batch: the steps (trajectories contiguous, ordered).
        gamma: discount in [0, 1].
        rewards: float64[n] rewards to discount; defaults to ``batch.reward``.

    Returns:
        float64[n]. A return past float64's range (finite rewards that add up to more than
        1.8e308) raises a ValueError naming its trajectory. Computed as the recursion
        R_t = r_t + gamma R_{t+1} from each trajectory's last step back, with exactly that rounding (no gamma^(-t) rescaling, which loses
        precision on long trajectories), vectorised across trajectories: in blocks of whole
        trajectories, one vector operation per step index (or per distance to the end when
        lengths differ a lot), so the work is O(n) and the arrays of a block stay in cache.
    """
    gamma = check_number("gamma", gamma, lo=0.0, hi=1.0)
    r = batch.reward if rewards is None else check_step_values(batch, rewards, "rewards")
    if gamma == 0.0:
        return check_finite(batch, r.copy(), "return")
    out = np.empty_like(r)
    starts, n, n_traj = batch.traj_start, batch.n_steps, batch.n_traj
    cut = np.searchsorted(starts, np.arange(_BLOCK_ROWS, n, _BLOCK_ROWS, dtype=np.int64))
    tb = np.unique(np.concatenate(([0], cut, [n_traj])))
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, naming the trajectory
        _discount_blocks(batch, r, out, tb, gamma)
    return check_finite(batch, out, "return")


def _discount_blocks(
    batch: StepBatch, r: np.ndarray, out: np.ndarray, tb: np.ndarray, gamma: float
) -> None:
    """The recursion block by block (blocks of whole trajectories, bounds ``tb``)."""
    starts, lens = batch.traj_start, batch.traj_len
    step = batch.step
    if batch.branches is not None:  # [branching] a branch's own rows start at its branch step
        step = step - batch.branches.branch_step[batch.traj_index]
    for t0, t1 in zip(tb[:-1].tolist(), tb[1:].tolist(), strict=True):
        lo, hi = int(starts[t0]), int(starts[t1 - 1] + lens[t1 - 1])
        block_lens = lens[t0:t1]
        T = int(block_lens.max())
        if (t1 - t0) * T <= 2 * (hi - lo) + 64:
            _returns_padded(r[lo:hi], out[lo:hi], step[lo:hi], batch.traj_index[lo:hi] - t0,
                            t1 - t0, T, gamma)  # fmt: skip
        else:
            _returns_by_distance(r[lo:hi], out[lo:hi], block_lens, T, gamma)


def _returns_padded(
    r: np.ndarray, out: np.ndarray, step: np.ndarray, col: np.ndarray, n_traj: int, T: int,
    gamma: float,
) -> None:  # fmt: skip
    """The recursion on a (T + 1, n_traj) table, one row per step index; 0 past each end."""
    P = np.zeros((T + 1, n_traj))
    P[step, col] = r
    tmp = np.empty(n_traj)
    for j in range(T - 1, -1, -1):
        np.multiply(P[j + 1], gamma, out=tmp)
        P[j] += tmp  # r_j + gamma R_{j+1}; past a trajectory's end R = 0 and r_j + 0.0 = r_j
    out[:] = P[step, col]


def _returns_by_distance(
    r: np.ndarray, out: np.ndarray, lens: np.ndarray, T: int, gamma: float
) -> None:
    """The recursion over "distance to the end": one vector operation per distance, touching
    only the rows at it (for blocks whose trajectory lengths differ a lot)."""
    out[:] = r
    ends = np.cumsum(lens)
    to_end = np.repeat(ends, lens) - 1 - np.arange(r.shape[0])  # 0 on last row
    order = np.argsort(to_end.astype(np.uint16) if T <= 1 << 16 else to_end, kind="stable")
    bounds = np.searchsorted(to_end[order], np.arange(T + 1))
    for d in range(1, T):
        rows = order[bounds[d] : bounds[d + 1]]
        out[rows] += gamma * out[rows + 1]


def episode_returns(batch: StepBatch, rewards: np.ndarray | None = None) -> np.ndarray:
    """float64[n_traj] undiscounted total reward of each trajectory (Eq. (1)'s R(tau)).

    Summed by the same recursion as the step returns (R_0 at gamma = 1, from the last step
    back), so the rounding, and hence which groups are exactly tied, is fixed by definition.
    A branch's episode is its virtual full trajectory, its parent's prefix then its own rows.
    """
    if rewards is not None:
        rewards = check_step_values(batch, rewards, "rewards")
    if batch.branches is not None:  # [branching] the parent's prefix counts too
        return virtual_episode_returns(batch, batch.reward if rewards is None else rewards)
    return discounted_returns(batch, 1.0, rewards)[batch.traj_start]
