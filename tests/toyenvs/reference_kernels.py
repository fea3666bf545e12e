"""The one-trajectory-at-a-time rollout kernel: the reference that
``toyenvs._kernels.rollout_kernel_fast`` must equal (same trajectories, bit for bit); only the
tests use it."""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs._kernels import env_next, sample_action, stream_seed, table_find, table_find_or_insert


@njit(cache=True)
def rollout_kernel(
    starts, n_rollouts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    o_group, o_traj, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx, o_next,
    o_keys, o_success, o_len,
):  # fmt: skip
    """Roll out every start state ``n_rollouts`` times; trajectory g * n_rollouts + j.

    Writes the rows of every trajectory contiguously into the ``o_*`` arrays (capacity
    len(starts) * n_rollouts * horizon) and returns the number of rows, or -1 when the policy
    table filled up (the caller grows it and calls again; nothing else is mutated).
    o_keys: int64[K + 1, cap] the k-step context code of each step (row K = full context).
    o_next: int64[cap] the observation of the state each step led to.
    """
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    pad = M - 1
    hist = np.empty(max(K, 1), dtype=np.int64)
    row = 0
    for g in range(starts.shape[0]):
        for j in range(n_rollouts):
            tr = g * n_rollouts + j
            st = stream_seed(seed, tr)
            s = starts[g]
            for k in range(K):
                hist[k] = pad
            success = False
            t = 0
            while True:
                o = obs_of_state[s]
                acc = np.int64(0)
                for k in range(K):
                    o_keys[k, row] = acc * n_obs + o
                    acc += hist[k] * powM[k]
                code = acc * n_obs + o
                o_keys[K, row] = code
                c = table_find(code, htab)
                if c < 0:
                    c = table_find_or_insert(
                        code,
                        htab,
                        codes,
                        logits,
                        cdf,
                        count,
                        init_mode,
                        init_seed,
                        init_scale,
                        inv_temp,
                    )
                    if c < 0:
                        return -1
                a, st = sample_action(cdf, c, st)
                s2, st = env_next(s, a, st, next_state, next_prob)
                o_group[row] = g
                o_traj[row] = tr
                o_step[row] = t
                o_reward[row] = reward_enter[s2]
                o_obs[row] = o
                o_action[row] = a
                o_invalid[row] = invalid[s, a]
                o_hidden[row] = s
                o_ctx[row] = c
                o_next[row] = obs_of_state[s2]
                row += 1
                t += 1
                if terminal[s2]:
                    success = reward_enter[s2] > 0.0
                    break
                if t >= horizon:
                    break
                for k in range(K - 1, 0, -1):
                    hist[k] = hist[k - 1]
                if K > 0:
                    hist[0] = o * (A + 1) + a
                s = s2
            o_success[tr] = success
            o_len[tr] = t
    return row
