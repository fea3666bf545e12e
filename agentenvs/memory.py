"""The paper's memory module: the last K observations and actions of each environment.

Step t's prompt shows the K most recent (observation, action) pairs, where the observation is the
one the action was taken in. The history text follows the reference implementation
(verl-agent ``SimpleMemory.fetch``): one line per step,
``[Observation {n}: '{obs}', Action {n}: '{action}']``, steps numbered from 1, joined by newlines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hgpo.options import check_int


@dataclass
class EpisodeMemory:
    """History of one environment: every (observation, action) pair since the reset."""

    records: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def store(self, observation: str, action: str) -> None:
        """Record that ``action`` was taken in ``observation``."""
        self.records.append((observation, action))

    def recent(self, history_length: int) -> list[tuple[int, str, str]]:
        """The last ``history_length`` records as (step number from 1, observation, action)."""
        history_length = check_int("history_length", history_length, lo=0)
        if history_length == 0:
            return []
        tail = self.records[-history_length:]
        first = len(self.records) - len(tail) + 1
        return [(first + j, o, a) for j, (o, a) in enumerate(tail)]

    def fetch(self, history_length: int) -> tuple[str, int]:
        """History text of the last ``history_length`` steps and how many steps it holds."""
        rows = self.recent(history_length)
        text = "\n".join(f"[Observation {n}: '{o}', Action {n}: '{a}']" for n, o, a in rows)
        return text, len(rows)


class BatchMemory:
    """One :class:`EpisodeMemory` per environment of a batch (the reference's SimpleMemory)."""

    def __init__(self, batch_size: int = 0) -> None:
        self.reset(batch_size)

    def reset(self, batch_size: int) -> None:
        """Forget everything and hold ``batch_size`` empty histories."""
        batch_size = check_int("batch_size", batch_size, lo=0)
        self.episodes = [EpisodeMemory() for _ in range(batch_size)]

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, idx: int) -> EpisodeMemory:
        return self.episodes[idx]

    def store(self, observations: Sequence[str], actions: Sequence[str]) -> None:
        """Append one step to every environment's history."""
        if len(observations) != len(self.episodes) or len(actions) != len(self.episodes):
            raise ValueError(
                f"store needs one entry per environment ({len(self.episodes)}): "
                f"len(observations)={len(observations)}, len(actions)={len(actions)}"
            )
        for ep, o, a in zip(self.episodes, observations, actions, strict=True):
            ep.store(o, a)

    def fetch(self, history_length: int) -> tuple[list[str], list[int]]:
        """History texts and valid lengths for every environment."""
        out = [ep.fetch(history_length) for ep in self.episodes]
        return [t for t, _ in out], [n for _, n in out]
