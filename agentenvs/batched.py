"""Batched environments in worker processes or Ray actors, with groups of identical starts and
crash recovery.

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
A worker that dies, does not take in its command within ``timeout_s`` (a frozen worker whose
pipe is full: an action over the pipe's buffer, about 208 KB) or does not answer within
``timeout_s`` of it is killed and restarted with fresh environments; all its slots report ``crashed`` and done for that step. The rest of the batch is
unaffected. With ``backend="ray"`` the workers are Ray actors (:mod:`agentenvs.ray_backend`),
placed on any node of the cluster, with the same slots, results and recovery.

Snapshots (for branching rollouts, docs/branching.md): ``snapshot(slots)`` takes each slot's
:class:`Snapshot` in its worker and brings it to this process; ``restore(pairs)`` puts one
into any slot of any worker and makes that slot live again. ``step(actions, snapshot=True)``
also returns the snapshot of every slot still live after the step, in the same round trip.
Only environments with ``supports_snapshot = True`` and ``snapshot()``/``restore()`` methods
take part; :func:`require_snapshot` says so by name before any work.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import selectors
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal, Protocol, overload

import numpy as np

from agentenvs.envhost import (
    EnvHost,
    Payloads,
    SnapshotEnv,
    TextEnv,
    _crash_info,
    env_supports_snapshot,
)
from hgpo.options import bad, check_bool, check_choice, check_int, check_number

__all__ = [
    "BACKENDS",
    "BatchedEnv",
    "EnvHost",
    "Payloads",
    "ProcessWorkers",
    "Snapshot",
    "SnapshotEnv",
    "TextEnv",
    "Workers",
    "env_supports_snapshot",
    "require_snapshot",
]

log = logging.getLogger(__name__)


def _sequence(where: str, value: Any) -> Sequence[Any]:
    """``value`` if it is a list, tuple or one-dimensional array (not a str, not a number)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if not isinstance(value, list | tuple):
        raise bad(where, "a list (one entry per slot)", value)
    return value


@dataclass(frozen=True)
class Snapshot:
    """One slot's state as :meth:`BatchedEnv.snapshot` hands it out (opaque to the caller).

    task: the task the slot was playing (``BatchedEnv.tasks`` of the slot it is restored into
    becomes this). state: what the environment's ``snapshot()`` returned.
    """

    task: int
    state: Any


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies.

    A forked worker holds copies of its parent's pipe ends, so after a SIGKILL of the parent it
    would wait forever on its pipe (and keep the parent's stdout open for whoever reads it).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def _worker(conn: Connection, factory: Callable[[], TextEnv], slots: list[int]) -> None:
    """A worker's loop until "close" or EOF. Ctrl-C (SIGINT, sent to the whole process group)
    is ignored: the trainer closes its workers (no traceback from each of them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    host = EnvHost(factory, slots)
    while True:
        try:
            cmd, payload = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if cmd == "close":
            return
        conn.send(host.run(cmd, payload))


class Workers(Protocol):
    """How a BatchedEnv reaches its workers (worker processes, or Ray actors)."""

    def call(self, cmd: str, payloads: Payloads, timeout_s: float) -> dict[int, list | None]:
        """Run ``cmd`` on every worker in ``payloads``; None for a worker that died or did not
        answer within ``timeout_s``."""
        ...

    def restart(self, w: int) -> None:
        """Kill worker ``w`` (if alive) and start it again with fresh environments."""
        ...

    def pids(self) -> list[int]: ...

    def nodes(self) -> list[str]: ...

    def close(self) -> None: ...


class ProcessWorkers:
    """One forked (or spawned) process per block of slots, reached through a pipe."""

    def __init__(
        self, factory: Callable[[], TextEnv], slots: list[list[int]], start_method: str
    ) -> None:
        self.factory, self.slots = factory, slots
        self._ctx = mp.get_context(start_method)
        self._procs: list[Any] = [None] * len(slots)
        self._conns: list[Connection | None] = [None] * len(slots)
        for w in range(len(slots)):
            self._start(w)

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(
            target=_worker, args=(child, self.factory, self.slots[w]), daemon=True
        )
        p.start()
        child.close()
        self._procs[w], self._conns[w] = p, parent

    def call(self, cmd: str, payloads: Payloads, timeout_s: float) -> dict[int, list | None]:
        """Send every worker its payload and read its reply, each bounded by ``timeout_s``: the
        sends (all workers at once) end by ``timeout_s`` after the call began, and each reply
        by ``timeout_s`` after its send ended. A worker that is frozen (its pipe full), dead or
        late gets None, and is then restarted by the caller."""
        conns = {w: c for w in payloads if (c := self._conns[w]) is not None}
        got = _exchange(conns, {w: _frame((cmd, payloads[w])) for w in conns}, timeout_s)
        return {w: got.get(w) for w in payloads}

    def restart(self, w: int) -> None:
        p, conn = self._procs[w], self._conns[w]
        if conn is not None:
            conn.close()
        if p is not None and p.is_alive():
            p.kill()
        if p is not None:
            p.join(timeout=5)
        self._start(w)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def nodes(self) -> list[str]:
        return ["local"] * len(self._procs)

    def close(self) -> None:
        for w, (conn, p) in enumerate(zip(self._conns, self._procs, strict=True)):
            if conn is not None:  # (bounded: a frozen worker may never read it)
                _exchange({w: conn}, {w: _frame(("close", None))}, 1.0, reply=False)
                conn.close()
            if p is not None:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
            self._conns[w] = None


# -- pipe I/O with a deadline ---------------------------------------------------------------------
# multiprocessing's Connection.send() blocks until the worker has read a message larger than the
# pipe's buffer (about 208 KB), and recv() until the whole reply has come, so a frozen worker
# would hold the batch forever. The parent's side writes and reads the same wire format
# (Connection's 4-byte size header, -1 then an 8-byte size past 2 GiB) on the non-blocking
# descriptor, for every worker at once, until each one's deadline.

_CHUNK = 1 << 20


def _frame(obj: Any) -> bytes:
    """``obj`` as one message in multiprocessing.Connection's wire format."""
    buf = bytes(ForkingPickler.dumps(obj))
    n = len(buf)
    head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return head + buf


@dataclass
class _Exchange:
    """One worker's message in flight: the rest of its frame to write, then its reply."""

    w: int
    out: memoryview
    deadline: float
    """time.monotonic() by which this phase (the write, then the reply) must end."""
    reading: bool = False
    buf: bytearray = field(default_factory=bytearray)


def _exchange(
    conns: dict[int, Connection], frames: dict[int, bytes], timeout_s: float, reply: bool = True
) -> dict[int, Any]:
    """Write ``frames[w]`` to every ``conns[w]`` at once, then (``reply``) read one message
    from each. Every write must end within ``timeout_s`` of the call, every reply within
    ``timeout_s`` of its write. Returns the replies that came whole (with ``reply=False``,
    None for each worker whose frame was written); a worker left out was dead (its pipe
    broken or closed) or too slow (frozen: its pipe full)."""
    start = time.monotonic()
    pending = {c.fileno(): _Exchange(w, memoryview(frames[w]), start + timeout_s)
               for w, c in conns.items()}  # fmt: skip
    got: dict[int, Any] = {}
    sel = selectors.DefaultSelector()
    try:
        for fd in pending:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_WRITE)
        while pending:
            left = min(x.deadline for x in pending.values()) - time.monotonic()
            for key, _ in sel.select(max(0.0, left)):
                x = pending[key.fd]
                try:
                    ended = _read_some(key.fd, x, got) if x.reading else _write_some(key.fd, x)
                except BlockingIOError:
                    continue
                except OSError:  # a dead worker: left out, restarted by the caller
                    ended = True
                if ended or (not x.out and not reply):
                    if not ended:
                        got[x.w] = None
                    del pending[key.fd]
                    sel.unregister(key.fd)
                elif not x.out and not x.reading:  # written: now its reply
                    x.reading, x.deadline = True, time.monotonic() + timeout_s
                    sel.modify(key.fd, selectors.EVENT_READ)
            now = time.monotonic()
            for fd in [fd for fd, x in pending.items() if x.deadline <= now]:
                del pending[fd]  # too slow: given up
                sel.unregister(fd)
    finally:
        sel.close()
        for conn in conns.values():
            os.set_blocking(conn.fileno(), True)
    return got


def _write_some(fd: int, x: _Exchange) -> bool:
    """Write what the pipe takes of ``x.out``; False (the exchange goes on)."""
    x.out = x.out[os.write(fd, x.out[:_CHUNK]) :]
    return False


def _read_some(fd: int, x: _Exchange, got: dict[int, Any]) -> bool:
    """Read what has come of ``x``'s reply; True once it is whole (then in ``got``) or the
    worker's end is closed (it died)."""
    chunk = os.read(fd, _CHUNK)
    if not chunk:
        return True
    x.buf += chunk
    whole, msg = _parse(x.buf)
    if whole:
        got[x.w] = msg
    return whole


def _parse(buf: bytearray) -> tuple[bool, Any]:
    """(True, message) once ``buf`` holds a whole Connection frame, else (False, None)."""
    if len(buf) < 4:
        return False, None
    (n,) = struct.unpack_from("!i", buf)
    start = 4
    if n == -1:
        if len(buf) < 12:
            return False, None
        (n,) = struct.unpack_from("!Q", buf, 4)
        start = 12
    if len(buf) < start + n:
        return False, None
    return True, ForkingPickler.loads(bytes(buf[start : start + n]))


BACKENDS = ("process", "ray")


class BatchedEnv:
    """``num_envs`` environments made by ``factory`` in ``num_workers`` workers.

    factory: a zero-argument callable building one environment (called in the workers).
    num_envs: batch size B = number of tasks x group size.
    num_workers: workers (each hosts a contiguous block of slots; block sizes differ by at most
        one).
    timeout_s: seconds a worker may take to take in one command (reset/step of its slots),
        and again to answer it, before it is restarted.
    start_method: multiprocessing start method of the process backend ("fork" is fastest on
        Linux).
    backend: "process" (worker processes on this machine) or "ray" (Ray actors placed anywhere
        in the cluster, one CPU each, spread over the nodes: :mod:`agentenvs.ray_backend`). Both
        give the same slots, ordering, results and crash/hang recovery.
    ray_address: the Ray cluster to join (backend "ray"; empty: ``$RAY_ADDRESS``, else Ray is
        started on this machine); ignored when this process is already connected to Ray.
    """

    def __init__(
        self,
        factory: Callable[[], TextEnv],
        num_envs: int,
        num_workers: int = 2,
        timeout_s: float = 300.0,
        start_method: str = "fork",
        backend: str = "process",
        ray_address: str = "",
    ) -> None:
        num_envs = check_int("num_envs", num_envs, lo=1)
        num_workers = check_int("num_workers", num_workers, lo=1)
        timeout_s = check_number("timeout_s", timeout_s, lo=0.0, lo_open=True)
        check_choice("backend", backend, BACKENDS)
        check_choice("start_method", start_method, mp.get_all_start_methods())
        self.factory = factory
        self.num_envs = num_envs
        self.num_workers = min(num_workers, num_envs)
        self.timeout_s = timeout_s
        self.backend = backend
        base, extra = divmod(num_envs, self.num_workers)
        bounds = [w * base + min(w, extra) for w in range(self.num_workers + 1)]
        self._slots = [list(range(bounds[w], bounds[w + 1])) for w in range(self.num_workers)]
        self._workers: Workers
        if backend == "ray":
            from agentenvs.ray_backend import RayWorkers

            self._workers = RayWorkers(factory, self._slots, timeout_s, ray_address)
        else:
            self._workers = ProcessWorkers(factory, self._slots, start_method)
        self.tasks: list[int] = []
        self.done = np.ones(num_envs, dtype=bool)
        self.last_obs = [""] * num_envs
        self.last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self.restarts = 0
        self._supports_snapshot: bool | None = None

    def worker_pids(self) -> list[int]:
        """Process id of each worker (on its node)."""
        return self._workers.pids()

    def worker_nodes(self) -> list[str]:
        """Ray node id of each worker ("local" for every worker of the process backend)."""
        return self._workers.nodes()

    def _run(self, cmd: str, per_slot: dict[int, Any]) -> dict[int, tuple]:
        """``cmd`` on the slots of ``per_slot`` -> slot: (obs, reward, done, info, snap)."""
        payloads: Payloads = {}
        for w in range(self.num_workers):
            payload = [(s, per_slot[s]) for s in self._slots[w] if s in per_slot]
            if payload:
                payloads[w] = payload
        replies = self._workers.call(cmd, payloads, self.timeout_s)
        results: dict[int, tuple] = {}
        for w, payload in payloads.items():
            reply = replies.get(w)
            if reply is not None:
                for r in reply:
                    results[r[0]] = r[1:]
                continue
            self._workers.restart(w)
            self.restarts += 1
            log.warning("worker %d restarted (%d restarts so far)", w, self.restarts)
            err = f"worker {w} died or timed out during {cmd}"
            for s, _ in payload:
                results[s] = ("", 0.0, True, _crash_info(err), None)
            # the restarted worker's other slots lost their episodes too
            for s in self._slots[w]:
                if s not in per_slot and not self.done[s]:
                    self._mark_crashed(s, err)
        return results

    def _mark_crashed(self, s: int, err: str) -> None:
        self.last_obs[s], self.last_info[s], self.done[s] = "", _crash_info(err), True

    def _record(self, s: int, obs: str, done: bool, info: dict[str, Any]) -> None:
        info = dict(info)
        info.setdefault("crashed", False)
        self.last_obs[s], self.last_info[s] = obs, info
        self.done[s] = bool(done or info["crashed"])

    def reset(self, tasks: Sequence[int], group_n: int = 1) -> tuple[list[str], list[dict]]:
        """Start ``tasks``, each repeated ``group_n`` times (len(tasks) * group_n == num_envs).

        A slot whose reset crashes is retried once after its worker is rebuilt.
        """
        group_n = check_int("group_n", group_n, lo=1)
        tasks = _sequence("BatchedEnv.reset: tasks", tasks)
        for i, t in enumerate(tasks):  # (int() would read 1.5, True and "0" as tasks)
            check_int(f"BatchedEnv.reset: tasks[{i}]", t, lo=0)
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
        for s, (obs, _, _, info, _) in res.items():
            self._record(s, obs, False, info)
        return list(self.last_obs), [dict(i) for i in self.last_info]

    @overload
    def step(
        self, actions: Sequence[str], snapshot: Literal[False] = False
    ) -> tuple[list[str], np.ndarray, np.ndarray, list[dict]]: ...

    @overload
    def step(
        self, actions: Sequence[str], snapshot: Literal[True]
    ) -> tuple[list[str], np.ndarray, np.ndarray, list[dict], list[Snapshot | None]]: ...

    def step(self, actions: Sequence[str], snapshot: bool = False) -> tuple:
        """One text action per slot; returns observations, rewards[B], dones[B], infos.

        snapshot: also return, as a fifth value, the :class:`Snapshot` of every slot that is
        live after this step (None for a slot that is done, crashed or was not stepped), taken
        in the same round trip to the workers as the step.
        """
        actions = _sequence("BatchedEnv.step: actions", actions)
        if len(actions) != self.num_envs:
            raise ValueError(
                f"actions must have one entry per env: len(actions)={len(actions)}, "
                f"num_envs={self.num_envs}"
            )
        for i, a in enumerate(actions):  # (a slot's env would crash on it, its episode lost)
            if not self.done[i] and not isinstance(a, str):
                raise bad(f"BatchedEnv.step: actions[{i}]", "a str (the text action)", a)
        snapshot = check_bool("BatchedEnv.step: snapshot", snapshot)
        if snapshot:
            self._require_snapshot("step(..., snapshot=True)")
        live = {s: actions[s] for s in range(self.num_envs) if not self.done[s]}
        res = self._run("step_snapshot" if snapshot else "step", live)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        snaps: list[Snapshot | None] = [None] * self.num_envs
        for s, (obs, r, d, info, state) in res.items():
            self._record(s, obs, d, info)
            rewards[s] = r
            if state is not None and not self.done[s]:
                snaps[s] = Snapshot(self.tasks[s], state)
        out = (list(self.last_obs), rewards, self.done.copy(), [dict(i) for i in self.last_info])
        return (*out, snaps) if snapshot else out

    # -- snapshots (branching rollouts) ---------------------------------------------------------
    @property
    def supports_snapshot(self) -> bool:
        """Whether this batch's environments can be snapshotted and restored (asked of one
        worker's environment once, then remembered). Raises RuntimeError when the factory
        cannot build an environment at all."""
        if self._supports_snapshot is None:
            res = self._run("supports_snapshot", {0: None})[0]
            if res[3].get("crashed"):
                raise RuntimeError(
                    f"cannot ask the environment for snapshot support: {res[3]['error']}"
                )
            self._supports_snapshot = bool(res[4])
        return self._supports_snapshot

    def _require_snapshot(self, what: str) -> None:
        if not self.supports_snapshot:
            raise ValueError(
                f"BatchedEnv.{what}: the environment has no snapshot support "
                "(supports_snapshot = True and snapshot()/restore() methods)"
            )

    def _check_slots(self, what: str, slots: Sequence[int]) -> list[int]:
        slots = _sequence(f"BatchedEnv.{what}: slots", slots)
        out = [check_int(f"BatchedEnv.{what}: slots[{i}]", s) for i, s in enumerate(slots)]
        wrong = [s for s in out if not 0 <= s < self.num_envs]
        if wrong:
            raise ValueError(
                f"BatchedEnv.{what}: slots must lie in 0..{self.num_envs - 1}, got {wrong}"
            )
        if len(set(out)) != len(out):
            raise ValueError(f"BatchedEnv.{what}: a slot may appear once, got {out}")
        return out

    def park(self, slots: Sequence[int]) -> None:
        """Leave ``slots`` out of the next steps (reported done, their last observation kept)
        until a :meth:`restore` or :meth:`reset` makes them live again."""
        self.done[self._check_slots("park", slots)] = True

    def snapshot(self, slots: Sequence[int]) -> list[Snapshot | None]:
        """The :class:`Snapshot` of each of ``slots`` (taken in its worker), in that order.

        Every slot must be live: asking for a done slot is a ValueError (a finished episode
        has no future to branch). A slot whose snapshot raises in its environment, or whose
        worker dies, is that slot's crash: None here, and the slot is done with
        ``info["crashed"]`` (reported by the next ``step``), like a crash during a step.
        """
        slots = self._check_slots("snapshot", slots)
        done = [s for s in slots if self.done[s]]
        if done:
            raise ValueError(
                f"BatchedEnv.snapshot: slots {done} are done; only live slots can be snapshotted"
            )
        self._require_snapshot("snapshot")
        res = self._run("snapshot", dict.fromkeys(slots))
        out: list[Snapshot | None] = []
        for s in slots:
            _, _, _, info, state = res[s]
            if info.get("crashed"):
                self._mark_crashed(s, info["error"])
                out.append(None)
            else:
                out.append(Snapshot(self.tasks[s], state))
        return out

    def restore(self, pairs: Sequence[tuple[int, Snapshot]]) -> tuple[list[str], list[dict]]:
        """Put each (slot, snapshot) of ``pairs`` into its slot and make the slot live.

        The snapshot may come from any slot of any worker (it travels through this process).
        Returns the observation and info current when each snapshot was taken, in the order of
        ``pairs``; the slot's task becomes the snapshot's (before any reset, the other slots'
        tasks read -1). Other slots are untouched. A restore that raises in its environment is
        that slot's crash: it is done, its info says ``crashed`` with the error, as for a crash
        during a step.
        """
        pairs = _sequence("BatchedEnv.restore: pairs", pairs)
        for i, pair in enumerate(pairs):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise bad(f"BatchedEnv.restore: pairs[{i}]", "a (slot, Snapshot) pair", pair)
        slots = self._check_slots("restore", [s for s, _ in pairs])
        wrong = [type(snap).__name__ for _, snap in pairs if not isinstance(snap, Snapshot)]
        if wrong:
            raise ValueError(
                "BatchedEnv.restore: every snapshot must be a Snapshot from "
                f"BatchedEnv.snapshot or step(..., snapshot=True), got {wrong}"
            )
        self._require_snapshot("restore")
        res = self._run(
            "restore", {s: snap.state for s, (_, snap) in zip(slots, pairs, strict=True)}
        )
        if len(self.tasks) != self.num_envs:  # restored before any reset
            self.tasks = [-1] * self.num_envs
        for s, (_, snap) in zip(slots, pairs, strict=True):
            obs, _, _, info, _ = res[s]
            self.tasks[s] = snap.task
            self._record(s, obs, False, info)
        return [self.last_obs[s] for s in slots], [dict(self.last_info[s]) for s in slots]

    def close(self) -> None:
        """Stop every worker."""
        self._workers.close()

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_snapshot(env_name: str, batched: BatchedEnv, where: str = "--env") -> None:
    """Raise ``OptionError`` "<where>: must be an environment with snapshot support, got
    <env_name>" unless ``batched``'s environments can be snapshotted and restored (branching
    rollouts need it; call this before any work)."""
    if not batched.supports_snapshot:
        raise bad(where, "an environment with snapshot support", env_name)
