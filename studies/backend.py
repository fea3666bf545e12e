"""Where a study's independent runs execute: local worker processes, or Ray tasks on a cluster.

    python -m studies.train_toy --backend ray                          # Ray on this machine
    python -m studies.train_toy --backend ray --ray-address HEAD:6379  # an existing cluster

Each run (train_toy) or cell (bias_variance) is one task: a module-level function and its
arguments, named by a key. Both backends call the same function on the same arguments, so
their results are identical; the study writes each result as it arrives (train_toy keeps one
file per finished run, which is what makes a re-submitted sweep skip it). A task that raises is
reported with its key on stderr as it fails, the others go on, and :class:`SweepError` lists
every failure at the end. A progress bar counts tasks.

Local: ``workers`` processes, each given one task at a time over its own pipe, so the study
always knows which task a worker is running. A worker that dies (killed, out of memory, a
crash in native code) fails that task only, "its worker process died (signal 9)", and is
replaced; the task is not retried (a task that kills its worker would kill the next one), and
every other task finishes and is saved. Workers die with the study: each one asks Linux for
SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``: immediate, whatever the parent
died of, SIGKILL included, and nothing to poll); elsewhere a watcher thread polls
``os.getppid()`` once a second.

Ray: each task asks for one CPU and tasks are spread over the nodes (``SPREAD``); a task whose
worker process or node dies is retried by Ray (``max_retries``), an exception in the task is
not. With no ``--ray-address`` (and no ``$RAY_ADDRESS``) a private Ray instance with
``--workers`` CPUs is started on this machine and stopped at the end. Every node needs this
project importable (installed, or on ``PYTHONPATH``), as it is for verl and OpenRLHF.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from agentenvs.ray_cluster import check_address, import_ray, ray_session
from hgpo.options import check_choice

__all__ = [
    "BACKENDS",
    "Failure",
    "Sweep",
    "SweepError",
    "Task",
    "check_backend",
    "run_tasks",
]

log = logging.getLogger(__name__)

BACKENDS = ("local", "ray")
BACKEND_HELP = (
    "where the runs execute: 'local' worker processes, or 'ray' tasks (needs the [ray] extra)"
)
ADDRESS_HELP = (
    "Ray cluster to join with --backend ray: host:port of its head, ray://host:port, or "
    "'auto' (the `ray start` cluster of this machine); empty: $RAY_ADDRESS, else Ray started "
    "here with --workers CPUs"
)


@dataclass(frozen=True)
class Task:
    """One independent unit of a sweep: ``fn(*args)``, named ``key`` in reports."""

    key: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Failure:
    """A task that raised: its key and the error, one line."""

    key: str
    error: str


@dataclass
class Sweep:
    """What a sweep did: the failed tasks, and the Ray node of each finished task (ray only)."""

    finished: int = 0
    failures: list[Failure] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)


class SweepError(RuntimeError):
    """Some tasks failed (after every other task finished); the message lists their keys."""

    def __init__(self, failures: list[Failure], total: int) -> None:
        self.failures = failures
        lines = [f"  {f.key}: {f.error}" for f in failures]
        super().__init__(
            f"{len(failures)} of {total} tasks failed (the others finished; run the same "
            "command again to retry only these):\n" + "\n".join(lines)
        )


def check_backend(backend: str, ray_address: str, flag: str = "--backend") -> None:
    """Validate the pair before any work; with ray, Ray must import and the address answer.

    Raises :class:`hgpo.options.OptionError` (a ValueError) naming the flag: the CLIs print it
    and exit with 2.
    """
    check_choice(flag, backend, BACKENDS)
    if backend == "ray":
        import_ray(f"{flag} ray")
        check_address("--ray-address", ray_address)
    elif ray_address:
        raise ValueError(f"--ray-address: only used with {flag} ray, got {ray_address!r}")


def _error_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc  # RayTaskError wraps the task's exception
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


def run_tasks(
    fn: Callable[..., Any],
    tasks: Sequence[Task],
    on_result: Callable[[str, Any], None],
    *,
    backend: str = "local",
    workers: int = 1,
    ray_address: str = "",
    progress: bool = True,
    desc: str = "tasks",
    total: int | None = None,
) -> Sweep:
    """Run ``fn(*task.args)`` for every task; ``on_result(key, result)`` as each one finishes.

    total: the bar's full length (a resumed sweep counts its finished runs in; default
        len(tasks)). Results arrive in completion order; a caller that needs task order keys
        them. Returns the :class:`Sweep`; raises nothing for failed tasks (see SweepError).
    """
    from tqdm import tqdm

    total = len(tasks) if total is None else total
    bar = tqdm(
        total=total, initial=total - len(tasks), desc=desc, disable=not progress, file=sys.stderr
    )
    sweep = Sweep()

    def finished(key: str, result: Any = None, error: BaseException | None = None) -> None:
        if error is None:
            on_result(key, result)
            sweep.finished += 1
        else:
            sweep.failures.append(Failure(key, _error_line(error)))
            bar.write(f"failed: {key}: {_error_line(error)}", file=sys.stderr)
        bar.update()

    try:
        if backend == "ray":
            _run_ray(fn, tasks, finished, sweep, workers, ray_address)
        elif workers > 1 and len(tasks) > 1:
            _run_pool(fn, tasks, finished, workers)
        else:
            for t in tasks:
                try:
                    result = fn(*t.args)
                except Exception as e:
                    finished(t.key, error=e)
                else:
                    finished(t.key, result)
    finally:
        bar.close()
    if sweep.nodes:
        log.info("%d tasks ran on %d Ray nodes", len(sweep.nodes), len(set(sweep.nodes.values())))
    return sweep


def _run_pool(
    fn: Callable[..., Any], tasks: Sequence[Task], finished: Callable, workers: int
) -> None:
    """Local worker processes, one task each at a time; a task's exception, or the death of
    the worker running it, fails that task only (the worker is replaced, the others go on)."""
    ctx = mp.get_context()
    queue = list(reversed(tasks))  # popped from the end: tasks start in the given order
    busy: dict[Any, tuple[Any, Any, Task]] = {}  # sentinel -> (process, pipe, its task)
    idle: list[tuple[Any, Any]] = []
    # every worker, listed before it starts: a Ctrl-C between a task's send and its entry in
    # busy (the worker already running it) must still stop that worker
    started: list[tuple[Any, Any]] = []
    try:
        while queue or busy:
            while queue and len(busy) < workers:
                proc, conn = idle.pop() if idle else _start_worker(ctx, started)
                try:
                    conn.send((fn, queue[-1].args))
                except OSError:  # the idle worker died in between: the task goes to a new one
                    conn.close()
                    continue
                except Exception as e:  # the task does not pickle: it fails, the worker waits
                    idle.append((proc, conn))
                    finished(queue.pop().key, error=e)
                    continue
                busy[proc.sentinel] = (proc, conn, queue.pop())
            ready = set(wait([*busy, *(c for _, c, _ in busy.values())]))
            for sentinel, (proc, conn, task) in list(busy.items()):
                if conn not in ready and sentinel not in ready:
                    continue
                del busy[sentinel]
                try:
                    ok, value = conn.recv()
                except (EOFError, OSError):  # the worker died running this task
                    proc.join(5)
                    finished(task.key, error=WorkerDied(_death(proc.exitcode)))
                    conn.close()
                    continue
                if proc.is_alive():
                    idle.append((proc, conn))
                else:  # it sent its result, then died: not given another task
                    conn.close()
                if ok:
                    finished(task.key, value)
                else:
                    finished(task.key, error=value)
    finally:
        _stop_workers(started)


def _stop_workers(started: list[tuple[Any, Any]]) -> None:
    """Close every worker's pipe (an idle worker reads EOF and exits), then kill each one still
    alive after a second: a busy worker ignores Ctrl-C and would run its task to the end."""
    for _, conn in started:
        conn.close()
    for proc, _ in started:
        if proc.pid is None:  # listed, never started
            continue
        proc.join(1)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


class WorkerDied(RuntimeError):
    """The worker process running a task died before it returned."""


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        return f"its worker process died (signal {-code}: {signal.Signals(-code).name})"
    return f"its worker process died (exit code {code})"


def _start_worker(ctx: Any, started: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """A worker process and the parent's end of its pipe (the child's end closed here, so
    that the parent reads EOF when the worker dies), added to ``started`` before it starts."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, os.getpid()))
    started.append((proc, parent))
    proc.start()
    child.close()
    return proc, parent


def _worker(conn: Any, parent_pid: int) -> None:
    """A worker's loop: (fn, args) in, (True, result) or (False, exception) out, until EOF.
    Ctrl-C (SIGINT, sent to the whole process group) is ignored: the study stops its workers
    (no traceback from each of them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            reply = (True, fn(*args))
        except Exception as e:
            reply = (False, e)
        try:
            conn.send(reply)
        except Exception as e:  # a result or an exception that does not pickle
            conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))


PR_SET_PDEATHSIG = 1


def set_parent_death_signal() -> bool:
    """Linux: ask for SIGKILL when this process's parent dies (``prctl(PR_SET_PDEATHSIG)``,
    kept across ``exec``: also a ``preexec_fn`` for a subprocess); False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int) -> None:
    """Make this process die when ``parent_pid`` (its parent) dies, however it dies.

    Linux: :func:`set_parent_death_signal`, then a check that the parent did not die before
    the call. Elsewhere (or if prctl fails): a daemon thread that polls ``os.getppid()`` every
    second and exits the process when the parent is gone.
    """
    if set_parent_death_signal():
        if os.getppid() != parent_pid:  # the parent died before prctl
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _call_on_node(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str]:
    """The task body on a Ray worker: the result, and the node that computed it."""
    import ray

    return fn(*args), ray.get_runtime_context().get_node_id()


def _run_ray(
    fn: Callable[..., Any],
    tasks: Sequence[Task],
    finished: Callable,
    sweep: Sweep,
    workers: int,
    address: str,
) -> None:
    """Every task submitted at once; results collected as they complete (ray.wait)."""
    with ray_session("--backend ray", address, num_cpus=workers) as ray:
        remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_call_on_node)
        fn_ref = ray.put(fn)
        refs = {remote.remote(fn_ref, t.args): t.key for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                key = refs[ref]
                try:
                    result, node = ray.get(ref)
                except Exception as e:  # RayTaskError (the task raised) or a lost worker
                    finished(key, error=e)
                else:
                    sweep.nodes[key] = node
                    finished(key, result)
