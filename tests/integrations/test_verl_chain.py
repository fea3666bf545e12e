"""The whole v1 chain of verl 0.9.1 on CPU against our trainer's own numbers.

verl side, verl's own code wherever it runs on CPU: a real TransferQueue (its controller and
one storage unit as Ray actors on the test session's Ray cluster, tests/raycluster.py); ``PPOTrainer._submit_batch_to_rollout``
(the prompts' tags in the queue); the v1 worker's ``generate_sequences`` -> ``_run_prompt``
(the ``rollout.n`` sessions of each prompt) -> ``_run_agent_loop`` (the hydra-built
:class:`~hgpo.integrations.verl_loop.StepwiseAgentLoop`) -> ``_agent_loop_postprocess`` (every
output stored under ``{uid}_{session}_{index}``), on a worker object built without its Ray
actor, with a scripted server manager in the place of the rollout servers; the sync
``ReplayBuffer.sample`` for the batch; ``PPOTrainer._compute_advantage`` (wrapped by
:mod:`hgpo.integrations.verl_v1`). verl's methods run unbound (PPOTrainer is abstract) on an
object holding only the attributes they read. The advantages are read back from the queue,
where verl's method wrote them.

Our side: the trainer's :func:`hgpo.train.episodes.run_episodes` on the same scripted actions
(one lockstep batch), its ``Rollout.step_batch()``, :func:`hgpo.compute_advantages` with the
trainer's ``TrainConfig.estimator_config()``, the step advantage broadcast to its response
tokens (float64, then float32: verl's token dtype). The two must be equal, bit for bit, token
by token.

The env slips (``slip=0.1``), so the sessions of a task differ; each session of the loop is
seeded as the trainer's slot of that episode (``session_slot`` mapped to the slot number),
since the loop's own seeding (a hash of the trajectory id) draws other streams than the
trainer's batch by design. The policy (:func:`policy`) follows the winning plan of
``scripted.PLAN`` (a wall bump and a malformed answer in it), then random admissible actions;
with the slips, some episodes win (return 10) and others do not.
"""

from __future__ import annotations

import asyncio
import re
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("transfer_queue")
pytest.importorskip("tokenizers")
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

from omegaconf import OmegaConf  # noqa: E402

from hgpo import compute_advantages  # noqa: E402
from hgpo.integrations import verl as hv  # noqa: E402
from hgpo.integrations import verl_loop as vl  # noqa: E402
from hgpo.train.tiny import train_tokenizer  # noqa: E402
from hgpo.train.train_config import resolve  # noqa: E402
from hgpo.train.trainer import tiny_corpus  # noqa: E402
from tests.integrations.scripted import (  # noqa: E402
    PLAN,
    PROMPT_LEN,
    RESPONSE_LEN,
    ScriptedServer,
    plan_text,
    scripted_text,
    trainer_rollout,
)

ENV = "toy:keydoor:size=4,slip=0.1"
TASKS, N = (0, 3), 3
MAX_STEPS = 14
WAIT_S = 120.0
"""Bound on the rollout and on the replay buffer's sampling (seconds)."""
# TransferQueue's controller and its one storage unit ask one logical CPU each
# (``@ray.remote(num_cpus=1)``; with fewer, ``tq.init`` waits for ever): the session cluster
# has 2 nodes x 2 CPUs.


@pytest.fixture(scope="module")
def queue(ray_cluster):
    """A real TransferQueue on the test session's Ray cluster (tests/raycluster.py, which the
    Ray tests share: a second local Ray started here broke their cluster), closed after."""
    import transfer_queue as tq

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        yield tq
    finally:
        tq.close()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), tiny_corpus(ENV), 1024)


def policy(prompt_text: str) -> str:
    """``plan_text`` for the steps of :data:`PLAN`, then ``scripted_text``."""
    at = re.search(r"You are now at step (\d+)", prompt_text)
    step = int(at.group(1)) if at else 1
    return plan_text(prompt_text) if step <= len(PLAN) else scripted_text(prompt_text)


def uid_of(task: int) -> str:
    return f"uid-{task}"  # (verl's ReplayBuffer takes the uid as the key's text before '_')


def trainer_slots() -> dict[str, int]:
    """traj_uid -> the slot of that episode in the trainer's batch (tasks x N, task-major)."""
    return {f"{uid_of(t)}_{m}": i * N + m for i, t in enumerate(TASKS) for m in range(N)}


def verl_config(estimator: str, options: dict, cfg) -> OmegaConf:
    """What the worker and the trainer read of verl's config (the trainer's gamma and lambda)."""
    return OmegaConf.create(
        {
            "trainer": {"use_v1": True},
            "data": {},
            "actor_rollout_ref": {
                "rollout": {
                    "n": N,
                    # verl's worker builds its sampling_params from these (generate_sequences)
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "prompt_length": PROMPT_LEN,
                    "response_length": RESPONSE_LEN,
                    "agent": {"default_agent_loop": vl.AGENT_NAME},
                }
            },
            "algorithm": {
                "adv_estimator": hv.verl_name(estimator),
                "gamma": cfg.gamma,
                "lam": cfg.estimator_config().gae_lambda,
                "use_kl_in_reward": False,
                "norm_adv_by_std_in_grpo": True,
                "hgpo": options,
            },
        }
    )


def worker(config, tok, server):
    """verl's v1 agent-loop worker without its Ray actor: the attributes its methods read."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    w = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    w.config, w.llm_client, w.tokenizer = config, server, tok
    w.processor = w.hf_model_type = w.dataset_cls = None
    w.tools, w.reward_loop_worker_handles, w.distillation_enabled = [], None, False
    return w


def prompt_batch(env: str):
    """The prompts as verl's trainer hands them on (``_next_train_batch``: the dataloader's
    columns as a TensorDict, ``global_steps`` set), one per task, with fixed uids."""
    from verl.utils import tensordict_utils as tu

    rows = [{"env": env, "split": "train", "task_id": t, "index": t} for t in TASKS]
    batch = tu.get_tensordict(
        {
            "uid": np.array([uid_of(t) for t in TASKS], dtype=object),
            "agent_name": np.array([vl.AGENT_NAME] * len(TASKS), dtype=object),
            "extra_info": np.array(rows, dtype=object),
            "index": np.array(list(TASKS), dtype=object),
            "raw_prompt": np.array([[] for _ in TASKS] + [None], dtype=object)[:-1],
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


async def generate(w, batch) -> None:
    """verl's worker ``generate_sequences`` (fire and forget), then its background tasks."""
    w.background_tasks = set()
    await w.generate_sequences(batch)
    await asyncio.wait_for(asyncio.gather(*list(w.background_tasks)), timeout=WAIT_S)


def sample(config) -> object:
    """verl's sync ``ReplayBuffer.sample`` of the stored groups (bounded: its poll waits for
    ever when a group is missing)."""
    import concurrent.futures

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    buffer = ReplayBuffer("sync", {}, None, "drop", {}, poll_interval=0.05)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = pool.submit(buffer.sample, global_steps=1, partition_id="train",
                          batch_size=len(TASKS))  # fmt: skip
        batch, _ = job.result(timeout=WAIT_S)
    return batch


def verl_advantages(queue, config, tok, env, monkeypatch):
    """The v1 chain: rollout into the queue, the batch of the stored keys, verl's
    _compute_advantage. Returns (the batch's keys, token advantages read back, prompt ids)."""
    from verl.trainer.ppo.v1 import trainer_base

    slots = trainer_slots()
    monkeypatch.setattr(vl, "session_slot", lambda traj_uid: slots[traj_uid])
    prompts = prompt_batch(env)
    manager = types.SimpleNamespace(generate_sequences=lambda batch: None)
    trainer = types.SimpleNamespace(
        config=config, trainer_mode="sync", global_steps=1, agent_loop_manager=manager
    )
    trainer_base.PPOTrainer._submit_batch_to_rollout(trainer, prompts)  # the prompts' tags
    asyncio.run(generate(worker(config, tok, ScriptedServer(tok, policy)), prompts))
    batch = sample(config)
    # (PPOTrainer is abstract: its method, unbound, on an object with the config it reads)
    out = trainer_base.PPOTrainer._compute_advantage(trainer, batch, {})
    got = queue.kv_batch_get(
        keys=out.keys, partition_id="train", select_fields=["advantages", "prompts"]
    )
    advantages = [a for a in got["advantages"].unbind(0)]
    prompts = [p.tolist() for p in got["prompts"].unbind(0)]
    queue.kv_clear(keys=list(out.keys), partition_id="train")
    return list(out.keys), advantages, prompts


def trainer_advantages(tok, env, estimator, cfg):
    """Our trainer's path: (rollout, float32 token advantages per row)."""
    options = {"history_length": cfg.history_length, "max_steps": MAX_STEPS, "env_workers": 1}
    roll = trainer_rollout(tok, env, options, list(TASKS), N, policy)
    est = compute_advantages(estimator, roll.step_batch(), cfg.estimator_config())
    tokens = [
        torch.full((len(roll.response_ids[r]),), est.advantages[r], dtype=torch.float64).float()
        for r in range(len(roll))
    ]
    return roll, tokens


@pytest.mark.parametrize(("estimator", "K"), [("hgpo", 2), ("hgpo", 4), ("gigpo", 2)])
def test_verl_v1_chain_gives_the_trainers_token_advantages(queue, tok, monkeypatch, estimator, K):
    cfg = resolve(ENV, overrides={"history_length": K, "max_steps": MAX_STEPS, "env_workers": 1})
    options = {"K": K} if estimator == "hgpo" else {}
    config = verl_config(estimator, options, cfg)
    # the trainer's EstimatorConfig is the one verl's call gives our estimator
    assert hv.estimator_config(config.algorithm, cfg.gamma, config.algorithm.lam) == (
        cfg.estimator_config()
    )
    # the loop's options as an agent-loop config file gives them (verl's worker instantiates
    # the registry's entry with hydra)
    from verl.experimental.agent_loop import agent_loop

    entry = dict(agent_loop._agent_loop_registry[vl.AGENT_NAME])
    entry["options"] = {"history_length": K, "max_steps": MAX_STEPS, "env_workers": 1}
    monkeypatch.setitem(agent_loop._agent_loop_registry, vl.AGENT_NAME, entry)
    keys, got, prompts = verl_advantages(queue, config, tok, ENV, monkeypatch)
    roll, want = trainer_advantages(tok, ENV, estimator, cfg)

    # row r of the trainer is (traj, step); verl's key is {uid}_{session}_{step}
    slot_of = trainer_slots()
    where = {(int(roll.traj[r]), int(roll.step[r])): r for r in range(len(roll))}
    assert len(keys) == len(roll) and len(set(keys)) == len(keys)
    for key, adv, prompt in zip(keys, got, prompts, strict=True):
        traj_uid, step = key.rsplit("_", 1)
        r = where[(slot_of[traj_uid], int(step))]
        assert prompt == roll.prompt_ids[r]
        assert adv.dtype == want[r].dtype and torch.equal(adv, want[r]), key
    flat = torch.cat(want)
    # the data are not degenerate: several returns, steps with and without a penalty
    assert len(set(float(a[0]) for a in want)) > 2 and flat.abs().sum() > 0
    assert any(roll.invalid) and not all(roll.invalid)
    returns = {float(sum(roll.reward[r] for r in range(len(roll)) if roll.traj[r] == i))
               for i in range(len(TASKS) * N)}  # fmt: skip
    assert len(returns) > 1 and max(returns) > 0
    assert np.unique(roll.traj).size == len(TASKS) * N
