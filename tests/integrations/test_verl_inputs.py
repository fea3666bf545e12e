"""Users' estimators and the per-step inputs they read, through verl and verl-agent.

Test estimators registered here (after hgpo.integrations.verl was imported) return one of their
inputs as the advantage, so each row's token advantages show exactly which value reached which
row: the policy's entropy (``step_entropy``, or verl's token ``entropys`` averaged over the
response), the observation text (``anchor_obs``), the critic's value.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
pytestmark = pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning")

from benchmarks.verl_parity import GAMMA, algo_config, make_dataproto, make_episodes, rows_of  # noqa: E402
from hgpo import ESTIMATORS, register_estimator, step_returns, unregister_estimator  # noqa: E402


def _entropy_is_advantage(batch, cfg, values=None, entropy=None):
    return entropy.copy()


def _obs_length_is_advantage(batch, cfg, values=None, observations=None):
    return np.array([float(len(o)) for o in observations])


def _value_is_advantage(batch, cfg, values=None):
    return values - 0.0 * step_returns(batch, cfg)


@pytest.fixture(scope="module")
def hv():
    """hgpo.integrations.verl with three test estimators registered after its import."""
    from hgpo.integrations import verl as module

    register_estimator("test_ent", _entropy_is_advantage, reads=("entropy",))
    register_estimator("test_obs", _obs_length_is_advantage, reads=("observations",))
    register_estimator("test_val", _value_is_advantage, reads=("values",))
    yield module
    for name in ("test_ent", "test_obs", "test_val"):
        unregister_estimator(name)
    module.sync()
    assert set(module.NAMES) == set(ESTIMATORS)


@pytest.fixture(scope="module")
def ray_trainer(hv):
    from verl.trainer.ppo import ray_trainer

    return ray_trainer


def _data(seed: int = 11):
    ep = make_episodes(seed)
    rows = rows_of(ep, "shuffled", seed)
    return ep, rows, make_dataproto(ep, rows, step_index=True)


def _row_advantage(data) -> np.ndarray:
    """The advantage of each row (every response token of a row holds it)."""
    adv = data.batch["advantages"].double()
    mask = data.batch["response_mask"].bool()
    first = torch.stack([adv[r][mask[r]][0] for r in range(adv.shape[0])])
    for r in range(adv.shape[0]):
        assert torch.all(adv[r][mask[r]] == first[r]) and torch.all(adv[r][~mask[r]] == 0)
    return first.numpy()


def test_an_estimator_registered_later_is_registered_in_verl(hv):
    from verl.trainer.ppo import core_algos

    assert hv.verl_name("test_ent") == "test_ent"  # verl has no estimator of that name
    assert hv.our_name("hgpo.test_obs") == "test_obs"
    assert core_algos.get_adv_estimator_fn("hgpo.test_val").hgpo_estimator == "test_val"
    assert {"test_ent", "hgpo.test_ent"} <= set(hv.REGISTERED)


def test_step_entropy_reaches_each_row(hv, ray_trainer):
    _, rows, data = _data()
    want = np.linspace(0.1, 2.0, len(rows))
    data.non_tensor_batch["step_entropy"] = np.array(want, dtype=object)
    out = ray_trainer.compute_advantage(data, adv_estimator="test_ent", config=algo_config({}))
    np.testing.assert_allclose(_row_advantage(out), want, rtol=1e-6)


def test_token_entropys_are_averaged_over_each_response(hv, ray_trainer):
    _, rows, data = _data()
    mask = data.batch["response_mask"]
    ent = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3)) * 3
    data.batch["entropys"] = ent
    want = []
    for r in range(len(rows)):  # a plain loop over the response tokens
        toks = [float(ent[r, j]) for j in range(mask.shape[1]) if mask[r, j]]
        want.append(sum(toks) / len(toks))
    out = ray_trainer.compute_advantage(data, adv_estimator="hgpo.test_ent", config=algo_config({}))
    np.testing.assert_allclose(_row_advantage(out), want, rtol=1e-6)


def test_entropy_missing_or_given_twice_is_named_before_any_work(hv, ray_trainer):
    _, rows, data = _data()
    with pytest.raises(hv.MissingMetadataError) as e:
        ray_trainer.compute_advantage(data, adv_estimator="test_ent", config=algo_config({}))
    msg = str(e.value)
    assert "estimator 'test_ent': reads the policy's entropy" in msg
    assert "'step_entropy'" in msg and "'entropys'" in msg and "bypass mode" in msg
    assert "advantages" not in set(data.batch.keys())
    data.non_tensor_batch["step_entropy"] = np.ones(len(rows))
    data.batch["entropys"] = torch.ones(data.batch["response_mask"].shape)
    with pytest.raises(ValueError, match="both non_tensor_batch 'step_entropy' and batch"):
        ray_trainer.compute_advantage(data, adv_estimator="test_ent", config=algo_config({}))


def test_observations_are_the_anchor_obs_of_each_row(hv, ray_trainer):
    ep, rows, data = _data()
    out = ray_trainer.compute_advantage(data, adv_estimator="test_obs", config=algo_config({}))
    want = [float(len(ep.obs[i][t])) for i, t in rows]
    np.testing.assert_array_equal(_row_advantage(out), want)
    data.non_tensor_batch["anchor_obs"][2] = np.zeros(3)
    with pytest.raises(ValueError, match=r"anchor_obs'\]\[2\]: an estimator that reads obs"):
        ray_trainer.compute_advantage(data, adv_estimator="test_obs", config=algo_config({}))


def test_a_users_values_reader_gets_the_critics_first_token_value(hv, ray_trainer):
    ep, rows, data = _data()
    out = ray_trainer.compute_advantage(
        data, adv_estimator="test_val", gamma=GAMMA, config=algo_config({})
    )
    want = [ep.values[i][t] for i, t in rows]
    np.testing.assert_allclose(_row_advantage(out), want, rtol=1e-6)
    data.batch.pop("values")
    with pytest.raises(hv.MissingMetadataError, match=r"lacks batch 'values'"):
        ray_trainer.compute_advantage(data, adv_estimator="test_val", config=algo_config({}))


def _next_state_is_advantage(batch, cfg, values=None):
    assert batch.next_state is not None
    return batch.next_state.astype(np.float64)


def _state_is_advantage(batch, cfg, values=None):
    return batch.state.astype(np.float64)


def test_next_obs_becomes_the_step_batchs_next_state(hv, ray_trainer):
    """The contract's optional next_obs (GraphGPO's rollout loop sets it) is the StepBatch's
    next_state, keyed together with anchor_obs (rows shuffled, step_index given): two keys are
    equal exactly where the observations are, across the two columns; a next_obs that is not
    the next step's anchor_obs is a named error."""
    ep, rows, data = _data()
    ends = {i: ep.obs[i][0] if i % 2 else f"end {i}" for i in range(len(ep.groups))}
    nxt = [ep.obs[i][t + 1] if t + 1 < len(ep.obs[i]) else ends[i] for i, t in rows]
    anchor = [ep.obs[i][t] for i, t in rows]
    data.non_tensor_batch["next_obs"] = np.array(nxt, dtype=object)
    register_estimator("test_next", _next_state_is_advantage)
    register_estimator("test_state", _state_is_advantage)
    try:
        cfg = algo_config({})
        next_key = _row_advantage(ray_trainer.compute_advantage(data, "test_next", config=cfg))
        key = _row_advantage(ray_trainer.compute_advantage(data, "test_state", config=cfg))
    finally:
        unregister_estimator("test_next")
        unregister_estimator("test_state")
    assert len(set(nxt) - set(anchor)) > 0 and len(set(nxt) & set(anchor)) > 1
    for a in range(len(rows)):
        for b in range(len(rows)):
            assert (next_key[a] == next_key[b]) == (nxt[a] == nxt[b])
            assert (next_key[a] == key[b]) == (nxt[a] == anchor[b])
    data.non_tensor_batch["next_obs"] = np.array(["elsewhere"] * len(rows), dtype=object)
    with pytest.raises(
        ValueError, match=r"DataProto -> StepBatch: non_tensor_batch\['next_obs'\].*next_state\["
    ):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo.graphgpo", config=algo_config({}))


def test_the_legacy_trainers_old_log_prob_pass_keeps_the_step_entropy(hv, ray_trainer):
    """verl 0.9.1's fit: old_log_prob = _compute_old_log_prob(batch); pop('entropys');
    batch.union(old_log_prob); compute_advantage(batch): the wrapped pass leaves each row's
    mean token entropy in non_tensor_batch['step_entropy'], for our entropy readers only."""
    from verl import DataProto

    assert ray_trainer.RayPPOTrainer._compute_old_log_prob.hgpo_original is not None
    _, _, data = _data()
    mask = data.batch["response_mask"]
    ent = torch.rand(mask.shape, generator=torch.Generator().manual_seed(5))

    def original(self, batch):  # what verl's pass returns: (old_log_prob, mfu)
        old = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(mask.shape),
                                           "entropys": ent.clone()})  # fmt: skip
        return old, 0.5

    def trainer(name):
        algorithm = types.SimpleNamespace(adv_estimator=name)
        return types.SimpleNamespace(config=types.SimpleNamespace(algorithm=algorithm))

    old, mfu = hv._keep_step_entropy(original)(trainer("hgpo"), data)
    assert mfu == 0.5 and "step_entropy" not in old.non_tensor_batch  # hgpo reads none
    old, _ = hv._keep_step_entropy(original)(trainer("test_ent"), data)
    old.batch.pop("entropys")  # as fit does after its metric
    batch = data.union(old)
    out = ray_trainer.compute_advantage(batch, adv_estimator="test_ent", config=algo_config({}))
    want = ((ent * mask).sum(-1) / mask.sum(-1)).double().numpy()
    np.testing.assert_allclose(_row_advantage(out), want, rtol=1e-6)


def test_the_v1_trainer_reads_the_queues_entropy(hv, monkeypatch):
    """verl's real v1 PPOTrainer._compute_advantage over the in-memory queue of
    test_verl_v1.py, each row also holding its token 'entropy' (nested, as
    _compute_old_log_prob writes it back): the advantages are each row's mean."""
    from omegaconf import OmegaConf

    from tests.integrations.test_verl_v1 import InMemoryQueue, queue_rows, real_trainer_base

    tb = real_trainer_base(hv)
    ep = make_episodes(22)
    rows = rows_of(ep, "shuffled", 22)
    keys, fields = queue_rows(ep, rows)
    gen = torch.Generator().manual_seed(9)
    want = []
    for f in fields:
        f["entropy"] = torch.rand(f["response_mask"].shape, generator=gen) * 2
        want.append(float(f["entropy"].double().mean()))
    queue = InMemoryQueue(keys, fields)
    monkeypatch.setattr(tb, "tq", queue)
    import transfer_queue

    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    config = OmegaConf.create({
        "algorithm": {"adv_estimator": "test_ent", "gamma": GAMMA, "lam": 1.0,
                      "use_kl_in_reward": False},
        "actor_rollout_ref": {"rollout": {"n": 1}},
    })  # fmt: skip
    batch = transfer_queue.KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train")
    tb.PPOTrainer._compute_advantage(types.SimpleNamespace(config=config), batch, {})
    assert ("entropy", "response_mask") in queue.asked
    got = [float(a[0]) for a in queue.put["fields"]["advantages"].unbind(0)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for f in fields:  # bypass mode: no entropy in the queue
        del f["entropy"]
    with pytest.raises(hv.MissingMetadataError, match="no 'entropy' for this batch"):
        tb.PPOTrainer._compute_advantage(types.SimpleNamespace(config=config), batch, {})


def test_verl_agent_routes_users_estimators_with_their_inputs():
    """verl-agent (a stand-in trainer module): an entropy reader and an observation reader
    are routed (an estimator registered after install() by a second install()), a values
    reader is not; a missing entropy names both keys."""
    from hgpo.integrations import verl_agent as va
    from tests.integrations.test_verl_agent import CASES, _coincident, _verl_agent_stand_in
    from tests.integrations.test_verl_agent import _data as agent_data

    args = _coincident(CASES[0])[1]
    mod = _verl_agent_stand_in()
    va.install(mod)
    register_estimator("test_agent_ent", _entropy_is_advantage, reads=("entropy",))
    register_estimator("test_agent_obs", _obs_length_is_advantage, reads=("observations",))
    register_estimator("test_agent_val", _value_is_advantage, reads=("values",))
    try:
        assert "test_agent_ent" not in mod.compute_advantage.hgpo_routed
        va.install(mod)
        routed = mod.compute_advantage.hgpo_routed
        assert {"test_agent_ent", "hgpo.test_agent_obs"} <= set(routed)
        assert "test_agent_val" not in routed and "hgpo.test_agent_val" not in routed
        assert mod.AdvantageEstimator.HGPO == "test_agent_ent"  # admitted on the step path
        n = args["response_mask"].shape[0]
        data = agent_data(args)
        data.non_tensor_batch["step_entropy"] = np.linspace(0.0, 1.0, n)
        out = mod.compute_advantage(data, "test_agent_ent", history_length=2)
        mask = args["response_mask"].bool()
        np.testing.assert_allclose(
            out.batch["advantages"][:, 0].double().numpy(), np.linspace(0.0, 1.0, n)
        )
        assert torch.all(out.batch["advantages"][~mask] == 0)
        data = agent_data(args)
        out = mod.compute_advantage(data, "hgpo.test_agent_obs", history_length=2)
        want = [float(len(o)) for o in args["anchor_obs"]]
        np.testing.assert_array_equal(out.batch["advantages"][:, 0].double().numpy(), want)
        with pytest.raises(KeyError, match=r"'step_entropy'.*'entropys'.*verl-agent's fit pops"):
            mod.compute_advantage(agent_data(args), "test_agent_ent", history_length=2)
        with pytest.raises(ValueError, match=r"'test_agent_val' is not routed.*critic value"):
            mod.compute_advantage(agent_data(args), "test_agent_val", history_length=2)
    finally:
        for name in ("test_agent_ent", "test_agent_obs", "test_agent_val"):
            unregister_estimator(name)
