"""The exact truth of the LLM policy on a toy env (score mode), and --truth-every end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import toyenvs
from hgpo import ESTIMATORS
from hgpo.train.run_metrics import read_metrics
from hgpo.train.train_config import TrainConfig, TrainConfigError
from hgpo.train.truth_monitor import TruthMonitor, cross_group_bias_variance, truth_chain
from tests.train.conftest import run_cli
from tests.train.tiny_engine import tiny_engine

TMAZE = "toy:tmaze:length=0"  # cue cell, junction; horizon 6: a chain of a few hundred nodes


def _cfg(**kw) -> TrainConfig:
    base = dict(env=TMAZE, action_mode="score", history_length=2, max_steps=20, env_workers=1,
                max_prompt_tokens=1024, truth_every=1)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_solve_equals_toyenvs_exact_truth_for_a_tabular_policy():
    """Fed a tabular policy's probabilities (the same at every t), the LLM truth's V, J and
    gradient (summed over t) are toyenvs.exact_ground_truth's."""
    cfg = _cfg(env="toy:keydoor:size=4,horizon=8", history_length=1)
    mon = TruthMonitor(cfg, tok=None)
    env = mon.env
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=3)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=cfg.gamma, tasks=env.train_tasks)
    rows = pol.index_of(mon.row_code)
    truth = mon.solve(pol.probs(rows))
    assert pytest.approx(gt.J, abs=1e-12) == truth.J
    np.testing.assert_allclose(truth.V, gt.V, atol=1e-12)
    g = np.zeros_like(gt.policy_gradient)
    np.add.at(g, rows, truth.grad)
    np.testing.assert_allclose(g, gt.policy_gradient, atol=1e-12)


def test_cross_group_bias_variance_hand_worked():
    """Key 0: errors 1, 3 in group 0 and 2 in group 1. Ordered cross-group pairs (1, 2), (3, 2)
    and back: products 2, 6, 2, 6, mean 4 = bias2 (the formula: (6^2 - 4^2 - 2^2) / (3^2 - 2^2
    - 1^2) = 16 / 4). mse = (1 + 9 + 4) / 3 = 14/3, variance = 14/3 - 4 = 2/3. Key 1 lies in
    one group only: left out, so coverage = 3 / 5 steps."""
    bv = cross_group_bias_variance(
        np.array([0, 0, 0, 1, 1]), np.array([0, 0, 1, 0, 0]), np.array([1.0, 3, 2, 5, 5])
    )
    assert bv.bias2 == pytest.approx(4.0) and bv.mse == pytest.approx(14 / 3)
    assert bv.variance == pytest.approx(2 / 3) and bv.coverage == pytest.approx(0.6)
    assert np.isnan(cross_group_bias_variance(np.zeros(3, int), np.zeros(3, int), np.ones(3)).bias2)


def test_cross_group_bias2_is_unbiased_where_groups_centre_their_samples():
    """Errors b_k + shared group noise + noise centred within each group (negatively
    correlated, as mean-centred group advantages are): the mean bias2 over 200 batches is the
    true mean b_k^2 (0.347) within 0.03, where the within-group decomposition is far below."""
    rng = np.random.default_rng(0)
    K, G, m = 50, 6, 3
    b = np.linspace(-1, 1, K)
    key = np.repeat(np.arange(K), G * m)
    group = np.tile(np.repeat(np.arange(G), m), K)
    got = []
    for _ in range(200):
        noise = rng.normal(0, 2, (K, G, m))
        noise -= noise.mean(axis=2, keepdims=True)
        err = (b[:, None, None] + rng.normal(0, 1, (K, G, 1)) + noise).reshape(-1)
        got.append(cross_group_bias_variance(key, group, err).bias2)
    assert abs(np.mean(got) - np.mean(b**2)) < 0.03


def test_cross_group_bias2_is_unbiased_when_visit_counts_move_the_errors():
    """A group whose rollouts meet key 0 n times has mean error 1.5 - 0.5 n (a good state met
    often raises the group's baseline), n uniform in 1..3: a group's expected error is 0.5,
    squared 0.25. The group-level pairs give 0.25; weighting by visits would not."""
    rng = np.random.default_rng(1)
    got = []
    for _ in range(2000):
        n = rng.integers(1, 4, size=4)
        err = np.concatenate([1.5 - 0.5 * k + rng.normal(0, 1, k) for k in n])
        group = np.repeat(np.arange(4), n)
        got.append(cross_group_bias_variance(np.zeros(err.size, int), group, err).bias2)
    assert abs(np.mean(got) - 0.25) < 0.03


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from agentenvs.toytext import toy_corpus

    return tiny_engine(tmp_path_factory.mktemp("m"), toy_corpus(TMAZE), 400, seed=1)


def test_exact_truth_agrees_with_monte_carlo_returns_and_rollout_prompts(tiny_llm):
    """J of the LLM policy (exact, from the scored chain) against the mean discounted return of
    160 rollouts of the same weights: a z-test; and every rollout step's prompt is the prompt
    the chain rendered for its (t, context)."""
    from hgpo.train.envs import EnvSet
    from hgpo.train.episodes import Play, run_episodes
    from hgpo.train.model import encode_prompt

    tok, engine = tiny_llm
    cfg = _cfg()
    mon = TruthMonitor(cfg, tok)
    truth = mon.policy_truth(engine.score)
    envs = EnvSet(cfg, "train", 160)
    try:
        torch.manual_seed(0)
        play = Play(40, cfg.temperature, 1.0, 16, cfg.max_prompt_tokens, cfg.max_steps, "score")
        roll = run_episodes(envs, engine, tok, [0, 1, 0, 1], play)
    finally:
        envs.close()
    step = np.asarray(roll.step)
    r = np.asarray(roll.reward) - 0.1 * np.asarray(roll.invalid)
    ret = np.bincount(np.asarray(roll.traj), weights=r * cfg.gamma**step)
    z = (ret.mean() - truth.J) / (ret.std(ddof=1) / np.sqrt(ret.size))
    assert abs(z) < 4, (ret.mean(), truth.J, z)
    steps = mon.rollout_steps(roll)
    nodes = mon.step_nodes(steps)
    for i in range(len(roll)):
        text = mon.prompt(int(step[i]), int(mon.row_code[nodes.row[i]]))
        assert roll.prompt_ids[i] == encode_prompt(tok, text, cfg.max_prompt_tokens)
    # the figures of every estimator come out for this batch
    m = mon.estimator_metrics(truth, steps, nodes)
    assert {f"truth/{e}/grad_cos" for e in ESTIMATORS} <= set(m)
    assert m["truth/oracle/coverage"] > 0.5 and np.isfinite(m["truth/hgpo/bias2"])


def test_every_estimator_gets_its_exact_inputs_and_a_failing_plugin_is_named(tiny_llm, caplog):
    """A registered estimator reading values, entropy and observations gets the chain's exact
    V at each step's node (gae_lambda = 1), the exact entropy of pi(. | t, c) at its row and
    the observation texts; a user's estimator that raises is left out with truth/<est>/failed
    = 1 and its error logged once; the one the run trains stops the run."""
    from hgpo import register_estimator, step_returns, unregister_estimator
    from hgpo.train.envs import EnvSet
    from hgpo.train.episodes import Play, run_episodes

    seen: dict = {}

    def reader(batch, cfg, values=None, entropy=None, observations=None):
        seen.update(values=values, entropy=entropy, observations=observations, lam=cfg.gae_lambda)
        return step_returns(batch, cfg) - values

    def boom(batch, cfg, values=None):
        raise RuntimeError("a plugin's bug")

    tok, engine = tiny_llm
    cfg = _cfg(train_tasks=1)
    mon = TruthMonitor(cfg, tok)
    envs = EnvSet(cfg, "train", 8)
    try:
        torch.manual_seed(1)
        play = Play(4, cfg.temperature, 1.0, 16, cfg.max_prompt_tokens, cfg.max_steps, "score")
        roll = run_episodes(envs, engine, tok, [0, 0], play)
    finally:
        envs.close()
    register_estimator("test_reader", reader, reads=("values", "entropy", "observations"))
    register_estimator("test_boom", boom)
    try:
        steps = mon.rollout_steps(roll)
        nodes = mon.step_nodes(steps)
        truth = mon.policy_truth(engine.score_batched)
        with caplog.at_level("ERROR", logger="hgpo.train.truth_monitor"):
            m = mon.estimator_metrics(truth, steps, nodes)
            mon.estimator_metrics(truth, steps, nodes)
        np.testing.assert_array_equal(seen["values"], truth.V[nodes.node])
        p = truth.probs[nodes.row]
        np.testing.assert_allclose(seen["entropy"], -(p * np.log(p)).sum(axis=1), rtol=1e-12)
        assert seen["lam"] == 1.0 and seen["observations"] == roll.observation
        obs_text = [mon.text.obs_text[int(mon.env.obs_of_state[h])] for h in roll.hidden]
        assert seen["observations"] == obs_text
        assert np.isfinite(m["truth/test_reader/grad_cos"])
        assert m["truth/test_boom/failed"] == 1.0
        assert [k for k in m if k.startswith("truth/test_boom/")] == ["truth/test_boom/failed"]
        msgs = [r.getMessage() for r in caplog.records]
        assert len(msgs) == 1 and "estimator 'test_boom' (register_estimator) failed" in msgs[0]
        assert "RuntimeError: a plugin's bug" in msgs[0]
        trained = TruthMonitor(_cfg(train_tasks=1, estimator="test_boom"), tok)
        with pytest.raises(RuntimeError, match="a plugin's bug"):
            trained.estimator_metrics(truth, steps, nodes)
    finally:
        unregister_estimator("test_reader")
        unregister_estimator("test_boom")


def test_policy_table_puts_each_score_back_in_its_row_and_shows_progress(tiny_llm, capsys):
    """The truth pass sends the prompts ordered by length then tokens, in calls of at most
    PROMPTS_PER_CALL prompts; a scorer whose figure is a function of the pair gives every
    row its own prompt's figures, and --progress shows a bar over the prompts (issue 30)."""
    import hgpo.train.truth_monitor as tm

    tok, _ = tiny_llm
    mon = TruthMonitor(_cfg(progress=True), tok)
    calls = []

    def scorer(prompts, responses):
        calls.append([len(p) for p in prompts])
        return [float(sum(p) % 97) / 10 + len(r) / 7 + r[-2] / 50 for p, r in
                zip(prompts, responses, strict=True)]  # fmt: skip

    probs = mon.policy_table(scorer)
    prompts = mon.prompt_ids()
    resp = [tok(tm.response_text(a), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for a in mon.text.actions]  # fmt: skip
    for i in (0, len(prompts) // 2, len(prompts) - 1):
        lg = np.array(scorer([prompts[i]] * len(resp), resp)) / mon.cfg.temperature
        np.testing.assert_allclose(probs[i], np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum())
    lens = [n for c in calls[:-3] for n in c]
    assert lens == sorted(lens) and max(len(c) for c in calls[:-3]) <= tm.PROMPTS_PER_CALL * 5
    assert f"truth:   0%|          | 0/{len(prompts)}" in capsys.readouterr().err  # the bar
    quiet = TruthMonitor(_cfg(progress=False), tok)
    np.testing.assert_array_equal(quiet.policy_table(scorer), probs)
    assert "truth:" not in capsys.readouterr().err  # no bar without --progress


def test_nan_bias2_is_explained_once(caplog):
    """Coverage 0 because every group plays its own task: the log names the cause and the flag,
    once a run; keys met by two groups log nothing."""
    mon = TruthMonitor(_cfg(), tok=None)
    key, group = np.array([0, 1, 2, 3]), np.array([0, 0, 1, 1])
    with caplog.at_level("WARNING", logger="hgpo.train.truth_monitor"):
        mon._explain_nan(key, group, np.array([5, 5, 6, 6]))
        mon._explain_nan(key, group, np.array([5, 5, 6, 6]))
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "0 of 4 batch steps" in msgs[0]
    assert "each of the batch's 2 rollout groups plays a different task" in msgs[0]
    assert "--train-tasks below --groups-per-iter" in msgs[0]
    caplog.clear()
    other = TruthMonitor(_cfg(), tok=None)
    with caplog.at_level("WARNING", logger="hgpo.train.truth_monitor"):
        other._explain_nan(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([5, 5, 5]))
        other._explain_nan(np.array([0, 1, 2]), np.array([0, 1, 1]), np.array([5, 5, 5]))
    msgs = [r.getMessage() for r in caplog.records]
    assert (
        len(msgs) == 1 and "its 2 groups of 1 tasks met no (task, state, action) twice" in msgs[0]
    )


def test_truth_every_needs_score_mode_and_a_toy_env():
    with pytest.raises(ValueError, match="truth_every=1 needs action_mode='score'"):
        _cfg(action_mode="generate")
    with pytest.raises(ValueError, match="needs a toy env"):
        _cfg(env="alfworld")
    r = run_cli(["--env", TMAZE, "--truth-every", "2", "--print-config"])
    assert r.returncode == 2 and "needs action_mode='score'" in r.stderr


def test_chain_size_is_guarded_before_any_model():
    with pytest.raises(TrainConfigError, match="truth_max_nodes=100: the reachable"):
        truth_chain(_cfg(env="toy:keydoor:size=4", truth_max_nodes=100))
    with pytest.raises(TrainConfigError, match="max_steps=3 is below the toy env's horizon 6"):
        truth_chain(_cfg(max_steps=3))


def test_unknown_toy_family_or_parameter_names_the_known_ones():
    with pytest.raises(ValueError, match="known families: keydoor, tmaze"):
        TrainConfig(env="toy:maze")
    r = run_cli(["--env", "toy:keydoor:sz=4", "--print-config"])
    assert r.returncode == 2 and "parameters: ['size', 'slip', 'horizon'" in r.stderr


def test_truth_every_1_end_to_end(tmp_path):
    out = tmp_path / "toy"
    args = ["--preset", "tiny", "--env", TMAZE, "--action-mode", "score", "--max-steps", "6"]
    args += ["--truth-every", "1", "--val-every", "2", "--save-every", "0", "--out-dir", str(out)]
    r = run_cli(args)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2]
    # the pass's size is logged once a run (the CLI and the Trainer both check it: issue 38)
    assert r.stderr.count("truth: a pass scores") == 1, r.stderr[-3000:]
    for row in rows:
        assert row["truth/nodes"] > 0 and row["truth/time"] > 0
        assert row["time/truth"] >= row["truth/time"]  # the phase joins time/* (issue 30)
        for est in ESTIMATORS:
            for metric in ("bias2", "variance", "mse", "sign", "grad_cos"):
                assert f"truth/{est}/{metric}" in row
    assert rows[-1]["val/heldout/tasks"] == 0  # the T-maze has no held-out tasks


def test_estimators_reading_entropy_or_observations_get_them_from_the_truth():
    """The truth monitor runs every registered estimator, a user's that reads entropy (the
    exact entropy of pi(. | t, c)) or observations (each step's observation text, as the
    batch's TruthSteps carry them) too; fed a tabular policy's batch, what they receive is
    checked here."""
    import hgpo
    from agentenvs.toytext import render
    from hgpo.train.truth_monitor import TruthSteps

    got = {}

    def ent(batch, cfg, values=None, entropy=None):
        got["entropy"] = entropy
        return entropy - entropy.mean()

    def obs(batch, cfg, values=None, observations=None):
        got["observations"] = observations
        return np.zeros(batch.n_steps)

    cfg = _cfg(env="toy:keydoor:size=4,horizon=8", history_length=1)
    mon = TruthMonitor(cfg, tok=None)
    env = mon.env
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=3)
    truth = mon.solve(pol.probs(pol.index_of(mon.row_code)))
    rb = toyenvs.rollout(env, pol, np.repeat(env.train_tasks[:2], 2), 4, 5)
    texts = render(env).obs_text
    steps = TruthSteps(rb.batch, rb.hidden, rb.batch.action, [texts[o] for o in rb.batch.state])
    hgpo.register_estimator("test_truth_entropy", ent, reads=("entropy",))
    hgpo.register_estimator("test_truth_observations", obs, reads=("observations",))
    try:
        m = mon.estimator_metrics(truth, steps, mon.step_nodes(steps))
    finally:
        hgpo.unregister_estimator("test_truth_entropy")
        hgpo.unregister_estimator("test_truth_observations")
    assert np.isfinite(m["truth/test_truth_entropy/mse_all"])
    assert "truth/test_truth_observations/sign" in m
    p = pol.probs(rb.context)
    np.testing.assert_allclose(got["entropy"], -(p * np.log(p)).sum(axis=1), rtol=1e-12)
    assert got["observations"] == [texts[o] for o in rb.batch.state]
