"""Batched rollouts: many groups x N rollouts in one numba call, as a :class:`hgpo.StepBatch`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.options import bad, check_int, check_number
from toyenvs import _kernels as kn
from toyenvs._kernels import SEED_MAX
from toyenvs.branched_rollout import branched_rollout, check_budget, parse_scheme
from toyenvs.core import INVALID_PENALTY, POMDP, check_tasks
from toyenvs.policy import TabularPolicy

if TYPE_CHECKING:
    from toyenvs.neural import NeuralPolicy

__all__ = ["Rollouts", "alloc_buffers", "rollout", "rollout_arrays"]


@dataclass(frozen=True)
class Rollouts:
    """A batch of rollouts with what the ground truth needs (n steps, n_traj trajectories).

    Attributes:
        batch: the estimators' StepBatch. group = task slot (index into ``tasks``), traj =
            slot * n_rollouts + j, step, reward = env reward excluding the invalid penalty,
            state = observation id, action = action id, invalid = invalid-action flag,
        next_state = the observation id of the state each step led to (after a trajectory's
        last step: of the state it ended in, a goal, a trap or where the horizon cut it).
        hidden: int64[n] hidden state s_t of each step.
        context: int64[n] the policy's dense context row of each step (row of ``pol.logits``).
        code: int64[n] full K-step context code of each step.
        context_keys: int64[K + 1, n] row k = code of the k-step context (o, a pairs of the last
            k steps + o_t); row K equals ``code``. Equal keys <=> equal k-step contexts.
        success: bool[n_traj] the trajectory reached a goal.
        tasks: int64[n_groups] the start state of each group. n_rollouts: rollouts per group.
        K: the policy's history length.
    """

    batch: StepBatch
    hidden: np.ndarray
    context: np.ndarray
    code: np.ndarray
    context_keys: np.ndarray
    success: np.ndarray
    tasks: np.ndarray
    n_rollouts: int
    K: int

    @property
    def true_reward(self) -> np.ndarray:
        """float64[n] r_t - 0.1 * invalid_t, the reward the ground truth uses."""
        return self.batch.reward - INVALID_PENALTY * self.batch.invalid

    @property
    def n_steps(self) -> int:
        return self.batch.n_steps


def _check_common(
    env: POMDP, pol: TabularPolicy | NeuralPolicy, n_rollouts: int, seed: int
) -> None:
    if not hasattr(pol, "run_visited"):
        raise bad("pol", "a toyenvs.TabularPolicy or NeuralPolicy", type(pol).__name__)
    if pol.n_obs != env.n_obs or pol.n_actions != env.n_actions:
        raise ValueError(
            f"policy has n_obs={pol.n_obs}, n_actions={pol.n_actions}; env has "
            f"n_obs={env.n_obs}, n_actions={env.n_actions}"
        )
    check_int("n_rollouts", n_rollouts, lo=1)
    check_int("seed", seed, lo=0, hi=SEED_MAX)


def env_args(env: POMDP) -> tuple[np.ndarray, ...]:
    return (
        env.obs_of_state, env.next_state, env.next_prob, env.invalid, env.reward_enter,
        env.terminal,
    )  # fmt: skip


_BUFFERS = {
    "group": np.int64, "traj": np.int64, "step": np.int64, "reward": np.float64,
    "state": np.int64, "action": np.int64, "invalid": np.bool_, "hidden": np.int64,
    "context": np.int64, "next_state": np.int64,
}  # fmt: skip
"""The per-row output columns of the rollout kernel and their dtypes."""


def alloc_buffers(n_rows: int, n_traj: int, K: int) -> dict[str, np.ndarray]:
    """Output buffers of :func:`rollout_arrays` for up to ``n_rows`` steps (reusable)."""
    out = {name: np.empty(n_rows, dtype) for name, dtype in _BUFFERS.items()}
    out["context_keys"] = np.empty((K + 1, n_rows), np.int64)
    out["success"] = np.empty(n_traj, np.bool_)
    out["length"] = np.empty(n_traj, np.int64)
    return out


def rollout_arrays(
    env: POMDP,
    pol: TabularPolicy | NeuralPolicy,
    tasks: np.ndarray,
    n_rollouts: int,
    seed: int,
    buffers: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The raw kernel output as views of trimmed arrays, without building a StepBatch.

    ``buffers`` (from :func:`alloc_buffers`, large enough) avoids allocating the outputs, for
    throughput runs; the returned arrays are then views into it. The arguments are checked as
    :func:`rollout` checks them (a start state out of range would be read out of bounds).
    """
    tasks = check_tasks(env, tasks)
    _check_common(env, pol, n_rollouts, seed)
    if buffers is not None:
        missing = [k for k in (*_BUFFERS, "context_keys", "success", "length") if k not in buffers]
        if missing:
            raise ValueError(f"buffers: must come from alloc_buffers, missing {missing}")
    n_rollouts, seed = int(n_rollouts), int(seed)
    n_traj = tasks.size * n_rollouts
    cap = n_traj * env.horizon
    if buffers is None:
        buffers = alloc_buffers(cap, n_traj, pol.K)
    elif buffers["group"].shape[0] < cap or buffers["success"].shape[0] < n_traj:
        raise ValueError(f"buffers hold fewer than {cap} rows or {n_traj} trajectories")
    b = buffers
    pol.cover(env, tasks)
    names = tuple(_BUFFERS)  # (the kernel's order)

    def call(tables: tuple) -> int:
        return kn.rollout_kernel_fast(
            tasks, n_rollouts, seed, env.horizon, pol.K, pol.n_obs, pol.powM, *env_args(env),
            *tables, *(b[k] for k in names), b["context_keys"], b["success"], b["length"],
        )  # fmt: skip

    n = pol.run_visited(call, lambda n: b["context"][:n])
    res = {k: b[k][:n] for k in names}
    res["context_keys"] = b["context_keys"][:, :n]
    res["success"] = b["success"][:n_traj]
    res["length"] = b["length"][:n_traj]
    return res


def rollout(
    env: POMDP,
    pol: TabularPolicy | NeuralPolicy,
    tasks: np.ndarray | None = None,
    n_rollouts: int = 8,
    seed: int = 0,
    scheme: str = "independent",
    steps: int | None = None,
    branch_budget: float = 0.5,
    spo3_config: EstimatorConfig | None = None,
) -> Rollouts:
    """Roll out each task ``n_rollouts`` times under ``pol`` (one numba call).

    Args:
        env: the POMDP.
        pol: the policy (its table grows with the contexts met).
        tasks: int64[n_groups] start states, one rollout group each (default ``env.tasks``).
        n_rollouts: N, rollouts per group.
        seed: non-negative; trajectory g * N + j draws from the stream (seed, g * N + j), so the
            same seed gives the same batch bit for bit.

        scheme, steps, branch_budget: a branching scheme (``toyenvs/branched_rollout.py``):
            "independent", "branch:uniform", "branch:singleton", "branch:hard", "branch:3spo" or
            "tree:D1,..." with ``steps`` env steps per group, the share ``branch_budget`` of
            them on branches. The batch is then branched (``StepBatch.parent``); ``n_rollouts``
            is unused.
        spo3_config: the ``spo3_*`` options (alpha, xi, zeta, eps, G_max) of "branch:3spo"
            (default: ``EstimatorConfig()``'s); refused under another scheme.

    Returns:
        :class:`Rollouts`.
    """
    tasks = check_tasks(env, tasks)
    _check_common(env, pol, n_rollouts, seed)
    check_number("branch_budget", branch_budget, lo=0.0, hi=1.0, lo_open=True)
    if spo3_config is not None and scheme != "branch:3spo":
        raise bad("spo3_config", f"None with scheme {scheme!r} (only branch:3spo reads it)",
                  type(spo3_config).__name__)  # fmt: skip
    if scheme != "independent" or steps is not None:  # [branching] toyenvs/branched_rollout.py
        return _branched(env, pol, tasks, int(n_rollouts), int(seed), scheme, steps, branch_budget,
                         spo3_config)  # fmt: skip
    r = rollout_arrays(env, pol, tasks, n_rollouts, seed)  # (its checks cost a few us)
    batch = StepBatch(
        group=r["group"], traj=r["traj"], step=r["step"], reward=r["reward"], state=r["state"],
        action=r["action"], invalid=r["invalid"], next_state=r["next_state"],
    )  # fmt: skip
    return Rollouts(
        batch=batch, hidden=r["hidden"], context=r["context"], code=r["context_keys"][pol.K],
        context_keys=np.ascontiguousarray(r["context_keys"]), success=r["success"], tasks=tasks,
        n_rollouts=int(n_rollouts), K=pol.K,
    )  # fmt: skip


def _branched(
    env: POMDP,
    pol: TabularPolicy | NeuralPolicy,
    tasks: np.ndarray,
    n_rollouts: int,
    seed: int,
    scheme: str,
    steps: int | None,
    branch_budget: float,
    spo3_config: EstimatorConfig | None = None,
) -> Rollouts:
    """[branching] :func:`rollout` under a scheme with a step budget."""
    parsed = parse_scheme(scheme, env.horizon)
    check_budget(parsed, steps)
    r, batch = branched_rollout(env, pol, tasks, seed, parsed, int(steps), float(branch_budget),
                                spo3_config)  # fmt: skip
    return Rollouts(
        batch=batch, hidden=r["hidden"], context=r["context"], code=r["context_keys"][pol.K],
        context_keys=r["context_keys"], success=r["success"], tasks=tasks, n_rollouts=n_rollouts,
        K=pol.K,
    )  # fmt: skip
