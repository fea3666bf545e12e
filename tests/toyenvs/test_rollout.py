"""Batched rollouts: determinism, StepBatch layout, env semantics, keys, kernels in Python."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL, make_small

import toyenvs
from hgpo.batch import StepBatch
from tests.toyenvs import reference_kernels
from toyenvs import _kernels as kn
from toyenvs.rollout import alloc_buffers, env_args


@pytest.mark.parametrize("key", sorted(SMALL))
def test_same_seed_same_batch_bit_for_bit(key: str) -> None:
    env = make_small(key)
    runs = []
    for _ in range(2):
        pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=1)
        runs.append(toyenvs.rollout(env, pol, n_rollouts=6, seed=42))
    a, b = runs
    for name in ("group", "traj", "step", "reward", "state", "action", "invalid"):
        np.testing.assert_array_equal(getattr(a.batch, name), getattr(b.batch, name))
    for name in ("hidden", "context", "code", "context_keys", "success"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=1)
    c = toyenvs.rollout(env, pol, n_rollouts=6, seed=43)
    assert not (c.n_steps == a.n_steps and np.array_equal(c.batch.action, a.batch.action))


def test_trajectory_depends_only_on_seed_and_index() -> None:
    env = make_small("keydoor_slip")
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=2)
    small = toyenvs.rollout(env, pol, tasks=env.tasks[:2], n_rollouts=3, seed=7)
    big = toyenvs.rollout(env, pol, tasks=env.tasks[:4], n_rollouts=3, seed=7)
    n = small.n_steps
    np.testing.assert_array_equal(big.batch.action[:n], small.batch.action)
    np.testing.assert_array_equal(big.hidden[:n], small.hidden)


@pytest.mark.parametrize("key", sorted(SMALL))
def test_batch_follows_the_env(key: str) -> None:
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=3)
    tasks = env.tasks
    rb = toyenvs.rollout(env, pol, tasks=tasks, n_rollouts=5, seed=0)
    b = rb.batch
    assert isinstance(b, StepBatch)
    assert b.n_traj == tasks.size * 5
    np.testing.assert_array_equal(b.group[b.traj_start], np.repeat(np.arange(tasks.size), 5))
    np.testing.assert_array_equal(rb.hidden[b.traj_start], np.repeat(tasks, 5))
    np.testing.assert_array_equal(b.state, env.obs_of_state[rb.hidden])
    np.testing.assert_array_equal(b.invalid, env.invalid[rb.hidden, b.action])
    # successor of each non-final step is a possible outcome; invalid steps stay put
    last = np.zeros(b.n_steps, bool)
    last[b.traj_start + b.traj_len - 1] = True
    i = np.flatnonzero(~last)
    nxt = rb.hidden[i + 1]
    support = env.next_state[rb.hidden[i], b.action[i]]
    prob = env.next_prob[rb.hidden[i], b.action[i]]
    assert ((support == nxt[:, None]) & (prob > 0)).any(axis=1).all()
    assert (nxt[b.invalid[i]] == rb.hidden[i][b.invalid[i]]).all()
    assert (b.reward[i] == 0).all()
    # a trajectory ends at the horizon or on a terminal entering; success <=> final +10
    end = b.traj_start + b.traj_len - 1
    np.testing.assert_array_equal(rb.success, b.reward[end] == 10.0)
    assert ((b.traj_len == env.horizon) | (b.reward[end] == 10.0) | (b.reward[end] == 0)).all()
    np.testing.assert_allclose(rb.true_reward, b.reward - 0.1 * b.invalid)
    np.testing.assert_array_equal(rb.context, pol.index_of(rb.code, insert=False))


@pytest.mark.parametrize("key", sorted(SMALL))
@pytest.mark.parametrize("scheme", ["independent", "branch:uniform"])
def test_next_state_is_the_observation_each_step_led_to(key: str, scheme: str) -> None:
    """next_state = the next row's state within a trajectory; after its last step, the
    observation of the state the env moved to: a successor the env draws with positive
    probability from (s_T-1, a_T-1), whose entering reward is the step's reward and which is
    terminal unless the horizon cut the trajectory (exactly the env's successor where the move
    is deterministic). The branched rollouts' too."""
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=3)
    steps = None if scheme == "independent" else 40
    rb = toyenvs.rollout(env, pol, n_rollouts=5, seed=0, scheme=scheme, steps=steps)
    b = rb.batch
    assert b.next_state is not None
    last = b.traj_start + b.traj_len - 1
    inner = np.ones(b.n_steps, bool)
    inner[last] = False
    np.testing.assert_array_equal(b.next_state[inner], b.state[1:][inner[:-1]])
    s, a = rb.hidden[last], b.action[last]
    support, prob = env.next_state[s, a], env.next_prob[s, a]
    fits = (prob > 0) & (env.obs_of_state[support] == b.next_state[last][:, None])
    fits &= env.reward_enter[support] == b.reward[last][:, None]
    cut = b.step[last] + 1 == env.horizon
    fits &= env.terminal[support] | cut[:, None]
    assert fits.any(axis=1).all()
    det = prob[:, 0] == 1.0
    assert det.any()
    np.testing.assert_array_equal(b.next_state[last][det], env.obs_of_state[support[det, 0]])
    if key in ("tmaze", "random"):  # trajectories that end in a terminal state, and others
        assert cut.any() and (~cut).any()


def test_context_keys_match_the_encoding() -> None:
    env = make_small("household")
    K = 3
    pol = toyenvs.TabularPolicy(env, K=K, init="random", seed=4)
    rb = toyenvs.rollout(env, pol, n_rollouts=3, seed=5)
    b = rb.batch
    assert rb.context_keys.shape == (K + 1, b.n_steps)
    np.testing.assert_array_equal(rb.context_keys[K], rb.code)
    for i in range(0, b.n_steps, 7):
        t = int(b.step[i])
        for k in range(K + 1):
            lo = i - min(t, k)
            expect = toyenvs.encode_context(
                b.state[lo:i].tolist(), b.action[lo:i].tolist(), int(b.state[i]), K=k,
                n_obs=env.n_obs, n_actions=env.n_actions,
            )  # fmt: skip
            assert rb.context_keys[k, i] == expect


def test_rollout_frequencies_match_the_policy() -> None:
    env = toyenvs.make("tmaze", length=1)
    pol = toyenvs.TabularPolicy(env, K=0, init="random", seed=8, init_scale=1.0)
    rb = toyenvs.rollout(env, pol, tasks=np.array([0]), n_rollouts=20000, seed=1)
    first = rb.batch.traj_start
    freq = np.bincount(rb.batch.action[first], minlength=4) / first.size
    p = pol.probs(rb.context[first[:1]])[0]
    np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / first.size))


def _run_kernel(fn, env: toyenvs.POMDP, K: int = 2) -> tuple[int, dict]:
    pol = toyenvs.TabularPolicy(env, K=K, init="random", seed=1)
    tasks = env.tasks[:3]
    buf = alloc_buffers(3 * 5 * env.horizon, 15, K)
    names = ("group", "traj", "step", "reward", "state", "action", "invalid", "hidden", "context",
             "next_state")  # fmt: skip
    with np.errstate(over="ignore"):
        n = fn(tasks, 5, 9, env.horizon, K, pol.n_obs, pol.powM, *env_args(env),
               *pol.kernel_tables(), *(buf[k] for k in names), buf["context_keys"],
               buf["success"], buf["length"])  # fmt: skip
    out = {k: v[:n].copy() for k, v in buf.items() if k not in ("context_keys", "success")}
    out["context_keys"] = buf["context_keys"][:, :n].copy()
    out["success"] = buf["success"].copy()
    out["codes"] = pol.codes[out["context"]]
    return n, out


@pytest.mark.parametrize("kernel", [reference_kernels.rollout_kernel, kn.rollout_kernel_fast])
def test_rollout_kernels_compiled_equal_python(kernel) -> None:
    env = make_small("keydoor_slip")
    (n1, a), (n2, b) = _run_kernel(kernel, env), _run_kernel(kernel.py_func, env)
    assert n1 == n2 > 0
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("key", sorted(SMALL))
@pytest.mark.parametrize("K", [0, 1, 4])
def test_fast_kernel_equals_the_one_at_a_time_reference(key: str, K: int) -> None:
    # Same trajectories; only the dense rows of newly met contexts may be numbered differently
    # (the lanes meet them in another order), so rows are compared through their codes.
    env = make_small(key)
    (n1, a), (n2, b) = (
        _run_kernel(reference_kernels.rollout_kernel, env, K=K),
        _run_kernel(kn.rollout_kernel_fast, env, K=K),
    )
    assert n1 == n2 > 0
    for k in a:
        if k != "context":
            np.testing.assert_array_equal(a[k], b[k])


def test_context_keys_pass_compiled_equals_python_and_the_encoding() -> None:
    n_obs, n_actions, K = 5, 3, 3
    M = (n_obs + 1) * (n_actions + 1)
    powM = np.array([M**k for k in range(K + 1)], dtype=np.int64)
    rng = np.random.default_rng(0)
    step = np.concatenate([np.arange(4), np.arange(6), np.arange(1)])
    obs = rng.integers(0, n_obs, step.size)
    act = rng.integers(0, n_actions, step.size)
    outs = []
    for fn in (kn.context_keys_pass, kn.context_keys_pass.py_func):
        keys = np.empty((K + 1, step.size), dtype=np.int64)
        keys[0] = obs
        fn(step.size, K, n_obs, n_actions, powM, step, obs, act, keys)
        outs.append(keys)
    np.testing.assert_array_equal(outs[0], outs[1])
    for i in range(step.size):
        t = int(step[i])
        for k in range(K + 1):
            lo = i - min(t, k)
            expect = toyenvs.encode_context(
                obs[lo:i].tolist(), act[lo:i].tolist(), int(obs[i]), K=k, n_obs=n_obs,
                n_actions=n_actions,
            )  # fmt: skip
            assert outs[0][k, i] == expect


def test_rng_and_init_kernels_compiled_equals_python() -> None:
    with np.errstate(over="ignore"):
        for seed, idx in ((0, 0), (5, 123456), (2**40, 7)):
            s1, s2 = kn.stream_seed(seed, idx), kn.stream_seed.py_func(seed, idx)
            assert s1 == s2
            assert kn.rng_uniform(s1) == kn.rng_uniform.py_func(s2)
        codes = np.array([0, 1, 2**40 + 3])
        np.testing.assert_array_equal(
            kn.init_logits_rows(codes, 3, 1, 7, 1.0),
            kn.init_logits_rows.py_func(codes, 3, 1, 7, 1.0),
        )
    u = np.array([kn.rng_uniform(kn.stream_seed(1, i))[1] for i in range(20000)])
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_bad_rollout_inputs() -> None:
    env = toyenvs.make("tmaze")
    pol = toyenvs.TabularPolicy(env, K=1)
    with pytest.raises(ValueError, match=r"^n_rollouts: must be an integer >= 1, got 0$"):
        toyenvs.rollout(env, pol, n_rollouts=0)
    with pytest.raises(ValueError, match=r"^n_rollouts: must be an integer >= 1, got 2\.0$"):
        toyenvs.rollout(env, pol, n_rollouts=2.0)
    with pytest.raises(ValueError, match=r"^seed: must be an integer in 0\.\.\d+, got -1$"):
        toyenvs.rollout(env, pol, seed=-1)
    # past int64 (the kernels' seed type): a named error, not numba's typing error
    with pytest.raises(ValueError, match=r"^seed: must be an integer in 0\.\.9223372036854775807"):
        toyenvs.rollout(env, pol, seed=2**64)
    with pytest.raises(ValueError, match="tasks"):
        toyenvs.rollout(env, pol, tasks=np.array([99]))
    with pytest.raises(ValueError, match="terminal"):
        toyenvs.rollout(env, pol, tasks=np.array([env.n_states - 1]))
    with pytest.raises(ValueError, match="n_obs"):
        toyenvs.rollout(toyenvs.make("keydoor"), pol)
