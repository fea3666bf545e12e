"""Rollout throughput of every toy family against gymnasium's FrozenLake 8x8, and exact-solver
sizes.

    python -m benchmarks.bench_toyenvs            # throughput table + keydoor 6x6 K=2 exact
    python -m benchmarks.bench_toyenvs --exact    # also the exact-solver size sweep
    python -m benchmarks.bench_toyenvs --branching  # only the rollout schemes' cost per step
    python -m benchmarks.bench_toyenvs --branching --fit  # also: a trajectory's cost
    python -m benchmarks.bench_toyenvs --branching --checks  # also: the checks, compiled
    python -m benchmarks.bench_toyenvs --neural   # only the NeuralPolicy figures (targets)

Throughput counts env step + policy sampling + context keys (k = 0..K) per step, one thread,
as steps per CPU-second of this process (``time.process_time``, so per core even on a busy
machine) and per wall-second. "kernel" is the numba rollout call (``rollout_arrays``: warm
policy table, reused output buffers, calls of 256 groups x 8 rollouts); "end-to-end" is the
public ``toyenvs.rollout`` (fresh buffers, ``hgpo.StepBatch`` construction and validation).
Each figure is the best of ``--repeat`` measurements (the median is printed beside it), and
the load average is printed before and after: on a shared machine other processes slow a core
down even in CPU time (caches, frequency). A plain numba grid loop with a random draw per step
is timed as a reference for what the core gives at the moment.

NeuralPolicy (keydoor 5x5, K = 2, MLP width 64, next to the tabular policy on the same env and
calls): "kernel" is the same numba call reading the network's table; "+ forward per call"
also re-evaluates the network on every reachable context before each call of 256 x 8
rollouts, the cost a training iteration pays once. The training figure is one
``studies.train_toy`` run (keydoor 4x4, 100 iterations of 16 x 8 rollouts, hgpo, MLP width 64,
one torch thread) in CPU seconds (target <= 60).
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import gymnasium as gym
import numpy as np
from numba import njit

import toyenvs
from hgpo.batch import StepBatch, _parented_starts, _trajectory_starts
from hgpo.branched_batch import branch_layout
from hgpo.options import ArgumentParser
from studies.train_toy import TrainToyConfig, run_one
from toyenvs.branched_rollout import SCHEMES, branch_arrays, parse_scheme
from toyenvs.rollout import alloc_buffers, rollout_arrays


def _timed(fn, min_cpu: float) -> tuple[float, float, int]:
    """Run fn() until min_cpu CPU-seconds passed; (cpu s, wall s, total steps)."""
    steps = 0
    c0, w0 = time.process_time(), time.perf_counter()
    while time.process_time() - c0 < min_cpu:
        steps += fn()
    return time.process_time() - c0, time.perf_counter() - w0, steps


def _rates(fn, min_cpu: float, repeat: int) -> dict[str, float]:
    """Best and median steps per CPU-second over ``repeat`` runs, and the best per wall-second."""
    runs = [_timed(fn, min_cpu) for _ in range(repeat)]
    cpu = [s / c for c, _, s in runs]
    return {"cpu": max(cpu), "median": statistics.median(cpu),
            "wall": max(s / w for _, w, s in runs)}  # fmt: skip


@njit(cache=True)
def _grid_loop(n: int, seed: int) -> int:
    """A 10x10 grid random walk with one random draw per step (the machine's reference)."""
    np.random.seed(seed)
    x = 0
    y = 0
    hits = 0
    for _ in range(n):
        a = np.random.randint(0, 4)
        if a == 0:
            x = min(x + 1, 9)
        elif a == 1:
            x = max(x - 1, 0)
        elif a == 2:
            y = min(y + 1, 9)
        else:
            y = max(y - 1, 0)
        if x == 9 and y == 9:
            x = 0
            y = 0
            hits += 1
    return hits


def bench_reference(min_cpu: float, repeat: int) -> dict[str, float]:
    _grid_loop(10, 0)
    n = 2_000_000
    return _rates(lambda: (_grid_loop(n, 1), n)[1], min_cpu, repeat)


def bench_family(name: str, K: int, min_cpu: float, repeat: int, groups: int = 256, n: int = 8,
                 **params) -> tuple[dict[str, float], dict[str, float] | None]:  # fmt: skip
    """(kernel rates, end-to-end rates or None); end-to-end is measured for keydoor only."""
    env = toyenvs.make(name, **params)
    pol = toyenvs.TabularPolicy(env, K=K)
    tasks = np.resize(env.tasks, groups)
    buf = alloc_buffers(groups * n * env.horizon, groups * n, K)
    seed = iter(range(10**9))
    for _ in range(20):  # warm: compile and meet most contexts
        rollout_arrays(env, pol, tasks, n, next(seed), buf)

    def one() -> int:
        return rollout_arrays(env, pol, tasks, n, next(seed), buf)["step"].size

    kernel = _rates(one, min_cpu, repeat)
    full = None
    if name == "keydoor":

        def e2e() -> int:
            return toyenvs.rollout(env, pol, tasks=tasks, n_rollouts=n, seed=next(seed)).n_steps

        full = _rates(e2e, min_cpu, repeat)
    return kernel, full


def bench_neural(min_cpu: float, repeat: int, groups: int = 256, n: int = 8) -> dict[str, dict]:
    """Rollout rates on keydoor 5x5, K=2: tabular, MLP 64 (warm table), MLP + forward per call."""
    import torch

    torch.set_num_threads(1)
    env = toyenvs.make("keydoor", size=5)
    tasks = np.resize(env.tasks, groups)
    buf = alloc_buffers(groups * n * env.horizon, groups * n, 2)
    seed = iter(range(10**9))
    pols = {"tabular": toyenvs.TabularPolicy(env, K=2),
            "mlp": toyenvs.NeuralPolicy(env, K=2, arch="mlp", width=64)}  # fmt: skip
    out = {}
    for name, pol in pols.items():
        for _ in range(5):
            rollout_arrays(env, pol, tasks, n, next(seed), buf)

        def one(pol=pol) -> int:
            return rollout_arrays(env, pol, tasks, n, next(seed), buf)["step"].size

        out[name] = _rates(one, min_cpu, repeat)
    mlp = pols["mlp"]

    def with_forward() -> int:
        mlp.refresh()
        return rollout_arrays(env, mlp, tasks, n, next(seed), buf)["step"].size

    out["mlp + forward per call"] = _rates(with_forward, min_cpu, repeat)
    return out


def bench_neural_training() -> tuple[float, float, float]:
    """(CPU s, wall s, final train success) of one MLP train_toy run (see module doc)."""
    cfg = TrainToyConfig(policy="mlp", width=64, iterations=100, groups=16, rollouts=8)
    run = {"env": "keydoor:size=4,horizon=40", "setting": "hgpo", "K": 2, "seed": 0}
    small = TrainToyConfig(policy="mlp", width=64, iterations=2, eval_rollouts=1)
    run_one(small, run)  # compile the kernels first
    c0, w0 = time.process_time(), time.perf_counter()
    r = run_one(cfg, run)
    return time.process_time() - c0, time.perf_counter() - w0, r["evals"][-1]["train_success"]


def report_neural(seconds: float, repeat: int) -> None:
    print(f"before: {_load()} ({os.cpu_count()} cores)")
    rates = bench_neural(seconds, repeat)
    print("NeuralPolicy rollouts, keydoor 5x5, K=2, calls of 256 x 8 rollouts, env-steps/s "
          "(target for mlp: >= 2,000,000 per core)")  # fmt: skip
    print(f"{'policy':<36}{'steps/s/core':>14}{'median':>14}{'wall':>14}")
    for name, r in rates.items():
        print(f"{name:<36}{r['cpu']:>14,.0f}{r['median']:>14,.0f}{r['wall']:>14,.0f}")
    cpu, wall, succ = bench_neural_training()
    print(
        f"one MLP-64 training run, keydoor 4x4, 100 iterations of 16 x 8 rollouts (hgpo): "
        f"{cpu:.1f} CPU s, {wall:.1f} wall s (target <= 60 s one core); final success {succ:.2f}"
    )
    print(f"after: {_load()}")


def bench_frozenlake(min_cpu: float, repeat: int) -> dict[str, float]:
    env = gym.make("FrozenLake-v1", map_name="8x8", is_slippery=True)
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 4, size=100_000).tolist()

    def chunk() -> int:
        for a in actions:
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
        return len(actions)

    return _rates(chunk, min_cpu, repeat)


def bench_exact(name: str, K: int, **params) -> dict:
    env = toyenvs.make(name, **params)
    pol = toyenvs.TabularPolicy(env, K=K)
    t0 = time.perf_counter()
    try:
        gt = toyenvs.exact_ground_truth(env, pol)
    except toyenvs.ChainTooLarge:
        return {"env": name, "K": K, "params": params, "nodes": ">limit"}
    return {
        "env": name, "K": K, "params": params, "states": env.n_states, "nodes": gt.n_nodes,
        "contexts": pol.n_contexts, "seconds": time.perf_counter() - t0,
        "MiB": gt.nbytes / 2**20,
    }  # fmt: skip


FAMILY_PARAMS = {
    "keydoor": dict(size=6, horizon=30),
    "tmaze": dict(length=8),
    "household": dict(),
    "shop": dict(),
    "random": dict(n_states=50, horizon=30),
}

SWEEP = [
    ("keydoor", 2, dict(size=6, horizon=30)),
    ("keydoor", 3, dict(size=6, horizon=30)),
    ("keydoor", 2, dict(size=8, horizon=40)),
    ("keydoor", 4, dict(size=6, horizon=30)),
    ("keydoor", 2, dict(size=10, horizon=50)),
    ("keydoor", 2, dict(size=6, horizon=30, slip=0.1)),
    ("tmaze", 4, dict(length=10)),
    ("household", 2, dict()),
    ("household", 3, dict()),
    ("shop", 4, dict()),
    ("random", 2, dict(n_states=50, horizon=30)),
    ("random", 3, dict(n_states=50, horizon=30)),
]


def bench_branching(K: int, rounds: int, groups: int = 64, n: int = 8) -> None:
    """CPU and wall time per env step of every rollout scheme against today's independent
    rollouts, end to end (``toyenvs.rollout``, branched StepBatch included), at the step budget
    per group that N = 8 independent rollouts use on average (keydoor 5x5, uniform policy).

    The schemes run in turn, a burst of 10 calls each, ``rounds`` times over (so a slow spell
    of a shared machine falls on every scheme alike); a figure is the fastest burst and the
    median one. Ratios: time per env step relative to today's independent rollouts (N = 8,
    ``rollout_kernel_fast``), and to ``independent`` run to the step budget (roots only, the
    branching kernel: the same machinery, so the cost of branching itself)."""
    env = toyenvs.make("keydoor", size=5)
    pol = toyenvs.TabularPolicy(env, K=K)
    tasks = np.resize(env.tasks, groups)
    seed = iter(range(10**9))
    steps = toyenvs.rollout(env, pol, tasks=tasks, n_rollouts=n, seed=0).n_steps // groups
    schemes = [s.replace("tree:D", "tree:2,4") for s in SCHEMES]

    def call(scheme: str | None) -> int:
        if scheme is None:
            return toyenvs.rollout(env, pol, tasks=tasks, n_rollouts=n, seed=next(seed)).n_steps
        return toyenvs.rollout(env, pol, tasks=tasks, seed=next(seed), scheme=scheme,
                               steps=steps, branch_budget=0.5).n_steps  # fmt: skip

    def burst(scheme: str | None) -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        rows = sum(call(scheme) for _ in range(10))
        return (time.process_time() - c0) / rows * 1e9, (time.perf_counter() - w0) / rows * 1e9

    labels = [("independent N=8 (today)", None), *[(s, s) for s in schemes]]
    for _, scheme in labels:  # warm: compile
        for _ in range(3):
            call(scheme)
    print(f"\nrollout schemes, keydoor 5x5 K={K}, {groups} groups, {steps} env steps per group "
          f"(= N={n} independent), branch_budget 0.5, end to end; before: {_load()}")  # fmt: skip
    times: dict[str | None, list[tuple[float, float]]] = {s: [] for _, s in labels}
    for _ in range(rounds):
        for _, scheme in labels:
            times[scheme].append(burst(scheme))
    print(f"ns per env step over {rounds} bursts of 10 calls (fastest / median); x: time per "
          f"step relative to today's independent rollouts | to independent to the budget; "
          f"after: {_load()}")  # fmt: skip
    print(f"{'scheme':<26}{'CPU':>7}{'median':>8}{'wall':>7}{'x today':>9}{'median':>8}"
          f"{'x budget':>10}{'median':>8}")  # fmt: skip

    def fig(scheme: str | None) -> tuple[float, float, float]:
        cpu = [c for c, _ in times[scheme]]
        return min(cpu), statistics.median(cpu), min(w for _, w in times[scheme])

    base, ref = fig(None), fig("independent")
    for label, scheme in labels:
        c, m, w = fig(scheme)
        print(f"{label:<26}{c:>7.1f}{m:>8.1f}{w:>7.1f}{c / base[0]:>9.2f}{m / base[1]:>8.2f}"
              f"{c / ref[0]:>10.2f}{m / ref[1]:>8.2f}")  # fmt: skip
    _branching_breakdown(env, pol, tasks, n, steps, labels, rounds, seed)


def _branching_breakdown(env, pol, tasks, n, steps, labels, rounds, seed) -> None:
    """Where a call's time goes: the kernel's arrays (``rollout_arrays`` / ``branch_arrays``:
    the numba call and its Python around it) and the ``StepBatch`` built from them, called as
    ``toyenvs.rollout`` calls them (its argument checks and ``Rollouts`` are the small rest):
    fastest burst of 10 calls of each, ns per step."""
    cols = ("group", "traj", "step", "reward", "state", "action", "invalid")

    def parts(scheme: str | None) -> tuple[float, float]:
        t_arr = t_sb = 0.0
        rows = 0
        for _ in range(10):
            s = next(seed)
            t0 = time.process_time()
            if scheme is None:
                r = rollout_arrays(env, pol, tasks, n, s)
                extra = {}
            else:
                r = branch_arrays(env, pol, tasks, s, parse_scheme(scheme, env.horizon), steps, 0.5)
                extra = {"parent": r["parent"]}
            t1 = time.process_time()
            StepBatch(**{k: r[k] for k in cols}, **extra)
            t_arr, t_sb = t_arr + t1 - t0, t_sb + time.process_time() - t1
            rows += r["group"].shape[0]
            del r, extra  # before the next call (see bench_branching_fit)
        return t_arr / rows * 1e9, t_sb / rows * 1e9

    got: dict[str | None, list[tuple[float, float]]] = {s: [] for _, s in labels}
    for _ in range(max(rounds // 2, 3)):
        for _, scheme in labels:
            got[scheme].append(parts(scheme))
    print("where the time goes, ns per env step (fastest burst of each): the kernel's arrays "
          "and their StepBatch")  # fmt: skip
    print(f"{'scheme':<26}{'arrays':>8}{'StepBatch':>11}")
    for label, scheme in labels:
        a, b = (min(x[i] for x in got[scheme]) for i in range(2))
        print(f"{label:<26}{a:>8.1f}{b:>11.1f}")


def bench_branching_fit(K: int, rounds: int, groups: int = 64, steps: int = 200) -> None:
    """What a trajectory costs the branching kernel: ``branch_arrays`` (the numba call and its
    Python) of ``branch:uniform`` at branch budgets 0.05..0.95, same tasks, fastest of
    ``rounds`` bursts of 10 calls each; least squares time = a rows + b trajectories (a also
    carries the per-call constant: the row counts hardly change)."""
    env = toyenvs.make("keydoor", size=5)
    pol = toyenvs.TabularPolicy(env, K=K)
    tasks = np.resize(env.tasks, groups)
    scheme = parse_scheme("branch:uniform", env.horizon)
    seed = iter(range(10**9))
    budgets = (0.05, 0.25, 0.5, 0.75, 0.95)
    for budget in budgets:  # warm: compile, and a policy table that has met every context
        for _ in range(10):
            branch_arrays(env, pol, tasks, next(seed), scheme, steps, budget)
    X, Y = [], []
    print(f"\nbranch:uniform kernel arrays, keydoor 5x5 K={K}, {groups} groups x {steps} steps; "
          f"{_load()}")  # fmt: skip
    for budget in budgets:
        best, shape = float("inf"), (0.0, 0.0)
        for _ in range(rounds):
            c0, rows, traj = time.process_time(), 0, 0
            for _ in range(10):  # (each result dropped before the next call, as in the
                r = branch_arrays(env, pol, tasks, next(seed), scheme, steps, budget)
                rows, traj = rows + r["group"].shape[0], traj + r["success"].shape[0]
                del r  # other benchmarks: holding it makes the next call's arrays fresh memory)
            if (dt := time.process_time() - c0) < best:
                best, shape = dt / 10, (rows / 10, traj / 10)
        X.append(shape)
        Y.append(best)
        print(f"budget {budget:.2f}: {shape[0]:,.0f} rows, {shape[1]:,.0f} trajectories, "
              f"{best * 1e6:,.1f} us a call ({best / shape[0] * 1e9:.2f} ns per row)")  # fmt: skip
    (a, b), *_ = np.linalg.lstsq(np.array(X), np.array(Y), rcond=None)
    print(f"fit: {a * 1e9:.1f} ns per row + {b * 1e9:.0f} ns per trajectory")


@njit(cache=True)
def _compiled_checks(step, traj, group, parent, state):
    """(diagnosis for ``--checks``, not used by the product) The checks a branched StepBatch
    makes in numpy (``hgpo.batch._parented_starts`` and ``hgpo.branched_batch.branch_layout``, on
    a batch whose trajectory ids are 0..n-1 in order and whose branches start at or after
    their parent's first own step, as every rollout kernel writes them) in one compiled
    pass. Returns (trajectory starts, their number, fault): fault 0 when every check holds."""
    n = step.shape[0]
    starts = np.empty(n, np.int64)
    ns = 1
    starts[0] = 0
    for i in range(1, n):  # rows: a trajectory starts where its id changes; else step + 1,
        if traj[i] != traj[i - 1]:  # same group, same parent
            starts[ns] = i
            ns += 1
        elif step[i] != step[i - 1] + 1 or group[i] != group[i - 1] or parent[i] != parent[i - 1]:
            return starts, ns, 1
    vlen = np.empty(ns, np.int64)
    for j in range(ns):  # trajectories: a root at step 0; a branch of an earlier trajectory at
        f = starts[j]  # a step 1..T_p - 1, in its group, from its state at that step
        b, p = step[f], parent[f]
        vlen[j] = b + (starts[j + 1] if j + 1 < ns else n) - f
        if traj[f] != j:
            return starts, ns, 2
        if p < 0:
            if b != 0 or p < -1:
                return starts, ns, 3
            continue
        if p >= j or b < 1 or b >= vlen[p] or b < step[starts[p]]:
            return starts, ns, 4
        r = starts[p] + b - step[starts[p]]
        if group[r] != group[f] or state[r] != state[f]:
            return starts, ns, 5
    return starts, ns, 0


def bench_branching_checks(K: int, rounds: int, groups: int = 64, steps: int = 200) -> None:
    """What the branched StepBatch's checks cost (``--checks``): its numpy row pass and
    branch layout on the same ``branch:uniform`` batch as the cost table, against the same
    checks in one compiled pass (:func:`_compiled_checks`, checked to agree on every batch);
    today's unbranched row pass beside. Fastest of ``rounds`` bursts of 200 calls, warm."""
    env = toyenvs.make("keydoor", size=5)
    pol = toyenvs.TabularPolicy(env, K=K)
    tasks = np.resize(env.tasks, groups)
    today = toyenvs.rollout(env, pol, tasks=tasks, n_rollouts=8, seed=1).batch
    r = branch_arrays(env, pol, tasks, 1, parse_scheme("branch:uniform", env.horizon), steps, 0.5)
    cols = ("group", "traj", "step", "reward", "state", "action", "invalid")
    b = StepBatch(**{k: r[k] for k in cols}, parent=r["parent"])
    starts, ns, fault = _compiled_checks(b.step, b.traj, b.group, b.parent, b.state)
    assert fault == 0 and np.array_equal(starts[:ns], b.traj_start)

    def best(fn) -> float:
        t = []
        for _ in range(rounds):
            c0 = time.process_time()
            for _ in range(200):
                fn()
            t.append((time.process_time() - c0) / 200)
        return min(t) * 1e6

    rows = b.n_steps
    figs = {
        "today: unbranched row pass (numpy)": (
            best(lambda: _trajectory_starts(today.step, today.traj, today.group)),
            today.n_steps,
        ),
        "branched: row pass (numpy)": (
            best(lambda: _parented_starts(b.step, b.traj, b.group, b.parent)), rows,
        ),
        "branched: branch layout (numpy)": (
            best(lambda: branch_layout(b.parent, b.traj, b.group, b.state, b.step,
                                       b.traj_start, b.traj_len, True)), rows,
        ),
        "branched: both, one compiled pass": (
            best(lambda: _compiled_checks(b.step, b.traj, b.group, b.parent, b.state)), rows,
        ),
    }  # fmt: skip
    print(f"\nbranched StepBatch checks, branch:uniform, keydoor 5x5 K={K}, {groups} groups x "
          f"{steps} steps ({rows:,} rows, {b.n_traj} trajectories; today {today.n_steps:,} rows, "
          f"{today.n_traj}); fastest of {rounds} bursts of 200 calls, {_load()}")  # fmt: skip
    for label, (us, n) in figs.items():
        print(f"{label:<38}{us:>8.1f} us{us / n * 1e3:>8.2f} ns per row")


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, default=4, help="history length of the policy")
    ap.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="measurements per figure (best kept)")
    ap.add_argument("--exact", action="store_true", help="also run the exact-solver sweep")
    ap.add_argument("--branching", action="store_true", help="only the rollout schemes' costs")
    ap.add_argument("--rounds", type=int, default=40,
                    help="--branching: bursts of 10 calls per scheme, taken in turn")  # fmt: skip
    ap.add_argument("--fit", action="store_true",
                    help="--branching: also the kernel's cost per row and per trajectory")  # fmt: skip
    ap.add_argument("--checks", action="store_true",
                    help="--branching: also the branched StepBatch's checks, numpy and compiled")  # fmt: skip
    ap.add_argument("--neural", action="store_true", help="only the NeuralPolicy figures")
    args = ap.parse_args()
    if args.branching:
        bench_branching(args.K, args.rounds)
        if args.fit:
            bench_branching_fit(args.K, max(args.rounds // 2, 3))
        if args.checks:
            bench_branching_checks(args.K, max(args.rounds // 2, 3))
        return
    if args.neural:
        report_neural(args.seconds, args.repeat)
        return

    print(f"before: {_load()} ({os.cpu_count()} cores)")
    ref = bench_reference(args.seconds, args.repeat)
    fl = bench_frozenlake(args.seconds, args.repeat)
    print(f"rollout throughput, K={args.K}, uniform policy, steps/s: per CPU-second best of "
          f"{args.repeat} (median) | per wall-second")  # fmt: skip
    print(f"{'env':<36}{'steps/s/core':>14}{'median':>14}{'wall':>14}{'x FrozenLake':>14}")

    def line(label: str, r: dict[str, float]) -> None:
        ratio = r["cpu"] / fl["cpu"]
        print(f"{label:<36.36}{r['cpu']:>14,.0f}{r['median']:>14,.0f}{r['wall']:>14,.0f}"
              f"{ratio:>14.1f}")  # fmt: skip

    line("reference: numba 10x10 grid loop", ref)
    line("gymnasium FrozenLake-v1 8x8", fl)
    for name, params in FAMILY_PARAMS.items():
        kernel, full = bench_family(name, args.K, args.seconds, args.repeat, **params)
        line(f"{name} {params}" if params else name, kernel)
        if full is not None:
            line("  keydoor end-to-end: rollout()", full)
    print(f"after: {_load()}")
    bench_exact("keydoor", 2, size=6, horizon=30)  # compiles the solver kernels if needed
    r = bench_exact("keydoor", 2, size=6, horizon=30)
    print(f"\nexact ground truth keydoor 6x6 K=2 (compiled): {r['nodes']:,} nodes, {r['contexts']:,} contexts, "
          f"{r['seconds']:.2f} s, {r['MiB']:.1f} MiB")  # fmt: skip
    if args.exact:
        print(f"\n{'env':<42}{'K':>3}{'states':>8}{'nodes':>12}{'contexts':>11}{'s':>8}{'MiB':>8}")
        for name, K, params in SWEEP:
            r = bench_exact(name, K, **params)
            label = f"{name} {params}" if params else name
            if r["nodes"] == ">limit":
                print(f"{label:<42.42}{K:>3}  exceeds max_nodes")
                continue
            print(f"{label:<42.42}{K:>3}{r['states']:>8}{r['nodes']:>12,}{r['contexts']:>11,}"
                  f"{r['seconds']:>8.2f}{r['MiB']:>8.0f}")  # fmt: skip
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak resident memory of this process: {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
