"""Rollout schemes that branch from visited steps, at a budget counted in env steps.

A toy POMDP restarts exactly from any visited step: its *snapshot* is the hidden state s_t,
the policy's K-step context (the code of the step's full context, whose past part P holds the
last K (observation, action) pairs) and the step index t. The environment's randomness is a
stream per trajectory, so a branch draws its own future from a fresh stream. A branch shares
its parent's steps 0..b-1 and state s_b, hence its first step falls in the level-K group of the
step it branches from; it runs until it terminates (goal, trap or horizon). The batch is a
branched :class:`hgpo.StepBatch` (``parent`` column, see ``hgpo/branching.py``): the shared
prefix is a sample once.

Schemes (``toyenvs.rollout(..., scheme=..., steps=S, branch_budget=beta)``), per rollout group:

- ``independent``: roots only, until the group has used S env steps (without ``steps``:
  today's N independent rollouts);
- otherwise root rollouts until (1 - beta) S steps are used (at least one), then branches until
  S steps are used, each branch point drawn by a rule among the group's steps with t >= 1:
  ``branch:uniform`` uniformly; ``branch:singleton`` among steps whose level-K group (same
  K-step context) is still a singleton (consistency-aware rollouts, the paper's future work);
  ``branch:hard`` among the steps of the level-K group whose return-to-go (true reward,
  undiscounted) varies most (3SPO-like); ``tree:D1,D2,...`` at the set depths, the step with
  the fewest branches first (Tree-GRPO-like). A rule with no eligible step falls back to
  uniform, and to a new root when no step has t >= 1.

The last trajectory of a group may overshoot S by at most ``horizon - 1`` steps; the batch's
row count is the cost actually paid (compare schemes by it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from hgpo.batch import StepBatch
from hgpo.options import bad, check_int, check_number
from toyenvs import _kernels as kn
from toyenvs.core import POMDP

__all__ = ["RULES", "SCHEMES", "Scheme", "branched_rollout", "parse_scheme"]

RULES = ("independent", "branch:uniform", "branch:singleton", "branch:hard", "tree")
SCHEMES = ("independent", "branch:uniform", "branch:singleton", "branch:hard", "tree:D")
"""Scheme names; ``tree:D`` stands for ``tree:`` followed by comma-separated depths."""
_RULE_CODE = {name: i for i, name in enumerate(RULES)}
_STREAMS = 1 << 24  # random streams per rollout group: trajectory j draws from g * 2^24 + j
_CHOICE = _STREAMS - 1  # the group's stream for drawing branch points


@dataclass(frozen=True)
class Scheme:
    """A parsed rollout scheme: ``rule`` one of :data:`RULES`, ``depths`` for ``tree``."""

    rule: str
    depths: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"tree:{','.join(map(str, self.depths))}" if self.rule == "tree" else self.rule


def parse_scheme(text: str, horizon: int | None = None, where: str = "scheme") -> Scheme:
    """``"branch:singleton"`` -> Scheme; OptionError naming ``where`` and the scheme when it is
    unknown or a tree depth lies outside 1..horizon - 1."""
    if not isinstance(text, str):
        raise bad(where, "one of " + ", ".join(SCHEMES), text)
    if text.startswith("tree:"):
        parts = text[5:].split(",")
        if not all(p.strip().isdigit() for p in parts):
            raise bad(where, "tree:D with D comma-separated depths >= 1, e.g. tree:2,4", text)
        depths = tuple(sorted({int(p) for p in parts}))
        hi = None if horizon is None else horizon - 1
        for d in depths:
            check_int(f"{where} {text!r}: depth", d, lo=1, hi=hi)
        return Scheme("tree", depths)
    if text not in RULES or text == "tree":
        raise bad(where, "one of " + ", ".join(SCHEMES), text)
    return Scheme(text)


def check_budget(scheme: Scheme, steps: int | None, branch_budget: float) -> None:
    """Named errors for a step budget or branch share that cannot be used, before any work."""
    check_number("branch_budget", branch_budget, lo=0.0, hi=1.0, lo_open=True)
    if steps is None:
        if scheme.rule != "independent":
            raise bad(
                f"steps (scheme {scheme.name!r})", "an integer >= 1 env steps per group", None
            )
        return
    check_int("steps", steps, lo=1)


def branched_rollout(
    env: POMDP,
    pol: object,
    tasks: np.ndarray,
    seed: int,
    scheme: Scheme,
    steps: int,
    branch_budget: float,
) -> tuple[dict[str, np.ndarray], StepBatch]:
    """Run ``scheme`` on every task with ``steps`` env steps per group (checked arguments).

    Returns the raw columns (as :func:`toyenvs.rollout.rollout_arrays`, plus ``parent``) and the
    branched StepBatch. Trajectory j of group g draws from stream (seed, g * 2^24 + j).
    """
    if scheme.rule == "independent":
        root_steps = steps
    else:
        root_steps = int(np.ceil((1.0 - branch_budget) * steps))
    at_depth = np.zeros(env.horizon + 1, dtype=np.bool_)
    at_depth[list(scheme.depths)] = True
    cap_g = steps + env.horizon
    n_groups = tasks.size
    cap = n_groups * cap_g
    K = pol.K  # type: ignore[attr-defined]
    out = {
        name: np.empty(cap, dtype)
        for name, dtype in (
            ("group", np.int64), ("traj", np.int64), ("parent", np.int64), ("step", np.int64),
            ("reward", np.float64), ("state", np.int64), ("action", np.int64),
            ("invalid", np.bool_), ("hidden", np.int64), ("context", np.int64),
        )
    }  # fmt: skip
    keys = np.empty((K + 1, cap), np.int64)
    success = np.empty(cap, np.bool_)
    names = ("group", "traj", "parent", "step", "reward", "state", "action", "invalid", "hidden",
             "context")  # fmt: skip

    def call(tables: tuple) -> tuple[int, int]:
        return branch_kernel(
            tasks, seed, env.horizon, K, pol.n_obs, pol.powM,  # type: ignore[attr-defined]
            env.obs_of_state, env.next_state, env.next_prob, env.invalid, env.reward_enter,
            env.terminal, *tables, steps, root_steps, _RULE_CODE[scheme.rule], at_depth,
            *(out[k] for k in names), keys, success,
        )  # fmt: skip

    n, n_traj = pol.run_growing(call)  # type: ignore[attr-defined]
    res = {k: out[k][:n] for k in names}
    res["context_keys"] = np.ascontiguousarray(keys[:, :n])
    res["success"] = success[:n_traj]
    batch = StepBatch(
        group=res["group"], traj=res["traj"], step=res["step"], reward=res["reward"],
        state=res["state"], action=res["action"], invalid=res["invalid"], parent=res["parent"],
    )  # fmt: skip
    return res, batch


# --------------------------------------------------------------------------- kernels


@njit(cache=True)
def walk(
    s, P, t, st, row, g, tr, parent, horizon, K, n_obs, powM, hist,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
    o_keys,
):  # fmt: skip
    """Run one trajectory from snapshot (s, P, t) with stream ``st`` until it terminates,
    writing rows from ``row``, with the dynamics of ``_kernels.rollout_kernel``.

    Returns (next row, success, ok); ok is False when the policy table filled up.
    """
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    for k in range(K):  # the past part P = sum_k hist[k] M^k, hist[0] the latest pair
        hist[k] = (P // powM[k]) % M
    while True:
        o = obs_of_state[s]
        acc = np.int64(0)
        for k in range(K):
            o_keys[k, row] = acc * n_obs + o
            acc += hist[k] * powM[k]
        code = acc * n_obs + o
        o_keys[K, row] = code
        c = kn.table_find(code, htab)
        if c < 0:
            c = kn.table_find_or_insert(
                code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp
            )
            if c < 0:
                return row, False, False
        a, st = kn.sample_action(cdf, c, st)
        s2, st = kn.env_next(s, a, st, next_state, next_prob)
        o_group[row] = g
        o_traj[row] = tr
        o_parent[row] = parent
        o_step[row] = t
        o_reward[row] = reward_enter[s2]
        o_obs[row] = o
        o_action[row] = a
        o_invalid[row] = invalid[s, a]
        o_hidden[row] = s
        o_ctx[row] = c
        row += 1
        t += 1
        if terminal[s2]:
            return row, reward_enter[s2] > 0.0, True
        if t >= horizon:
            return row, False, True
        for k in range(K - 1, 0, -1):
            hist[k] = hist[k - 1]
        if K > 0:
            hist[0] = o * (A + 1) + a
        s = s2


@njit(cache=True)
def _slot(code, gkey):
    """Slot of a level-K code in the group's open-addressing table (inserted when absent)."""
    mask = gkey.shape[0] - 1
    h = kn.slot_of(code, np.uint64(mask))
    while gkey[h] != -1 and gkey[h] != code:
        h = (h + 1) & mask
    gkey[h] = code
    return h


@njit(cache=True)
def _pick(eligible, n_eligible, lo, hi, cst):
    """A uniformly drawn row among ``eligible[lo:hi]`` (n_eligible of them), and the stream."""
    cst, u = kn.rng_uniform(cst)
    j = min(np.int64(u * n_eligible), n_eligible - 1)
    for r in range(lo, hi):
        if eligible[r - lo]:
            if j == 0:
                return r, cst
            j -= 1
    return -1, cst


@njit(cache=True)
def choose_branch_point(rule, lo, hi, o_step, slot, gcnt, gsum, gsq, nchild, at_depth, elig,
                        cst):  # fmt: skip
    """The row to branch from among the group's rows lo..hi-1 (-1: none has t >= 1)."""
    n_any = 0
    n_rule = 0
    best = -1.0
    for r in range(lo, hi):
        i = r - lo
        ok = o_step[r] >= 1
        n_any += ok
        if not ok:
            elig[i] = False
            continue
        if rule == 2:  # singleton
            elig[i] = gcnt[slot[i]] == 1
        elif rule == 3:  # hard: population variance of the return-to-go in the group
            c = gcnt[slot[i]]
            m = gsum[slot[i]] / c
            v = gsq[slot[i]] / c - m * m if c >= 2 else 0.0
            best = max(best, v)
            elig[i] = True
        elif rule == 4:  # tree
            elig[i] = at_depth[o_step[r]]
        else:
            elig[i] = True
    if n_any == 0:
        return -1, cst
    if rule == 3:
        for r in range(lo, hi):
            i = r - lo
            if elig[i]:
                c = gcnt[slot[i]]
                m = gsum[slot[i]] / c
                v = gsq[slot[i]] / c - m * m if c >= 2 else 0.0
                elig[i] = best > 1e-12 and v >= best - 1e-12
    if rule == 4:  # fewest branches first, then the earliest row
        fewest = -1
        for r in range(lo, hi):
            if elig[r - lo] and (fewest < 0 or nchild[r - lo] < nchild[fewest - lo]):
                fewest = r
        if fewest >= 0:
            return fewest, cst
    for r in range(lo, hi):
        n_rule += elig[r - lo]
    if n_rule == 0:  # nothing the rule asks for: uniform over steps with t >= 1
        for r in range(lo, hi):
            elig[r - lo] = o_step[r] >= 1
        n_rule = n_any
    return _pick(elig, n_rule, lo, hi, cst)


@njit(cache=True)
def _record(lo, row0, row1, o_keys, K, o_reward, o_invalid, slot, gkey, gcnt, gsum, gsq):
    """Enter the rows of a finished trajectory in the group's level-K statistics."""
    g = 0.0
    for r in range(row1 - 1, row0 - 1, -1):
        g += o_reward[r] - kn.INVALID_PENALTY * o_invalid[r]
        h = _slot(o_keys[K, r], gkey)
        slot[r - lo] = h
        gcnt[h] += 1
        gsum[h] += g
        gsq[h] += g * g


@njit(cache=True)
def branch_kernel(
    starts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    steps, root_steps, rule, at_depth,
    o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
    o_keys, o_success,
):  # fmt: skip
    """Every group: roots until ``root_steps`` rows (at least one), then branches by ``rule``
    until ``steps`` rows. Returns (rows, trajectories), or (-1, 0) when the table filled up."""
    cap_g = steps + horizon
    size = 1
    while size < 2 * cap_g:
        size *= 2
    gkey = np.full(size, -1, dtype=np.int64)
    gcnt = np.zeros(size, dtype=np.int64)
    gsum = np.zeros(size)
    gsq = np.zeros(size)
    slot = np.empty(cap_g, dtype=np.int64)
    nchild = np.zeros(cap_g, dtype=np.int64)
    elig = np.empty(cap_g, dtype=np.bool_)
    hist = np.empty(max(K, 1), dtype=np.int64)
    row = 0
    tr = 0
    for g in range(starts.shape[0]):
        lo = row
        cst = kn.stream_seed(seed, g * _STREAMS + _CHOICE)
        j = 0
        while row - lo < steps:
            r = -1
            if j > 0 and row - lo >= root_steps:
                r, cst = choose_branch_point(
                    rule, lo, row, o_step, slot, gcnt, gsum, gsq, nchild, at_depth, elig, cst
                )
            st = kn.stream_seed(seed, g * _STREAMS + j)
            if r < 0:
                s, P, t, parent = starts[g], powM[K] - 1, 0, -1
            else:
                s, P, t, parent = o_hidden[r], o_keys[K, r] // n_obs, o_step[r], o_traj[r]
                nchild[r - lo] += 1
            end, ok_success, ok = walk(
                s, P, t, st, row, g, tr, parent, horizon, K, n_obs, powM, hist,
                obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
                htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
                o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid,
                o_hidden, o_ctx, o_keys,
            )  # fmt: skip
            if not ok:
                return -1, 0
            o_success[tr] = ok_success
            nchild[row - lo : end - lo] = 0
            _record(lo, row, end, o_keys, K, o_reward, o_invalid, slot, gkey, gcnt, gsum, gsq)
            row = end
            tr += 1
            j += 1
        for i in range(row - lo):  # clear the group's table for the next group
            h = slot[i]
            gkey[h] = -1
            gcnt[h] = 0
            gsum[h] = 0.0
            gsq[h] = 0.0
    return row, tr
