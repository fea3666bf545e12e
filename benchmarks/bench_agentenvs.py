"""Environment steps per second of 128 WebShop and 32 ALFWorld environments, per backend.

Run: ``python -m benchmarks.bench_agentenvs [--envs 128] [--alfworld-envs 32] [--workers 2]
[--steps 10] [--backend process|ray|both]``. Random admissible actions (the same ones for every
backend); resets are timed apart from steps (wall seconds, and the CPU seconds of the worker
processes or Ray actors, which a shared machine does not inflate). ALFWorld plays generated
games through the real engine (needs the alfworld package); a group's members share their
worker's per-game translation and grammar (:mod:`agentenvs.alfworld.engine`). With
``--backend both`` each benchmark runs on worker processes, then on Ray actors on this machine
(a Ray started with --workers CPUs), and the line "ray/process" gives the overhead ratio of
env-steps/s.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from typing import Any

from agentenvs.batched import BatchedEnv
from agentenvs.factories import alfworld_factory, webshop_factory
from agentenvs.ray_cluster import ensure_ray
from hgpo.options import ArgumentParser


def _workers_cpu(env: BatchedEnv) -> float:
    """CPU seconds (user + system) used so far by the env's worker processes (Linux /proc)."""
    total = 0.0
    for pid in env.worker_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, AttributeError, IndexError, ValueError):
            return float("nan")
    return total


def _bench(name: str, env: BatchedEnv, n_tasks: int, group_n: int, steps: int) -> float:
    rng = random.Random(0)
    c0 = _workers_cpu(env)
    t0 = time.perf_counter()
    _, infos = env.reset(list(range(n_tasks)), group_n)
    t_reset = time.perf_counter() - t0
    c_reset = _workers_cpu(env) - c0
    n_steps, t_step = 0, 0.0
    c0 = _workers_cpu(env)
    for _ in range(steps):
        acts = []
        for info in infos:
            adm = [a for a in info.get("admissible_actions", []) if a != "search[<your query>]"]
            first = (info.get("admissible_actions") or [""])[0]
            if first == "search[<your query>]":  # WebShop's search page: a random query
                acts.append(f"search[{rng.choice(['tea', 'mug', 'shoes', 'lamp', 'cable'])}]")
            else:
                acts.append(rng.choice(adm) if adm else "look")
        live = int((~env.done).sum())
        if live == 0:
            break
        t0 = time.perf_counter()
        _, _, _, infos = env.step(acts)
        t_step += time.perf_counter() - t0
        n_steps += live
    c_step = _workers_cpu(env) - c0
    rate = n_steps / max(t_step, 1e-9)
    print(
        f"{name:9s} {env.backend:7s} envs={env.num_envs:4d} workers={env.num_workers} "
        f"reset={t_reset:6.1f}s (workers' CPU {c_reset:6.1f}s) steps={n_steps:5d} "
        f"step_time={t_step:6.1f}s (workers' CPU {c_step:6.1f}s) "
        f"-> {rate:8.1f} env-steps/s"
    )
    return rate


class EchoEnv:
    """No work at all: a step costs only the trip to the worker and back."""

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        return f"task {task}", {}

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return action, 0.0, False, {}


def _roundtrip(backend: str, workers: int, steps: int = 200) -> float:
    """Milliseconds per batch step of ``workers`` echo environments (one per worker)."""
    with BatchedEnv(EchoEnv, workers, workers, backend=backend) as env:
        env.reset(list(range(workers)), 1)
        env.step(["a"] * workers)  # warm
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(["a"] * workers)
        return (time.perf_counter() - t0) / steps * 1e3


def _compare(name: str, factory: Any, n_envs: int, group_n: int, a: argparse.Namespace) -> None:
    """One benchmark on each backend asked for, then the ray/process ratio of env-steps/s."""
    rates = {}
    for backend in ("process", "ray") if a.backend == "both" else (a.backend,):
        with BatchedEnv(factory, n_envs, a.workers, backend=backend) as env:
            rates[backend] = _bench(name, env, n_envs // group_n, group_n, a.steps)
    if len(rates) == 2:
        print(f"{name:9s} ray/process env-steps/s = {rates['ray'] / rates['process']:.2f}")


def main() -> None:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--envs", type=int, default=128, help="WebShop environments")
    ap.add_argument("--alfworld-envs", type=int, default=32, help="ALFWorld environments")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", choices=("process", "ray", "both"), default="process")
    ap.add_argument("--skip-alfworld", action="store_true")
    a = ap.parse_args()
    if a.backend != "process":
        ensure_ray("--backend ray")  # started before the timings, not inside them
    print("load average before: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for backend in ("process", "ray") if a.backend == "both" else (a.backend,):
        ms = _roundtrip(backend, a.workers)
        print(
            f"echo      {backend:7s} workers={a.workers} -> {ms:.2f} ms per batch step (no env work)"
        )
    _compare("webshop", webshop_factory(), a.envs, a.group, a)
    if not a.skip_alfworld:
        try:
            from agentenvs.alfworld.generator import generate_split
        except ImportError as e:
            print(f"alfworld   skipped: {e}")
            return
        with tempfile.TemporaryDirectory() as tmp:
            n_tasks = a.alfworld_envs // a.group
            files = [str(p) for p in generate_split(tmp, "train", n_tasks, seed=1)]
            _compare("alfworld", alfworld_factory(files), a.alfworld_envs, a.group, a)
    print("load average after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
