"""The context encoding and the tabular policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import toyenvs

N_OBS, N_ACT = 5, 3


@given(
    K=st.integers(0, 4),
    hist=st.lists(st.tuples(st.integers(0, N_OBS - 1), st.integers(0, N_ACT - 1)), max_size=6),
    obs=st.integers(0, N_OBS - 1),
)
def test_encode_decode_roundtrip(K: int, hist: list, obs: int) -> None:
    po = [o for o, _ in hist]
    pa = [a for _, a in hist]
    code = toyenvs.encode_context(po, pa, obs, K=K, n_obs=N_OBS, n_actions=N_ACT)
    d_obs, d_act, d_cur = toyenvs.decode_context(code, K=K, n_obs=N_OBS, n_actions=N_ACT)
    keep = hist[-K:] if K else []
    pad = K - len(keep)
    assert d_cur == obs
    assert d_obs == [-1] * pad + [o for o, _ in keep]
    assert d_act == [-1] * pad + [a for _, a in keep]


def test_encoding_is_collision_free() -> None:
    K = 2
    seen = {}
    hists = [[]] + [[(o, a)] for o in range(N_OBS) for a in range(N_ACT)]
    hists += [[(o1, a1), (o2, a2)] for o1 in range(N_OBS) for a1 in range(N_ACT)
              for o2 in range(N_OBS) for a2 in range(N_ACT)]  # fmt: skip
    for h in hists:
        for o in range(N_OBS):
            code = toyenvs.encode_context([x for x, _ in h], [y for _, y in h], o, K=K,
                                          n_obs=N_OBS, n_actions=N_ACT)  # fmt: skip
            assert code not in seen, (h, o, seen.get(code))
            seen[code] = (tuple(h), o)
    _, size = toyenvs.context_radix(N_OBS, N_ACT, K)
    assert max(seen) < size


def test_encoding_overflow_is_an_error() -> None:
    env = toyenvs.make("household")
    with pytest.raises(ValueError, match="63"):
        toyenvs.TabularPolicy(env, K=6)


def test_bad_policy_arguments() -> None:
    env = toyenvs.make("tmaze")
    for kw, message in (
        ({"K": -1}, r"^K: must be an integer >= 0, got -1$"),
        ({"K": 2.0}, r"^K: must be an integer >= 0, got 2\.0$"),
        ({"temperature": 0}, r"^temperature: must be a finite number > 0\.0, got 0$"),
        ({"temperature": True}, r"^temperature: must be a finite number > 0\.0, got True$"),
        ({"init": "zeros"}, r"^init: must be one of 'uniform', 'random', got 'zeros'$"),
        ({"seed": -3}, r"^seed: must be an integer in 0\.\.9223372036854775807, got -3$"),
        (
            {"seed": 2**64},
            r"^seed: must be an integer in 0\.\.9223372036854775807, got 18446744073709551616$",
        ),
        (
            {"temperature": 1e-320},
            r"^temperature: must be a number > 0 whose inverse is finite, got 1e-320$",
        ),
        (
            {"K": 2**40},
            r"K=1099511627776 contexts over .* need \d+ bits; the int64 context code holds 63",
        ),
        ({"seed": True}, r"^seed: must be an integer in 0\.\.9223372036854775807, got True$"),
        ({"init_scale": float("inf")}, r"^init_scale: must be a finite number >= 0\.0, got inf$"),
        ({"init_scale": "1"}, r"^init_scale: must be a finite number >= 0\.0, got '1'$"),
        ({"capacity": 0}, r"^capacity: must be an integer >= 1, got 0$"),
    ):
        with pytest.raises(ValueError, match=message):
            toyenvs.TabularPolicy(env, **kw)
    pol = toyenvs.TabularPolicy(env)
    for value in (0.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"^temperature: must be a finite number > 0\.0"):
            pol.temperature = value


def test_random_init_depends_on_code_not_visit_order() -> None:
    env = toyenvs.make("keydoor", size=4)
    a = toyenvs.TabularPolicy(env, K=1, init="random", seed=5, init_scale=2.0)
    b = toyenvs.TabularPolicy(env, K=1, init="random", seed=5, init_scale=2.0)
    codes = np.array([3, 17, 250, 40, 9])
    ra = a.index_of(codes)
    rb = b.index_of(codes[::-1])[::-1]
    np.testing.assert_array_equal(a.logits_of(ra), b.logits_of(rb))
    assert a.logits.std() > 0.5
    c = toyenvs.TabularPolicy(env, K=1, init="random", seed=6)
    assert not np.allclose(c.logits_of(c.index_of(codes)), a.logits_of(ra) / 2)
    u = toyenvs.TabularPolicy(env, K=1)
    assert (u.logits_of(u.index_of(codes)) == 0).all()


def test_probs_temperature_and_growth() -> None:
    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", temperature=0.5, capacity=2)
    rows = pol.index_of(np.arange(1000) * 7)  # forces several doublings
    assert pol.n_contexts == 1000 and pol.capacity >= 1000
    np.testing.assert_array_equal(pol.index_of(np.arange(1000) * 7, insert=False), rows)
    assert pol.index_of(np.array([5]), insert=False)[0] == -1
    p = pol.probs(rows)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    z = pol.logits_of(rows) / 0.5
    np.testing.assert_allclose(np.log(p), z - np.log(np.exp(z).sum(1, keepdims=True)))
    np.testing.assert_allclose(pol.log_probs(rows), np.log(p))
    with pytest.raises(ValueError, match="context_ids"):
        pol.probs(np.array([10**6]))


def test_snapshot_and_load(tmp_path) -> None:
    env = toyenvs.make("tmaze", length=3)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=3, temperature=0.7)
    toyenvs.rollout(env, pol, n_rollouts=20, seed=1)
    pol.logits[0] += 1.5
    path = tmp_path / "pol.npz"
    pol.snapshot(path)
    back = toyenvs.TabularPolicy.load(path)
    np.testing.assert_array_equal(back.codes, pol.codes)
    np.testing.assert_array_equal(back.logits, pol.logits)
    assert (back.K, back.temperature, back.init, back.seed) == (2, 0.7, "random", 3)
    a = toyenvs.rollout(env, pol, n_rollouts=5, seed=9)
    b = toyenvs.rollout(env, back, n_rollouts=5, seed=9)
    np.testing.assert_array_equal(a.batch.action, b.batch.action)
    np.testing.assert_array_equal(a.context, b.context)


def test_logit_edits_change_sampling() -> None:
    env = toyenvs.make("tmaze", length=1)
    pol = toyenvs.TabularPolicy(env, K=0)
    toyenvs.rollout(env, pol, n_rollouts=4, seed=0)
    pol.logits[:, :] = -50.0
    pol.logits[:, 0] = 0.0  # always "forward"
    rb = toyenvs.rollout(env, pol, n_rollouts=4, seed=0)
    assert (rb.batch.action == 0).all()
