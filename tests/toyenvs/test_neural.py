"""NeuralPolicy: bad input, exact sampling (chi-square), exact truth and its parameter gradient."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import toyenvs
from hgpo.options import OptionError
from toyenvs import _kernels as kn

torch = pytest.importorskip("torch")
from toyenvs.neural import _tokens  # noqa: E402


@pytest.fixture(scope="module")
def tmaze() -> toyenvs.POMDP:
    return toyenvs.make("tmaze", length=2, horizon=6)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"arch": "rnn"}, r"NeuralPolicy.arch: must be one of 'mlp', 'transformer', got 'rnn'"),
        ({"width": 0}, r"NeuralPolicy.width: must be an integer >= 1, got 0"),
        ({"layers": -1}, r"NeuralPolicy.layers: must be an integer >= 1, got -1"),
        ({"K": 40}, r"NeuralPolicy.K: must be small enough .* fits in int64, got 40"),
        ({"K": 1.5}, r"NeuralPolicy.K: must be an integer >= 0, got 1.5"),
        ({"temperature": float("nan")}, r"NeuralPolicy.temperature: must be a finite number"),
        ({"evaluate": "lazy"}, r"NeuralPolicy.evaluate: must be one of 'table', 'visited', got"),
        ({"dtype": "float16"}, r"NeuralPolicy.dtype: must be one of 'float64', 'float32', got"),
    ],
)
def test_bad_arguments_are_named_errors(tmaze: toyenvs.POMDP, kw: dict, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        toyenvs.NeuralPolicy(tmaze, **kw)


def test_tokens_decode_like_the_context_code(tmaze: toyenvs.POMDP) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=2)
    obs, act = _tokens(pol.codes, 2, pol.n_obs, pol.n_actions)
    for i, code in enumerate(pol.codes):
        past_o, past_a, o = pol.decode(int(code))
        pad_o = [pol.n_obs if x < 0 else x for x in past_o]
        pad_a = [pol.n_actions if x < 0 else x for x in past_a]
        assert obs[i].tolist() == [*pad_o, o] and act[i].tolist() == pad_a


def test_table_holds_every_reachable_context(tmaze: toyenvs.POMDP) -> None:
    # The exact solver enumerates the time-indexed chain; every context it meets is in the
    # table the policy enumerated at construction, so it adds no row.
    pol = toyenvs.NeuralPolicy(tmaze, K=2)
    n = pol.n_contexts
    toyenvs.exact_ground_truth(tmaze, pol)
    assert pol.n_contexts == n


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
def test_sampling_follows_the_network_softmax(arch: str) -> None:
    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.NeuralPolicy(env, K=1, arch=arch, width=16, init_scale=1.0, seed=3)
    rb = toyenvs.rollout(env, pol, n_rollouts=400, seed=1)
    rows, counts = np.unique(rb.context, return_counts=True)
    busiest = rows[np.argsort(counts)[-4:]]
    p_net = torch.softmax(pol.forward_rows(busiest), dim=1).detach().numpy()
    for row, p in zip(busiest, p_net, strict=True):
        seen = np.bincount(rb.batch.action[rb.context == row], minlength=env.n_actions)
        assert seen.sum() * p.min() >= 5  # chi-square needs every expected count large
        assert stats.chisquare(seen, seen.sum() * p).pvalue > 1e-4
        # the test has power: the uniform distribution is rejected at the same context
        assert stats.chisquare(seen, np.full(p.size, seen.sum() / p.size)).pvalue < 1e-4


def test_parameter_updates_refresh_the_sampling_table(tmaze: toyenvs.POMDP) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=2, init_scale=1.0)
    before = pol.probs(np.arange(pol.n_contexts))
    opt = torch.optim.Adam(pol.parameters(), lr=0.1)
    loss = pol.forward_rows(np.arange(pol.n_contexts))[:, 0].sum()
    loss.backward()
    opt.step()
    after = pol.probs(np.arange(pol.n_contexts))
    net = torch.softmax(pol.forward_rows(np.arange(pol.n_contexts)), 1).detach().numpy()
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, net, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(np.diff(pol._cdf, axis=1, prepend=0.0), net, atol=1e-12)


def test_a_context_outside_the_table_is_an_error(tmaze: toyenvs.POMDP) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=2)
    unseen = np.setdiff1d(np.arange(pol.n_codes), pol.codes)[:1]
    with pytest.raises(RuntimeError, match="outside its enumerated table"):
        pol.run_growing(lambda tables: kn.table_insert_many(unseen, *tables)[1])


def _exact_J(env: toyenvs.POMDP, pol: toyenvs.NeuralPolicy, theta: np.ndarray) -> float:
    pol.set_flat_parameters(theta)
    return toyenvs.exact_ground_truth(env, pol, gamma=0.9).J


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
def test_parameter_gradient_matches_finite_differences(tmaze: toyenvs.POMDP, arch: str) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=1, arch=arch, width=8, init_scale=1.0, seed=1)
    gt = toyenvs.exact_ground_truth(tmaze, pol, gamma=0.9)
    theta = pol.flat_parameters()
    rng = np.random.default_rng(0)
    eps = 1e-5
    for _ in range(3):
        d = rng.normal(size=theta.size)
        fd = (_exact_J(tmaze, pol, theta + eps * d) - _exact_J(tmaze, pol, theta - eps * d)) / (
            2 * eps
        )
        assert gt.parameter_gradient @ d == pytest.approx(fd, rel=1e-6, abs=1e-9)
    pol.set_flat_parameters(theta)


def test_exact_truth_agrees_with_monte_carlo(tmaze: toyenvs.POMDP) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=2, arch="transformer", width=16, init_scale=1.0)
    gt = toyenvs.exact_ground_truth(tmaze, pol, gamma=0.9)
    mc = toyenvs.mc_ground_truth(tmaze, pol, gamma=0.9, n_rollouts=4000, seed=2)
    assert abs(gt.J - mc.J) < 4 * mc.J_stderr
    # as test_truth.py: entries above 5% of the largest within 5.5 standard errors, and the
    # squared error overall no larger than the sum of the squared standard errors allows
    e, est, se = gt.policy_gradient, mc.policy_gradient, mc.policy_gradient_stderr
    big = np.abs(e) > 0.05 * np.abs(e).max()
    assert (np.abs(e - est)[big] < 5.5 * se[big]).all()
    assert ((e - est) ** 2).sum() <= 1.5 * (se**2).sum()


def test_tabular_parameter_gradient_is_the_logit_gradient(tmaze: toyenvs.POMDP) -> None:
    pol = toyenvs.TabularPolicy(tmaze, K=2, init="random", seed=1)
    gt = toyenvs.exact_ground_truth(tmaze, pol, gamma=0.9)
    np.testing.assert_array_equal(gt.parameter_gradient, gt.policy_gradient.ravel())


def test_snapshot_load_and_copy_give_the_same_rollouts(tmaze: toyenvs.POMDP, tmp_path) -> None:
    pol = toyenvs.NeuralPolicy(tmaze, K=2, arch="transformer", width=16, init_scale=1.0)
    path = tmp_path / "pol.npz"
    pol.snapshot(path)
    for other in (toyenvs.NeuralPolicy.load(path), pol.copy()):
        np.testing.assert_array_equal(other.codes, pol.codes)
        np.testing.assert_array_equal(other.logits, pol.logits)
        a = toyenvs.rollout(tmaze, pol, n_rollouts=16, seed=5).batch.action
        b = toyenvs.rollout(tmaze, other, n_rollouts=16, seed=5).batch.action
        np.testing.assert_array_equal(a, b)
    clone = pol.copy()
    with torch.no_grad():
        clone.net.head.bias.add_(1.0)
    assert not np.array_equal(clone.logits, pol.logits)


def test_new_start_states_are_covered_on_first_use() -> None:
    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.NeuralPolicy(env, K=1)
    n = pol.n_contexts
    others = np.setdiff1d(np.flatnonzero(~env.terminal), env.tasks)[:3]
    rb = toyenvs.rollout(env, pol, tasks=others, n_rollouts=4, seed=0)
    assert pol.n_contexts >= n and rb.n_steps > 0


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
@pytest.mark.parametrize("scheme", ["independent", "branch:singleton"])
def test_visited_evaluation_rolls_out_the_same_trajectories(arch: str, scheme: str) -> None:
    # "visited" evaluates only the rows its rollouts visit, re-running the rollout until no
    # visited row is unevaluated; the probabilities are the table's up to float64 rounding, so
    # the trajectories are the same (a last-bit difference flipping a draw has probability
    # ~1e-16 per draw), before and after a parameter update.
    env = toyenvs.make("keydoor", size=4)
    table = toyenvs.NeuralPolicy(env, K=4, arch=arch, width=16, init_scale=2.0, seed=1)
    visited = table.copy()
    visited.evaluate = "visited"
    kw = {} if scheme == "independent" else {"scheme": scheme, "steps": 30}
    for it in range(2):
        a = toyenvs.rollout(env, table, n_rollouts=8, seed=it, **kw)
        b = toyenvs.rollout(env, visited, n_rollouts=8, seed=it, **kw)
        for f in ("traj", "step", "state", "action"):
            assert np.array_equal(getattr(a.batch, f), getattr(b.batch, f))
        assert np.array_equal(a.context, b.context)
        assert visited._fresh.sum() < table.n_contexts / 2  # far fewer rows evaluated
        assert np.isnan(visited._cdf[~visited._fresh]).all()  # the rest cannot be sampled
        np.testing.assert_allclose(
            visited.log_probs(b.context), table.log_probs(a.context), rtol=0, atol=1e-12
        )
        for pol in (table, visited):  # the same update on both: every row is stale again
            opt = torch.optim.SGD(pol.parameters(), lr=0.5)
            pol.forward_rows(np.arange(40))[:, 0].sum().backward()
            opt.step()


def test_visited_evaluation_gives_whole_tables_to_other_readers(tmaze: toyenvs.POMDP) -> None:
    # The exact solver, the logits property and a copy read the whole table (equal up to
    # float64 rounding: rows evaluated in a different batch can differ in the last bit).
    pol = toyenvs.NeuralPolicy(tmaze, K=2, init_scale=1.0, evaluate="visited")
    ref = toyenvs.NeuralPolicy(tmaze, K=2, init_scale=1.0)
    toyenvs.rollout(tmaze, pol, n_rollouts=2, seed=0)
    assert pol.evaluate == pol.copy().evaluate == "visited"
    J, J_ref = toyenvs.exact_ground_truth(tmaze, pol).J, toyenvs.exact_ground_truth(tmaze, ref).J
    assert abs(J - J_ref) <= 1e-12 * abs(J_ref)
    assert pol._fresh.all() and np.array_equal(pol.logits, ref.logits)


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
def test_pullbacks_share_one_forward_and_equal_pullback(tmaze: toyenvs.POMDP, arch: str) -> None:
    # Several logit gradients pushed to the parameters at once (over the union of their
    # non-zero rows) equal each one's own pullback up to float64 rounding.
    pol = toyenvs.NeuralPolicy(tmaze, K=2, arch=arch, width=16, init_scale=1.0)
    rng = np.random.default_rng(0)
    G1, G2 = rng.normal(size=(2, pol.n_contexts, tmaze.n_actions))
    G1[: pol.n_contexts // 2] = 0.0  # different non-zero rows
    both = pol.pullbacks([G1, G2])
    assert both.shape == (2, pol.n_parameters)
    for got, G in zip(both, (G1, G2), strict=True):
        np.testing.assert_allclose(got, pol.pullback(G), rtol=1e-12, atol=1e-13)
    assert pol.pullbacks([]).shape == (0, pol.n_parameters)
    # given on a few rows (zero elsewhere): the same, bit for bit
    rows = np.array([1, 4, 5, 9])
    G3 = np.zeros_like(G2)
    G3[rows] = G2[rows]
    np.testing.assert_array_equal(pol.pullbacks([G2[rows]], rows=rows)[0], pol.pullback(G3))
    with pytest.raises(ValueError, match=r"pullbacks: each gradient must have shape \(4, "):
        pol.pullbacks([G2[:3]], rows=rows)


@pytest.mark.parametrize(("K", "layers"), [(3, 3), (2, 1), (0, 2)])
def test_last_token_only_transformer_computes_the_same_logits(K: int, layers: int) -> None:
    # Only what the head reads (a table for the first block's projections, the last token in
    # the last block) against every block over every token, and the same parameter gradient.
    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.NeuralPolicy(env, K=K, arch="transformer", width=16, layers=layers,
                               init_scale=1.0)  # fmt: skip
    net, obs, act = pol.net, pol._obs_tok, pol._act_tok
    G = torch.from_numpy(np.random.default_rng(0).normal(size=(obs.shape[0], env.n_actions)))
    out = {}
    for fast in (False, True):
        net.last_token_only = fast
        z = net(obs, act)
        out[fast] = z.detach().numpy(), torch.autograd.grad(z, list(net.parameters()), G)
    np.testing.assert_allclose(out[True][0], out[False][0], rtol=0, atol=1e-13)
    for a, b in zip(out[True][1], out[False][1], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
def test_float32_network_keeps_a_float64_table_and_close_gradients(
    tmaze: toyenvs.POMDP, arch: str, tmp_path
) -> None:
    # Same initial parameters (rounded to float32); the table the kernels and the truth read
    # stays float64, its logits within float32 rounding of the float64 network's; the exact
    # parameter gradient within float32 rounding too (cosine 1 - 1e-9). The precision
    # survives copies, snapshots and set_flat_parameters.
    kw = dict(K=2, arch=arch, width=16, init_scale=1.0, seed=3)
    p64 = toyenvs.NeuralPolicy(tmaze, **kw)
    p32 = toyenvs.NeuralPolicy(tmaze, dtype="float32", **kw)
    assert all(p.dtype == torch.float32 for p in p32.parameters())
    assert p32.net.last_token_only and not p64.net.last_token_only
    assert p32.logits.dtype == np.float64
    np.testing.assert_allclose(p32.logits, p64.logits, rtol=0, atol=1e-5)
    g64 = toyenvs.exact_ground_truth(tmaze, p64, gamma=0.9).parameter_gradient
    g32 = toyenvs.exact_ground_truth(tmaze, p32, gamma=0.9).parameter_gradient
    assert g32.dtype == np.float64
    assert g32 @ g64 / np.linalg.norm(g32) / np.linalg.norm(g64) > 1 - 1e-9
    path = tmp_path / "p32.npz"
    p32.snapshot(path)
    theta = p32.flat_parameters()
    for other in (toyenvs.NeuralPolicy.load(path), p32.copy()):
        assert other.meta["dtype"] == "float32"
        other.set_flat_parameters(theta)
        assert all(p.dtype == torch.float32 for p in other.parameters())
        np.testing.assert_array_equal(other.logits, p32.logits)


def test_studies_name_the_same_precisions() -> None:
    from studies.cli import NET_DTYPES  # the studies' --net-dtype, named without torch

    assert set(NET_DTYPES) == set(toyenvs.neural.DTYPES)


def test_precision_benchmark_measures_float32_rounding_only() -> None:
    from benchmarks.neural_precision import measure

    r = measure("tmaze:length=2:1:0.5:transformer")
    assert r["contexts"] > 0 and 0 < r["success"] <= 1
    assert 0 < r["logits"] < 1e-4 and r["A*"] < 1e-4 and abs(r["J32"] - r["J64"]) < 1e-5
    assert r["grad rel"] < 1e-3 and r["1-cos"] < 1e-6


@pytest.mark.parametrize("arch", ["mlp", "transformer"])
def test_memoryless_network_k0(tmaze: toyenvs.POMDP, arch: str) -> None:
    # K = 0: the context is o_t alone (one token, no action tokens)
    pol = toyenvs.NeuralPolicy(tmaze, K=0, arch=arch, width=8, init_scale=1.0)
    assert 0 < pol.n_contexts <= tmaze.n_obs
    rb = toyenvs.rollout(tmaze, pol, n_rollouts=4, seed=0)
    gt = toyenvs.exact_ground_truth(tmaze, pol, gamma=0.9)
    assert rb.n_steps > 0 and np.isfinite(gt.parameter_gradient).all()
