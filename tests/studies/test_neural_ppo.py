"""Neural PPO: the torch loss is the tabular recipe's; train_toy --policy mlp|transformer runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import toyenvs
from studies.tabular_ppo import PPOSettings, TabularPPO

torch = pytest.importorskip("torch")
from studies.neural_ppo import NeuralPPO, ppo_loss  # noqa: E402


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_torch_loss_and_gradient_equal_the_tabular_ones(temperature: float) -> None:
    # On a table, autograd of ppo_loss w.r.t. the logits must give TabularPPO's loss and its
    # analytic gradient: every branch (clip, dual clip, k3 KL, entropy) is hit by the draws.
    env = toyenvs.make("tmaze", length=2, horizon=6)
    pol = toyenvs.TabularPolicy(env, K=1, temperature=temperature)
    toyenvs.exact_ground_truth(env, pol)
    s = PPOSettings(clip=0.2, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01)
    ppo = TabularPPO(pol, s)
    rng = np.random.default_rng(0)
    pol.logits[:] = rng.normal(size=pol.logits.shape)
    n = 300
    rows = rng.integers(0, pol.n_contexts, n)
    act = rng.integers(0, env.n_actions, n)
    adv = 3 * rng.normal(size=n)
    old_lp = pol.log_probs(rows)[np.arange(n), act] + rng.normal(scale=0.5, size=n)
    loss, grad, figs = ppo.loss_and_grad(rows, act, adv, old_lp)
    logits = torch.tensor(pol.logits, requires_grad=True)
    ref = torch.from_numpy(ppo._ref(rows))
    t_loss, t_figs = ppo_loss(
        logits[torch.from_numpy(rows)] / temperature, ref / temperature,
        torch.from_numpy(act), torch.from_numpy(adv), torch.from_numpy(old_lp), s,
    )  # fmt: skip
    t_loss.backward()
    assert 0 < figs["clip_frac"] < 1
    assert t_loss.item() == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), grad, rtol=1e-9, atol=1e-12)
    for k in figs:
        assert t_figs[k] == pytest.approx(figs[k], rel=1e-12)


def test_update_moves_probability_toward_positive_advantage() -> None:
    env = toyenvs.make("tmaze", length=2, horizon=6)
    pol = toyenvs.NeuralPolicy(env, K=1, width=16, seed=0)
    ppo = NeuralPPO(pol, PPOSettings(lr=0.01, minibatches=1))
    row = np.zeros(64, dtype=np.int64)
    act = np.zeros(64, dtype=np.int64)
    before = pol.probs(row[:1])[0, 0]
    old = ppo.old_log_probs(row, act)
    st = ppo.update(row, act, np.ones(64), old, np.random.default_rng(0))
    assert pol.probs(row[:1])[0, 0] > before
    assert np.isfinite(st.grad_norm) and st.kl == pytest.approx(0.0, abs=1e-12)


def test_neural_run_is_reproducible_and_logs_the_truth(tmp_path) -> None:
    from studies import train_toy as tt

    cfg = tt.TrainToyConfig(
        envs=("tmaze:length=2",), settings=("hgpo",), seeds=1, iterations=4, eval_every=2,
        eval_rollouts=4, workers=1, policy="mlp", width=8, layers=1, truth_every=2,
        out=str(tmp_path / "o"),
    )  # fmt: skip
    run = {"env": "tmaze:length=2", "setting": "hgpo", "K": 2, "seed": 0}
    a, b = tt.run_one(cfg, run), tt.run_one(cfg, run)
    assert json.dumps(a["curve"]) == json.dumps(b["curve"])
    logged = [c for c in a["curve"] if np.isfinite(c["truth_grad_cos"])]
    assert [c["iteration"] for c in logged] == [1, 2, 4]
    for c in logged:
        assert -1 <= c["truth_grad_cos"] <= 1 and c["truth_adv_mse"] >= 0
    # the first figure is taken before any update: the uniform start's exact J
    env = toyenvs.make("tmaze", length=2)
    uniform = toyenvs.TabularPolicy(env, K=2)
    J0 = toyenvs.exact_ground_truth(env, uniform, gamma=0.95, tasks=env.train_tasks).J
    assert logged[0]["truth_J"] == pytest.approx(J0, rel=1e-9)


def test_tabular_run_keys_do_not_change_with_the_neural_options(tmp_path) -> None:
    from studies import train_toy as tt

    run = {"env": "tmaze:length=2", "setting": "hgpo", "K": 2, "seed": 0}
    plain = tt.TrainToyConfig(out=str(tmp_path))
    assert "policy" not in plain.run_fields() and "truth_every" not in plain.run_fields()
    wide = tt.TrainToyConfig(out=str(tmp_path), width=8)
    assert tt._run_key(plain, run) == tt._run_key(wide, run)
    assert tt._run_key(plain, run) != tt._run_key(tt.TrainToyConfig(policy="mlp"), run)
    # where the network is evaluated changes how, not what: runs resume across it
    mlp = tt.TrainToyConfig(policy="mlp")
    visited = tt.TrainToyConfig(policy="mlp", network_eval="visited")
    assert tt._run_key(mlp, run) == tt._run_key(visited, run)
    # float64 (the default) keeps the keys of the runs before --net-dtype; float32 is new
    assert "net_dtype" not in mlp.run_fields()
    f32 = tt.TrainToyConfig(policy="mlp", net_dtype="float32")
    assert tt._run_key(mlp, run) != tt._run_key(f32, run)


def test_float32_network_run_trains_and_logs_the_truth(tmp_path) -> None:
    from studies import train_toy as tt

    cfg = tt.TrainToyConfig(
        envs=("tmaze:length=2",), settings=("hgpo",), seeds=1, iterations=3, eval_every=3,
        eval_rollouts=4, workers=1, policy="transformer", width=8, layers=1, truth_every=3,
        net_dtype="float32", out=str(tmp_path / "o"),
    )  # fmt: skip
    run = {"env": "tmaze:length=2", "setting": "hgpo", "K": 2, "seed": 0}
    a, b = tt.run_one(cfg, run), tt.run_one(cfg, run)
    assert json.dumps(a["curve"]) == json.dumps(b["curve"])
    logged = [c for c in a["curve"] if np.isfinite(c["truth_grad_cos"])]
    assert logged and all(-1 <= c["truth_grad_cos"] <= 1 for c in logged)
    assert all(np.isfinite(c["pg_loss"]) for c in a["curve"])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--policy", "rnn"], "--policy: must be one of 'tabular', 'mlp', 'transformer'"),
        (["--width", "0"], "--width: must be an integer >= 1, got 0"),
        (["--layers", "-2"], "--layers: must be an integer >= 1, got -2"),
        (["--truth-every", "-1"], "--truth-every: must be an integer >= 0, got -1"),
        (["--network-eval", "lazy"], "--network-eval: must be one of 'table', 'visited'"),
        (["--net-dtype", "float16"], "--net-dtype: must be one of 'float32', 'float64'"),
    ],
)
def test_cli_rejects_bad_neural_options_before_any_work(tmp_path, capsys, argv, match) -> None:
    from studies import train_toy as tt

    with pytest.raises(SystemExit) as e:
        tt.main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bias_variance_reports_parameter_gradient_cosines(tmp_path) -> None:
    from studies.bias_variance import main

    args = ["--policy", "mlp", "--width", "8", "--layers", "1", "--envs", "tmaze:length=2",
            "--K", "1", "--stages", "untrained", "0.5", "--batches", "10", "--groups", "4",
            "--estimators", "grpo", "hgpo", "--workers", "1", "--no-progress",
            "--out", str(tmp_path / "bv")]  # fmt: skip
    assert main(args) == 0
    rows = json.loads((tmp_path / "bv" / "results.json").read_text())["rows"]
    assert {r["policy"] for r in rows} == {"mlp"}
    cos = [r["grad_J_cos"] for r in rows if "grad_J_cos" in r]
    assert cos and all(-1 <= c <= 1 for c in cos)
    assert max(cos) > 0.3  # the estimates point along the true parameter gradient


def test_neural_imitation_reaches_its_target() -> None:
    from studies.tabular import neural_expert_stages

    env = toyenvs.make("tmaze", length=2)
    (stage,) = neural_expert_stages(
        env, lambda: toyenvs.NeuralPolicy(env, K=2, width=8, layers=1), (0.5,), rounds=3,
        fit_steps=50,
    )  # fmt: skip
    assert isinstance(stage.policy, toyenvs.NeuralPolicy)
    assert abs(stage.success - 0.5) < 0.1
    assert stage.policy.evaluate == "table"  # the imitation's "visited" does not leak out


def test_stage_out_of_reach_takes_the_best_beta_tried(monkeypatch) -> None:
    # success(beta) peaks at beta = 8 (0.4) and falls to 0.1 at beta = 64, as a network's can.
    # Without also_try (the table's rule) a 0.7 target gets beta = 64; with it, beta = 8. A
    # 0.3 target (above 64's 0.1, below 8's 0.4) is bisected on [0, 8]; a 0.05 target on
    # [0, 64] as before.
    from studies import tabular

    def success(beta: float) -> float:
        return 0.4 * beta / 8 if beta <= 8 else 0.4 - 0.3 * (beta - 8) / 56

    beta = {"now": 0.0}

    class Pol:
        def copy(self) -> float:
            return beta["now"]

    monkeypatch.setattr(tabular, "evaluate_success", lambda env, pol: success(beta["now"]))
    set_beta = lambda b: beta.__setitem__("now", b)  # noqa: E731
    (plain,) = tabular._stages_by_beta(None, Pol(), set_beta, (0.7,), 1)
    assert plain.policy == 64.0 and plain.success == pytest.approx(0.1)
    got = tabular._stages_by_beta(None, Pol(), set_beta, (0.05, 0.3, 0.7), 1, (2.0, 8.0, 16.0))
    assert [st.target for st in got] == [0.05, 0.3, 0.7]
    assert got[0].policy == pytest.approx(1.0, abs=1e-3)  # 0.4 b / 8 = 0.05 on [0, 64]
    assert got[1].policy == pytest.approx(6.0, abs=1e-3) and got[1].success >= 0.3
    assert got[2].policy == 8.0 and got[2].success == pytest.approx(0.4)
