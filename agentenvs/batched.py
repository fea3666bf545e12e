"""Batched environments in worker processes, with groups of identical starts and crash recovery.

``reset(tasks, group_n)`` starts ``len(tasks) * group_n`` environments: slot ``g * group_n + j``
plays ``tasks[g]``, so every member of a group starts from the same state (environments are
deterministic given the task). ``step(actions)`` sends one text action per slot; finished slots
are not stepped again (reward 0, done True, their last observation).

Each worker process hosts a contiguous block of slots, so the members of a group (consecutive
slots) live in as few workers as possible and share what a worker caches per task (ALFWorld's
per-game translation and grammar, see :mod:`agentenvs.alfworld.engine`). An exception inside one
environment is caught in its worker: that slot reports ``info["crashed"] = True`` and done, and
its environment is rebuilt. A reset at which every slot crashes (twice) raises ``RuntimeError``
with the first error, e.g. a factory that cannot build its environment at all.
A worker that dies or does not answer within ``timeout_s`` is killed and restarted with fresh
environments; all its slots report ``crashed`` and done for that step. The rest of the batch is
unaffected.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


class TextEnv(Protocol):
    """What a worker needs of an environment."""

    def reset(self, task: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]: ...


def _crash_info(err: str) -> dict[str, Any]:
    return {
        "won": False,
        "task_score": 0.0,
        "task_type": "",
        "admissible_actions": [],
        "crashed": True,
        "error": err,
    }


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies.

    A forked worker holds copies of its parent's pipe ends, so after a SIGKILL of the parent it
    would wait forever on its pipe (and keep the parent's stdout open for whoever reads it).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def _build(factory: Callable[[], TextEnv], slot: int) -> TextEnv:
    """One slot's environment; one with randomness of its own (a toy POMDP with slip) learns
    its slot number through ``seed_slot`` so that the members of a group draw differently."""
    env = factory()
    seed_slot = getattr(env, "seed_slot", None)
    if seed_slot is not None:
        seed_slot(slot)
    return env


def _worker(conn: Connection, factory: Callable[[], TextEnv], slots: list[int]) -> None:
    _die_with_parent()
    try:
        envs: dict[int, TextEnv] = {s: _build(factory, s) for s in slots}
        build_error = ""
    except Exception as e:  # e.g. a missing optional dependency: report it on every command
        envs, build_error = {}, f"building the environment failed: {e!r}"
        log.error("%s", build_error)
    while True:
        try:
            cmd, payload = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if cmd == "close":
            return
        if build_error:
            conn.send([(slot, "", 0.0, True, _crash_info(build_error)) for slot, _ in payload])
            continue
        out = []
        for slot, arg in payload:
            try:
                if cmd == "reset":
                    obs, info = envs[slot].reset(arg)
                    out.append((slot, obs, 0.0, False, info))
                else:
                    out.append((slot, *envs[slot].step(arg)))
            except Exception as e:  # an env bug must not stop the batch
                log.warning("env slot %d crashed: %r", slot, e)
                out.append((slot, "", 0.0, True, _crash_info(repr(e))))
                try:
                    envs[slot] = _build(factory, slot)
                except Exception as e2:
                    log.error("rebuilding slot %d failed: %r", slot, e2)
        conn.send(out)


class BatchedEnv:
    """``num_envs`` environments made by ``factory`` in ``num_workers`` processes.

    factory: a zero-argument callable building one environment (called in the workers).
    num_envs: batch size B = number of tasks x group size.
    num_workers: worker processes (each hosts a contiguous block of slots; block sizes differ
        by at most one).
    timeout_s: seconds a worker may take for one reset/step of its slots before it is restarted.
    start_method: multiprocessing start method ("fork" is fastest on Linux).
    """

    def __init__(
        self,
        factory: Callable[[], TextEnv],
        num_envs: int,
        num_workers: int = 2,
        timeout_s: float = 300.0,
        start_method: str = "fork",
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got num_envs={num_envs}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got num_workers={num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got timeout_s={timeout_s}")
        self.factory = factory
        self.num_envs = num_envs
        self.num_workers = min(num_workers, num_envs)
        self.timeout_s = timeout_s
        self._ctx = mp.get_context(start_method)
        base, extra = divmod(num_envs, self.num_workers)
        bounds = [w * base + min(w, extra) for w in range(self.num_workers + 1)]
        self._slots = [list(range(bounds[w], bounds[w + 1])) for w in range(self.num_workers)]
        self._procs: list[Any] = [None] * self.num_workers
        self._conns: list[Connection | None] = [None] * self.num_workers
        for w in range(self.num_workers):
            self._start(w)
        self.tasks: list[int] = []
        self.done = np.ones(num_envs, dtype=bool)
        self.last_obs = [""] * num_envs
        self.last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self.restarts = 0

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(
            target=_worker, args=(child, self.factory, self._slots[w]), daemon=True
        )
        p.start()
        child.close()
        self._procs[w], self._conns[w] = p, parent

    def _restart(self, w: int) -> None:
        p, conn = self._procs[w], self._conns[w]
        if conn is not None:
            conn.close()
        if p is not None and p.is_alive():
            p.kill()
        if p is not None:
            p.join(timeout=5)
        self.restarts += 1
        log.warning("worker %d restarted (%d restarts so far)", w, self.restarts)
        self._start(w)

    def _run(self, cmd: str, per_slot: dict[int, Any]) -> dict[int, tuple]:
        sent = []
        for w in range(self.num_workers):
            payload = [(s, per_slot[s]) for s in self._slots[w] if s in per_slot]
            if not payload:
                continue
            try:
                self._conns[w].send((cmd, payload))  # type: ignore[union-attr]
                sent.append((w, payload))
            except (BrokenPipeError, OSError):
                sent.append((w, payload))
        results: dict[int, tuple] = {}
        for w, payload in sent:
            conn = self._conns[w]
            ok = False
            try:
                if conn is not None and conn.poll(self.timeout_s):
                    for r in conn.recv():
                        results[r[0]] = r[1:]
                    ok = True
            except (EOFError, OSError):
                ok = False
            if not ok:
                self._restart(w)
                err = f"worker {w} died or timed out during {cmd}"
                for s, _ in payload:
                    results[s] = ("", 0.0, True, _crash_info(err))
        return results

    def reset(self, tasks: Sequence[int], group_n: int = 1) -> tuple[list[str], list[dict]]:
        """Start ``tasks``, each repeated ``group_n`` times (len(tasks) * group_n == num_envs).

        A slot whose reset crashes is retried once after its worker is rebuilt.
        """
        if group_n < 1:
            raise ValueError(f"group_n must be >= 1, got group_n={group_n}")
        if len(tasks) * group_n != self.num_envs:
            raise ValueError(
                f"len(tasks) * group_n must equal num_envs={self.num_envs}: "
                f"len(tasks)={len(tasks)}, group_n={group_n}"
            )
        self.tasks = [int(t) for t in tasks for _ in range(group_n)]
        self.group_ids = np.repeat(np.arange(len(tasks)), group_n)
        res = self._run("reset", dict(enumerate(self.tasks)))
        retry = {s: self.tasks[s] for s, r in res.items() if r[3].get("crashed")}
        if retry:
            res.update(self._run("reset", retry))
        errors = [r[3]["error"] for r in res.values() if r[3].get("crashed")]
        if len(errors) == self.num_envs:  # nothing to play: say why instead of an empty batch
            raise RuntimeError(
                f"every one of the {self.num_envs} environments crashed at reset, twice; "
                f"first error: {errors[0]}"
            )
        for s, (obs, _, _, info) in res.items():
            info = dict(info)
            info.setdefault("crashed", False)
            self.last_obs[s], self.last_info[s] = obs, info
            self.done[s] = bool(info["crashed"])
        return list(self.last_obs), [dict(i) for i in self.last_info]

    def step(self, actions: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, list[dict]]:
        """One text action per slot; returns observations, rewards[B], dones[B], infos."""
        if len(actions) != self.num_envs:
            raise ValueError(
                f"actions must have one entry per env: len(actions)={len(actions)}, "
                f"num_envs={self.num_envs}"
            )
        live = {s: actions[s] for s in range(self.num_envs) if not self.done[s]}
        res = self._run("step", live)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        for s, (obs, r, d, info) in res.items():
            info = dict(info)
            info.setdefault("crashed", False)
            self.last_obs[s], self.last_info[s] = obs, info
            rewards[s], self.done[s] = r, bool(d)
        return list(self.last_obs), rewards, self.done.copy(), [dict(i) for i in self.last_info]

    def close(self) -> None:
        """Stop every worker."""
        for w in range(self.num_workers):
            conn, p = self._conns[w], self._procs[w]
            try:
                if conn is not None:
                    conn.send(("close", None))
                    conn.close()
            except (BrokenPipeError, OSError):
                pass
            if p is not None:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
        self._conns = [None] * self.num_workers

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
