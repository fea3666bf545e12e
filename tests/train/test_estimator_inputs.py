"""The per-step inputs the trainer hands the estimator it trains (hgpo.STEP_INPUTS): the
policy's entropy (score mode: exact over the candidates; generate mode: the mean token entropy
of the scoring pass) and the observation text, each only to an estimator that reads it; and
the batch's ``next_state`` column (graphgpo's terminal states)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from agentenvs.toytext import parse_toy_spec, render
from hgpo import register_estimator, step_returns, unregister_estimator
from hgpo.train.episodes import Play, run_episodes, score_candidates
from hgpo.train.train_config import TrainConfig, uses_critic
from hgpo.train.update import Scored, mean_token_entropy
from tests.train.tiny_engine import CharTokenizer, FixedScores, tiny_engine

ENV = "toy:keydoor:size=4,horizon=6"


def test_score_mode_entropy_is_the_candidate_distributions_hand_worked():
    """Scores (0, ln 3): pi = (1/4, 3/4) at T = 1, H = ln 4 - (3/4) ln 3 = 0.5623351; at
    T = 0.5 the logits are (0, 2 ln 3): pi = (1/10, 9/10), H = -(0.1 ln 0.1 + 0.9 ln 0.9)
    = 0.3250830."""
    engine = FixedScores([0.0, math.log(3.0)])
    got = score_candidates(engine, CharTokenizer(), [[1]], [["a", "b"]], 1.0)
    assert got.entropy == [pytest.approx(0.5623351446, abs=1e-9)]
    got = score_candidates(engine, CharTokenizer(), [[1]], [["a", "b"]], 0.5)
    assert got.entropy == [pytest.approx(0.3250829734, abs=1e-9)]


def test_mean_token_entropy_averages_the_response_tokens_hand_worked():
    """Row 0 has 2 response tokens (entropies 1 and 3: mean 2; the padded 9 is left out),
    row 1 has 3 (0.5, 0.5, 2: mean 1)."""
    ent = torch.tensor([[1.0, 3.0, 9.0], [0.5, 0.5, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert mean_token_entropy(ent, mask).tolist() == [2.0, 1.0]
    with pytest.raises(RuntimeError, match="sample 1 has no response token"):
        mean_token_entropy(ent, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hgpo.train.trainer import tiny_corpus

    return tiny_engine(tmp_path_factory.mktemp("m"), tiny_corpus(ENV), 512, seed=2)


@pytest.fixture
def reader():
    """An estimator reading entropy and observations that records what it is given."""
    seen: list[dict] = []

    def fn(batch, cfg, values=None, entropy=None, observations=None):
        seen.append({"entropy": entropy, "observations": observations})
        return step_returns(batch, cfg)

    register_estimator("test_reader", fn, reads=("entropy", "observations"))
    yield seen
    unregister_estimator("test_reader")


def _cfg(**kw) -> TrainConfig:
    base = dict(env=ENV, history_length=1, max_steps=3, env_workers=1, group_size=2,
                max_prompt_tokens=512, max_response_tokens=6, micro_batch_size=3,
                kl_coef=0.0)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def _play(tiny, cfg):
    from hgpo.train.envs import EnvSet

    tok, engine = tiny
    envs = EnvSet(cfg, "train", 4)
    try:
        torch.manual_seed(0)
        return run_episodes(envs, engine, tok, [0, 1], Play.training(cfg))
    finally:
        envs.close()


def _observation_texts(roll) -> list[str]:
    """The toy env's observation text of each step's hidden state (agentenvs.toytext)."""
    env = parse_toy_spec(ENV).build()
    text = render(env)
    return [text.obs_text[int(env.obs_of_state[h])] for h in roll.hidden]


def test_generate_mode_entropy_is_the_responses_mean_token_entropy(tiny, reader):
    """The scoring pass's entropy of each step equals the mean over the response tokens of the
    entropy of softmax(logits) from a plain full forward of prompt + response (no packing),
    and the estimator gets it with the env's observation texts, through estimator_inputs."""
    from hgpo import compute_advantages
    from hgpo.train.trainer import Trainer, estimator_inputs

    tok, engine = tiny
    cfg = _cfg(estimator="test_reader")
    roll = _play(tiny, cfg)
    fake = types.SimpleNamespace(
        cfg=cfg, actor=types.SimpleNamespace(module=engine.model), sharded=False, tok=tok,
        device=torch.device("cpu"), critic=None,
        _reusable_logprobs=lambda roll: None,  # the forward runs (no rollout log-probs reused)
    )  # fmt: skip
    scored = Trainer._score(fake, roll)
    assert scored.entropy is not None and len(scored.entropy) == len(roll)
    want = []
    with torch.no_grad():
        for p, r in zip(roll.prompt_ids, roll.response_ids, strict=True):
            logits = engine.model(torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
            logp = torch.log_softmax(logits.double(), -1)
            want.append(float(-(logp.exp() * logp).sum(-1).mean()))
    np.testing.assert_allclose(scored.entropy, want, rtol=1e-5)
    inputs = estimator_inputs("test_reader", roll, scored, "generate")
    assert set(inputs) == {"entropy", "observations"}
    assert inputs["observations"] == _observation_texts(roll)
    compute_advantages("test_reader", roll.step_batch(), cfg.estimator_config(), **inputs)
    np.testing.assert_array_equal(reader[-1]["entropy"], scored.entropy)
    # an estimator that reads nothing gets nothing, and the pass computes no entropy
    assert estimator_inputs("hgpo", roll, scored, "generate") == {}
    fake.cfg = _cfg(estimator="hgpo")
    assert Trainer._score(fake, roll).entropy is None


def test_score_mode_entropy_comes_from_the_rollouts_candidates(tiny, reader):
    """In score mode the entropy is each step's candidate distribution's, recorded while
    sampling: recomputed here from the engine's scores of every admissible action."""
    from hgpo.train.episodes import response_text
    from hgpo.train.trainer import estimator_inputs

    tok, engine = tiny
    cfg = _cfg(estimator="test_reader", action_mode="score")
    roll = _play(tiny, cfg)
    text = render(parse_toy_spec(ENV).build())
    resp = [tok(response_text(a), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for a in text.actions]  # fmt: skip
    want = []
    for p in roll.prompt_ids:
        s = torch.tensor(engine.score([p] * len(resp), resp), dtype=torch.float64)
        logp = torch.log_softmax(s / cfg.temperature, 0)
        want.append(float(-(logp.exp() * logp).sum()))
    inputs = estimator_inputs("test_reader", roll, Scored([]), "score")
    # the rollout scores all envs' candidates in batched passes, the engine.score here one
    # prompt at a time: the same scores to float32 rounding
    np.testing.assert_allclose(inputs["entropy"], want, rtol=1e-5)
    assert inputs["observations"] == _observation_texts(roll)


def test_the_batch_records_the_observation_each_step_led_to(tiny, monkeypatch):
    """Rollout.next_key / StepBatch.next_state: within a trajectory the next step's key; after
    its last step the key of the observation the env returned (checked against the env's own
    hidden state after that step, whether the episode ended or max_steps cut it), keyed with
    the states' keys; graphgpo then reads it."""
    from hgpo import compute_advantages
    from hgpo.train.envs import EnvSet

    final: dict[int, int] = {}  # slot -> the env's hidden state after its last step
    step = EnvSet.step

    def recording(self, actions):
        live = [i for i in range(len(actions)) if not self.done(i)]
        out = step(self, actions)
        for i in live:
            final[i] = int(out[3][i]["hidden_state"])
        return out

    monkeypatch.setattr(EnvSet, "step", recording)
    cfg = _cfg(max_steps=4, action_mode="score")  # (valid moves: the states change)
    roll = _play(tiny, cfg)
    batch = roll.step_batch()
    assert batch.next_state is not None and len(roll.next_key) == len(roll)
    last = batch.traj_start + batch.traj_len - 1
    inner = np.setdiff1d(np.arange(len(roll)), last)
    assert [roll.next_key[i] for i in inner] == [roll.key[i + 1] for i in inner]
    assert any(roll.key[i] != roll.key[i + 1] for i in inner)
    env = parse_toy_spec(ENV).build()
    text = render(env)
    want = [text.obs_text[int(env.obs_of_state[final[tr]])] for tr in range(batch.n_traj)]
    assert [roll.next_key[i] for i in last] == want
    keys = {k: s for k, s in zip(roll.key, batch.state.tolist(), strict=True)}
    for i in last:  # a terminal observation seen as a state has that state's key
        if roll.next_key[i] in keys:
            assert batch.next_state[i] == keys[roll.next_key[i]]
    out = compute_advantages("graphgpo", batch, cfg.estimator_config())
    assert out.diagnostics["graph"]["terminal"] == "next_state"


def test_the_batch_carries_each_steps_parsed_action_and_ecpo_runs_on_it(tiny):
    """StepBatch.action: the id of the action text each step sent to the env (equal texts,
    equal ids), in score mode one of the env's listed actions; ecpo (which needs canonical
    actions) and hgpo with include_actions then run on the trainer's batch."""
    from hgpo import compute_advantages

    cfg = _cfg(max_steps=4, action_mode="score")
    roll = _play(tiny, cfg)
    batch = roll.step_batch()
    assert batch.action is not None and len(roll.action) == len(roll) == len(batch.action)
    listed = set(render(parse_toy_spec(ENV).build()).actions)
    assert set(roll.action) <= listed
    for i in range(len(roll)):
        for j in range(len(roll)):
            assert (roll.action[i] == roll.action[j]) == (batch.action[i] == batch.action[j])
    out = compute_advantages("ecpo", batch, cfg.estimator_config())
    assert np.isfinite(out.advantages).all()
    est = cfg.estimator_config().replace(include_actions=True)
    assert np.isfinite(compute_advantages("hgpo", batch, est).advantages).all()


def test_a_values_reader_trains_a_critic_and_an_unknown_name_lists_the_registered():
    from tests.train.conftest import run_cli

    assert uses_critic("gae") and not uses_critic("hgpo")
    register_estimator("test_critic", lambda b, c, values=None: values, reads=("values",))
    try:
        assert uses_critic("test_critic") and _cfg(estimator="test_critic").use_critic
        # --resume: a change to or from a critic changes the optimizer state's shapes
        from hgpo.train.rundir import _critic_change

        assert _critic_change("gae", "hgpo") and _critic_change("hgpo", "test_critic")
        assert not _critic_change("gae", "test_critic") and not _critic_change("hgpo", "grpo")
        assert not _critic_change("gone", "hgpo")  # no longer registered: not known to have one
    finally:
        unregister_estimator("test_critic")
    r = run_cli(["--preset", "tiny", "--env", ENV, "--estimator", "nope"])  # refused at parse
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unknown estimator 'nope'; known estimators: grpo, rloo" in r.stderr
