"""Batched worker-process env: group-start identity and crash recovery."""

import os
import time

import numpy as np
import pytest

from agentenvs.batched import BatchedEnv


class ToyEnv:
    """Counts steps; "raise" raises, "die" kills the worker, "hang" sleeps past the timeout."""

    def reset(self, task):
        self.task, self.t = task, 0
        return f"start {task}", {
            "won": False,
            "task_score": 0.0,
            "task_type": "toy",
            "admissible_actions": ["inc", "win"],
        }

    def step(self, action):
        if action == "raise":
            raise RuntimeError("env bug")
        if action == "die":
            os._exit(3)
        if action == "hang":
            time.sleep(60)
        self.t += 1
        won = action == "win"
        return (
            f"task {self.task} t {self.t}",
            10.0 if won else 0.0,
            won,
            {
                "won": won,
                "task_score": float(won),
                "task_type": "toy",
                "admissible_actions": ["inc", "win"],
            },
        )


def test_groups_start_identical_and_step():
    with BatchedEnv(ToyEnv, num_envs=6, num_workers=2) as env:
        obs, _ = env.reset([4, 9], group_n=3)
        assert obs == ["start 4"] * 3 + ["start 9"] * 3
        assert list(env.group_ids) == [0, 0, 0, 1, 1, 1]
        obs, r, d, _infos = env.step(["inc", "win", "inc", "inc", "inc", "win"])
        assert list(r) == [0, 10, 0, 0, 0, 10] and list(d) == [0, 1, 0, 0, 0, 1]
        # finished slots are not stepped again
        obs, r, d, _ = env.step(["inc"] * 6)
        assert obs[1] == "task 4 t 1" and r[1] == 0 and d[1]
        assert obs[0] == "task 4 t 2"
        with pytest.raises(ValueError, match="len\\(tasks\\)"):
            env.reset([1], group_n=2)
        with pytest.raises(ValueError, match=r"^group_n: must be an integer >= 1, got 3\.0$"):
            env.reset([1, 2], group_n=3.0)
        with pytest.raises(ValueError, match="len\\(actions\\)"):
            env.step(["inc"])


def test_exception_in_one_env_is_reported_and_env_rebuilt():
    with BatchedEnv(ToyEnv, num_envs=4, num_workers=2) as env:
        env.reset([0, 1], group_n=2)
        obs, _r, d, infos = env.step(["raise", "inc", "inc", "inc"])
        assert infos[0]["crashed"] and d[0] and "env bug" in infos[0]["error"]
        assert not any(i["crashed"] for i in infos[1:]) and not d[1:].any()
        obs, _ = env.reset([0, 1], group_n=2)
        assert obs == ["start 0", "start 0", "start 1", "start 1"]


def test_dead_worker_is_restarted():
    with BatchedEnv(ToyEnv, num_envs=4, num_workers=2) as env:
        env.reset([0, 1], group_n=2)
        # slot 0 lives in worker 0 with slot 1; worker 1 (slots 2, 3) is unaffected
        obs, r, d, infos = env.step(["die", "inc", "inc", "inc"])
        assert infos[0]["crashed"] and infos[1]["crashed"] and d[0] and d[1]
        assert not infos[2]["crashed"] and obs[2] == "task 1 t 1"
        assert env.restarts == 1
        obs, _ = env.reset([5, 6], group_n=2)
        assert obs == ["start 5", "start 5", "start 6", "start 6"] and not env.done.any()
        obs, r, d, _ = env.step(["win"] * 4)
        assert np.all(r == 10.0)


def test_hanging_worker_times_out():
    with BatchedEnv(ToyEnv, num_envs=2, num_workers=2, timeout_s=1.0) as env:
        env.reset([0], group_n=2)
        t = time.time()
        _obs, _r, _d, infos = env.step(["hang", "inc"])
        assert time.time() - t < 10
        assert infos[0]["crashed"] and not infos[1]["crashed"]


class EchoEnv(ToyEnv):
    """Answers each action with the action itself as the observation."""

    def step(self, action):
        return action, 0.0, False, {"won": False, "task_score": 0.0, "admissible_actions": []}


@pytest.mark.parametrize("size", [300_000, 10_000_000])
def test_a_frozen_worker_cannot_block_a_large_send(size):
    """An action larger than the pipe's buffer (about 208 KB) to a SIGSTOPped worker: the send
    is bounded by timeout_s like the reply (it blocked step() forever, issue 27 item 7)."""
    import signal
    import threading

    with BatchedEnv(EchoEnv, num_envs=2, num_workers=2, timeout_s=1.0) as env:
        env.reset([0], group_n=2)
        frozen = env.worker_pids()[0]
        os.kill(frozen, signal.SIGSTOP)
        box = {}
        stepper = threading.Thread(
            target=lambda: box.update(out=env.step(["x" * size, "ok"])), daemon=True
        )
        t = time.monotonic()
        try:
            stepper.start()
            stepper.join(8.0)
            took = time.monotonic() - t
        finally:
            if _running(frozen):  # (before the fix: still frozen, blocking the send)
                os.kill(frozen, signal.SIGKILL)
            stepper.join(10.0)
        assert took < 1.0 + 3.0, f"step() took {took:.1f} s with timeout_s=1"
        obs, _r, d, infos = box["out"]
        assert infos[0]["crashed"] and d[0] and "timed out during step" in infos[0]["error"]
        assert not infos[1]["crashed"] and obs[1] == "ok" and env.restarts == 1
        assert env.worker_pids()[0] != frozen and not _running(frozen)
        obs, _ = env.reset([3], group_n=2)  # the restarted worker plays again
        assert obs == ["start 3", "start 3"]


def test_large_messages_pass_both_ways():
    with BatchedEnv(EchoEnv, num_envs=3, num_workers=2, timeout_s=30.0) as env:
        env.reset([0, 1, 2], group_n=1)
        actions = ["a" * 10_000_000, "b" * 300_000, "c"]
        obs, _r, d, infos = env.step(actions)
        assert obs == actions and not d.any() and not any(i["crashed"] for i in infos)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_envs"):
        BatchedEnv(ToyEnv, num_envs=0)


def test_webshop_groups_share_the_start():
    pytest.importorskip("bm25s", reason="WebShop search needs bm25s (extra [webshop])")
    from agentenvs.factories import observation_key, webshop_factory
    from agentenvs.webshop.env import webshop_task

    with BatchedEnv(webshop_factory(n_products=800, n_goals=200), num_envs=8, num_workers=2) as env:
        obs, infos = env.reset([3, 17], group_n=4)
        assert len(set(obs[:4])) == 1 and len(set(obs[4:])) == 1 and obs[0] != obs[4]
        assert all(i["admissible_actions"] == infos[0]["admissible_actions"] for i in infos)
        obs, _, _, _ = env.step(["search[tea]"] * 8)
        task = webshop_task(env.reset([3, 17], group_n=4)[0][0])
        assert observation_key("webshop", obs[0], task).startswith("'Back to Search'")


def _running(pid):
    """The process exists and is not a zombie."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_a_killed_parent(tmp_path):
    """A SIGKILLed parent cannot close its workers; the kernel must kill them, or they would
    wait forever on their pipes (keeping the parent's stdout open for whoever reads it)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(os.path.dirname(__file__))!r})\n"
        "from test_batched import ToyEnv\n"
        "from agentenvs.batched import BatchedEnv\n"
        "env = BatchedEnv(ToyEnv, num_envs=2, num_workers=2)\n"
        "env.reset([0], group_n=2)\n"
        "print(' '.join(str(p) for p in env.worker_pids()), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=os.getcwd())  # fmt: skip
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    assert not alive, f"workers {alive} outlived their killed parent"


def _unbuildable() -> ToyEnv:
    raise ModuleNotFoundError("No module named 'bm25s'")


def test_factory_that_cannot_build_raises_with_its_error():
    # before: every slot reported crashed, and the trainer failed later on an empty batch
    with (
        BatchedEnv(_unbuildable, num_envs=4, num_workers=2) as env,
        pytest.raises(RuntimeError, match=r"every one of the 4 environments.*bm25s"),
    ):
        env.reset([0, 1], group_n=2)


def test_ctrl_c_does_not_reach_the_workers():
    """Ctrl-C goes to the whole process group: the workers ignore it (no traceback from each),
    and the trainer stops and closes them."""
    import signal

    with BatchedEnv(ToyEnv, num_envs=4, num_workers=2) as env:
        env.reset([0, 1], group_n=2)
        for pid in env.worker_pids():
            os.kill(pid, signal.SIGINT)
        obs, _r, _d, infos = env.step(["inc"] * 4)
        assert not any(i["crashed"] for i in infos) and obs[0] == "task 0 t 1"
