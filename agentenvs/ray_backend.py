"""Environment workers as Ray actors: ``BatchedEnv(..., backend="ray")``.

Each worker is one actor (:class:`EnvWorker`) hosting a contiguous block of slots through the
same :class:`agentenvs.envhost.EnvHost` as a worker process, so slots, ordering, observations
and rewards are those of the process backend. Actors ask for one CPU each and are spread over
the cluster's nodes (``SPREAD``), like verl-agent's ``AlfworldWorker``/``WebshopWorker``.

Recovery is the process backend's: a command waits at most ``timeout_s`` for every actor
(``ray.wait``); an actor that died (``RayActorError``) or did not answer is killed
(``ray.kill``) and a new one is started with fresh environments; its slots report
``crashed`` and done for that step and start again at the next reset. Ray's own actor
restarts are off (``max_restarts=0``) so that this one path handles every failure.

Needs the ``[ray]`` extra; every node needs this project importable (installed, or on
``PYTHONPATH``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from agentenvs.envhost import EnvHost, Payloads, TextEnv
from agentenvs.ray_cluster import ensure_ray, import_ray

log = logging.getLogger(__name__)

ray = import_ray("BatchedEnv(backend='ray')")

ACTOR_CPUS = 1
"""Logical CPUs each env actor asks of Ray."""

STARTUP_S = 120.0
"""Seconds an actor may take to be placed, start and build its environments (on top of
``timeout_s``); longer means the cluster has no free CPU for it, which is said in the error."""


@ray.remote(num_cpus=ACTOR_CPUS, max_restarts=0)
class EnvWorker:
    """The environments of one block of slots, on whichever node Ray placed this actor."""

    def __init__(self, factory: Callable[[], TextEnv], slots: list[int]) -> None:
        self.host = EnvHost(factory, slots)

    def run(self, cmd: str, payload: list[tuple[int, Any]]) -> list[tuple]:
        return self.host.run(cmd, payload)

    def where(self) -> tuple[int, str]:
        """(process id, Ray node id) of this actor."""
        return os.getpid(), ray.get_runtime_context().get_node_id()


def free_cpus(where: str, address: str = "") -> tuple[float, float]:
    """(free, total) logical CPUs of the Ray cluster at ``address`` (joined, or started here,
    for the rest of the process as the env actors need: :func:`agentenvs.ray_cluster.ensure_ray`)."""
    ensure_ray(where, address)
    return (
        float(ray.available_resources().get("CPU", 0.0)),
        float(ray.cluster_resources().get("CPU", 0.0)),
    )


class RayWorkers:
    """One :class:`EnvWorker` actor per block of slots (the ``Workers`` of a BatchedEnv)."""

    def __init__(
        self,
        factory: Callable[[], TextEnv],
        slots: list[list[int]],
        timeout_s: float,
        address: str = "",
    ) -> None:
        ensure_ray("BatchedEnv(backend='ray')", address)
        self.slots = slots
        self.startup_s = timeout_s + STARTUP_S
        self._factory = ray.put(factory)  # serialised once, shared by every actor
        self._actors: list[Any] = [None] * len(slots)
        self._where: list[tuple[int, str]] = [(0, "")] * len(slots)
        for w in range(len(slots)):
            self._spawn(w)
        self._wait_ready(range(len(slots)))

    def _spawn(self, w: int) -> None:
        self._actors[w] = EnvWorker.options(scheduling_strategy="SPREAD").remote(
            self._factory, self.slots[w]
        )

    def _wait_ready(self, ws: Any) -> None:
        ws = list(ws)
        refs = [self._actors[w].where.remote() for w in ws]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.startup_s)
        if len(ready) < len(refs):
            self.close()
            raise RuntimeError(
                f"{len(refs) - len(ready)} of {len(refs)} env actors did not start within "
                f"{self.startup_s:.0f} s; each asks for {ACTOR_CPUS} CPU, and the cluster has "
                f"{ray.available_resources().get('CPU', 0):g} CPUs free"
            )
        for w, where in zip(ws, ray.get(refs), strict=True):
            self._where[w] = where

    def call(self, cmd: str, payloads: Payloads, timeout_s: float) -> dict[int, list | None]:
        refs = {self._actors[w].run.remote(cmd, payload): w for w, payload in payloads.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        replies: dict[int, list | None] = dict.fromkeys(payloads)
        for ref in ready:
            try:
                replies[refs[ref]] = ray.get(ref)
            except ray.exceptions.RayError as e:  # the actor died (RayActorError) or was lost
                log.warning("env actor %d failed: %s", refs[ref], str(e).splitlines()[0])
        return replies

    def restart(self, w: int) -> None:
        ray.kill(self._actors[w], no_restart=True)
        self._spawn(w)
        self._wait_ready([w])

    def pids(self) -> list[int]:
        return [pid for pid, _ in self._where]

    def nodes(self) -> list[str]:
        return [node for _, node in self._where]

    def close(self) -> None:
        for w, actor in enumerate(self._actors):
            if actor is not None:
                ray.kill(actor, no_restart=True)
                self._actors[w] = None
