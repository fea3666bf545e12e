"""Time every estimator at the paper's batch size and at 10^5, 10^6 and 10^7 steps.

    python -m benchmarks.bench_estimators [--sizes 6400 100000 1000000 10000000] [--K 4]
        [--estimators hgpo gigpo_similarity] [--options gigpo_similarity_thresh=0.9]

Prints, per estimator and size, the median wall and CPU time, steps per second and the peak memory
that numpy allocated (tracemalloc sees numpy's buffers), and the machine's load average before
each size (on a shared machine the CPU time is the fairer per-core figure). Everything runs on one core: the
estimators are single-threaded numpy. The batch imitates ALFWorld: groups of 8 rollouts of
50 steps, states drawn from a small per-phase alphabet so that contexts share prefixes and
every level of the hierarchy has groups of several sizes. Each trajectory ends in a state of
its last phase's alphabet (``next_state``, read by graphgpo only), so failed trajectories'
last steps join the group's graph as the authors' rollouts do.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import tracemalloc

import numpy as np

from hgpo import ESTIMATORS, EstimatorConfig, StepBatch, compute_advantages, estimator_reads
from hgpo.options import ArgumentParser, parse_name_values


def synthetic_batch(
    n_steps: int, traj_len: int = 50, group_size: int = 8, seed: int = 0
) -> StepBatch:
    """A batch of ``n_steps`` steps: n_steps / traj_len trajectories of traj_len steps."""
    rng = np.random.default_rng(seed)
    n_traj = max(1, n_steps // traj_len)
    n = n_traj * traj_len
    t = np.tile(np.arange(traj_len, dtype=np.int64), n_traj)
    traj = np.repeat(np.arange(n_traj, dtype=np.int64), traj_len)
    state = (t // 5) * 4 + rng.integers(0, 4, n)  # 4 observations per 5-step phase
    reward = np.zeros(n)
    reward[t == traj_len - 1] = 10.0 * (rng.random(n_traj) < 0.4)
    invalid = rng.random(n) < 0.05
    action = rng.integers(0, 6, n)
    next_state = np.empty_like(state)
    next_state[:-1] = state[1:]
    next_state[traj_len - 1 :: traj_len] = ((traj_len - 1) // 5) * 4 + rng.integers(0, 4, n_traj)
    return StepBatch(traj // group_size, traj, t, reward, state, action, invalid,
                     next_state=next_state)  # fmt: skip


_PLACES = ("countertop", "cabinet", "drawer", "fridge", "shelf", "sinkbasin", "stoveburner",
           "microwave", "garbagecan", "desk")  # fmt: skip
_THINGS = ("apple", "mug", "knife", "plate", "spoon", "bread", "egg", "lettuce", "tomato",
           "cellphone", "pen", "book", "vase", "soapbar", "towel")  # fmt: skip


def observation_texts(batch: StepBatch, seed: int = 0) -> list[str]:
    """ALFWorld-like observation texts, one per step: each (rollout group, state) has its own
    text of about 150 characters (the task's place for the state's 5-step phase, and 4-7
    things drawn for the state), so texts of a phase share their opening and differ in the
    things, and no text recurs across rollout groups (no rollout group is another's task)."""
    rng = np.random.default_rng(seed)
    pairs = np.unique(np.stack([batch.group, batch.state], axis=1), axis=0)
    text = {}
    for g, s in pairs.tolist():
        place = _PLACES[(s // 4 + g) % len(_PLACES)]
        things = rng.choice(_THINGS, int(rng.integers(4, 8)), replace=False)
        listed = ", ".join(f"a {t} {int(rng.integers(1, 4))}" for t in things)
        text[g, s] = (
            f"Task {g}: you arrive at {place} {s // 4 + 1}. On the {place}, you see {listed}."
        )
    return [text[g, s] for g, s in zip(batch.group.tolist(), batch.state.tolist(), strict=True)]


def step_inputs(name: str, batch: StepBatch) -> dict[str, object]:
    """The per-step inputs estimator ``name`` reads (``hgpo.estimator_reads``): zeros as
    values, mean token entropies drawn from a gamma distribution, observation texts."""
    reads = estimator_reads(name)
    rng = np.random.default_rng(1)
    out: dict[str, object] = {}
    if "values" in reads:
        out["values"] = np.zeros(batch.n_steps)
    if "entropy" in reads:
        out["entropy"] = rng.gamma(2.0, 0.4, batch.n_steps)
    if "observations" in reads:
        out["observations"] = observation_texts(batch)
    return out


def time_one(
    name: str, batch: StepBatch, cfg: EstimatorConfig, repeat: int
) -> tuple[float, float, int]:
    """(median wall seconds, median CPU seconds, peak bytes) of one estimator call."""
    inputs = step_inputs(name, batch)
    compute_advantages(name, batch, cfg, **inputs)  # warm caches
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        compute_advantages(name, batch, cfg, **inputs)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tracemalloc.start()
    compute_advantages(name, batch, cfg, **inputs)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return float(np.median(wall)), float(np.median(cpu)), peak


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[6400, 100_000, 1_000_000, 10_000_000])
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--estimators", nargs="+", default=list(ESTIMATORS))
    p.add_argument("--repeat", type=int, default=0, help="timed runs per cell (0: by size)")
    p.add_argument("--options", default="",
                   help="estimator options for every estimator, name=value,... (EstimatorConfig "
                        "fields, e.g. gigpo_similarity_thresh=0.9)")  # fmt: skip
    args = p.parse_args(argv)
    for name in args.estimators:
        if name not in ESTIMATORS:
            p.error(f"--estimators: unknown estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    try:
        cfg = EstimatorConfig(K=args.K).replace(
            **parse_name_values(args.options, where="--options")
        )
    except ValueError as exc:
        p.error(f"--options: {exc}" if not str(exc).startswith("--options") else str(exc))
    shown = f", {args.options}" if args.options else ""
    print(
        f"numpy {np.__version__}, {platform.processor() or platform.machine()}, K={args.K}"
        f"{shown}, one core"
    )
    print("wall = elapsed time; cpu = this process's CPU time (what one core costs when others")
    print("compete for the machine); steps/s from cpu")
    print(f"{'estimator':<14}{'steps':>11}{'wall':>12}{'cpu':>12}{'steps/s':>14}{'peak MiB':>10}")
    for size in args.sizes:
        print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        batch = synthetic_batch(size)
        repeat = args.repeat or (50 if size <= 10_000 else 5 if size <= 1_000_000 else 1)
        for name in args.estimators:
            wall, cpu, peak = time_one(name, batch, cfg, repeat)
            print(
                f"{name:<14}{batch.n_steps:>11,}{wall * 1e3:>10.2f}ms{cpu * 1e3:>10.2f}ms"
                f"{batch.n_steps / max(cpu, 1e-9):>14,.0f}{peak / 2**20:>10.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
