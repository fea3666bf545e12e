"""Multi-turn rollouts: prompt (memory + template) -> generate -> parse -> step, until done.

Every step of every trajectory becomes one training sample (stepwise policy optimisation); the
finished batch also yields the :class:`hgpo.StepBatch` that the estimators read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from agentenvs.registry import BENCHMARKS, benchmark
from hgpo import StateIndexer, StepBatch
from hgpo.train.envs import EnvSet

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What the trainer needs of a rollout engine (``hf_engine.HFEngine``, ``vllm_engine.VLLMEngine``)."""

    def generate(
        self, prompts: Sequence[Sequence[int]], temperature: float, top_p: float, max_new: int
    ) -> list[list[int]]:
        """One sampled response (token ids) per prompt."""
        ...

    def generated_logprobs(self) -> list[list[float]] | None:
        """The engine's own log-probs of the last ``generate`` call's tokens, or None where the
        engine samples from the training module itself (hf)."""
        ...

    def sync(self, model: Any) -> None:
        """Sample from ``model``'s current weights from now on."""
        ...

    def close(self) -> None:
        """Free what the engine holds."""
        ...


class PlaySettings(Protocol):
    """The settings both :meth:`Play.training` and :meth:`Play.validation` read."""

    action_mode: str
    enable_thinking: bool
    max_prompt_tokens: int
    max_response_tokens: int
    max_steps: int


class TrainingPlaySettings(PlaySettings, Protocol):
    """The settings :meth:`Play.training` reads (``TrainConfig`` has them)."""

    group_size: int
    temperature: float
    top_p: float


class ValidationPlaySettings(PlaySettings, Protocol):
    """The settings :meth:`Play.validation` reads (``TrainConfig`` has them)."""

    val_temperature: float


@dataclass(frozen=True)
class Play:
    """How :func:`run_episodes` plays: rollouts per task, sampling, lengths."""

    group_size: int
    """Rollouts of each task (one rollout group)."""
    temperature: float
    top_p: float
    max_response_tokens: int
    max_prompt_tokens: int
    max_steps: int
    action_mode: str = "generate"
    """"generate" samples free text; "score" samples among the admissible actions."""
    keep_samples: bool = True
    """Keep prompts, responses and engine log-probs (training); False for validation."""
    enable_thinking: bool = False
    """The chat template's thinking switch (:func:`hgpo.train.model.encode_prompt`)."""

    @classmethod
    def training(cls, cfg: TrainingPlaySettings) -> Play:
        """The training rollouts of ``cfg``."""
        return cls(
            cfg.group_size,
            cfg.temperature,
            cfg.top_p,
            cfg.max_response_tokens,
            cfg.max_prompt_tokens,
            cfg.max_steps,
            cfg.action_mode,
            enable_thinking=cfg.enable_thinking,
        )

    @classmethod
    def validation(cls, cfg: ValidationPlaySettings) -> Play:
        """One rollout per held-out task at the validation temperature, no samples kept."""
        return cls(
            1,
            cfg.val_temperature,
            1.0,
            cfg.max_response_tokens,
            cfg.max_prompt_tokens,
            cfg.max_steps,
            cfg.action_mode,
            keep_samples=False,
            enable_thinking=cfg.enable_thinking,
        )


SCORE_THINK = "<think>I follow the plan.</think>"
"""The fixed think of action_mode="score" (the warm start's too)."""


def candidate_actions(bench: str, admissible: Sequence[str], task: str) -> list[str]:
    """The actions action_mode="score" chooses from on benchmark ``bench`` (a name or an
    ``--env`` value): the admissible ones, each once, with WebShop's ``search[<your query>]``
    placeholder filled with the task text (``Benchmark.candidates``)."""
    found = BENCHMARKS.get(bench) or benchmark(bench)
    return found.candidates(admissible, task)


def response_text(action: str) -> str:
    """The response of one candidate action in action_mode="score"."""
    return f"{SCORE_THINK}<action>{action}</action>"


class Sampled(NamedTuple):
    """action_mode="score": the sampled response of each prompt and the exact entropy of the
    distribution it was sampled from."""

    responses: list[list[int]]
    entropy: list[float]
    """Per prompt, H(pi) = -sum_a pi(a) log pi(a) in nats, pi = softmax(log p(response(a) |
    prompt) / temperature) over its candidate actions a (float64)."""
    token_logprobs: list[list[float]] | None = None
    """Per prompt, the sampled response's token log-probs at temperature 1 under the engine's
    weights (the trainer's old log-probs of that step, where the engine scores with the
    training module itself: :meth:`hgpo.train.trainer.Trainer._score`); None from an engine
    that reports sums only (``score``, no ``score_tokens``)."""


def score_and_sample(
    engine: Any,
    tok: Any,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[str]],
    temperature: float,
) -> list[list[int]]:
    """action_mode="score": one response per prompt, sampled among its candidates' responses
    with probability softmax(log pi(response | prompt) / temperature) (torch's global RNG)."""
    return score_candidates(engine, tok, prompts, candidates, temperature).responses


def score_candidates(
    engine: Any,
    tok: Any,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[str]],
    temperature: float,
) -> Sampled:
    """:func:`score_and_sample`, with the exact entropy of each step's candidate distribution
    (:class:`Sampled`): the policy's entropy at a score-mode step."""
    import torch

    if not all(candidates):
        raise ValueError('action_mode="score": an environment listed no admissible actions')
    eos = [tok.eos_token_id]
    resp = [
        [tok(response_text(a), add_special_tokens=False)["input_ids"] + eos for a in cands]
        for cands in candidates
    ]
    flat_p = [p for p, rs in zip(prompts, resp, strict=True) for _ in rs]
    flat_r = [r for rs in resp for r in rs]
    tokens: list[list[float]] | None = None
    if hasattr(engine, "score_tokens"):  # every env's candidates in a few batched passes
        tokens = engine.score_tokens(flat_p, flat_r)
        scores = [math.fsum(t) for t in tokens]
    else:
        scores = engine.score(flat_p, flat_r)
    out, entropy, chosen, k = [], [], [], 0
    for rs in resp:
        s = torch.tensor(scores[k : k + len(rs)], dtype=torch.float64)
        j = int(torch.multinomial(torch.softmax(s / temperature, 0), 1))
        out.append(rs[j])
        if tokens is not None:
            chosen.append(tokens[k + j])
        k += len(rs)
        logp = torch.log_softmax(s / temperature, 0)
        entropy.append(float(-(logp.exp() * logp).sum()))
    return Sampled(out, entropy, chosen if tokens is not None else None)


@dataclass(frozen=True)
class Episodes:
    """Per episode: summed env reward, success, task score, length."""

    reward: list[float]
    success: list[bool]
    score: list[float]
    length: list[int]


@dataclass
class Rollout:
    """The step samples of one batch of episodes, trajectory by trajectory.

    Per step (n rows, trajectories contiguous, steps 0..T-1): prompt_ids, response_ids, group,
    traj, step, reward (env reward, no penalty), invalid, key (state key text), next_key (the
    state key of the observation the step led to), engine_logprobs.
    Per trajectory: success, score, task_type, length.
    """

    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    traj: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    key: list[str] = field(default_factory=list)
    next_key: list[str | None] = field(default_factory=list)
    """The state key (as ``key``) of the observation each step led to: the next step's key, and
    after a trajectory's last step its terminal observation's (the env's observation when it
    ended, or when ``max_steps`` cut it); None where it was not recorded."""
    engine_logprobs: list[list[float] | None] = field(default_factory=list)
    """The rollout engine's log-probs of each response's tokens, where it reports them (vLLM)."""
    hidden: list[int] = field(default_factory=list)
    """Toy envs: the hidden state s_t before each step (-1 elsewhere); the exact truth needs it."""
    observation: list[str] = field(default_factory=list)
    """The observation text each step was taken from, as the env returned it (before the
    memory and the prompt template): the ``observations`` input of an estimator."""
    candidate_entropy: list[float | None] = field(default_factory=list)
    """action_mode="score": the exact entropy of the policy over each step's candidate actions
    (:class:`Sampled`); None per step in "generate" mode (the trainer's scoring pass computes
    the mean token entropy there)."""
    action: list[str] = field(default_factory=list)
    """The action each step sent to the env, as the env parsed it from the response (the
    listed action in action_mode "score"): the canonical action of ``StepBatch.action``."""
    score_logprobs: list[list[float] | None] = field(default_factory=list)
    """Each response's token log-probs at temperature 1 as the rollout computed them: in
    action_mode="score" its scoring of the candidates (:attr:`Sampled.token_logprobs`), in
    "generate" the hf engine's sampling passes (``HFEngine.token_logprobs``); None where
    the engine reported none. The trainer reuses them as the old log-probs where they are
    exactly its own (:meth:`hgpo.train.trainer.Trainer._score`)."""
    success: list[bool] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    task_type: list[str] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    """Each trajectory's episode length (a branch's counts its parent's prefix)."""
    parent: list[int] = field(default_factory=list)
    """Branched rollouts (hgpo.train.branched_play): each trajectory's parent, -1 for a root; empty
    for independent rollouts. A branch's rows are its own steps only, from its branch step."""
    gen_tokens: int = 0
    gen_seconds: float = 0.0
    env_seconds: float = 0.0
    crashed: int = 0
    """Episodes whose environment crashed (it raised, or its worker died or hung): left out of
    the batch, so its rollout group is normalised over the members that remain."""
    dropped: int = 0
    """Trajectories left out: the crashed ones and, in a branched rollout, every branch of a
    crashed trajectory (its prefix rows went with it)."""

    def __len__(self) -> int:
        return len(self.step)

    @property
    def played(self) -> int:
        """Trajectories played: those in the batch and those left out."""
        return len(self.success) + self.dropped

    def trajectory_rewards(self) -> list[float]:
        """Each trajectory's summed env reward (own rows), in trajectory order."""
        return [
            float(sum(r for r, tr in zip(self.reward, self.traj, strict=True) if tr == i))
            for i in sorted(set(self.traj))
        ]

    @property
    def n_branches(self) -> int:
        return sum(p >= 0 for p in self.parent)

    def roots(self) -> list[int]:
        """The trajectories that start at step 0 (all of them without branches)."""
        return [i for i in range(len(self.success)) if not self.parent or self.parent[i] < 0]

    def root_episodes(self) -> Episodes:
        """Reward, success, score and length of the root episodes: every episode of an
        independent rollout; a branched one's roots (on-policy from the task's start, so
        comparable across schemes; branches start where the rule chose)."""
        if not self.n_branches:
            return Episodes(self.trajectory_rewards(), self.success, self.score, self.length)
        per = np.zeros(len(self.success))
        np.add.at(per, np.asarray(self.traj, dtype=np.int64), np.asarray(self.reward))
        roots = self.roots()
        return Episodes(
            [float(per[i]) for i in roots],
            [self.success[i] for i in roots],
            [self.score[i] for i in roots],
            [self.length[i] for i in roots],
        )

    def add_trajectory(
        self, records: Sequence[StepRecord], group: int, info: dict[str, Any], start: int = 0
    ) -> None:
        """Append one trajectory: its own step records (steps ``start``.. of its virtual
        trajectory; 0 for a root) and, from its last ``info``, its success, score and task type.
        Its length is that of the virtual trajectory; a branch's ``parent`` is the caller's."""
        n = len(self.success)
        self.success.append(bool(info.get("won", False)))
        self.score.append(float(info.get("task_score", 0.0)))
        self.task_type.append(str(info.get("task_type", "")))
        self.length.append(start + len(records))
        for j, rec in enumerate(records):
            self.prompt_ids.append(rec.prompt)
            self.response_ids.append(rec.response)
            self.group.append(group)
            self.traj.append(n)
            self.step.append(start + j)
            self.reward.append(rec.reward)
            self.invalid.append(rec.invalid)
            self.key.append(rec.key)
            self.next_key.append(rec.next_key)
            self.engine_logprobs.append(rec.engine_logprobs)
            self.hidden.append(rec.hidden)
            self.observation.append(rec.observation)
            self.candidate_entropy.append(rec.candidate_entropy)
            self.action.append(rec.action)
            self.score_logprobs.append(rec.score_logprobs)

    def step_batch(self) -> StepBatch:
        """The estimator input: state = id of the raw-observation key within this batch,
        ``next_state`` = id of ``next_key`` with the same ids (one interning of both; None when
        no step recorded its next key), ``action`` = id of each step's parsed action text (equal
        texts, equal ids: what ecpo and ``include_actions`` key on; None when the rollout
        recorded no actions); a branched rollout's batch has the ``parent`` column
        (hgpo.branched_batch)."""
        traj = np.asarray(self.traj, dtype=np.int64)
        parent = None
        if self.n_branches:  # trajectory i is traj id i
            parent = np.asarray(self.parent, dtype=np.int64)[traj]
        keys = StateIndexer()
        state = keys(self.key)
        next_state = None
        missing = [i for i, k in enumerate(self.next_key) if k is None]
        if len(missing) < len(self.next_key):
            if missing:
                raise ValueError(
                    f"Rollout.next_key[{missing[0]}] is None but other steps recorded theirs: "
                    "every step of a batch records the key of the observation it led to, or none"
                )
            next_state = keys(self.next_key)
        action = StateIndexer()(self.action) if len(self.action) == len(traj) > 0 else None
        return StepBatch(
            group=np.asarray(self.group, dtype=np.int64),
            traj=traj,
            step=np.asarray(self.step, dtype=np.int64),
            reward=np.asarray(self.reward, dtype=np.float64),
            state=state,
            invalid=np.asarray(self.invalid, dtype=bool),
            parent=parent,
            next_state=next_state,
            action=action,
        )


@dataclass
class StepRecord:
    """One step of one episode while it is played (then a row of the :class:`Rollout`)."""

    prompt: list[int]
    response: list[int]
    key: str
    invalid: bool
    engine_logprobs: list[float] | None
    hidden: int = -1
    """The hidden state id of a toy env (agentenvs.toytext; -1 elsewhere), for the exact truth."""
    reward: float = 0.0
    observation: str = ""
    """The observation text the step was taken from, as the env returned it."""
    candidate_entropy: float | None = None
    """action_mode="score": the entropy of the policy over the step's candidates; else None."""
    score_logprobs: list[float] | None = None
    """The response's token log-probs at temperature 1 as the rollout computed them (score
    mode's scoring, or the hf engine's sampling passes); else None."""
    next_key: str | None = None
    """The state key of the observation the step led to (filled after the env stepped)."""
    action: str = ""
    """The action parsed from the response (the text sent to the env)."""


@dataclass
class Acted:
    """One lockstep step's choices for the live slots (in the order of ``live``)."""

    records: list[StepRecord]
    """The step's record per live slot (reward and env-side invalid flag filled after the step)."""
    actions: list[str]
    """The parsed action per live slot (the text sent to the env)."""
    gen_tokens: int
    gen_seconds: float


def act(
    envs: EnvSet,
    engine: Engine,
    tok: Any,
    obs: Sequence[str],
    infos: Sequence[dict[str, Any]],
    live: list[int],
    play: Play,
) -> Acted:
    """Prompt every slot of ``live``, sample its response (one engine call for all), parse the
    action and store (observation, action) in the slot's memory."""
    from hgpo.train.model import encode_prompt

    prompts = [
        encode_prompt(
            tok, envs.prompt(i, obs[i], infos[i]), play.max_prompt_tokens, play.enable_thinking
        )
        for i in live
    ]
    t = time.perf_counter()
    entropy: list[float | None] = [None] * len(live)
    score_lps: list[list[float] | None] = [None] * len(live)
    if play.action_mode == "score":
        cands = [envs.candidates(i, infos[i]) for i in live]
        sampled = score_candidates(engine, tok, prompts, cands, play.temperature)
        responses, entropy = sampled.responses, list(sampled.entropy)
        if sampled.token_logprobs is not None:
            score_lps = list(sampled.token_logprobs)
        engine_lps = None
    else:
        responses = engine.generate(prompts, play.temperature, play.top_p, play.max_response_tokens)
        engine_lps = engine.generated_logprobs()
        own = getattr(engine, "token_logprobs", None)  # the hf engine: the actor's own figures
        if own is not None and (got := own()) is not None:
            score_lps = list(got)
    gen_s = time.perf_counter() - t
    keep = play.keep_samples
    records, actions = [], []
    for j, i in enumerate(live):
        text = tok.decode(responses[j], skip_special_tokens=True)
        parsed = envs.parse(text, infos[i])
        actions.append(parsed.action)
        records.append(
            StepRecord(
                prompt=prompts[j] if keep else [],
                response=responses[j] if keep else [],
                key=envs.key(i, obs[i]),
                invalid=not parsed.valid,
                engine_logprobs=engine_lps[j] if engine_lps and keep else None,
                hidden=int(infos[i].get("hidden_state", -1)),
                observation=obs[i],
                candidate_entropy=entropy[j],
                action=parsed.action,
                score_logprobs=score_lps[j] if keep else None,
            )
        )
        envs.remember(i, obs[i], parsed.action)
    return Acted(records, actions, sum(len(r) for r in responses), gen_s)


def run_episodes(
    envs: EnvSet, engine: Engine, tok: Any, task_ids: list[int], play: Play
) -> Rollout:
    """Play ``task_ids`` x ``play.group_size`` episodes to the end; group g = task_ids[g].

    action_mode "generate" samples free text; "score" samples among the admissible actions'
    responses (:func:`score_and_sample`). ``enable_thinking`` is the chat template's thinking
    switch (:func:`hgpo.train.model.encode_prompt`).

    An episode whose env crashed (at its reset or at a step: the env raised, or its worker died
    or hung) is left out of the batch, not kept as a failed one: its truncated trajectory has
    no return. Its group keeps its other members (group g may hold fewer than group_size
    trajectories, or none); ``Rollout.crashed`` counts them.
    """
    t0 = time.perf_counter()
    obs, infos = envs.reset(task_ids, play.group_size)
    env_s = time.perf_counter() - t0
    B = len(obs)
    crashed = [bool(i.get("crashed")) for i in infos]
    done = np.array(crashed)
    per: list[list[StepRecord]] = [[] for _ in range(B)]
    gen_tokens, gen_s = 0, 0.0
    last_info = list(infos)
    for _ in range(play.max_steps):
        live = [i for i in range(B) if not done[i]]
        if not live:
            break
        acted = act(envs, engine, tok, obs, infos, live, play)
        gen_tokens, gen_s = gen_tokens + acted.gen_tokens, gen_s + acted.gen_seconds
        actions = [""] * B
        for j, i in enumerate(live):
            actions[i] = acted.actions[j]
            per[i].append(acted.records[j])
        t = time.perf_counter()
        obs, rewards, dones, infos = envs.step(actions)
        env_s += time.perf_counter() - t
        for i in live:
            after_step(per[i][-1], float(rewards[i]), infos[i], envs.key(i, obs[i]))
            last_info[i] = infos[i]
            crashed[i] |= bool(infos[i].get("crashed"))
        done = dones.copy()
    out = Rollout(gen_tokens=gen_tokens, gen_seconds=gen_s, env_seconds=env_s)
    for i, steps in enumerate(per):
        if not crashed[i]:  # a crashed episode is no failed one: it is left out
            out.add_trajectory(steps, i // play.group_size, last_info[i])
    out.crashed = out.dropped = sum(crashed)
    warn_crashed(out)
    return out


def after_step(record: StepRecord, reward: float, info: dict[str, Any], next_key: str) -> None:
    """Fill in a step's env reward, env-side invalid flag and the state key of the observation
    it led to (``EnvSet.key`` of the env's returned observation) once the env has stepped."""
    record.reward = reward
    # a toy action invalid in its state costs the penalty too
    record.invalid |= bool(info.get("invalid", False))
    record.next_key = next_key


def warn_crashed(roll: Rollout) -> None:
    """Log how many episodes crashed and were left out of the batch (none: nothing)."""
    if roll.crashed:
        extra = roll.dropped - roll.crashed
        log.warning(
            "%d of %d episodes crashed (their env raised, or its worker died or hung) and are "
            "left out of the batch%s",
            roll.crashed,
            roll.played,
            f", with {extra} branches of theirs" if extra else "",
        )


class LogprobGap(NamedTuple):
    """The rollout engine's log-probs against the trainer's, over the response tokens."""

    total: float
    """Sum of |difference|."""
    tokens: int
    worst: float
    """Largest |difference|."""


def logprob_gap(
    engine_logprobs: Sequence[Sequence[float] | None], trainer_logprobs: Sequence[Any]
) -> LogprobGap:
    """How far the rollout engine's log-probs of the sampled tokens are from the trainer's
    (its old log-probs, same weights): (sum of |difference| over tokens, tokens, max). A weight
    sync that missed a layer shows here at once. Samples without engine log-probs are skipped;
    ``(0.0, 0, 0.0)`` when there are none (the hf engine)."""
    total, n, worst = 0.0, 0, 0.0
    for eng, ours in zip(engine_logprobs, trainer_logprobs, strict=True):
        if not eng:
            continue
        d = np.abs(np.asarray(eng, np.float64) - np.asarray(ours[: len(eng)], np.float64))
        total, n, worst = total + float(d.sum()), n + d.size, max(worst, float(d.max()))
    return LogprobGap(total, n, worst)
