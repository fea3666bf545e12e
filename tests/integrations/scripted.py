"""Scripted stand-ins for verl's rollout server, shared by the verl agent-loop tests.

A scripted server manager answers verl's ``generate`` with fixed token ids: a function of the
prompt only (an admissible action picked by a hash of the prompt text, or a malformed answer),
so the trainer's :func:`hgpo.train.episodes.run_episodes` driven by :class:`ScriptedEngine`
with the same function sees the same steps as :class:`hgpo.integrations.verl_loop.
StepwiseAgentLoop` driven by :class:`ScriptedServer`. Import it after
``pytest.importorskip("verl")``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from hgpo.integrations import verl_loop as vl
from hgpo.train.envs import EnvSet
from hgpo.train.episodes import Play, run_episodes
from hgpo.train.train_config import resolve

TOY = "toy:keydoor:size=4"
PROMPT_LEN, RESPONSE_LEN = 2048, 48
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
LOGPROB = -0.25
_ACTIONS = re.compile(r"situation are: ?\n?\[(.*?)\]\.\n\nNow", re.S)


def scripted_text(prompt_text: str) -> str:
    """The scripted policy: a function of the prompt text only. One prompt in four gets a
    malformed answer (no tags, long enough to be cut at RESPONSE_LEN tokens); the others an
    admissible action of the prompt, picked by a hash."""
    h = int(hashlib.md5(prompt_text.encode()).hexdigest(), 16)
    if h % 4 == 0:
        return "I am not sure what to do here. " * 8
    found = _ACTIONS.findall(prompt_text)
    acts = re.findall(r"'([^']+)'", found[-1]) if found else ["look"]
    return f"<think>I follow the plan.</think><action>{acts[h % len(acts)]}</action>"


PLAN = ["left", "down", None, "down", "down", "pickup", "up", "right", "right", "right", "up", "up"]
"""A winning episode of task 0 of toy:keydoor:size=4: a bump into the wall first ("left" at
column 0: invalid in its state), a malformed answer at step 3 (None: the env receives the
fallback text and stays), then the key, the door and the goal (reward 10 at step 12)."""


def plan_text(prompt_text: str) -> str:
    """The scripted policy of :data:`PLAN`: the action of the prompt's step number."""
    at = re.search(r"You are now at step (\d+)", prompt_text)
    action = PLAN[int(at.group(1)) - 1 if at else 0]
    if action is None:
        return "I am not sure what to do here."
    return f"<think>I follow the plan.</think><action>{action}</action>"


def scripted_ids(tok, prompt_ids, policy=scripted_text) -> list[int]:
    text = policy(tok.decode(list(prompt_ids)))
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


class ScriptedServer:
    """verl's server manager interface (``generate(request_id, *, prompt_ids,
    sampling_params)``) with scripted token ids and fixed log-probs."""

    def __init__(self, tok, policy=scripted_text) -> None:
        self.tok, self.policy, self.calls = tok, policy, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, dict(sampling_params)))
        await asyncio.sleep(0)
        ids = scripted_ids(self.tok, prompt_ids, self.policy)
        return TokenOutput(token_ids=ids, log_probs=[LOGPROB] * len(ids))


class SilentServer:
    """A server that never answers."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        await asyncio.sleep(3600)


class ScriptedEngine:
    """The trainer's engine interface with the same scripted responses."""

    def __init__(self, tok, policy=scripted_text) -> None:
        self.tok, self.policy = tok, policy

    def generate(self, prompts, temperature, top_p, max_new):
        return [scripted_ids(self.tok, p, self.policy)[:max_new] for p in prompts]

    def generated_logprobs(self):
        return None


def make_loop(tok, server, options=None, use_v1=True, **kwargs):
    config = OmegaConf.create(
        {
            "trainer": {"use_v1": use_v1},
            "actor_rollout_ref": {
                "rollout": {"prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN}
            },
            "data": {},
        }
    )
    return vl.StepwiseAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tok,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        options=options,
        **kwargs,
    )


def run_session(loop, env, split, task, uid, session):
    row = {"env": env, "split": split, "task_id": task, "index": task}
    coro = loop.run(dict(SAMPLING), uid=uid, session_id=session, extra_info=row, raw_prompt=[])
    return asyncio.run(coro)


def trainer_rollout(tok, env, options, tasks, n, policy=scripted_text):
    """The trainer's rollout of ``tasks`` x ``n`` in one lockstep batch, scripted."""
    cfg = resolve(env, overrides=options)
    envs = EnvSet(cfg, "train", len(tasks) * n)
    try:
        play = Play(n, 1.0, 1.0, RESPONSE_LEN, PROMPT_LEN, cfg.max_steps)
        return run_episodes(envs, ScriptedEngine(tok, policy), tok, tasks, play)
    finally:
        envs.close()
