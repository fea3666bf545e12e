"""One worker's environments, run one command at a time: what a worker process
(:mod:`agentenvs.batched`) and a Ray actor (:mod:`agentenvs.ray_backend`) both host.

:class:`EnvHost` builds the environments of its slots with the factory and runs a command
("reset", "step", "step_snapshot", "snapshot", "restore", "supports_snapshot") on each; an
exception in one environment is that slot's crash (``info["crashed"]``, the slot rebuilt), never
the host's. :class:`TextEnv` and :class:`SnapshotEnv` say what it needs of an environment.
``agentenvs.batched`` re-exports these names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["EnvHost", "Payloads", "SnapshotEnv", "TextEnv", "env_supports_snapshot"]

log = logging.getLogger("agentenvs.batched")  # the records keep the batched envs' logger name


class TextEnv(Protocol):
    """What a worker needs of an environment."""

    def reset(self, task: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]: ...


class SnapshotEnv(TextEnv, Protocol):
    """An environment that can be snapshotted and restored (branching rollouts).

    ``snapshot()`` returns a picklable value holding everything the current episode needs to go
    on as if never interrupted; ``restore(snap)`` puts this environment (possibly another
    instance, in another process) into that state and returns the (observation, info) that
    were current when the snapshot was taken.
    """

    supports_snapshot: bool

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> tuple[str, dict[str, Any]]: ...


def env_supports_snapshot(env: object) -> bool:
    """True when ``env`` says ``supports_snapshot = True`` and has ``snapshot``/``restore``."""
    return (
        bool(getattr(env, "supports_snapshot", False))
        and callable(getattr(env, "snapshot", None))
        and callable(getattr(env, "restore", None))
    )


def _crash_info(err: str) -> dict[str, Any]:
    return {
        "won": False,
        "task_score": 0.0,
        "task_type": "",
        "admissible_actions": [],
        "crashed": True,
        "error": err,
    }


def _build(factory: Callable[[], TextEnv], slot: int) -> TextEnv:
    """One slot's environment; one with randomness of its own (a toy POMDP with slip) learns
    its slot number through ``seed_slot`` so that the members of a group draw differently."""
    env = factory()
    seed_slot = getattr(env, "seed_slot", None)
    if seed_slot is not None:
        seed_slot(slot)
    return env


class EnvHost:
    """The environments of one worker's slots, run one command at a time (in a worker process
    or a Ray actor). An exception in one environment is that slot's crash, never the host's."""

    def __init__(self, factory: Callable[[], TextEnv], slots: list[int]) -> None:
        self.factory = factory
        try:
            self.envs: dict[int, TextEnv] = {s: _build(factory, s) for s in slots}
            self.build_error = ""
        except Exception as e:  # e.g. a missing optional dependency: report it on every command
            self.envs, self.build_error = {}, f"building the environment failed: {e!r}"
            log.error("%s", self.build_error)

    def run(self, cmd: str, payload: list[tuple[int, Any]]) -> list[tuple]:
        """``cmd`` on each (slot, arg) of ``payload``; returns (slot, obs, reward, done, info,
        snap) per slot, in payload order.

        cmd (arg): "reset" (task), "step" (action), "step_snapshot" (action; snap is the
        snapshot after the step, None when the step ended the episode), "snapshot" (unused;
        obs "", info {}), "restore" (a snapshot's state), "supports_snapshot" (unused; snap is
        a bool). snap is None for the other commands.
        """
        if self.build_error:
            return [
                (slot, "", 0.0, True, _crash_info(self.build_error), None) for slot, _ in payload
            ]
        out = []
        for slot, arg in payload:
            try:
                out.append((slot, *self._one(cmd, self.envs[slot], arg)))
            except Exception as e:  # an env bug must not stop the batch
                log.warning("env slot %d crashed during %s: %r", slot, cmd, e)
                out.append((slot, "", 0.0, True, _crash_info(repr(e)), None))
                try:
                    self.envs[slot] = _build(self.factory, slot)
                except Exception as e2:
                    log.error("rebuilding slot %d failed: %r", slot, e2)
        return out

    @staticmethod
    def _one(cmd: str, env: Any, arg: Any) -> tuple[str, float, bool, dict[str, Any], Any]:
        """One command on one environment: (obs, reward, done, info, snap)."""
        if cmd == "reset":
            obs, info = env.reset(arg)
            return obs, 0.0, False, info, None
        if cmd == "step":
            return (*env.step(arg), None)
        if cmd == "step_snapshot":
            obs, reward, done, info = env.step(arg)
            return obs, reward, done, info, None if done else env.snapshot()
        if cmd == "snapshot":
            return "", 0.0, False, {}, env.snapshot()
        if cmd == "restore":
            obs, info = env.restore(arg)
            return obs, 0.0, False, info, None
        if cmd == "supports_snapshot":
            return "", 0.0, False, {}, env_supports_snapshot(env)
        raise ValueError(f"unknown env command {cmd!r}")


Payloads = dict[int, list[tuple[int, Any]]]
"""Per worker index, the (slot, argument) pairs of one command."""
