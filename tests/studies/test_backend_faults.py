"""studies.backend's local pool under faults (issue 27, items 5 and 6): a worker that dies fails
its own task only, and no worker outlives a SIGKILLed study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from studies import backend as B


def _die_on_two(x: int, marks: str) -> int:
    Path(marks, f"{x}.{os.getpid()}").write_text("")  # one file per attempt
    if x == 2:
        os._exit(3)
    time.sleep(0.2)  # the other worker is busy when task 2 kills its worker
    return 10 * x


def test_a_dead_worker_fails_its_own_task_only_and_is_not_retried(tmp_path, capsys):
    tasks = [B.Task(f"t{i}", (i, str(tmp_path))) for i in range(6)]
    got: dict[str, int] = {}
    sweep = B.run_tasks(_die_on_two, tasks, got.__setitem__, workers=2, progress=False)
    assert got == {f"t{i}": 10 * i for i in (0, 1, 3, 4, 5)}
    assert sweep.finished == 5
    assert sweep.failures == [B.Failure("t2", "WorkerDied: its worker process died (exit code 3)")]
    assert "failed: t2: WorkerDied" in capsys.readouterr().err
    assert len(list(tmp_path.glob("2.*"))) == 1  # the task that killed its worker ran once


def _signal_self(x: int) -> int:
    if x == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_killed_worker_is_named_with_its_signal():
    tasks = [B.Task(f"t{i}", (i,)) for i in range(3)]
    got: dict[str, int] = {}
    sweep = B.run_tasks(_signal_self, tasks, got.__setitem__, workers=2, progress=False)
    assert got == {"t0": 0, "t2": 2}
    assert [f.key for f in sweep.failures] == ["t1"]
    assert "died (signal 9: SIGKILL)" in sweep.failures[0].error


def test_exceptions_and_results_come_back_from_the_workers():
    tasks = [B.Task(f"t{i}", (i,)) for i in range(5)]
    got: dict[str, int] = {}
    sweep = B.run_tasks(_maybe_fail, tasks, got.__setitem__, workers=2, progress=False)
    assert got == {"t0": 0, "t1": 10, "t3": 30, "t4": 40}
    assert sweep.failures == [B.Failure("t2", "ValueError: bad input 2")]


def _maybe_fail(x: int) -> int:
    if x == 2:
        raise ValueError(f"bad input {x}")
    return 10 * x


STUDY = """
import os, sys, time
from pathlib import Path
from studies.backend import Task, run_tasks

def work(i, d):
    Path(d, f"{os.getpid()}.pid").write_text("")
    time.sleep(120)

if __name__ == "__main__":
    d = sys.argv[1]
    run_tasks(work, [Task(f"t{i}", (i, d)) for i in range(4)], lambda k, r: None,
              workers=2, progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited (only its parent's reaping is left)


def test_no_worker_outlives_a_sigkilled_study(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(textwrap.dedent(STUDY))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    main = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
        assert len(workers) == 2 and all(map(_alive, workers))
        main.kill()  # SIGKILL: no finally, no atexit in the study
        main.wait(10)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in workers if _alive(pid)]
        assert not left, f"workers {left} outlived their study"
    finally:
        main.kill()
        for pid in [int(p.stem) for p in tmp_path.glob("*.pid")]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_task_that_does_not_pickle_fails_alone():
    tasks = [B.Task("t0", (0,)), B.Task("lambda", (lambda: 1,)), B.Task("t3", (3,))]
    got: dict[str, int] = {}
    sweep = B.run_tasks(_maybe_fail, tasks, got.__setitem__, workers=2, progress=False)
    assert got == {"t0": 0, "t3": 30}
    assert [f.key for f in sweep.failures] == ["lambda"]


def _touch_and_sleep(x: int, marks: str) -> int:
    Path(marks, f"started{x}").write_text("")
    time.sleep(60)
    return x


def test_ctrl_c_right_after_a_task_is_sent_still_stops_its_worker(tmp_path, monkeypatch):
    """A Ctrl-C landing between the second task's send and its entry among the busy workers
    stops both workers at once; before, the one running that task was in no list, ran its 60 s
    task to the end and held the study's exit (the interrupt is raised there by hand)."""
    from multiprocessing.connection import Connection

    parent, sends, send = os.getpid(), [], Connection.send

    def send_then_interrupt(self, obj):
        send(self, obj)
        if os.getpid() == parent:
            sends.append(obj)
            if len(sends) == 2:
                while len(list(tmp_path.glob("started*"))) < 2:  # both tasks run
                    time.sleep(0.02)
                raise KeyboardInterrupt

    monkeypatch.setattr(Connection, "send", send_then_interrupt)
    tasks = [B.Task(str(i), (i, str(tmp_path))) for i in range(2)]
    t0 = time.monotonic()
    try:
        B.run_tasks(_touch_and_sleep, tasks, print, workers=2, progress=False)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt did not reach run_tasks")
    assert time.monotonic() - t0 < 30
    import multiprocessing as mp

    assert mp.active_children() == []
