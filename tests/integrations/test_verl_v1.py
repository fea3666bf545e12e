"""The metadata contract through verl 0.9's v1 trainer (hgpo.integrations.verl_v1).

The v1 trainer needs the TransferQueue package, which this project's machines do not have:
the wrappers run here on a stand-in ``trainer_base`` that makes verl's calls (its
``_compute_advantage`` builds the DataProto from 'uid' and tensors only, then calls
``compute_advantage_for_multi_trajectories``) and a stand-in queue; the advantages must equal,
bit for bit, those of the same episodes given as a verl-agent-style DataProto.
"""

from __future__ import annotations

import sys
import textwrap
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


FAKE_TRAINER_BASE = textwrap.dedent(
    """
    # verl's v1 trainer_base, reduced to the calls that matter here
    import transfer_queue as tq
    from verl.trainer.ppo.ray_trainer import compute_advantage

    def compute_advantage_for_multi_trajectories(data, batch_keys, adv_estimator, gamma=1.0,
                                                 lam=1.0, num_repeat=1,
                                                 norm_adv_by_std_in_grpo=True, config=None):
        return compute_advantage(data, adv_estimator=adv_estimator, gamma=gamma, lam=lam,
                                 num_repeat=num_repeat,
                                 norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)

    class PPOTrainer:
        def __init__(self, config):
            self.config = config

        def _compute_advantage(self, batch, metrics):
            data = tq.make_dataproto(batch.keys)  # 'uid' and tensors only
            return compute_advantage_for_multi_trajectories(
                data, batch_keys=batch.keys, adv_estimator=self.config.algorithm.adv_estimator,
                gamma=self.config.algorithm.gamma, config=self.config.algorithm)
    """
)


def test_the_v1_wrappers_fetch_extra_fields_and_pass_them_on(hv, tmp_path, monkeypatch):
    """A stand-in trainer_base imported under a fresh name through the import hook: the hook
    patches it once it has run; its _compute_advantage then gives the verl-agent batch's
    advantages; verl's own estimators (grpo) take verl's path, untouched."""
    from omegaconf import OmegaConf

    from hgpo.integrations import verl_v1

    ep = make_episodes(22)
    rows = rows_of(ep, "shuffled", 22)
    keys, extra = v1_outputs(ep, rows)
    asked = []

    class Stack:
        def __init__(self, items):
            self.items = items

        def tolist(self):
            return list(self.items)

    def kv_batch_get(keys, partition_id, select_fields):
        asked.append((tuple(keys), partition_id, tuple(select_fields)))
        by_key = dict(zip(v1_outputs(ep, rows)[0], extra, strict=True))
        return {"extra_fields": Stack([by_key[k] for k in keys])}

    fake_tq = types.ModuleType("transfer_queue")
    fake_tq.kv_batch_get = kv_batch_get
    fake_tq.make_dataproto = lambda keys: v1_dataproto(ep, rows)
    monkeypatch.setitem(sys.modules, "transfer_queue", fake_tq)
    name = "hgpo_fake_v1_trainer_base"
    (tmp_path / f"{name}.py").write_text(FAKE_TRAINER_BASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    verl_v1.on_import(
        name, lambda m: verl_v1.patch_trainer_base(m, hv.our_name, hv.compute_advantage)
    )
    module = __import__(name)
    assert module.PPOTrainer._compute_advantage.hgpo_original is not None

    batch = types.SimpleNamespace(keys=keys, partition_id="train")
    config = OmegaConf.create({"algorithm": {"adv_estimator": "hgpo", "gamma": GAMMA, "hgpo": {}}})
    got = module.PPOTrainer(config)._compute_advantage(batch, {})
    assert asked == [(tuple(keys), "train", ("extra_fields",))]
    want = hv.compute_advantage(
        make_dataproto(ep, rows, step_index=True), "hgpo", gamma=GAMMA, config=None
    )
    assert torch.equal(got.batch["advantages"], want.batch["advantages"])

    config.algorithm.adv_estimator = "grpo"  # verl's own: no fetch, verl's path
    module.PPOTrainer(config)._compute_advantage(batch, {})
    assert len(asked) == 1
    with pytest.raises(RuntimeError, match=r"outside verl's PPOTrainer\._compute_advantage"):
        module.compute_advantage_for_multi_trajectories(
            v1_dataproto(ep, rows), batch_keys=keys, adv_estimator="hgpo"
        )
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "name", None) != name]
