"""Generate-mode validity and success of a model on held-out tasks (the warm start's before/after).

:func:`evaluate` plays ``repeats`` episodes of each of the first ``tasks`` tasks of a split with
free-text generation (``action_mode="generate"``, the trainer's prompt path, sampling and
parser) and counts the steps whose response holds a valid action (the trainer's invalid flag:
no parseable admissible action, or on a toy env an action invalid in its state), the steps
whose response has the format at all (admissible or not) and the won episodes. :func:`table`
prints them with 95% Wilson intervals (statsmodels).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from hgpo.options import check_int

__all__ = ["EvalCounts", "evaluate", "table", "wilson"]


@dataclass(frozen=True)
class EvalCounts:
    """What one evaluation counted."""

    split: str
    tasks: int
    episodes: int
    """Episodes played to the end (crashed ones are not counted)."""
    won: int
    steps: int
    valid_steps: int
    crashed: int
    seconds: float
    formatted_steps: int | None = None
    """Steps whose response has the format (``<think>..</think><action>..</action>``, the
    reference parser's validity, ``agentenvs.parser.parse_action`` without admissibility),
    whatever its action: a valid step is formatted and also admissible (and, on a toy env,
    possible in its state). None where not counted."""
    transcripts: tuple[dict[str, Any], ...] = ()
    """The steps of the first episode of each task (its group's first trajectory): task, step,
    the observation's last 300 characters, the response text, the action sent, valid, and the
    episode's success: what the counts came from, for a reader to check."""

    def as_dict(self) -> dict[str, Any]:
        """The counts and their 95% Wilson intervals, for the JSON report."""
        return {
            **dataclasses.asdict(self),
            "success_ci95": list(wilson(self.won, self.episodes)),
            "validity_ci95": list(wilson(self.valid_steps, self.steps)),
            "format_ci95": None
            if self.formatted_steps is None
            else list(wilson(self.formatted_steps, self.steps)),
        }


def wilson(count: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of ``count`` of ``n`` (statsmodels ``proportion_confint``);
    (0, 1) when n is 0."""
    if n == 0:
        return (0.0, 1.0)
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(count, n, alpha=0.05, method="wilson")
    return (float(lo), float(hi))


def evaluate(cfg: Any, model: Any, tok: Any, split: str, tasks: int, repeats: int) -> EvalCounts:
    """Play ``repeats`` generate-mode episodes of each of the first ``tasks`` tasks of ``split``
    with ``model`` at ``cfg.val_temperature`` (``cfg``: a TrainConfig) and count them."""
    import torch

    from hgpo.train.envs import EnvSet
    from hgpo.train.episodes import Play, run_episodes
    from hgpo.train.hf_engine import HFEngine

    check_int("tasks", tasks, lo=1)
    check_int("repeats", repeats, lo=1)
    play = dataclasses.replace(  # keep_samples: the responses, for the transcripts
        Play.validation(cfg), group_size=repeats, action_mode="generate", keep_samples=True
    )
    engine = HFEngine(model, tok, cfg.rollout_batch_size, torch.device("cpu"))
    t0 = time.perf_counter()
    envs = EnvSet(cfg, split, tasks * repeats)
    try:
        roll = run_episodes(envs, engine, tok, list(range(tasks)), play)
    finally:
        envs.close()
    return EvalCounts(
        split=split,
        tasks=tasks,
        episodes=len(roll.success),
        won=int(sum(roll.success)),
        steps=len(roll.invalid),
        valid_steps=int(sum(not x for x in roll.invalid)),
        crashed=roll.crashed,
        seconds=time.perf_counter() - t0,
        formatted_steps=sum(formatted(ids, tok) for ids in roll.response_ids),
        transcripts=transcripts(roll, tok),
    )


def formatted(ids: list[int], tok: Any) -> bool:
    """Whether a response (token ids, decoded as the rollout decodes them) has the action
    format, admissible or not."""
    from agentenvs.parser import parse_action

    return parse_action(tok.decode(ids, skip_special_tokens=True)).valid


def transcripts(roll: Any, tok: Any, chars: int = 300) -> tuple[dict[str, Any], ...]:
    """The steps of each group's first trajectory of a :class:`~hgpo.train.episodes.Rollout`
    (rows in trajectory order), each response decoded as written (:func:`_text`)."""
    first: dict[int, int] = {}
    for g, t in zip(roll.group, roll.traj, strict=True):
        first.setdefault(g, t)
    keep = set(first.values())
    return tuple(
        {
            "task": roll.group[i],
            "step": roll.step[i],
            "observation": roll.observation[i][-chars:],
            "response": _text(roll.response_ids[i], tok),
            "action": roll.action[i],
            "valid": not roll.invalid[i],
            "won": bool(roll.success[roll.traj[i]]),
        }
        for i in range(len(roll.traj))
        if roll.traj[i] in keep
    )


def _text(ids: list[int], tok: Any) -> str:
    """A response's text without its trailing end and padding tokens (the format's tags may be
    special tokens of a tokenizer, so special tokens are kept)."""
    ends = {tok.eos_token_id, tok.pad_token_id} - {None}
    n = len(ids)
    while n and ids[n - 1] in ends:
        n -= 1
    return tok.decode(ids[:n], skip_special_tokens=False)


def _cell(count: int, n: int) -> str:
    lo, hi = wilson(count, n)
    return f"{count}/{n} = {count / n if n else 0.0:.2f} [{lo:.2f}, {hi:.2f}]"


def table(env: str, before: EvalCounts | None, after: EvalCounts) -> str:
    """A Markdown table of the evaluations (counts, rates, 95% Wilson intervals); ``before``
    None: the after row only."""
    rows = [
        "| env | split | model | episodes | success [95% CI] | valid steps [95% CI] "
        "| formatted steps [95% CI] | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in (("before", before), ("after", after)):
        if c is None:
            continue
        rows.append(
            f"| {env} | {c.split} | {name} | {c.episodes} | {_cell(c.won, c.episodes)} | "
            f"{_cell(c.valid_steps, c.steps)} | "
            f"{'-' if c.formatted_steps is None else _cell(c.formatted_steps, c.steps)} | "
            f"{c.seconds:.0f} |"
        )
    return "\n".join(rows)
