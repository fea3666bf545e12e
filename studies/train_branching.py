"""Level-K utilisation of the LLM trainer's rollouts at equal env steps: schemes side by side.

    python -m studies.train_branching --out runs/train_branching \\
        --schemes independent branch:singleton branch:uniform --seeds 0 1 2 -- \\
        --preset tiny --env alfworld --alfworld-games-dir GAMES --action-mode score ...

Runs ``python -m hgpo.train`` once per (scheme, seed) with the arguments after ``--`` plus
``--rollout-scheme SCHEME --branch-budget B --seed S --out-dir OUT/SCHEME/seedS`` (a run whose
metrics already hold every iteration is not run again), then prints, per scheme, the mean over
seeds of each run's per-iteration means: level-K utilisation (the estimator's
``level{K}/utilisation``: share of steps whose level-K group has two or more members), env
steps per iteration (``n_steps``: one row per env step), episodes (roots) and branches per
iteration, rollout seconds per env step; with a 95% t interval over seeds, and the paired
difference to ``independent`` (same seed: same tasks in every iteration, same initial weights).
docs/branching.md ("In the LLM trainer") has the figures and the exact command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from hgpo.train.metrics import read_metrics


def _run(args: list[str], scheme: str, budget: float, seed: int, out: Path, iters: int) -> None:
    if (out / "metrics.jsonl").exists() and len(read_metrics(out)) >= iters:
        return
    cmd = [sys.executable, "-m", "hgpo.train", *args, "--rollout-scheme", scheme]
    cmd += ["--branch-budget", str(budget), "--seed", str(seed), "--out-dir", str(out)]
    cmd += ["--iterations", str(iters), "--progress", "false"]
    print("+", " ".join(cmd[1:]), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"run failed ({r.returncode}):\n{r.stderr[-3000:]}")


def _ci(x: np.ndarray) -> str:
    """mean ± 95% t half-width over seeds (mean only for one seed)."""
    if x.size < 2:
        return f"{x.mean():.3f}"
    h = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return f"{x.mean():.3f} ± {h:.3f}"


def _figures(out: Path, K: int) -> dict[str, float]:
    rows = read_metrics(out)
    steps = np.array([r["n_steps"] for r in rows], dtype=float)
    out_ = {
        "util": float(np.mean([r[f"level{K}/utilisation"] for r in rows])),
        "steps": float(steps.mean()),
        "episodes": float(np.mean([r["n_trajectories"] for r in rows])),
        "branches": float(np.mean([r.get("rollout/branches", 0) for r in rows])),
        "s_per_step": float(np.mean([r["time/rollout"] for r in rows] / steps)),
    }
    for key in TRUTH:  # --truth-every 1 runs (toy envs): the exact truth's figures
        if all(key in r for r in rows):
            out_[key] = float(np.mean([r[key] for r in rows]))
    return out_


TRUTH = ("truth/J", "truth/hgpo/mse_all", "truth/hgpo/grad_cos", "truth/gigpo/grad_cos")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", nargs="+", default=["independent", "branch:singleton"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--branch-budget", type=float, default=0.5)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--K", type=int, default=2, help="the run's --history-length")
    a = ap.parse_args(own)
    if a.schemes[0] != "independent":
        ap.error("--schemes: the first must be 'independent' (the reference)")
    figs: dict[str, list[dict[str, float]]] = {}
    for scheme in a.schemes:
        for seed in a.seeds:
            out = Path(a.out) / scheme.replace(":", "_") / f"seed{seed}"
            _run(rest, scheme, a.branch_budget, seed, out, a.iterations)
            figs.setdefault(scheme, []).append(_figures(out, a.K))
    ref = np.array([f["util"] for f in figs["independent"]])
    print(f"\n{len(a.seeds)} seeds x {a.iterations} iterations; mean ± 95% t over seeds")
    print(f"| scheme | level-{a.K} util | paired diff | env steps/iter | episodes (roots)/iter "
          "| branches/iter | rollout s/env step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for scheme, fs in figs.items():
        col = {k: np.array([f[k] for f in fs]) for k in fs[0]}
        diff = "" if scheme == "independent" else _ci(col["util"] - ref)
        print(f"| {scheme} | {_ci(col['util'])} | {diff} | {_ci(col['steps'])} | "
              f"{_ci(col['episodes'])} | {_ci(col['branches'])} | {_ci(col['s_per_step'])} |")  # fmt: skip
    truth = [k for k in TRUTH if k in figs["independent"][0]]
    if truth:  # each figure, then its paired difference to independent (same seed)
        print("\n| scheme | " + " | ".join(f"{k} | diff" for k in truth) + " |")
        print("|---|" + "---|---|" * len(truth))
        for scheme, fs in figs.items():
            cells = []
            for k in truth:
                x = np.array([f[k] for f in fs])
                base = np.array([f[k] for f in figs["independent"]])
                cells += [_ci(x), "" if scheme == "independent" else _ci(x - base)]
            print(f"| {scheme} | " + " | ".join(cells) + " |")
    print(json.dumps({s: fs for s, fs in figs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
