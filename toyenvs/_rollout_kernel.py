"""numba kernels of the unbranched rollout: trajectories in lanes, then the row pass and the
k-step context keys. (One of the topic modules behind ``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs._context import probe, table_find_or_insert
from toyenvs._rng import U, stream_seed
from toyenvs._step import draw_and_move

LANES = 8  # trajectories in flight at once in rollout_kernel_fast


@njit(cache=True)
def fill_step_rows(n_rollouts, horizon, n_obs, n_actions, powM, K, obs_of_state, invalid,
                   reward_enter, final, o_group, o_traj, o_step, o_reward, o_obs, o_action,
                   o_invalid, o_hidden, o_ctx, o_next, o_keys, o_len):  # fmt: skip
    """Second pass of :func:`rollout_kernel_fast`: compact the rows and fill the other columns.

    On entry step t of trajectory tr sits at the padded position tr * horizon + t of
    ``o_hidden``, ``o_action`` and ``o_ctx``. Trajectory by trajectory, in order, its rows move
    forward to their contiguous place (a row never moves to a later index, and every source
    row is read before anything is written over it), and group / traj / step, observation,
    invalid flag and reward are filled in (the reward of a step is ``reward_enter`` of the next
    step's hidden state, or of ``final[tr]`` on the last step), and ``o_next``, the observation
    of that state (the next row's observation, or ``final[tr]``'s on the last step); then the
    k-step context keys come from :func:`context_keys_pass`. Returns the number of rows.
    """
    row = 0
    for tr in range(final.shape[0]):  # o_len may be longer than this call's trajectories
        g = tr // n_rollouts
        L = o_len[tr]
        src = tr * horizon
        for tt in range(L):
            r = U(row + tt)
            q = U(src + tt)
            s = o_hidden[q]
            a = o_action[q]
            c = o_ctx[q]
            s2 = o_hidden[U(src + tt + 1)] if tt + 1 < L else final[tr]
            o_hidden[r] = s
            o_action[r] = a
            o_ctx[r] = c
            o_group[r] = g
            o_traj[r] = tr
            o_step[r] = tt
            o_obs[r] = obs_of_state[U(s)]
            o_invalid[r] = invalid[U(s), U(a)]
            o_reward[r] = reward_enter[U(s2)]
            o_next[r] = obs_of_state[U(s2)]
            o_keys[0, r] = obs_of_state[U(s)]
        row += L
    context_keys_pass(row, K, n_obs, n_actions, powM, o_step, o_obs, o_action, o_keys)
    return row


@njit(cache=True)
def context_keys_pass(n_rows, K, n_obs, n_actions, powM, o_step, o_obs, o_action, o_keys):
    """Fill rows 1..K of ``o_keys[:, :n_rows]`` from row 0 (= o_t), the steps and the actions.

    With key_k(t) = P_k(t) n_obs + o_t and P_k(t) = P_{k-1}(t-1) M + pair_{t-1}:
    key_k(t) = (key_{k-1}(t-1) - o_{t-1}) M + pair_{t-1} n_obs + o_t, and at t = 0 (all
    padding) key_k(0) = (M^k - 1) n_obs + o_0: one loop per k with no loop-carried dependence.
    """
    M = (n_obs + 1) * (n_actions + 1)
    for k in range(1, K + 1):
        pad = (powM[k] - 1) * n_obs
        uk, um = U(k), U(k - 1)
        for r in range(n_rows):
            ur = U(r)
            if o_step[ur] == 0:
                o_keys[uk, ur] = pad + o_obs[ur]
            else:
                b = U(r - 1)
                o1 = o_obs[b]
                pair = o1 * (n_actions + 1) + o_action[b]
                o_keys[uk, ur] = (o_keys[um, b] - o1) * M + pair * n_obs + o_obs[ur]


# lanes: int64[W, 6] per lane of rollout_kernel_fast: its trajectory (-1: idle), hidden state,
# stream state, past part P, ring slot of P's oldest pair, t.
LN_TR, LN_S, LN_ST, LN_P, LN_POS, LN_T = range(6)


@njit(cache=True, _nrt=False, inline="always")
def _take_trajectory(lanes, ring, w, tr, starts, n_rollouts, seed, K, M, powM):
    """Lane w starts trajectory tr: the start state of its group, stream (seed, tr), a past
    of K padding pairs."""
    uw = U(w)
    lanes[uw, LN_TR], lanes[uw, LN_S] = tr, starts[U(tr // n_rollouts)]
    lanes[uw, LN_ST], lanes[uw, LN_P] = stream_seed(seed, tr), powM[U(K)] - 1
    lanes[uw, LN_POS], lanes[uw, LN_T] = 0, 0
    for k in range(K):
        ring[uw, U(k)] = M - 1


@njit(cache=True, _nrt=False)
def run_trajectories(
    starts, n_rollouts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob,
    reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
    inv_temp, deterministic, lanes, ring, final, o_action, o_hidden, o_ctx, o_success, o_len,
):  # fmt: skip
    """The step loop of :func:`rollout_kernel_fast`: W lanes step in turn, a lane that
    finishes takes the next trajectory; False when the policy table filled up. Compiled
    without reference counting (it allocates nothing), so :func:`probe` and
    :func:`draw_and_move` inline for free."""
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    top = powM[K - 1] if K > 0 else np.int64(0)
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    imask = np.int64(mask)
    W = lanes.shape[0]
    n_traj = final.shape[0]
    nxt = min(W, n_traj)
    for w in range(W):
        lanes[U(w), LN_TR] = -1
        if w < nxt:
            _take_trajectory(lanes, ring, w, w, starts, n_rollouts, seed, K, M, powM)
    active = nxt
    while active > 0:
        for w in range(W):
            uw = U(w)
            tr = lanes[uw, LN_TR]
            if tr < 0:
                continue
            s, P, t = lanes[uw, LN_S], lanes[uw, LN_P], lanes[uw, LN_T]
            o = obs_of_state[U(s)]
            code = P * n_obs + o
            c = probe(code, htab, mask, imask)
            if c == -2:
                c = table_find_or_insert(
                    code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
                    inv_temp,
                )  # fmt: skip
                if c < 0:
                    return False
            a, s2, st = draw_and_move(lanes[uw, LN_ST], c, s, cdf, next_state, next_prob,
                                      deterministic)  # fmt: skip
            i = U(tr * horizon + t)
            o_hidden[i] = s
            o_action[i] = a
            o_ctx[i] = c
            t += 1
            if terminal[U(s2)] or t >= horizon:
                o_len[U(tr)] = t
                final[U(tr)] = s2
                o_success[U(tr)] = terminal[U(s2)] and reward_enter[U(s2)] > 0.0
                if nxt < n_traj:  # this lane takes the next trajectory
                    _take_trajectory(lanes, ring, w, nxt, starts, n_rollouts, seed, K, M, powM)
                    nxt += 1
                else:
                    lanes[uw, LN_TR] = -1
                    active -= 1
                continue
            if K > 0:
                pair = o * (A + 1) + a
                pos = lanes[uw, LN_POS]
                lanes[uw, LN_P] = (P - ring[uw, U(pos)] * top) * M + pair
                ring[uw, U(pos)] = pair
                lanes[uw, LN_POS] = pos + 1 if pos + 1 < K else 0
            lanes[uw, LN_S], lanes[uw, LN_ST], lanes[uw, LN_T] = s2, st, t
    return True


@njit(cache=True)
def rollout_kernel_fast(
    starts, n_rollouts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    o_group, o_traj, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx, o_next,
    o_keys, o_success, o_len,
):  # fmt: skip
    """Same contract and same trajectories as the one-at-a-time ``rollout_kernel`` (kept in
    ``tests/toyenvs/reference_kernels.py``), bit for bit, faster.

    Only the dense row numbers of contexts met for the first time in this call can differ (they
    follow the order in which the table meets them); codes, actions, states and keys do not.

    How: LANES trajectories are in flight at once and step in turn, so the table lookups of
    independent trajectories overlap in the CPU instead of waiting on each other; a lane that
    finishes takes the next trajectory. The step loop does only what the next step depends on
    (context code, table probe, action draw, env move) and records hidden state, action and
    dense row at the padded position tr * horizon + t of the outputs;
    :func:`fill_step_rows` then compacts the rows and fills every other column. The context's
    past part P is updated from a ring of the last K pairs, P' = (P - oldest * M^(K-1)) * M +
    pair (no loop over k, no division). The step loop (:func:`run_trajectories`) is compiled
    without reference counting: in a function that allocates, an inlined helper that takes
    arrays counts them on every step (the table probe and the draw then made the call twice as
    slow end to end), so this function only allocates.
    """
    A = next_state.shape[1]
    deterministic = True
    for x in next_prob[:, :, 0].ravel():
        if x < 1.0:
            deterministic = False
    final = np.empty(starts.shape[0] * n_rollouts, dtype=np.int64)
    lanes = np.empty((LANES, 6), dtype=np.int64)
    ring = np.empty((LANES, max(K, 1)), dtype=np.int64)
    if not run_trajectories(
        starts, n_rollouts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob,
        reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed,
        init_scale, inv_temp, deterministic, lanes, ring, final, o_action, o_hidden, o_ctx,
        o_success, o_len,
    ):  # fmt: skip
        return -1
    return fill_step_rows(
        n_rollouts, horizon, n_obs, A, powM, K, obs_of_state, invalid, reward_enter, final,
        o_group, o_traj, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx, o_next,
        o_keys, o_len,
    )  # fmt: skip
