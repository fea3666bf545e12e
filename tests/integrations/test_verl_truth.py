"""The exact truth from verl (hgpo.integrations.verl_truth) against our trainer's, on CPU.

One tiny Qwen2 plays a score-mode T-maze batch with our trainer's rollout. Our truth scores
the chain with the HF engine (a KV-cached pass per prompt); the verl side sends the same
chain as verl DataProtos through a fake actor worker group whose ``compute_log_prob`` runs the
same model on verl's no-padding TensorDict the way verl's FSDP actor does (packed sequences,
labels rolled by one, log-softmax at the batch's temperature), and reads the batch from a
shuffled DataProto through the metadata contract. Every ``truth/*`` figure must agree.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from hgpo import ESTIMATORS  # noqa: E402
from hgpo.train.train_config import TrainConfig, TrainConfigError  # noqa: E402
from hgpo.train.truth_monitor import truth_chain, truth_prompts  # noqa: E402

TMAZE = "toy:tmaze:length=0"  # horizon 6; K = 1: a chain of 58 nodes, 54 prompts x 4 actions
SETTINGS = {"env": TMAZE, "every": 2, "history_length": 1, "max_steps": 20,
            "max_prompt_tokens": 1024}  # fmt: skip
TEMPERATURE, GAMMA = 1.0, 0.95


@pytest.fixture(scope="module")
def vt():
    from hgpo.integrations import verl_truth

    return verl_truth


class FakeActor:
    """A worker group's ``compute_log_prob`` on the tiny HF model, as verl's actor runs it.

    It takes the no-padding TensorDict (nested ``input_ids``/``position_ids``), runs the
    packed sequences one by one, takes log_softmax(logits / temperature) of the next token
    (verl rolls the packed ids by -1, transformer_impl.py) and returns ``log_probs`` nested
    like the input with ``metrics``. Batches must split evenly over its ``dp`` ranks.
    """

    def __init__(self, model, dp: int) -> None:
        self.model, self.dp, self.sizes = model, dp, []
        self._dispatch_info = {"actor": list(range(dp))}  # read by RayPPOTrainer._get_dp_size

    def compute_log_prob(self, td):
        from verl.utils import tensordict_utils as tu

        assert len(td) % self.dp == 0, "verl's dispatch splits the batch over the dp ranks"
        self.sizes.append(len(td))
        ids, pos = td["input_ids"], td["position_ids"]
        T = tu.get(td, "temperature")
        offsets = ids.offsets()
        values = ids.values()
        labels = torch.roll(values, shifts=-1, dims=0)
        out = []
        with torch.no_grad():
            for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
                logits = self.model(input_ids=values[None, s:e],
                                    position_ids=pos.values()[None, s:e]).logits[0]  # fmt: skip
                lp = torch.log_softmax(logits.float() / T, dim=-1)
                out.append(lp.gather(-1, labels[s:e, None])[:, 0])
        log_probs = torch.nested.nested_tensor_from_jagged(torch.cat(out), offsets)
        return tu.get_tensordict({"log_probs": log_probs}, non_tensor_dict={"metrics": {"mfu": 0}})


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """(tok, engine, cfg, roll): 2 groups of 4 per T-maze task, score mode, K = 1."""
    from agentenvs.toytext import toy_corpus
    from hgpo.train.envs import EnvSet
    from hgpo.train.episodes import Play, run_episodes
    from tests.train.tiny_engine import tiny_engine

    tok, engine = tiny_engine(tmp_path_factory.mktemp("m"), toy_corpus(TMAZE), 400, seed=1)
    cfg = TrainConfig(env=TMAZE, action_mode="score", history_length=1, max_steps=20,
                      env_workers=1, max_prompt_tokens=1024, truth_every=2,
                      temperature=TEMPERATURE, gamma=GAMMA)  # fmt: skip
    envs = EnvSet(cfg, "train", 16)
    try:
        torch.manual_seed(0)
        play = Play(4, cfg.temperature, 1.0, 16, cfg.max_prompt_tokens, cfg.max_steps, "score")
        roll = run_episodes(envs, engine, tok, [0, 1, 0, 1], play)
    finally:
        envs.close()
    return tok, engine, cfg, roll


def verl_batch(vt, roll, pad_token_id: int, perm: np.ndarray, rewards_key: bool):
    """The rollout as verl step rows (the contract's keys + hidden_state), rows in ``perm``
    order (verl's balancing reorders them); the reward as ``rewards`` or on the last token."""
    data = vt.score_batch(roll.prompt_ids, roll.response_ids, pad_token_id)
    n = len(roll)
    nt = {
        "uid": np.array([f"task-{g}" for g in roll.group], dtype=object),
        "traj_uid": np.array([f"ep-{t}" for t in roll.traj], dtype=object),
        "anchor_obs": np.array(roll.key, dtype=object),
        "next_obs": np.array(roll.next_key, dtype=object),  # (as verl_loop's outputs carry it)
        "step_index": np.array(roll.step, dtype=object),
        "is_action_valid": np.array([not b for b in roll.invalid], dtype=object),
        vt.TRUTH_KEY: np.array(roll.hidden, dtype=object),
    }
    mask = data.batch["response_mask"]
    tlr = torch.zeros(mask.shape, dtype=torch.float32)
    last = mask.sum(-1) - 1
    tlr[torch.arange(n), last] = torch.tensor(roll.reward, dtype=torch.float32)
    if rewards_key:
        nt["rewards"] = np.array(roll.reward, dtype=object)
    else:
        data.batch["token_level_rewards"] = tlr
    data.non_tensor_batch.update(nt)
    return data[torch.as_tensor(perm)]


def test_verl_truth_equals_our_trainers_truth(vt, played, monkeypatch):
    """Through the hook (TruthRayPPOTrainer._update_actor, verl's own RayPPOTrainer update
    replaced by a stub): off-steps add nothing; on step 2 every truth/* figure equals
    TruthMonitor.measure on our rollout, to float32 rounding; the batch is read from shuffled
    rows with the reward once as ``rewards`` and once as ``token_level_rewards``."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from hgpo.train.truth_monitor import TruthMonitor

    tok, engine, cfg, roll = played
    mon = TruthMonitor(cfg, tok)
    ours = mon.measure(roll, engine)
    actor = FakeActor(engine.model, dp=5)
    stub = {"actor/pg_loss": [0.5]}
    monkeypatch.setattr(RayPPOTrainer, "_update_actor",
                        lambda self, b: DataProto.from_single_dict({}, meta_info={"metrics": dict(stub)}))  # fmt: skip
    trainer = vt.TruthRayPPOTrainer.__new__(vt.TruthRayPPOTrainer)  # no workers, no Ray
    trainer.tokenizer, trainer.actor_rollout_wg = tok, actor
    trainer.hgpo_truth = vt.VerlTruth(vt.truth_config(SETTINGS, TEMPERATURE, GAMMA), tok)
    perm = np.random.default_rng(0).permutation(len(roll))
    data = verl_batch(vt, roll, tok.pad_token_id, perm, rewards_key=True)
    trainer.global_steps = 1
    assert trainer._update_actor(data).meta_info["metrics"] == stub and not actor.sizes
    trainer.global_steps = 2
    theirs = trainer._update_actor(data).meta_info["metrics"]
    assert theirs.pop("actor/pg_loss") == [0.5] and theirs.pop("truth/rows_no_action") == 0
    assert set(theirs) == set(ours) and {f"truth/{e}/grad_cos" for e in ESTIMATORS} <= set(ours)
    # one call per 128 prompts x 4 candidates (54 x 4 here), padded to a multiple of dp = 5
    pairs = [min(128, mon.row_code.size - lo) * mon.env.n_actions
             for lo in range(0, mon.row_code.size, 128)]  # fmt: skip
    assert actor.sizes == [-(-p // 5) * 5 for p in pairs] != pairs
    # float32 rounding: both score in float32 (HF's KV-cached pass, verl's packed pass), the
    # summed log-probs differ by ~1e-5 nats, the policy by ~1e-5, the figures by ~1e-4 relative
    figures = sorted(k for k in ours if not k.startswith("truth/time"))
    np.testing.assert_allclose([theirs[k] for k in figures], [ours[k] for k in figures],
                               rtol=1e-3, atol=1e-5, err_msg=str(figures))  # fmt: skip
    # the figures are not trivially equal: the uniform policy's J is another number
    uniform = np.full((mon.row_code.size, mon.env.n_actions), 1.0 / mon.env.n_actions)
    assert abs(mon.solve(uniform).J - ours["truth/J"]) > 1e-3
    # the batch read from token_level_rewards gives the same estimator figures (against any
    # truth: the uniform policy's, no scoring)
    data2 = verl_batch(vt, roll, tok.pad_token_id, perm[::-1].copy(), rewards_key=False)
    truth = mon.solve(uniform)
    steps = trainer.hgpo_truth.steps(data2)
    m2 = mon.estimator_metrics(truth, steps, mon.step_nodes(steps))
    m1 = mon.estimator_metrics(
        truth, mon.rollout_steps(roll), mon.step_nodes(mon.rollout_steps(roll))
    )
    np.testing.assert_allclose([m2[k] for k in sorted(m1)], [m1[k] for k in sorted(m1)],
                               rtol=1e-9, atol=1e-12)  # fmt: skip


def test_verl_scorer_equals_the_engines_scores(vt, played):
    """The verl scorer's summed log-probs of (prompt, candidate) pairs against HFEngine.score,
    on a batch that must be padded to the dp size (7 pairs, dp = 4)."""
    from hgpo.train.episodes import response_text

    tok, engine, _, roll = played
    prompts = [roll.prompt_ids[i] for i in (0, 0, 0, 1, 1, 2, 5)]
    resp = [tok(response_text(a), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for a in ("left", "right", "up", "down", "left", "up", "right")]  # fmt: skip
    actor = FakeActor(engine.model, dp=4)
    got = vt.verl_scorer(actor.compute_log_prob, tok.pad_token_id, dp_size=4)(prompts, resp)
    want = engine.score(prompts, resp)
    assert actor.sizes == [8]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-5)  # float32 sums of ~20 tokens
    assert np.ptp(want) > 1e-3  # distinct scores: a row mix-up would show


def test_bad_input_is_named_before_any_work(vt, played):
    tok, *_ = played
    with pytest.raises(TrainConfigError, match=r"hgpo_truth.env='alfworld': .*needs a toy env"):
        vt.truth_config({"env": "alfworld", "every": 1}, 1.0, 0.95)
    with pytest.raises(TrainConfigError, match=r"unknown key\(s\) \['gamma'\]"):
        vt.truth_config({**SETTINGS, "gamma": 0.9}, 1.0, 0.95)
    with pytest.raises(TrainConfigError, match=r"hgpo_truth.every is required"):
        vt.truth_config({"env": TMAZE}, 1.0, 0.95)
    with pytest.raises(TrainConfigError, match=r"hgpo_truth.every=0: must be an int >= 1"):
        vt.truth_config({**SETTINGS, "every": 0}, 1.0, 0.95)
    big = vt.truth_config({"env": "toy:keydoor:size=4", "every": 1, "max_nodes": 100}, 1.0, 0.95)
    with pytest.raises(TrainConfigError, match=r"max_nodes=100.*the reachable .* is larger"):
        vt.VerlTruth(big, tok)
    few = vt.truth_config({**SETTINGS, "max_prompts": 10}, 1.0, 0.95)
    n = truth_prompts(truth_chain(few))
    with pytest.raises(TrainConfigError, match=rf"max_prompts=10: .* scores {n} prompts x 4"):
        vt.VerlTruth(few, tok)


def test_a_batch_without_the_truth_keys_is_refused(vt, played):
    tok, _, _, roll = played
    truth = vt.VerlTruth(vt.truth_config(SETTINGS, TEMPERATURE, GAMMA), tok)
    data = verl_batch(vt, roll, tok.pad_token_id, np.arange(len(roll)), rewards_key=True)
    data.non_tensor_batch.pop(vt.TRUTH_KEY)
    data.non_tensor_batch.pop("traj_uid")

    def never(*a):
        raise AssertionError("scored before the batch was checked")

    with pytest.raises(ValueError, match=r"lacks \['traj_uid', 'hidden_state'\]"):
        truth.measure(data, never)


def test_install_makes_verls_legacy_task_runner_build_the_truth_trainer(vt, monkeypatch):
    import verl.trainer.main_ppo_v0 as v0
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(v0, "RayPPOTrainer", v0.RayPPOTrainer)  # restored after the test
    vt.install()
    assert v0.RayPPOTrainer is vt.TruthRayPPOTrainer
    monkeypatch.setattr(v0, "RayPPOTrainer", RayPPOTrainer)
    importlib.reload(importlib.import_module("hgpo.integrations.verl_truth_plugin"))
    assert v0.RayPPOTrainer is vt.TruthRayPPOTrainer  # what VERL_USE_EXTERNAL_MODULES loads
    assert issubclass(vt.TruthRayPPOTrainer, RayPPOTrainer)


def test_free_text_rows_naming_no_action_leave_out_the_estimator_figures(vt, played):
    """A row whose response names no listed action (verl samples free text): the step logs the
    scored policy's J and the count, not estimator figures computed off the chain."""
    tok, _, _, roll = played
    truth = vt.VerlTruth(vt.truth_config(SETTINGS, TEMPERATURE, GAMMA), tok)
    data = verl_batch(vt, roll, tok.pad_token_id, np.arange(len(roll)), rewards_key=True)
    text = tok("<action>fly</action>", add_special_tokens=False)["input_ids"]
    R = data.batch["responses"].shape[1]
    assert len(text) <= R
    data.batch["responses"][3, : len(text)] = torch.tensor(text)
    data.batch["response_mask"][3] = 0
    data.batch["response_mask"][3, : len(text)] = 1
    uniform = lambda p, r: [0.0] * len(p)  # noqa: E731 - every action equally likely
    out = truth.measure(data, uniform)
    assert out["truth/rows_no_action"] == 1 and not any(k.count("/") == 2 for k in out)
    mon = truth.monitor
    want = mon.solve(np.full((mon.row_code.size, mon.env.n_actions), 1 / mon.env.n_actions)).J
    assert out["truth/J"] == pytest.approx(want, abs=1e-12)


class FakeTQ:
    """What the v1 trainer's ``tq.kv_batch_get`` returns for stored rows: per-row tensors as
    jagged nested tensors, per-row objects (``extra_fields`` dicts) as a NonTensorStack."""

    def __init__(self, rows: dict[str, dict]) -> None:
        self.rows, self.asked = rows, []

    def kv_batch_get(self, keys, partition_id, select_fields):
        from tensordict import NonTensorData, NonTensorStack, TensorDict

        self.asked.append(list(keys))
        out = {}
        for f in select_fields:
            vals = [self.rows[k][f] for k in keys]
            if isinstance(vals[0], torch.Tensor):
                out[f] = torch.nested.as_nested_tensor(vals, layout=torch.jagged)
            else:
                out[f] = NonTensorStack.from_list([NonTensorData(v) for v in vals])
        return TensorDict(out, batch_size=[len(keys)])


def test_v1_trainer_mode_logs_the_same_truth(vt, played, monkeypatch):
    """verl's v1 trainer (TransferQueue): register_v1's trainer reads the non-padding rows'
    extra_fields and tensors from the queue and logs the same truth/* as our trainer, into
    the step's metrics. The queue's reads (``kv_batch_get``) are faked over the installed
    transfer_queue package, or over a stand-in module where it is missing (then the test
    removes every module it imported afterwards)."""
    import sys
    import types

    from omegaconf import OmegaConf

    from hgpo.train.truth_monitor import TruthMonitor

    tok, engine, cfg, roll = played
    before = set(sys.modules)
    try:  # the real queue package when installed (the [verl] extra); its reads are faked
        import transfer_queue as fake
    except ImportError:
        fake = types.ModuleType("transfer_queue")
        fake.KVBatchMeta = type("KVBatchMeta", (), {})
        fake.BatchMeta = type("BatchMeta", (), {})
        monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    try:
        cls = vt.register_v1()
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        assert get_trainer_cls(vt.V1_MODE) is cls and vt.register_v1() is cls  # once only
        # the queue's rows: the contract in extra_fields; a padding row (no metadata) at the end
        rows, keys, tags = {}, [], []
        for i in range(len(roll)):
            key = f"task-{roll.group[i]}_{roll.traj[i]}_{roll.step[i]}"
            extra = {"uid": f"task-{roll.group[i]}", "traj_uid": f"ep-{roll.traj[i]}",
                     "anchor_obs": roll.key[i], "next_obs": roll.next_key[i],
                     "step_index": int(roll.step[i]), "rewards": float(roll.reward[i]),
                     "is_action_valid": not roll.invalid[i], vt.TRUTH_KEY: int(roll.hidden[i])}  # fmt: skip
            r = torch.tensor(roll.response_ids[i])
            rows[key] = {"responses": r, "response_mask": torch.ones_like(r),
                         "rm_scores": torch.zeros(r.shape), "extra_fields": extra}  # fmt: skip
            keys.append(key)
            tags.append({"seq_len": 1})
        keys.append("pad_0")
        tags.append({"is_padding": True})
        order = np.random.default_rng(1).permutation(len(keys))
        batch = types.SimpleNamespace(keys=[keys[j] for j in order], tags=[tags[j] for j in order],
                                      partition_id="train")  # fmt: skip
        tq = FakeTQ(rows)
        monkeypatch.setattr(fake, "kv_batch_get", tq.kv_batch_get, raising=False)

        def stub_update(self, batch, metrics):
            metrics["actor/pg_loss"] = 0.5
            return batch

        monkeypatch.setattr(PPOTrainer, "_update_actor", stub_update)
        monkeypatch.setattr(
            PPOTrainer, "_init_tokenizer", lambda self: setattr(self, "tokenizer", tok)
        )
        trainer = cls.__new__(cls)  # no workers, no Ray, no queue
        trainer.trainer_mode = vt.V1_MODE  # as PPOTrainer.__init__ sets it from the config
        assert trainer.trainer_mode == "sync" and trainer.hgpo_trainer_mode == vt.V1_MODE
        trainer.config = OmegaConf.create({
            "trainer": {"hgpo_truth": SETTINGS}, "algorithm": {"gamma": GAMMA},
            "actor_rollout_ref": {"rollout": {"temperature": TEMPERATURE}},
        })  # fmt: skip
        trainer.parameter_sync_step = 1
        trainer._init_tokenizer()
        actor = FakeActor(engine.model, dp=2)
        trainer.actor_rollout_wg = actor
        trainer.global_steps, metrics = 1, {}
        assert trainer._update_actor(batch, metrics=metrics) is batch
        assert metrics == {"actor/pg_loss": 0.5} and not tq.asked
        trainer.global_steps, metrics = 2, {}
        trainer._update_actor(batch, metrics=metrics)
        assert len(tq.asked) == 1 and "pad_0" not in tq.asked[0]
        ours = TruthMonitor(cfg, tok).measure(roll, engine)
        assert metrics.pop("actor/pg_loss") == 0.5 and metrics.pop("truth/rows_no_action") == 0
        assert set(metrics) == set(ours)
        figures = sorted(k for k in ours if not k.startswith("truth/time"))
        np.testing.assert_allclose([metrics[k] for k in figures], [ours[k] for k in figures],
                                   rtol=1e-3, atol=1e-5, err_msg=str(figures))  # fmt: skip
        trainer.parameter_sync_step = 2
        with pytest.raises(TrainConfigError, match="needs parameter_sync_step=1, got 2"):
            trainer._init_tokenizer()
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("verl."):
                del sys.modules[name]
