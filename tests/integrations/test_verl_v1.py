"""The metadata contract through verl 0.9's v1 trainer (hgpo.integrations.verl_v1).

:func:`attach_v1_metadata` on its own; the import hook on verl's REAL ``trainer_base`` (it
fires, the wrapped methods keep verl's signatures); verl's real ``_compute_advantage`` over an
in-memory queue that returns rows in the real queue's format. The advantages must equal, bit
for bit, those of the same episodes given as a verl-agent-style DataProto. The real
TransferQueue runs in tests/integrations/test_verl_chain.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
# verl's engine registry warns at import about every optional engine it lacks (megatron, ...)
pytestmark = pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning")

from benchmarks.verl_parity import (  # noqa: E402
    GAMMA,
    algo_config,
    make_dataproto,
    make_episodes,
    rows_of,
)


@pytest.fixture(scope="module")
def hv():
    from hgpo.integrations import verl as module

    return module


def v1_outputs(ep, rows):
    """What verl's v1 agent-loop worker puts in the queue for these rows: keys
    ``{uid}_{session}_{index}`` and each output's extra_fields (session = the episode within its
    group, index = the step)."""
    session = {}
    keys, extra = [], []
    for i, t in rows:
        g = ep.groups[i]
        session.setdefault(i, sum(1 for j in session if ep.groups[j] == g))
        keys.append(f"prompt-{g}_{session[i]}_{t}")
        extra.append(
            {
                "anchor_obs": ep.obs[i][t],
                "rewards": ep.rewards[i][t],
                "is_action_valid": ep.valid[i][t],
                "reward_extra_info": {},
            }
        )
    return keys, extra


def v1_dataproto(ep, rows):
    """The DataProto verl's v1 _compute_advantage builds: 'uid' and tensors, nothing else."""
    data = make_dataproto(ep, rows)
    uid = np.array([f"prompt-{ep.groups[i]}" for i, _ in rows], dtype=object)
    data.non_tensor_batch.clear()
    data.non_tensor_batch["uid"] = uid
    return data


@pytest.mark.parametrize("layout", ["emitted", "shuffled"])
def test_attached_v1_metadata_gives_the_verl_agent_batchs_advantages(hv, layout):
    from hgpo.integrations.verl_v1 import attach_v1_metadata

    ep = make_episodes(21)
    rows = rows_of(ep, layout, 21)
    want = hv.compute_advantage(
        make_dataproto(ep, rows, step_index=True), "hgpo", gamma=GAMMA, config=algo_config({"K": 4})
    )
    data = v1_dataproto(ep, rows)
    keys, extra = v1_outputs(ep, rows)
    attach_v1_metadata(data, keys, extra)
    got = hv.compute_advantage(data, "hgpo", gamma=GAMMA, config=algo_config({"K": 4}))
    assert torch.equal(got.batch["advantages"], want.batch["advantages"])
    assert got.batch["advantages"].abs().sum() > 0


def test_next_obs_comes_from_the_outputs_extra_fields(hv):
    """An agent loop's ``next_obs`` (hgpo.integrations.verl_loop sets it) becomes the batch's
    column, row for row, and graphgpo then reads the terminal states: its advantages equal
    those of the verl-agent-style DataProto with the same column."""
    from hgpo.integrations.verl_v1 import attach_v1_metadata

    ep = make_episodes(21)
    rows = rows_of(ep, "shuffled", 21)
    nxt = [ep.obs[i][t + 1] if t + 1 < len(ep.obs[i]) else f"end {i}" for i, t in rows]
    keys, extra = v1_outputs(ep, rows)
    for f, o in zip(extra, nxt, strict=True):
        f["next_obs"] = o
    data = v1_dataproto(ep, rows)
    attach_v1_metadata(data, keys, extra)
    assert data.non_tensor_batch["next_obs"].tolist() == nxt
    want = make_dataproto(ep, rows, step_index=True)
    want.non_tensor_batch["next_obs"] = np.array(nxt, dtype=object)
    name = hv.verl_name("graphgpo")
    a = hv.compute_advantage(data, name, gamma=GAMMA, config=algo_config({}))
    b = hv.compute_advantage(want, name, gamma=GAMMA, config=algo_config({}))
    assert torch.equal(a.batch["advantages"], b.batch["advantages"])
    assert a.batch["advantages"].abs().sum() > 0


def test_bad_v1_metadata_is_named(hv):
    from hgpo.integrations.verl_v1 import attach_v1_metadata

    ep = make_episodes(21)
    rows = rows_of(ep, "emitted", 21)
    keys, extra = v1_outputs(ep, rows)
    with pytest.raises(ValueError, match="key 'nounderscore' is not"):
        attach_v1_metadata(v1_dataproto(ep, rows), ["nounderscore", *keys[1:]], extra)
    del extra[3]["anchor_obs"]
    with pytest.raises(ValueError, match=r"extra_fields\['anchor_obs'\] is set on some outputs"):
        attach_v1_metadata(v1_dataproto(ep, rows), keys, extra)
    no_rewards = [{k: v for k, v in f.items() if k != "rewards"} for f in v1_outputs(ep, rows)[1]]
    with pytest.raises(hv.MissingMetadataError, match="lack 'rewards'"):
        attach_v1_metadata(v1_dataproto(ep, rows), keys, no_rewards)
    for f in extra:
        f.pop("anchor_obs", None)
    data = v1_dataproto(ep, rows)
    attach_v1_metadata(data, keys, extra)
    with pytest.raises(hv.MissingMetadataError, match=r"extra_fields\['anchor_obs'\]"):
        hv.compute_advantage(data, "hgpo", config=None)


def real_trainer_base(hv):
    """verl's real v1 trainer_base (it needs TransferQueue), imported after our module."""
    pytest.importorskip("transfer_queue")
    from verl.trainer.ppo.v1 import trainer_base

    return trainer_base


def test_the_hook_fires_on_verls_real_trainer_base_and_keeps_its_signatures(hv):
    import inspect

    from verl.trainer.ppo.v1 import utils as v1_utils

    tb = real_trainer_base(hv)
    method = tb.PPOTrainer._compute_advantage
    multi = tb.compute_advantage_for_multi_trajectories
    assert method.hgpo_original.__qualname__ == "PPOTrainer._compute_advantage"
    assert multi.hgpo_original is v1_utils.compute_advantage_for_multi_trajectories
    ours = inspect.signature(method, follow_wrapped=False)
    theirs = inspect.signature(method.hgpo_original)
    assert list(ours.parameters) == list(theirs.parameters) == ["self", "batch", "metrics"]
    # every keyword of verl's call (trainer_base.py, _compute_advantage step 3) binds
    inspect.signature(multi, follow_wrapped=False).bind(
        None, batch_keys=[], adv_estimator="hgpo", gamma=1.0, lam=1.0, num_repeat=1,
        norm_adv_by_std_in_grpo=True, config=None,
    )  # fmt: skip
    assert list(inspect.signature(multi.hgpo_original).parameters)[:3] == [
        "data", "batch_keys", "adv_estimator",
    ]  # fmt: skip


class InMemoryQueue:
    """The three TransferQueue calls of verl's _compute_advantage, on rows kept here in the
    format the real queue returns (list_of_dict_to_tensordict: nested tensors, extra_fields a
    NonTensorStack whose item is a tensordict LinkedList). The real queue runs in
    tests/integrations/test_verl_chain.py."""

    def __init__(self, keys, fields):
        self.rows = dict(zip(keys, fields, strict=True))
        self.asked, self.put = [], {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.asked.append(tuple(select_fields))
        rows = [{f: self.rows[k][f] for f in select_fields if f in self.rows[k]} for k in keys]
        return list_of_dict_to_tensordict(rows)

    def kv_batch_put(self, keys, partition_id, fields):
        self.put = {"keys": list(keys), "fields": fields}
        return types.SimpleNamespace(keys=list(keys), partition_id=partition_id)


def queue_rows(ep, rows):
    """What verl's v1 worker stores for these rows (the fields _compute_advantage reads)."""
    data = make_dataproto(ep, rows)
    keys, extra = v1_outputs(ep, rows)
    fields = []
    for r, (key, ef) in enumerate(zip(keys, extra, strict=True)):
        n = int(data.batch["response_mask"][r].sum())
        fields.append(
            {
                "uid": key.rsplit("_", 2)[0],
                "response_mask": data.batch["response_mask"][r, :n],
                "rm_scores": data.batch["token_level_rewards"][r, :n],
                "extra_fields": ef,
            }
        )
    return keys, fields


def test_verls_real_compute_advantage_hands_our_estimator_the_metadata(hv, monkeypatch):
    """verl's real PPOTrainer._compute_advantage (unbound: PPOTrainer is abstract) over an
    in-memory queue: our estimator gets the outputs' extra_fields, and the advantages it writes
    back equal those of the same episodes as a verl-agent DataProto; verl's own grpo takes
    verl's path (no extra_fields fetch)."""
    from omegaconf import OmegaConf

    tb = real_trainer_base(hv)
    ep = make_episodes(22)
    rows = rows_of(ep, "shuffled", 22)
    keys, fields = queue_rows(ep, rows)
    queue = InMemoryQueue(keys, fields)
    monkeypatch.setattr(tb, "tq", queue)
    import transfer_queue

    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "hgpo", "gamma": GAMMA, "lam": 1.0, "use_kl_in_reward": False,
                "hgpo": {"K": 4},
            },
            "actor_rollout_ref": {"rollout": {"n": 1}},
        }
    )  # fmt: skip
    batch = transfer_queue.KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train")
    trainer = types.SimpleNamespace(config=config)
    tb.PPOTrainer._compute_advantage(trainer, batch, {})
    assert ("extra_fields",) in queue.asked
    want = hv.compute_advantage(
        make_dataproto(ep, rows, step_index=True), "hgpo", gamma=GAMMA, config=algo_config({"K": 4})
    ).batch["advantages"]
    got = queue.put["fields"]["advantages"].unbind(0)
    assert len(got) == len(keys)
    for r, adv in enumerate(got):
        assert torch.equal(adv, want[r, : adv.numel()]), keys[r]
    assert sum(float(a.abs().sum()) for a in got) > 0

    config.algorithm.adv_estimator = "grpo"  # verl's own: no fetch, verl's path
    queue.asked.clear()
    tb.PPOTrainer._compute_advantage(trainer, batch, {})
    assert ("extra_fields",) not in queue.asked
    with pytest.raises(RuntimeError, match=r"outside verl's PPOTrainer\._compute_advantage"):
        tb.compute_advantage_for_multi_trajectories(
            v1_dataproto(ep, rows), batch_keys=keys, adv_estimator="hgpo"
        )
