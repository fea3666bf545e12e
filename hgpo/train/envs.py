"""The trainer's view of a benchmark (its adapter, agentenvs.registry): splits, batched envs,
prompts and grouping keys."""

from __future__ import annotations

import functools
import os
from typing import Any, Protocol

import numpy as np

from agentenvs import BatchedEnv, BatchMemory, EpisodeMemory, ParsedAction
from agentenvs.adapters import Benchmark
from agentenvs.batched import require_snapshot
from agentenvs.registry import benchmark
from hgpo.options import check_int
from hgpo.train.train_config import TrainConfigError

TRAIN_SPLIT = "train"

CRASH_ENV = "HGPO_TRAIN_ENV_CRASH"
"""Test hook: "S1,S2,...@T" makes the training envs of slots S1, S2, ... raise at the T-th step
of every episode (counted from its reset or restore); "...@T:exit" makes their worker exit
there instead (every slot of that worker crashes). Validation envs are left alone."""


class CrashingEnv:
    """An env that crashes at a set step (the :data:`CRASH_ENV` hook); else the wrapped env."""

    def __init__(self, env: Any, slots: set[int], at: int, how: str) -> None:
        self._env, self._slots, self._at, self._how = env, slots, at, how
        self._slot, self._t = -1, 0

    def seed_slot(self, slot: int) -> None:
        self._slot = slot
        if hasattr(self._env, "seed_slot"):
            self._env.seed_slot(slot)

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        self._t = 0
        return self._env.reset(task)

    def restore(self, snap: Any) -> tuple[str, dict[str, Any]]:
        self._t = 0
        return self._env.restore(snap)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self._t += 1
        if self._slot in self._slots and self._t == self._at:
            if self._how == "exit":
                os._exit(3)
            raise RuntimeError(f"{CRASH_ENV}: slot {self._slot} crashes at step {self._t}")
        return self._env.step(action)

    def __getattr__(self, name: str) -> Any:  # snapshot, supports_snapshot, ...
        if name.startswith("_"):  # (not set yet: unpickling)
            raise AttributeError(name)
        return getattr(self._env, name)


def _crashing(factory: Any, rule: str) -> Any:
    """``factory`` whose envs crash as the :data:`CRASH_ENV` rule ``rule`` says."""
    where, _, how = rule.partition(":")
    slots, _, at = where.partition("@")
    if not at.isdigit() or how not in ("", "exit"):
        raise ValueError(f"{CRASH_ENV}: must be 'S1,S2,...@T' or 'S1,...@T:exit', got {rule!r}")
    chosen = {int(x) for x in slots.split(",") if x.strip()}
    return functools.partial(_build_crashing, factory, chosen, int(at), how)


def _build_crashing(factory: Any, slots: set[int], at: int, how: str) -> CrashingEnv:
    return CrashingEnv(factory(), slots, at, how)


class SlotBaseEnv:
    """An env whose ``seed_slot(slot)`` passes ``base + slot`` on (else the wrapped env): the
    envs of an :class:`EnvSet` built with ``slot_base`` draw their own random streams, as
    slots ``base``, ``base + 1``, ... of one big batch would."""

    def __init__(self, env: Any, base: int) -> None:
        self._env, self._base = env, base

    def seed_slot(self, slot: int) -> None:
        if hasattr(self._env, "seed_slot"):
            self._env.seed_slot(self._base + slot)

    def __getattr__(self, name: str) -> Any:  # reset, step, snapshot, supports_snapshot, ...
        if name.startswith("_"):  # (not set yet: unpickling)
            raise AttributeError(name)
        return getattr(self._env, name)


def _build_slot_base(factory: Any, base: int) -> SlotBaseEnv:
    return SlotBaseEnv(factory(), base)


def val_splits(env: str) -> tuple[str, ...]:
    """Held-out splits of ``env``'s benchmark (``Benchmark.val_splits``): ALFWorld in
    (valid_seen) and out of distribution (valid_unseen); WebShop eval; a toy family its
    held-out start states."""
    return benchmark(env).val_splits


class BenchmarkSettings(Protocol):
    """What the trainer reads of a run's config to reach its benchmark: ``env``. The config is
    then handed on whole to the adapter's callables (``Benchmark.split_size``, ``factory``,
    ...), which read the fields of their own Protocol (``WebShopSettings``,
    ``AlfWorldSettings``, ``ToySettings`` in ``agentenvs.adapters.*_bench``): which fields a
    benchmark needs is the adapter's business, so no Protocol here can list them."""

    env: str


class EnvActorSettings(BenchmarkSettings, Protocol):
    """The settings :func:`env_actors` and :func:`check_ray_capacity` read."""

    groups_per_iter: int
    group_size: int
    env_workers: int
    val_every: int
    val_tasks: int


class EnvSetSettings(BenchmarkSettings, Protocol):
    """The settings :class:`EnvSet` reads (and hands on to its benchmark's adapter)."""

    env_workers: int
    env_timeout_s: float
    env_backend: str
    history_length: int


def split_size(cfg: BenchmarkSettings, split: str) -> int:
    """Number of tasks of ``split``."""
    return benchmark(cfg.env).split_size(cfg, split)


def env_actors(cfg: EnvActorSettings, world: int = 1) -> dict[str, int]:
    """Env workers the run keeps at once, over its ``world`` ranks, per split: the training
    set, and (``val_every`` > 0) each validation split's set, built at the first validation
    and kept to the end. Each is ``BatchedEnv``'s min(env_workers, that rank's slots)."""
    per_rank = (cfg.groups_per_iter // world) * cfg.group_size
    out = {TRAIN_SPLIT: world * min(cfg.env_workers, per_rank)}
    if cfg.val_every:
        for split in val_splits(cfg.env):
            n = min(cfg.val_tasks, split_size(cfg, split))
            mine = [len(range(r, n, world)) for r in range(world)]
            out[split] = sum(min(cfg.env_workers, m) for m in mine)
    return out


def check_ray_capacity(cfg: EnvActorSettings, world: int = 1) -> None:
    """With ``env_backend="ray"``: raise TrainConfigError unless the Ray cluster has a free CPU
    for every env actor the run will hold (:func:`env_actors`), before any work; otherwise
    the first set that does not fit would wait minutes for a CPU (at the first validation,
    after an iteration was trained)."""
    from agentenvs.ray_backend import ACTOR_CPUS, free_cpus

    actors = env_actors(cfg, world)
    need = sum(actors.values()) * ACTOR_CPUS
    free, total = free_cpus("TrainConfig.env_backend='ray'")
    if need <= free:
        return
    parts = ", ".join(f"{n} {split}" for split, n in actors.items())
    ranks = f" over {world} ranks" if world > 1 else ""
    raise TrainConfigError(
        f"TrainConfig.env_workers: {cfg.env_workers} per env set makes {sum(actors.values())} "
        f"Ray env actors ({parts}{ranks}; {ACTOR_CPUS} CPU each), but the Ray cluster has "
        f"{free:g} of {total:g} CPUs free; lower --env-workers, "
        + ("set --val-every 0 (no validation sets), " if cfg.val_every else "")
        + "or give the cluster more CPUs"
    )


class EnvSet:
    """One split of a benchmark as a :class:`BatchedEnv` of ``num_envs`` slots, with prompts
    (the benchmark's adapter, :func:`agentenvs.registry.benchmark`, builds and reads them).

    ``slot_base``: the slot number its first env is seeded with (``seed_slot``; an env with
    randomness of its own, a toy POMDP with slip, draws its stream from it); 0 in the trainer,
    where one EnvSet holds the whole batch. A set that plays one episode of a larger batch
    (hgpo.integrations.verl_loop) gives each episode its own base."""

    def __init__(self, cfg: EnvSetSettings, split: str, num_envs: int, slot_base: int = 0) -> None:
        self.cfg: EnvSetSettings = cfg
        self.split = split
        self.bench: Benchmark = benchmark(cfg.env)
        self.num_tasks = self.bench.split_size(cfg, split)
        factory = self.bench.factory(cfg, split)
        if check_int("EnvSet: slot_base", slot_base, lo=0):
            factory = functools.partial(_build_slot_base, factory, slot_base)
        if split == TRAIN_SPLIT and os.environ.get(CRASH_ENV):
            factory = _crashing(factory, os.environ[CRASH_ENV])
        self._env = BatchedEnv(
            factory,
            num_envs,
            num_workers=cfg.env_workers,
            timeout_s=cfg.env_timeout_s,
            backend=cfg.env_backend,
        )
        self._memory = BatchMemory(num_envs)
        self._tasks: list[str] = [""] * num_envs

    def reset(self, task_ids: list[int], group_n: int) -> tuple[list[str], list[dict[str, Any]]]:
        """Start the tasks (each ``group_n`` times), forget the memories, read the goal texts."""
        obs, infos = self._env.reset(task_ids, group_n)
        self._memory.reset(len(obs))
        for i, (o, info) in enumerate(zip(obs, infos, strict=True)):
            self._tasks[i] = self.bench.task_text(o, info)
        return obs, infos

    def shown(self, i: int, obs: str) -> str:
        """What the prompt and the memory show of observation ``obs`` of slot ``i``."""
        return self.bench.shown(obs, self._tasks[i])

    def key(self, i: int, obs: str) -> str:
        """The state key HGPO groups by (``Benchmark.key``)."""
        return self.bench.key(obs, self._tasks[i])

    def prompt(self, i: int, obs: str, info: dict[str, Any]) -> str:
        """The paper's prompt of slot ``i`` (memory module + template)."""
        admissible = info.get("admissible_actions", [])
        return self.bench.prompt(
            self.cfg.env, self._tasks[i], self.shown(i, obs), admissible, self._memory[i],
            self.cfg.history_length,
        )  # fmt: skip

    def candidates(self, i: int, info: dict[str, Any]) -> list[str]:
        """The actions action_mode="score" chooses from at slot ``i``."""
        return self.bench.candidates(info.get("admissible_actions", []), self._tasks[i])

    def parse(self, text: str, info: dict[str, Any]) -> ParsedAction:
        """The action of response ``text`` at a step with ``info`` (``Benchmark.parse``)."""
        return self.bench.parse(text, info)

    def step(self, actions: list[str]) -> tuple[list[str], np.ndarray, np.ndarray, list[dict]]:
        """Step every slot that is not done with its action: (obs, rewards, dones, infos)."""
        return self._env.step(actions)

    # -- snapshots (branched rollouts, hgpo.train.branched_play) -----------------------------------
    def require_snapshot(self, where: str) -> None:
        """OptionError naming ``where`` and the env unless its envs snapshot and restore."""
        require_snapshot(self.cfg.env, self._env, where=where)

    def step_and_snapshot(
        self, actions: list[str]
    ) -> tuple[list[str], np.ndarray, np.ndarray, list[dict], list[Any]]:
        """:meth:`step`, plus the snapshot of every slot still live after it (None for the
        others), in the same round trip to the workers."""
        return self._env.step(actions, snapshot=True)

    def snapshot(self, slots: list[int]) -> list[Any]:
        """The snapshot of each of the live ``slots`` (None where taking it crashed the slot)."""
        return self._env.snapshot(slots)

    def restore(
        self, pairs: list[tuple[int, Any]], memories: list[EpisodeMemory]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Restore each (slot, snapshot) of ``pairs`` with its prompt memory: (obs, infos) of
        each, in order. The slot keeps its task text: a snapshot is restored into a slot of
        its own rollout group."""
        obs, infos = self._env.restore(pairs)
        for (i, _), memory in zip(pairs, memories, strict=True):
            self._memory.episodes[i] = memory
        return obs, infos

    def park(self, slots: list[int]) -> None:
        """Leave ``slots`` out of the next steps (done) until a restore makes them live."""
        self._env.park(slots)

    def memory(self, i: int) -> EpisodeMemory:
        """Slot ``i``'s prompt memory (the object :meth:`remember` appends to)."""
        return self._memory[i]

    def done(self, i: int) -> bool:
        """Whether slot ``i``'s episode has ended."""
        return bool(self._env.done[i])

    def remember(self, i: int, obs: str, action: str) -> None:
        """Store (observation, action) in slot ``i``'s memory (the next prompts show it)."""
        self._memory[i].store(self.shown(i, obs), action)

    def task(self, i: int) -> str:
        """The goal text of slot ``i``'s task."""
        return self._tasks[i]

    def close(self) -> None:
        """Stop the env workers."""
        self._env.close()
