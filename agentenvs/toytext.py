"""The toy POMDPs of :mod:`toyenvs` as text environments for the LLM trainer.

``--env toy:FAMILY:param=value,...`` (e.g. ``toy:keydoor:size=4,horizon=20``) builds
``toyenvs.make(FAMILY, **params)`` and plays it behind the same batched interface as ALFWorld and
WebShop (:class:`agentenvs.batched.BatchedEnv`, one :class:`ToyTextEnv` per slot):

- the observation is a readable sentence per observation id (:func:`render`): it is a function
  of the observation id only, so the text aliases exactly the hidden states the POMDP aliases;
- the actions are the family's ``action_names``, all listed as admissible; an action invalid in
  the current state (walking into a wall, taking nothing) can be chosen: the state stays, the
  step reports ``info["invalid"]`` and the estimators charge the 0.1 penalty, as in toyenvs;
  a text that names no action (free-text mode) is treated the same way;
- each task (a start state from the family's train or held-out split) has a task description;
  entering a goal pays 10 and ends the episode, as does the horizon;
- the prompt is the paper's template (memory module: the last K observations and actions, the
  step count, the admissible actions) in :func:`toy_prompt`.

The dynamics are toyenvs' exactly: a slot seeded with ``s`` draws its slip outcomes from
``numpy.random.default_rng(s)`` the way :class:`toyenvs.POMDPEnv` does after ``reset(seed=s)``.
Because the prompt is a function of (t, the K-step context of observation and action ids), the
trainer can compute the exact advantage of the LLM policy itself (:mod:`hgpo.train.truth_monitor`).

Snapshots (branching rollouts): :meth:`ToyTextEnv.snapshot` holds the hidden state, the step
count and the last observation and info, not the random stream. A restore opens a fresh
stream of the restoring slot (the next of its per-episode streams), so a branch draws its own
future slip outcomes instead of replaying its parent's, as ``toyenvs.rollout``'s branches do.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import toyenvs
from agentenvs.memory import EpisodeMemory
from hgpo.options import OptionError, bad, check_int, parse_name_values
from toyenvs.core import POMDP

__all__ = [
    "SPLITS",
    "TOY_PREFIX",
    "ToySnapshot",
    "ToySpec",
    "ToyText",
    "ToyTextEnv",
    "parse_toy_spec",
    "render",
    "toy_corpus",
    "toy_factory",
    "toy_prompt",
]

TOY_PREFIX = "toy:"
SPLITS = ("train", "heldout")

TOY_TEMPLATE_NO_HIS = """
You are an expert agent operating in the {family} environment. Your task is to: {task_description}
Your current observation is: {current_observation}
Your admissible actions of the current situation are: [{admissible_actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291 (the paper's ALFWorld template, trailing space included)

TOY_TEMPLATE = """
You are an expert agent operating in the {family} environment. Your task is to: {task_description}
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} observations and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is: {current_observation}
Your admissible actions of the current situation are: [{admissible_actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToySpec:
    """A parsed ``toy:FAMILY:param=value,...``: the family and its constructor's parameters."""

    family: str
    params: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        """The :class:`toyenvs.POMDP` (built afresh; construction is cheap and deterministic)."""
        return _build(self.family, tuple(sorted(self.params.items())))


@functools.lru_cache(maxsize=8)
def _build(family: str, items: tuple[tuple[str, Any], ...]) -> Any:
    return toyenvs.make(family, **dict(items))


def parse_toy_spec(spec: str, where: str = "--env") -> ToySpec:
    """``"toy:keydoor:size=4,horizon=20"`` -> ``ToySpec("keydoor", {"size": 4, "horizon": 20})``.

    The family is built once to validate it. Raises :class:`hgpo.options.OptionError` (a
    ValueError) naming ``where`` and the known families, or the family's parameters.
    """
    if not isinstance(spec, str) or not spec.startswith(TOY_PREFIX):
        raise bad(where, f"'{TOY_PREFIX}FAMILY:param=value,...'", spec)
    family, _, rest = spec[len(TOY_PREFIX) :].partition(":")
    if family not in toyenvs.FAMILIES:
        raise OptionError(
            f"{where}: unknown toy family {family!r} in {spec!r}; known families: "
            f"{', '.join(toyenvs.FAMILIES)}"
        )
    params = parse_name_values(rest, where=where)
    try:
        toyenvs.make(family, **params)
    except (ValueError, TypeError) as e:
        raise OptionError(f"{where}: {spec!r}: {e}") from None
    return ToySpec(family, params)


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToyText:
    """The text rendering of one POMDP.

    obs_text: one sentence per observation id. task_of_obs: the task description shown with
    each observation id (constant within an episode: it depends only on what every observation
    of the task shows, e.g. household's and shop's task index). actions: the action names.
    task_type: per observation id, the label of per-type validation metrics.
    """

    family: str
    obs_text: tuple[str, ...]
    task_of_obs: tuple[str, ...]
    actions: tuple[str, ...]
    task_type: tuple[str, ...]

    def action_id(self, text: str) -> int:
        """Index of the action named ``text`` (stripped, lower-cased), -1 when none is."""
        if not isinstance(text, str):
            raise bad("action", "a str (the text action)", text)
        try:
            return self.actions.index(text.strip().lower())
        except ValueError:
            return -1


def _keydoor(env: Any) -> tuple[list[str], list[str], list[str]]:
    size = env.params["size"]
    w = size // 2
    texts = []
    for name in env.obs_names:
        r, c = (int(x) for x in re.findall(r"\d+", name))
        room = "left room" if c < w else "right room" if c > w else "doorway of the wall"
        text = f"You are in the {room} at row {r}, column {c}."
        if (r, c) == (size - 1, 0):
            text += " This is where the key lies."
        elif (r, c) == (0, size - 1):
            text += " You reached the goal."
        texts.append(text)
    task = (
        f"pick up the key at row {size - 1}, column 0, go through the door at row {w}, "
        f"column {w}, and reach the goal at row 0, column {size - 1}."
    )
    return texts, [task] * len(texts), ["keydoor"] * len(texts)


_TMAZE_TEXT = {
    "cue-up": "You are at the start of a long corridor. A sign here points up.",
    "cue-down": "You are at the start of a long corridor. A sign here points down.",
    "corridor": "You are in the corridor. It looks the same in both directions.",
    "junction": "You are at the junction at the end of the corridor. Paths lead up and down.",
    "goal": "You found the treasure.",
    "fail": "You reached a dead end.",
}


def _tmaze(env: Any) -> tuple[list[str], list[str], list[str]]:
    texts = [_TMAZE_TEXT[n] for n in env.obs_names]
    task = "walk forward to the junction and turn the way the sign at the start pointed."
    return texts, [task] * len(texts), ["tmaze"] * len(texts)


def _household(env: Any) -> tuple[list[str], list[str], list[str]]:
    locs = env.params["locations"]
    task_list = env.params["task_list"]
    L = len(locs)
    texts, tasks, types = [], [], []
    verbs = {"heat": "heat it with the microwave", "cool": "cool it with the fridge",
             "clean": "clean it in the sinkbasin"}  # fmt: skip
    for o in range(env.n_obs):
        if o == len(task_list) * L * 2:  # the goal
            texts.append("You put the object in place. The task is done.")
            tasks.append("the task is done.")
            types.append("done")
            continue
        k, rest = divmod(o, L * 2)
        loc, here = divmod(rest, 2)
        where = f"You are in {locs[loc]}." if locs[loc].startswith("room") else (
            f"You arrive at {locs[loc]}."
        )  # fmt: skip
        texts.append(where + (" You see the object here." if here else ""))
        ty, obj, target = task_list[k]
        middle = f", {verbs[ty]}," if ty in verbs else ""
        tasks.append(f"take the object from {obj}{middle} and put it in {target}.")
        types.append(ty)
    return texts, tasks, types


def _shop(env: Any) -> tuple[list[str], list[str], list[str]]:
    p = env.params
    n_items, ipp, n_opt = p["n_items"], p["items_per_page"], p["n_options"]
    n_pages = -(-n_items // ipp)
    per_task = 1 + n_pages + n_items * (n_opt + 1)
    per_obs = 1 + n_pages + n_items
    click0 = 4
    texts, tasks = [], []
    for o in range(env.n_obs):
        k, page = divmod(o, per_obs)
        if k >= p["n_tasks"]:
            texts.append(
                "You bought the right item." if page == 0 else "You bought the wrong item."
            )
            tasks.append("the purchase is done.")
            continue
        base = k * per_task
        if page == 0:
            texts.append("You are on the search page of the shop.")
        elif page <= n_pages:
            s = base + page
            items = []
            for j in range(ipp):
                if not env.invalid[s, click0 + j]:
                    i = (int(env.next_state[s, click0 + j, 0]) - base - 1 - n_pages) // (n_opt + 1)
                    items.append(f"click{j}: item {i}")
            texts.append(f"Results page {page} of {n_pages}: {', '.join(items)}.")
        else:
            i = page - 1 - n_pages
            opts = ", ".join(f"select{q}" for q in range(n_opt))
            texts.append(f"The page of item {i}. Options: {opts}. You can buy it.")
        item, opt = p["targets"][k]
        tasks.append(f"buy item {item} with option {opt}.")
    return texts, tasks, ["shop"] * len(texts)


def _random(env: Any) -> tuple[list[str], list[str], list[str]]:
    goal_obs = int(env.obs_of_state[env.n_states - 1])
    texts = [
        "You reached the goal." if o == goal_obs else f"You see signal {o}."
        for o in range(env.n_obs)
    ]
    return texts, ["reach the goal."] * len(texts), ["random"] * len(texts)


_RENDER: dict[str, Callable[[Any], tuple[list[str], list[str], list[str]]]] = {
    "keydoor": _keydoor,
    "tmaze": _tmaze,
    "household": _household,
    "shop": _shop,
    "random": _random,
}


def render(env: Any) -> ToyText:
    """The text of every observation id of ``env`` (a toyenvs.POMDP of a known family)."""
    if not isinstance(env, POMDP):
        raise bad("render: env", "a toyenvs.POMDP", type(env).__name__)
    if env.name not in _RENDER:
        raise ValueError(f"render: no text rendering for family {env.name!r}; known: "
                         f"{', '.join(_RENDER)}")  # fmt: skip
    texts, tasks, types = _RENDER[env.name](env)
    if len(texts) != env.n_obs:  # pragma: no cover - a rendering bug
        raise RuntimeError(f"render({env.name}): {len(texts)} texts for {env.n_obs} observations")
    return ToyText(env.name, tuple(texts), tuple(tasks), tuple(env.action_names), tuple(types))


# --------------------------------------------------------------------------------------------
def split_tasks(env: Any, split: str) -> np.ndarray:
    """Start states of ``split``: "train" (the family's train_tasks) or "heldout"."""
    if split not in SPLITS:
        raise bad("split", f"one of {SPLITS}", split)
    return env.train_tasks if split == "train" else env.heldout_tasks


@dataclass(frozen=True)
class ToySnapshot:
    """What :meth:`ToyTextEnv.snapshot` holds: the episode without its random stream.

    spec: the env it came from (a restore into another spec is refused). state: hidden state.
    t: steps taken (the horizon counts them). obs, info: the last observation and info the env
    returned (reset's or step's).
    """

    spec: ToySpec
    split: str
    state: int
    t: int
    won: bool
    task: str
    task_type: str
    obs: str
    info: dict[str, Any]


class ToyTextEnv:
    """One slot of a toy POMDP as a text environment (see the module docstring).

    reset(task) plays start state ``split_tasks(env, split)[task]``. Episode n of slot ``slot``
    draws its slip outcomes from ``default_rng(SeedSequence([seed, slot, n]))``; its seed is in
    ``info["episode_seed"]`` (the integer ``toyenvs.POMDPEnv.reset(seed=...)`` would need).
    info: admissible_actions (every action name), task, hidden_state, obs_id, invalid (the
    last action was invalid in its state or named no action), action_id (-1 for no action),
    won, task_score (10 when won), task_type.
    """

    supports_snapshot = True

    def __init__(self, spec: ToySpec, split: str = "train", seed: int = 0) -> None:
        self.spec, self.split = spec, split
        self.env = spec.build()
        self.text = render(self.env)
        self.tasks = split_tasks(self.env, split)
        self.seed, self.slot, self.episodes = check_int("seed", seed, lo=0), 0, 0
        self._s, self._t, self._won = 0, 0, False
        self.rng = np.random.default_rng(0)
        self._last: tuple[str, dict[str, Any]] | None = None

    def seed_slot(self, slot: int) -> None:
        """Called by BatchedEnv with the slot number, so that slots draw different outcomes."""
        self.slot = int(slot)

    def _info(self, invalid: bool, action_id: int) -> dict[str, Any]:
        o = int(self.env.obs_of_state[self._s])
        return {
            "admissible_actions": list(self.text.actions),
            "task": self.task,
            "hidden_state": self._s,
            "obs_id": o,
            "invalid": invalid,
            "action_id": action_id,
            "won": self._won,
            "task_score": 10.0 if self._won else 0.0,
            "task_type": self.task_type,
        }

    def _next_stream(self) -> int:
        """Open this slot's next random stream (one per reset or restore); returns its seed."""
        seed = int(
            np.random.SeedSequence([self.seed, self.slot, self.episodes]).generate_state(1)[0]
        )
        self.episodes += 1
        self.rng = np.random.default_rng(seed)
        return seed

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        task = check_int("task", task, lo=0, hi=self.tasks.size - 1)
        episode_seed = self._next_stream()
        self._s, self._t, self._won = int(self.tasks[task]), 0, False
        o = int(self.env.obs_of_state[self._s])
        self.task, self.task_type = self.text.task_of_obs[o], self.text.task_type[o]
        info = self._info(False, -1)
        info["episode_seed"] = episode_seed
        self._last = (self.text.obs_text[o], info)
        return self.text.obs_text[o], copy.deepcopy(info)

    def snapshot(self) -> ToySnapshot:
        """The current episode (hidden state, step count, last observation and info), without
        the random stream (see the module docstring)."""
        if self._last is None:
            raise ValueError("snapshot called before reset")
        obs, info = self._last
        return ToySnapshot(self.spec, self.split, self._s, self._t, self._won, self.task,
                           self.task_type, obs, copy.deepcopy(info))  # fmt: skip

    def restore(self, snap: ToySnapshot) -> tuple[str, dict[str, Any]]:
        """Continue ``snap``'s episode here, drawing from this slot's next random stream
        (its seed: ``self.stream_seed``); returns the observation and info current when it
        was taken (a snapshot of a reset keeps the parent's ``episode_seed`` there)."""
        if not isinstance(snap, ToySnapshot):
            raise TypeError(f"restore: expected a ToySnapshot, got {type(snap).__name__}")
        if (snap.spec, snap.split) != (self.spec, self.split):
            raise ValueError(
                f"restore: snapshot of {snap.spec} ({snap.split}), this env plays "
                f"{self.spec} ({self.split})"
            )
        self.stream_seed = self._next_stream()
        self._s, self._t, self._won = snap.state, snap.t, snap.won
        self.task, self.task_type = snap.task, snap.task_type
        self._last = (snap.obs, copy.deepcopy(snap.info))
        return snap.obs, copy.deepcopy(snap.info)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Returns (observation text, env reward without the penalty, done, info)."""
        env, a = self.env, self.text.action_id(action)
        if a < 0:
            bad_action, s2 = True, self._s
        else:
            bad_action = bool(env.invalid[self._s, a])
            probs = env.next_prob[self._s, a]
            # the same draw as toyenvs.POMDPEnv.step, so a seed replays the same outcomes
            b = 0 if probs[0] >= 1.0 else int(self.rng.choice(probs.size, p=probs))
            s2 = int(env.next_state[self._s, a, b])
        self._s, self._t = s2, self._t + 1
        reward = float(env.reward_enter[s2]) if a >= 0 else 0.0
        terminated = bool(env.terminal[s2])
        self._won = terminated and reward > 0
        done = terminated or self._t >= env.horizon
        obs, info = self.text.obs_text[int(env.obs_of_state[s2])], self._info(bad_action, a)
        self._last = (obs, info)
        return obs, reward, done, copy.deepcopy(info)


def _make_env(spec: ToySpec, split: str, seed: int) -> ToyTextEnv:
    return ToyTextEnv(spec, split, seed)


def toy_factory(spec: ToySpec, split: str = "train", seed: int = 0) -> Callable[[], ToyTextEnv]:
    """Factory of :class:`ToyTextEnv` slots for :class:`agentenvs.batched.BatchedEnv`."""
    if not isinstance(spec, ToySpec):
        raise bad("toy_factory: spec", "a ToySpec (agentenvs.toytext.parse_toy_spec)", spec)
    seed = check_int("seed", seed, lo=0)
    split_tasks(spec.build(), split)  # validates the split
    return functools.partial(_make_env, spec, split, seed)


def toy_corpus(spec: str) -> list[str]:
    """Text a tiny tokenizer for ``spec`` is trained on: templates, observations, tasks, and
    each action in its tags many times over, so that BPE gives every action name about as many
    tokens: a summed-log-prob score (action_mode "score") of a random model then starts near
    uniform instead of favouring the shortest name by several nats per extra token."""
    tt = render(parse_toy_spec(spec).build())
    tagged = " ".join(f"<action>{a}</action>" for a in tt.actions)
    return [TOY_TEMPLATE, TOY_TEMPLATE_NO_HIS, *sorted(set(tt.obs_text)),
            *sorted(set(tt.task_of_obs)), *[tagged] * 50]  # fmt: skip


# --------------------------------------------------------------------------------------------
def format_toy_actions(actions: Sequence[str]) -> str:
    """Actions as the ALFWorld template lists them: quoted, "\\n " between."""
    return "\n ".join(f"'{a}'" for a in actions)


def toy_prompt(
    family: str,
    task: str,
    observation: str,
    actions: Sequence[str],
    memory: EpisodeMemory,
    history_length: int,
) -> str:
    """The paper-style prompt of the current step (no-history form at step 1 or K = 0)."""
    acts = format_toy_actions(actions)
    if len(memory) == 0 or history_length <= 0:
        return TOY_TEMPLATE_NO_HIS.format(
            family=family, task_description=task, current_observation=observation,
            admissible_actions=acts,
        )  # fmt: skip
    history, n = memory.fetch(history_length)
    return TOY_TEMPLATE.format(
        family=family, task_description=task, step_count=len(memory), history_length=n,
        action_history=history, current_step=len(memory) + 1, current_observation=observation,
        admissible_actions=acts,
    )  # fmt: skip
