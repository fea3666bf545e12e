"""The stepwise verl agent loop against the trainer's own rollout, on the same scripted actions.

A scripted server manager answers verl's ``generate`` with fixed token ids: a function of the
prompt only (an admissible action picked by a hash of the prompt text, or a malformed answer),
so the trainer's :func:`hgpo.train.episodes.run_episodes` driven by a scripted engine with the
same function must see the same steps. Every output of the loop is compared with the trainer's
row: prompt ids, response ids and mask, env reward (no penalty), validity, state key, step,
group and trajectory, and the episode return in ``reward_score``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

from hgpo import StateIndexer, state_ids
from hgpo.integrations import verl_loop as vl
from hgpo.integrations import verl_tasks
from hgpo.options import OptionError
from hgpo.train.envs import CRASH_ENV, EnvSet
from hgpo.train.tiny import train_tokenizer
from hgpo.train.train_config import resolve
from hgpo.train.trainer import tiny_corpus
from tests.integrations.scripted import (
    LOGPROB,
    PLAN,
    RESPONSE_LEN,
    SAMPLING,
    TOY,
    ScriptedServer,
    SilentServer,
    make_loop,
    plan_text,
    run_session,
    scripted_text,
    trainer_rollout,
)

GAMES = Path(__file__).resolve().parents[1] / "agentenvs" / "data" / "alfworld_games"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), tiny_corpus(TOY), 1024)


def compare(tok, env, options, tasks, n, policy=scripted_text):
    """Play ``tasks`` x ``n`` sessions with the loop and the same batch with the trainer;
    assert every output equals its trainer row. Returns (outputs in trajectory order, roll)."""
    server = ScriptedServer(tok, policy)
    loop = make_loop(tok, server, options)
    outs_per_traj = [
        run_session(loop, env, "train", t, f"uid-{t}", m) for t in tasks for m in range(n)
    ]
    roll = trainer_rollout(tok, env, options, tasks, n, policy)
    assert len(roll.success) == len(outs_per_traj) == len(tasks) * n and not roll.crashed
    flat = []
    for i, outs in enumerate(outs_per_traj):
        rows = [r for r in range(len(roll)) if roll.traj[r] == i]
        assert len(outs) == len(rows) >= 1
        uid = f"uid-{tasks[i // n]}"
        ret = sum(roll.reward[r] for r in rows)
        for out, r in zip(outs, rows, strict=True):
            assert out.prompt_ids == roll.prompt_ids[r]
            assert out.response_ids == roll.response_ids[r]
            assert out.response_mask == [1] * len(out.response_ids)
            assert 1 <= len(out.response_ids) <= RESPONSE_LEN
            assert out.response_logprobs == [LOGPROB] * len(out.response_ids)
            assert out.reward_score == pytest.approx(ret, abs=0)
            ef = out.extra_fields
            assert ef["uid"] == uid and ef["traj_uid"] == f"{uid}_{i % n}"
            assert ef["anchor_obs"] == roll.key[r]
            assert ef["next_obs"] == roll.next_key[r] is not None
            assert ef["step_index"] == roll.step[r]
            assert ef["rewards"] == roll.reward[r]
            assert ef["is_action_valid"] is (not roll.invalid[r])
            assert ef["won"] == roll.success[i]
        flat.extend(outs)
    assert all(sp == SAMPLING for _, sp in server.calls) and len(server.calls) == len(flat)
    return flat, roll


def check_contract(flat, roll):
    """The contract columns of the outputs give the trainer's StepBatch, row for row."""
    cols = vl.metadata_columns([o.extra_fields for o in flat])
    want = roll.step_batch()
    _, group = np.unique(cols["uid"].astype(str), return_inverse=True)
    traj = {t: k for k, t in enumerate(dict.fromkeys(cols["traj_uid"]))}
    np.testing.assert_array_equal(group, want.group)
    np.testing.assert_array_equal([traj[t] for t in cols["traj_uid"]], want.traj)
    np.testing.assert_array_equal(cols["step_index"].astype(np.int64), want.step)
    np.testing.assert_array_equal(cols["rewards"].astype(np.float64), want.reward)
    np.testing.assert_array_equal(state_ids(list(cols["anchor_obs"])), want.state)
    keys = StateIndexer()  # next_obs keyed as anchor_obs: the trainer's next_state
    keys(list(cols["anchor_obs"]))
    np.testing.assert_array_equal(keys(list(cols["next_obs"])), want.next_state)
    np.testing.assert_array_equal(~cols["is_action_valid"].astype(bool), want.invalid)


def test_registered_under_its_name():
    assert _agent_loop_registry[vl.AGENT_NAME] == {
        "_target_": "hgpo.integrations.verl_loop.StepwiseAgentLoop"
    }


def test_toy_outputs_equal_the_trainers_rollout(tok):
    options = {"history_length": 2, "max_steps": 8, "env_workers": 1}
    flat, roll = compare(tok, TOY, options, tasks=[0, 3], n=2)
    check_contract(flat, roll)
    # the data hold both kinds of step, history prompts, and cut responses
    assert any(roll.invalid) and not all(roll.invalid)
    assert any("[Observation 1:" in tok.decode(o.prompt_ids) for o in flat)
    assert any(len(o.response_ids) == RESPONSE_LEN for o in flat)
    # verl's own conversion of an output: rm_scores holds the episode return at the end
    d = flat[0].as_dict()
    assert d["rm_scores"][-1] == pytest.approx(flat[0].reward_score, abs=0)
    assert set(vl.CONTRACT_KEYS) <= set(d["extra_fields"])


def test_a_won_episode_carries_its_rewards_and_penalised_steps(tok):
    options = {"history_length": 2, "max_steps": 20, "env_workers": 1}
    flat, roll = compare(tok, TOY, options, tasks=[0], n=2, policy=plan_text)
    check_contract(flat, roll)
    assert roll.success == [True, True] and len(flat) == 2 * len(PLAN)
    first = flat[: len(PLAN)]
    assert [o.extra_fields["rewards"] for o in first] == [0.0] * (len(PLAN) - 1) + [10.0]
    assert all(o.reward_score == 10.0 for o in flat)  # R = 10, no penalty in it
    valid = [o.extra_fields["is_action_valid"] for o in first]
    assert valid == [False, True, False] + [True] * (len(PLAN) - 3)
    # the malformed answer sent the reference's fallback text (its last 30 characters)
    assert "'i am not sure what to do here.'" in tok.decode(first[3].prompt_ids)


def test_alfworld_outputs_equal_the_trainers_rollout(tok):
    pytest.importorskip("textworld")
    options = {"alfworld_games_dir": str(GAMES), "max_steps": 3, "history_length": 1}
    flat, roll = compare(tok, "alfworld", {**options, "env_workers": 1}, tasks=[0], n=2)
    check_contract(flat, roll)
    assert any("ALFRED" in tok.decode(o.prompt_ids) for o in flat)


def test_webshop_outputs_equal_the_trainers_rollout(tok):
    pytest.importorskip("bm25s")
    options = {
        "webshop_products": 60, "webshop_goals": 20, "webshop_eval_goals": 5, "max_steps": 3,
        "history_length": 2, "env_workers": 1,
    }  # fmt: skip
    flat, roll = compare(tok, "webshop", options, tasks=[1], n=2)
    check_contract(flat, roll)
    assert any("WebShop" in tok.decode(o.prompt_ids) for o in flat)


def test_sessions_draw_their_own_env_streams():
    """Each session's env is seeded as its own slot (a toy env with slip draws from it)."""
    a, b = vl.session_slot("u_0"), vl.session_slot("u_1")
    assert a != b and a == vl.session_slot("u_0")
    cfg = resolve("toy:keydoor:size=4,slip=0.3", overrides={"env_workers": 1})
    envs = EnvSet(cfg, "train", 1, slot_base=b)
    try:
        _, infos = envs.reset([0], 1)
    finally:
        envs.close()
    want = int(np.random.SeedSequence([cfg.seed, b, 0]).generate_state(1)[0])
    assert infos[0]["episode_seed"] == want


def test_a_crashed_episode_gives_no_outputs(tok, monkeypatch):
    monkeypatch.setenv(CRASH_ENV, "0@2")  # slot 0 of the training env raises at step 2
    outs = run_session(make_loop(tok, ScriptedServer(tok)), TOY, "train", 0, "u", 0)
    assert outs == []


def test_a_silent_server_times_out_and_no_env_worker_survives(tok):
    loop = make_loop(tok, SilentServer(), {"env_workers": 1}, generate_timeout_s=0.5)
    with pytest.raises(TimeoutError, match=r"generate_timeout_s=0\.5"):
        run_session(loop, TOY, "train", 0, "u", 0)
    assert mp.active_children() == []


def test_unknown_env_is_a_named_error_listing_the_registered_ones(tok):
    loop = make_loop(tok, ScriptedServer(tok))
    with pytest.raises(OptionError, match=r"extra_info\['env'\].*'alfworld', 'webshop', 'toy:"):
        run_session(loop, "nethack", "train", 0, "u", 0)
    with pytest.raises(OptionError, match=r"extra_info\['env'\].*'alfworld'"):
        vl.task_rows("nethack", "train", 1)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"env": TOY, "task_id": 0}, r"extra_info.*missing \['split'\]"),
        ({"env": TOY, "split": "valid_seen", "task_id": 0}, r"extra_info\['split'\].*heldout"),
        ({"env": TOY, "split": "train", "task_id": -1}, r"extra_info\['task_id'\]"),
        ({"env": TOY, "split": "train", "task_id": 10**6}, r"extra_info\['task_id'\].*below"),
        ("toy", r"extra_info: must be a dict"),
    ],
)
def test_bad_rows_are_named_errors(tok, row, match):
    loop = make_loop(tok, ScriptedServer(tok), {"env_workers": 1})
    coro = loop.run(dict(SAMPLING), uid="u", session_id=0, extra_info=row)
    with pytest.raises(OptionError, match=match):
        asyncio.run(coro)
    assert mp.active_children() == []


def test_bad_settings_are_named_errors(tok):
    with pytest.raises(OptionError, match=r"trainer.use_v1.*got False"):
        make_loop(tok, ScriptedServer(tok), use_v1=False)
    with pytest.raises(OptionError, match=r"options\['max_prompt_tokens'\].*rollout"):
        vl.loop_settings(TOY, {"max_prompt_tokens": 10})
    with pytest.raises(OptionError, match=r"options\['action_mode'\]"):
        vl.loop_settings(TOY, {"action_mode": "score"})
    with pytest.raises(OptionError, match=r"extra_fields\[1\].*traj_uid"):
        vl.metadata_columns([dict.fromkeys(vl.CONTRACT_KEYS, 0), {"uid": "u"}])


def test_task_rows_feed_the_loop(tmp_path):
    yaml = Path(__file__).resolve().parents[2] / "examples" / "verl" / "hgpo_agent_loop.yaml"
    assert verl_tasks.config_options(str(yaml))["history_length"] == 2
    argv = ["--env", TOY, "--out-dir", str(tmp_path), "--train", "3", "--val", "2"]
    verl_tasks.main([*argv, "--agent-loop-config", str(yaml)])
    import pandas as pd

    train, test = (pd.read_parquet(tmp_path / f"{n}.parquet") for n in ("train", "test"))
    assert len(train) == 3 and len(test) == 2
    assert set(train["agent_name"]) == {vl.AGENT_NAME}
    specs = [vl.task_spec(e) for e in test["extra_info"]]
    assert specs == [vl.TaskSpec(TOY, "heldout", i) for i in range(2)]


def test_verl_v1_worker_conversion_keeps_the_contract(tok):
    """What verl 0.9.1's v1 worker does with a list of outputs before it stores them
    (verl/trainer/ppo/v1/agent_loop_tq.py:183-203, 222-224: ``as_dict``, the row's kwargs,
    ``list_of_dict_to_tensordict``; the store itself needs transfer_queue): the rows keep
    their tokens, the episode return at the last response token, and the contract."""
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    kwargs = {"uid": "uid-0", "session_id": 1, "global_steps": 3}
    outs = run_session(make_loop(tok, ScriptedServer(tok, plan_text)), TOY, "train", 0, "uid-0", 1)
    fields = []
    for out in outs:
        field = out.as_dict()
        field.update(kwargs)
        field.pop("multi_modal_data", None)
        field["loss_mask"] = field["response_mask"]
        field["input_ids"] = torch.cat([field["prompts"], field["responses"]])
        fields.append(field)
    td = list_of_dict_to_tensordict(fields)
    assert td.batch_size[0] == len(PLAN)
    for i, out in enumerate(outs):
        assert td["responses"][i].tolist() == out.response_ids
        assert td["rm_scores"][i].tolist()[-1] == 10.0
    cols = vl.metadata_columns(list(td["extra_fields"]))
    assert list(cols["traj_uid"]) == ["uid-0_1"] * len(PLAN)
    assert list(cols["step_index"]) == list(range(len(PLAN)))
    assert list(cols["uid"]) == ["uid-0"] * len(PLAN)


def test_verl_instantiates_the_loop_from_the_example_config(tok):
    """As verl's worker does (agent_loop.py:534-539 loads agent_loop_config_path, 682-693
    instantiates the entry with hydra): the example config's options reach the loop."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import ToolListWrap

    path = Path(__file__).resolve().parents[2] / "examples" / "verl" / "hgpo_agent_loop.yaml"
    (entry,) = OmegaConf.load(path)
    assert entry.name == vl.AGENT_NAME
    base = make_loop(tok, ScriptedServer(tok))
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(base.config),
        server_manager=ScriptedServer(tok, plan_text),
        tokenizer=tok,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(base.config.data),
        tools=ToolListWrap([]),
    )
    assert isinstance(loop, vl.StepwiseAgentLoop)
    assert loop.options["history_length"] == 2 and loop.generate_timeout_s == 1800
    outs = run_session(loop, TOY, "train", 0, "u", 0)
    assert [o.extra_fields["step_index"] for o in outs] == list(range(len(PLAN)))


def test_example_script_composes_against_verls_config(tmp_path):
    """The launch script, run with a stand-in python3 that records its arguments: its verl
    overrides compose against verl's own ppo_trainer config (no unknown key), and give the
    lengths, group size and agent-loop config the loop reads."""
    import os
    import subprocess

    import verl
    from hydra import compose, initialize_config_dir

    root = Path(__file__).resolve().parents[2]
    script = root / "examples" / "verl" / "run_qwen2.5_1.5b_alfworld_hgpo.sh"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_DIR/$2"\n')
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "ARGS_DIR": str(tmp_path)}
    env["HOME"] = str(tmp_path)
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, timeout=60)
    data_args = (tmp_path / "hgpo.integrations.verl_tasks").read_text().splitlines()
    assert data_args[data_args.index("--env") + 1] == "alfworld"
    overrides = (tmp_path / "verl.trainer.main_ppo").read_text().splitlines()[2:]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.trainer.use_v1 is True and cfg.algorithm.adv_estimator == "hgpo"
    assert (rollout.prompt_length, rollout.response_length, rollout.n) == (4096, 512, 8)
    assert Path(rollout.agent.agent_loop_config_path).is_file()
    assert rollout.agent.default_agent_loop == vl.AGENT_NAME
