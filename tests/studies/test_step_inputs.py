"""The per-step inputs the studies supply to an estimator that reads them."""

import math

import numpy as np
import pytest

import hgpo
import toyenvs
from agentenvs.toytext import render
from studies.step_inputs import StepInputs, observation_texts, step_entropy


def test_step_entropy_hand_worked():
    # uniform over 4: log 4 = 1.3863; (1, 0): 0 (0 log 0 = 0); (0.5, 0.5): log 2 = 0.6931
    H = step_entropy(np.array([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0]]))
    np.testing.assert_allclose(H, [math.log(4), 0.0, math.log(2)], rtol=1e-15)


@pytest.fixture
def readers():
    """Two estimators registered for the test: one reading entropy, one observations."""

    def ent(batch, cfg, values=None, entropy=None):
        return entropy - entropy.mean()

    def obs(batch, cfg, values=None, observations=None):
        lengths = np.array([len(o) for o in observations], dtype=np.float64)
        return lengths - lengths.mean()

    hgpo.register_estimator("test_reads_entropy", ent, reads=("entropy",))
    hgpo.register_estimator("test_reads_observations", obs, reads=("observations",))
    yield
    hgpo.unregister_estimator("test_reads_entropy")
    hgpo.unregister_estimator("test_reads_observations")


def test_inputs_are_exactly_what_each_estimator_reads(readers):
    env = toyenvs.make("keydoor", size=4)
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=1)
    rb = toyenvs.rollout(env, pol, env.tasks[:3], 4, 7)
    V = np.linspace(0, 1, rb.n_steps)
    calls = []
    inputs = StepInputs(env, rb, V, probs=lambda: calls.append(1) or pol.probs(rb.context))
    assert inputs.of("hgpo") == {} and calls == []  # nothing read, nothing computed
    assert inputs.of("gae") == {"values": V}
    H = inputs.of("test_reads_entropy")["entropy"]
    p = pol.probs(rb.context)
    np.testing.assert_allclose(H, -(p * np.log(p)).sum(axis=1), rtol=1e-12)
    inputs.of("test_reads_entropy")
    assert calls == [1]  # computed once a batch
    obs = inputs.of("test_reads_observations")["observations"]
    texts = render(env).obs_text
    assert obs == [texts[o] for o in rb.batch.state] == observation_texts(env, rb.batch.state)
    assert obs[0].startswith("You are in the ")
    for name in ("gae", "test_reads_entropy", "test_reads_observations"):
        hgpo.compute_advantages(name, rb.batch, **inputs.of(name))  # the registry's checks pass


def test_a_missing_critic_or_policy_is_a_named_error(readers):
    env = toyenvs.make("tmaze", length=1)
    rb = toyenvs.rollout(env, toyenvs.TabularPolicy(env, K=1), env.tasks, 2, 0)
    with pytest.raises(ValueError, match="estimator 'gae' reads values; this study has no critic"):
        StepInputs(env, rb).of("gae")
    with pytest.raises(ValueError, match="entropy: this study has no policy probabilities"):
        StepInputs(env, rb).of("test_reads_entropy")
