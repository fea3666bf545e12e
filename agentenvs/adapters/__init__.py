"""What the trainer needs of one benchmark: :class:`Benchmark`, one adapter module per benchmark.

``agentenvs.adapters.alfworld_bench``, ``webshop_bench`` and ``toy_bench`` each define one
:class:`Benchmark`; :mod:`agentenvs.registry` holds them by name (``BENCHMARKS``, the way
``hgpo.ESTIMATORS`` holds the estimators) and looks an ``--env`` string up
(:func:`agentenvs.registry.benchmark`). Code outside the adapters asks the benchmark and never
compares its name. Adding a benchmark is one adapter module plus one ``register`` call.

The files are named ``<name>_bench.py`` so that none shares a name with the env packages
(``agentenvs/alfworld/``, ``agentenvs/webshop/``), the installed ``alfworld`` package, the
top-level ``benchmarks/`` scripts or ``agentenvs/webshop/adapter.py``.

The ``settings`` argument of the callables is a run's config (``hgpo.train.train_config.TrainConfig``
or anything with the attributes the adapter reads, each listed by its ``Settings`` Protocol).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentenvs.batched import TextEnv
from agentenvs.memory import EpisodeMemory
from agentenvs.parser import ParsedAction

__all__ = ["Benchmark", "unique_actions"]


def unique_actions(admissible: Sequence[str], task: str = "") -> list[str]:
    """The admissible actions in order, each once (score mode's candidates of most benchmarks)."""
    out: list[str] = []
    for a in admissible:
        if a not in out:
            out.append(a)
    return out


def _no_text(env: str) -> list[str]:
    return []


def _no_problem(settings: Any) -> str | None:
    return None


def _no_check(env: str, where: str) -> None:
    return None


@dataclass(frozen=True)
class Benchmark:
    """One benchmark as the trainer, the warm start and the preflight checks use it."""

    name: str
    """Registry key (``BENCHMARKS[name]``); the ``--env`` value itself unless ``spec``."""
    defaults: Mapping[str, Any]
    """The paper's settings of this benchmark (max_steps, max_prompt_tokens, ...), applied
    before a preset (by ``hgpo.train.train_config.resolve``)."""
    val_splits: tuple[str, ...]
    """Held-out splits the trainer validates on."""
    split_size: Callable[[Any, str], int]
    """(settings, split) -> number of tasks of the split."""
    factory: Callable[[Any, str], Callable[[], TextEnv]]
    """(settings, split) -> the env factory of ``BatchedEnv`` (called in its workers)."""
    task_text: Callable[[str, dict[str, Any]], str]
    """(first observation, its info) -> the goal text of the episode."""
    shown: Callable[[str, str], str]
    """(observation, task) -> what the prompt and the memory show of the observation."""
    key: Callable[[str, str], str]
    """(observation, task) -> the state key HGPO groups steps by."""
    prompt: Callable[[str, str, str, Sequence[str], EpisodeMemory, int], str]
    """(env string, task, shown observation, admissible actions, memory, K) -> the prompt."""
    parse: Callable[[str, dict[str, Any]], ParsedAction]
    """(response text, the step's info) -> the parsed action sent to the env."""
    candidates: Callable[[Sequence[str], str], list[str]] = unique_actions
    """(admissible actions, task) -> the actions action_mode="score" chooses from."""
    spec: bool = False
    """True when ``--env`` is ``NAME:...`` (parameters after the name), e.g. "toy:keydoor:size=4"."""
    usage: str = ""
    """How ``--env`` names it in an error's list of choices (default: ``name``)."""
    check: Callable[[str, str], None] = _no_check
    """(env string, where) -> None, or a named error for a bad spec."""
    templates: tuple[str, ...] = ()
    """Prompt templates the tiny model's tokenizer is trained on (for every env)."""
    sample_text: tuple[str, ...] = ()
    """Typical env strings the tiny model's tokenizer is trained on (for every env)."""
    corpus: Callable[[str], list[str]] = _no_text
    """(env string) -> text the tiny tokenizer of this env alone adds (before the rest)."""
    extras: tuple[str, ...] = ()
    """The ``pip install -e '.[X]'`` extras it needs (names in ``hgpo.extras.EXTRAS``)."""
    modules: tuple[str, ...] = ()
    """The modules the preflight check asks for (those of the extras the env imports)."""
    snapshots: bool = True
    """Its envs snapshot and restore (branching rollouts)."""
    own_horizon: bool = False
    """Its envs end episodes at their own horizon: a preset's ``max_steps`` (the tiny preset's
    3) does not cut them short, only ``--max-steps`` does (``hgpo.train.train_config.resolve``)."""
    exact_truth: bool = False
    """Its hidden states are known and enumerable (``--truth-every``, hgpo.train.truth_monitor)."""
    paper: bool = False
    """The paper ran it: the ``{name}-{size}-k{K}`` presets exist."""
    reference_profile: str | None = None
    """The verl-agent recipe its ``--reference-options`` reproduce: a key of
    ``hgpo.config.REFERENCE_PROFILES`` (None: the reference has no recipe for it)."""
    expert_plans: Callable[[Any, list[int]], list[list[str]]] | None = None
    """(settings, training task ids) -> the scripted expert's actions of each (warm start)."""
    preflight: Callable[[Any], str | None] = field(default=_no_problem)
    """(settings) -> None, or the one-line problem the run would meet (checked before work)."""

    @property
    def install(self) -> str:
        """The command that installs its extras ("" when it needs none)."""
        return f"pip install -e '.[{','.join(self.extras)}]'" if self.extras else ""
