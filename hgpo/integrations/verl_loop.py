"""A verl agent loop that plays this project's environments stepwise: one output per step.

Load it with ``VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl_loop`` (``import verl`` imports
it in every process, and ``@register`` adds :data:`AGENT_NAME` to verl's agent-loop registry);
the training data are rows of :func:`task_rows` (one per task; ``agent_name`` names this loop).

How an episode becomes outputs (verl 0.9.1)
--------------------------------------------
verl's v1 trainer (``trainer.use_v1=True``, the default in 0.9.1) runs ``rollout.n`` sessions
of every prompt (``verl/trainer/ppo/v1/agent_loop_tq.py:122-128``, ``session_id=i``), and its
worker takes a *list* of outputs from one ``run`` (``agent_loop_tq.py:150-155``): each output is
one row of the batch, stored under the key ``{uid}_{session_id}_{index}``
(``agent_loop_tq.py:177-193``). :meth:`StepwiseAgentLoop.run` returns one output per step of
the episode, in step order, so row ``index`` is step ``index``. The v0 worker
(``verl/experimental/agent_loop/agent_loop.py:694-695``) post-processes exactly one output per
run; this loop refuses ``trainer.use_v1=False`` with a named error.

Each episode is played by the trainer's own code: :func:`hgpo.train.episodes.run_episodes` on a
one-slot :class:`hgpo.train.envs.EnvSet`, with :class:`ServerEngine` in the place of the
trainer's engine (it asks verl's server manager, ``generate(request_id, prompt_ids=...,
sampling_params=...)``). So the prompt (the paper's template over the memory module's last K
steps, in the tokenizer's chat template, cut from the left to ``rollout.prompt_length``), the
parsed action and what the env receives are the trainer's, token for token.

What each output carries
------------------------
Tokens: ``prompt_ids`` (the step's prompt), ``response_ids`` (the sampled response, at most
``rollout.response_length`` tokens), ``response_mask`` (1 on every response token; verl pads
with 0), ``response_logprobs`` (the server's, when it reports them). ``reward_score`` is the
episode's summed env reward R = sum_t r_t on every step (verl writes it at the last response
token, ``rm_scores``); the step's own reward is in ``rewards``.

``extra_fields`` (verl's way to carry fields of an output into the batch: the v0 worker makes
each key a ``non_tensor_batch`` column, ``agent_loop.py:1119-1135``; the v1 worker stores the
dict as the row's ``extra_fields``, ``agent_loop_tq.py:194``; :func:`metadata_columns` turns
those dicts into columns) hold the metadata contract of ``hgpo.integrations``:

- ``uid``: the prompt's uid (the rollout group: every session of a task shares it);
- ``traj_uid``: ``f"{uid}_{session_id}"``, the episode (verl's key prefix of its rows);
- ``anchor_obs``: the state key of the step's observation (``Benchmark.key``, the string HGPO
  groups by: ALFWorld's raw observation, WebShop's formatted page, a toy observation);
- ``step_index``: t = 0, 1, ... within the episode;
- ``rewards``: the env reward r_t of the step, WITHOUT the invalid-action penalty;
- ``is_action_valid``: False where the parser found the response malformed (or, on a toy env,
  the action invalid in its state), exactly the trainer's ``Rollout.invalid``;
- ``next_obs``: the state key of the observation the step led to (the next step's
  ``anchor_obs``; after the episode's last step its terminal observation's), the trainer's
  ``Rollout.next_key`` (graphgpo's terminal states);

plus ``hidden_state`` (a toy env's hidden state s_t, -1 elsewhere), ``won`` and ``task_score``
of the episode, and the keys verl's workers expect (``reward_extra_info``, ``turn_scores``,
``tool_rewards``).

Invalid actions, as in the trainer: the env receives the parser's text (the tagged action, or
the reference's fallback, the response's last 30/20 characters), its reward is kept without
the penalty, and ``is_action_valid`` = False lets the estimator charge
``INVALID_ACTION_PENALTY`` (0.1) per its ``penalty_mode``. Nothing else is charged here.

Bounded waits: every env command is bounded by ``env_timeout_s`` (the trainer's worker
timeout: a hung env is restarted, its episode left out), every call to the server by
``generate_timeout_s`` (a TimeoutError); the episode's env workers are stopped when it ends,
whatever happened. An episode whose env crashed gives no outputs (verl logs "Empty output"
and its group is normalised over the sessions that remain, as in the trainer).

Settings: the env's run settings are the trainer's (``hgpo.train.train_config.resolve(env,
overrides=options)``: the paper's defaults of the benchmark, then ``options``, the loop's
keyword argument from an agent-loop config file); sampling and lengths are verl's
(``sampling_params``, ``rollout.prompt_length``, ``rollout.response_length``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hgpo.extras import MissingExtraError
from hgpo.options import bad, check_int, check_number

try:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as e:  # pragma: no cover - exercised where verl is missing
    raise MissingExtraError(
        f'hgpo.integrations.verl_loop needs verl 0.9.x ({e}); install it with pip install -e ".[verl]"'
    ) from e

from hgpo.integrations.verl_tasks import (
    AGENT_NAME,
    TaskSpec,
    loop_settings,
    task_rows,
    task_spec,
)
from hgpo.train.envs import EnvSet
from hgpo.train.episodes import Play, Rollout, run_episodes
from hgpo.train.train_config import TrainConfig

__all__ = [
    "AGENT_NAME",
    "CONTRACT_KEYS",
    "GENERATE_TIMEOUT_S",
    "ServerEngine",
    "StepwiseAgentLoop",
    "TaskSpec",
    "loop_settings",
    "metadata_columns",
    "session_slot",
    "step_outputs",
    "task_rows",
    "task_spec",
]

GENERATE_TIMEOUT_S = 1800.0
"""Default bound on one call to verl's server manager (seconds)."""

CONTRACT_KEYS = (
    "uid", "traj_uid", "anchor_obs", "step_index", "rewards", "is_action_valid", "next_obs",
)  # fmt: skip
"""The ``non_tensor_batch`` keys of the hgpo.integrations metadata contract every output has."""


def play_settings(cfg: TrainConfig, prompt_length: int, response_length: int) -> Play:
    """One rollout of one task, the lengths verl's; temperature and top_p are not read
    (:class:`ServerEngine` samples with verl's ``sampling_params``)."""
    return Play(
        group_size=1,
        temperature=1.0,
        top_p=1.0,
        max_response_tokens=check_int("rollout.response_length", response_length, lo=1),
        max_prompt_tokens=check_int("rollout.prompt_length", prompt_length, lo=1),
        max_steps=cfg.max_steps,
        action_mode="generate",
        keep_samples=True,
        enable_thinking=cfg.enable_thinking,
    )


def session_slot(traj_uid: str) -> int:
    """The env slot number episode ``traj_uid`` is seeded with (``EnvSet(slot_base=...)``): 56
    bits of its SHA-256, so that the sessions of a group draw different random streams (a toy
    env with slip draws from ``SeedSequence([seed, slot, 0])``), as the slots of the trainer's
    batch do."""
    return int.from_bytes(hashlib.sha256(traj_uid.encode()).digest()[:7], "big")


class ServerEngine:
    """The trainer's rollout engine (``hgpo.train.episodes.Engine``) over verl's server manager.

    ``generate`` is called from a worker thread (the episode runs there); each prompt's
    ``server.generate`` coroutine runs on ``loop`` (the agent loop's event loop), and each wait
    is bounded by ``timeout_s``. Responses are cut to ``max_new`` tokens, with their log-probs.
    """

    def __init__(
        self,
        server: Any,
        loop: asyncio.AbstractEventLoop,
        sampling_params: Mapping[str, Any],
        request_id: str,
        timeout_s: float = GENERATE_TIMEOUT_S,
    ) -> None:
        self.server, self.loop = server, loop
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self.timeout_s = check_number("generate_timeout_s", timeout_s, lo=0.0, lo_open=True)
        self._logprobs: list[list[float]] | None = None
        self.seconds: list[float] = []
        """Seconds of each ``generate`` call (one per step)."""

    async def _one(self, prompt: Sequence[int]) -> Any:
        return await self.server.generate(
            request_id=self.request_id,
            prompt_ids=list(prompt),
            sampling_params=dict(self.sampling_params),
        )

    def _wait(self, futures: list[concurrent.futures.Future]) -> list[Any]:
        outs = []
        for f in futures:
            try:
                outs.append(f.result(timeout=self.timeout_s))
            except concurrent.futures.TimeoutError:
                for g in futures:
                    g.cancel()
                raise TimeoutError(
                    f"verl server generate (request {self.request_id}) took over "
                    f"generate_timeout_s={self.timeout_s:g} s"
                ) from None
        return outs

    def generate(
        self, prompts: Sequence[Sequence[int]], temperature: float, top_p: float, max_new: int
    ) -> list[list[int]]:
        """One response per prompt from verl's server (``temperature`` and ``top_p`` are the
        trainer's and not read: verl's ``sampling_params`` rule)."""
        t = time.perf_counter()
        futures = [asyncio.run_coroutine_threadsafe(self._one(p), self.loop) for p in prompts]
        outs = self._wait(futures)
        self.seconds.append(time.perf_counter() - t)
        lps = [o.log_probs for o in outs]
        self._logprobs = [list(lp)[:max_new] for lp in lps] if all(lps) else None
        return [list(o.token_ids)[:max_new] for o in outs]

    def generated_logprobs(self) -> list[list[float]] | None:
        """The server's log-probs of the last call's tokens (None where it gave none)."""
        return self._logprobs

    def sync(self, model: Any) -> None:
        raise NotImplementedError("verl syncs its rollout servers' weights itself")

    def close(self) -> None:
        """Nothing to free (verl owns the servers)."""


def play_episode(
    cfg: TrainConfig, spec: TaskSpec, engine: ServerEngine, tokenizer: Any, play: Play, slot: int
) -> Rollout:
    """One episode of ``spec`` by the trainer's :func:`run_episodes` on a one-slot EnvSet
    seeded as slot ``slot``; its env workers are stopped before it returns or raises."""
    envs = EnvSet(cfg, spec.split, 1, slot_base=slot)
    try:
        if spec.task_id >= envs.num_tasks:
            raise bad(
                "extra_info['task_id']",
                f"below the {envs.num_tasks} tasks of {spec.env} {spec.split}",
                spec.task_id,
            )
        return run_episodes(envs, engine, tokenizer, [spec.task_id], play)
    finally:
        envs.close()


def step_metadata(roll: Rollout, row: int, uid: str, traj_uid: str) -> dict[str, Any]:
    """The ``extra_fields`` of step ``row`` of ``roll`` (see the module docstring)."""
    traj = roll.traj[row]
    return {
        "uid": uid,
        "traj_uid": traj_uid,
        "anchor_obs": roll.key[row],
        "next_obs": roll.next_key[row],
        "step_index": int(roll.step[row]),
        "rewards": float(roll.reward[row]),
        "is_action_valid": not roll.invalid[row],
        "hidden_state": int(roll.hidden[row]),
        "won": bool(roll.success[traj]),
        "task_score": float(roll.score[traj]),
        "reward_extra_info": {},
        "turn_scores": [],
        "tool_rewards": [],
    }


def step_outputs(
    roll: Rollout, uid: str, traj_uid: str, gen_seconds: Sequence[float] = ()
) -> list[AgentLoopOutput]:
    """One verl output per row of the one-episode rollout ``roll``, in step order; none when
    its env crashed (``roll`` has no rows then)."""
    if not len(roll):
        return []
    episode_return = float(sum(roll.reward))
    env_s = roll.env_seconds / len(roll)
    outs = []
    for j in range(len(roll)):
        response = list(roll.response_ids[j])
        lps = roll.engine_logprobs[j]
        outs.append(
            AgentLoopOutput(
                prompt_ids=list(roll.prompt_ids[j]),
                response_ids=response,
                response_mask=[1] * len(response),
                response_logprobs=list(lps) if lps else None,
                reward_score=episode_return,
                num_turns=2,
                metrics=AgentLoopMetrics(
                    generate_sequences=gen_seconds[j] if j < len(gen_seconds) else 0.0,
                    tool_calls=env_s,
                ),
                extra_fields=step_metadata(roll, j, uid, traj_uid),
            )
        )
    return outs


def metadata_columns(extra_fields: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The contract's ``non_tensor_batch`` columns (object arrays) of rows whose outputs carry
    ``extra_fields`` (the v1 trainer's per-row dicts); a row without a key is a named error."""
    out: dict[str, np.ndarray] = {}
    for key in CONTRACT_KEYS:
        col = np.empty(len(extra_fields), dtype=object)
        for i, fields in enumerate(extra_fields):
            if not isinstance(fields, Mapping) or key not in fields:
                raise bad(
                    f"extra_fields[{i}]", f"a dict with the keys {list(CONTRACT_KEYS)}", fields
                )
            col[i] = fields[key]
        out[key] = col
    return out


def require_v1(config: Any) -> None:
    """A named error unless verl runs its v1 trainer, whose worker takes several outputs of one
    run (``verl/trainer/ppo/v1/agent_loop_tq.py:150-155``)."""
    trainer = config.get("trainer", {}) if hasattr(config, "get") else {}
    use_v1 = trainer.get("use_v1", True) if hasattr(trainer, "get") else True
    if use_v1 is not True:
        raise bad(
            "trainer.use_v1",
            f"True ({AGENT_NAME} emits one output per step; verl's v0 worker takes one per episode)",
            use_v1,
        )


@register(AGENT_NAME)
class StepwiseAgentLoop(AgentLoopBase):
    """Plays one episode of an ``agentenvs`` benchmark per session, one output per step.

    Keyword arguments (an agent-loop config file's entries, hydra-instantiated):
    ``options``: TrainConfig overrides of the env settings (:func:`loop_settings`);
    ``generate_timeout_s``: bound on one server call (default :data:`GENERATE_TIMEOUT_S`).
    """

    def __init__(
        self,
        *args: Any,
        options: Mapping[str, Any] | None = None,
        generate_timeout_s: float = GENERATE_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        require_v1(self.config)
        self.options = {str(k): v for k, v in dict(options or {}).items()}
        self.generate_timeout_s = check_number(
            "generate_timeout_s", generate_timeout_s, lo=0.0, lo_open=True
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """The episode of the row's task (``extra_info``), session ``session_id`` of ``uid``."""
        for key in ("uid", "session_id", "extra_info"):
            if key not in kwargs:
                raise bad(f"{AGENT_NAME} run: {key}", "given (verl's v1 worker passes it)", None)
        spec = task_spec(kwargs["extra_info"])
        uid = str(kwargs["uid"])
        traj_uid = f"{uid}_{int(kwargs['session_id'])}"
        cfg = loop_settings(spec.env, self.options)
        rc = self.rollout_config
        play = play_settings(cfg, rc.prompt_length, rc.response_length)
        loop = asyncio.get_running_loop()
        engine = ServerEngine(
            self.server_manager, loop, sampling_params, uuid.uuid4().hex, self.generate_timeout_s
        )
        roll = await loop.run_in_executor(
            None, play_episode, cfg, spec, engine, self.tokenizer, play, session_slot(traj_uid)
        )
        return step_outputs(roll, uid, traj_uid, engine.seconds)
