"""Level-K utilisation of the LLM trainer's rollouts at equal env steps: schemes side by side.

    python -m studies.train_branching --out runs/train_branching \\
        --schemes independent branch:singleton branch:uniform --seeds 0 1 2 -- \\
        --preset tiny --env alfworld --alfworld-games-dir GAMES --action-mode score ...

Runs ``python -m hgpo.train`` once per (scheme, seed) with the arguments after ``--`` plus
``--rollout-scheme SCHEME --branch-budget B --seed S --iterations I --out-dir
OUT/SCHEME/seedS_KEY --resume``. KEY hashes the run's whole resolved TrainConfig (``hgpo.train
--print-config`` of those arguments, without its out_dir, resume and progress), so a run made
with other settings (another --iterations, another ``--lr`` after ``--``) is never read back:
it gets a folder of its own, and a run whose metrics already hold every iteration is not run
again. The study's own flags may not be given after ``--`` (a one-line error). Every flag, and
the runs' arguments through ``--print-config``, is checked before the first run; then it
prints, per scheme, the mean over seeds of each run's per-iteration means: level-K utilisation
(the estimator's ``level{K}/utilisation``: share of steps whose level-K group has two or more
members), env steps per iteration (``n_steps``: one row per env step), episodes (roots) and
branches per iteration, rollout seconds per env step; with a 95% t interval over seeds, and the
paired difference to ``independent`` (same seed: same tasks in every iteration, same initial
weights).
docs/branching.md ("In the LLM trainer") has the figures and the exact command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import stats

from hgpo.options import ArgumentParser, bad, check_int, check_number
from hgpo.train.run_metrics import read_metrics
from hgpo.train.train_config import build_parser
from studies.backend import set_parent_death_signal
from studies.cli import check_out_dir, one_line_stops
from studies.io import result_key
from toyenvs.branched_rollout import parse_scheme


@dataclass(frozen=True)
class Study:
    """The checked command line: the runs' arguments (after ``--``) and this study's own."""

    out: Path
    schemes: tuple[str, ...]
    seeds: tuple[int, ...]
    branch_budget: float
    iterations: int
    K: int
    run_args: tuple[str, ...]
    configs: dict[str, dict] = field(default_factory=dict)
    """scheme -> the runs' resolved TrainConfig (seed: the first; out_dir, resume and progress
    left out): what a run's folder is keyed by."""

    def run_dir(self, scheme: str, seed: int) -> Path:
        """``OUT/SCHEME/seedS_KEY``: KEY hashes the run's whole configuration (:func:`run_key`)."""
        return self.out / scheme.replace(":", "_") / run_key(self.configs[scheme], seed)

    def run_argv(self, scheme: str, seed: int, out_dir: Path | None = None) -> list[str]:
        """``python -m hgpo.train``'s arguments for one run (``--resume``: a run killed after
        a checkpoint goes on from it; without one it starts afresh)."""
        out_dir = self.run_dir(scheme, seed) if out_dir is None else out_dir
        budget = [] if scheme == "independent" else ["--branch-budget", str(self.branch_budget)]
        return [
            *self.run_args, "--rollout-scheme", scheme, *budget,  # (no budget: it would do nothing)
            "--seed", str(seed), "--out-dir", str(out_dir),
            "--iterations", str(self.iterations), "--progress", "false", "--resume",
        ]  # fmt: skip


UNKEYED = ("out_dir", "resume", "progress")
"""TrainConfig fields left out of a run's key: where it is written, and how it is run."""

OWN = {
    "rollout_scheme": "give --schemes",
    "branch_budget": "give --branch-budget before --",
    "seed": "give --seeds",
    "out_dir": "give --out",
    "iterations": "give --iterations before --",
    "resume": "every run resumes",
    "progress": "the runs' progress bars are off",
    "print_config": "the study reads it itself",
}
"""``hgpo.train`` options this study sets for every run, and what to give instead."""


def run_key(config: dict, seed: int) -> str:
    """``seed{S}_`` and a hash of the run's resolved TrainConfig at that seed (its scheme,
    branch budget, iterations and every setting after ``--``; not where it is written)."""
    settings = {k: v for k, v in config.items() if k not in UNKEYED}
    return result_key(f"seed{seed}", {**settings, "seed": seed})


def check_run_args(run_args: tuple[str, ...]) -> None:
    """A ValueError naming the first option after ``--`` that the study sets itself, in any
    spelling ``hgpo.train`` accepts (``--flag value``, ``--flag=value``, a unique prefix)."""
    options = build_parser()._option_string_actions
    for tok in run_args:
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0]
        hits = [name] if name in options else [o for o in options if o.startswith(name)]
        dests = {options[o].dest for o in hits}
        if len(dests) == 1 and (dest := dests.pop()) in OWN:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} after --: the study sets it itself ({OWN[dest]})")


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="python -m studies.train_branching",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", nargs="+", default=["independent", "branch:singleton"],
                    help="rollout schemes; the first must be independent (the reference)")  # fmt: skip
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--branch-budget", type=float, default=0.5)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--K", type=int, default=None,
                    help="the level whose utilisation is read (default: the runs' "
                    "--history-length; another value is an error)")  # fmt: skip
    return ap


def parse(argv: list[str]) -> Study:
    """The study of ``argv`` (its own flags, then ``--`` and the runs' arguments), every value
    checked before any run: a ValueError naming the flag and the value. The runs' arguments
    go through ``hgpo.train --print-config`` once per scheme (the trainer's own checks)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    a = _parser().parse_args(argv[:cut])
    for i, scheme in enumerate(a.schemes):
        parse_scheme(scheme, where="--schemes")
        if a.schemes.index(scheme) != i:
            raise bad("--schemes", "distinct schemes", scheme)
    if a.schemes[0] != "independent":
        raise bad("--schemes", "'independent' first (the reference)", a.schemes[0])
    for seed in a.seeds:
        check_int("--seeds", seed, lo=0)
    if len(set(a.seeds)) != len(a.seeds):
        raise bad("--seeds", "distinct seeds", a.seeds)
    check_number("--branch-budget", a.branch_budget, lo=0, hi=1, lo_open=True)
    check_int("--iterations", a.iterations, lo=1)
    check_out_dir(a.out)
    run_args = tuple(argv[cut + 1 :])
    check_run_args(run_args)
    study = Study(Path(a.out), tuple(a.schemes), tuple(a.seeds), a.branch_budget, a.iterations,
                  -1, run_args)  # fmt: skip
    configs = {scheme: _run_config(study, scheme) for scheme in study.schemes}
    K = min(c["history_length"] for c in configs.values())
    if a.K is not None and a.K != K:  # (the runs of the schemes differ in the scheme only)
        raise bad("--K", f"the runs' --history-length {K} (or left out)", a.K)
    return replace(study, K=K, configs=configs)


def _run_config(study: Study, scheme: str) -> dict:
    """The validated TrainConfig of the runs of ``scheme`` (``--print-config``; out_dir a
    folder that does not exist, so that no saved config.json is read in its place)."""
    argv = study.run_argv(scheme, study.seeds[0], out_dir=study.out / "(key)")
    r = subprocess.run([sys.executable, "-m", "hgpo.train", *argv, "--print-config"],
                       capture_output=True, text=True, preexec_fn=set_parent_death_signal)  # fmt: skip
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(f"the runs' arguments (after --) with --rollout-scheme {scheme}: {last}")
    return json.loads(r.stdout)


def _run(study: Study, scheme: str, seed: int) -> None:
    """One training run, unless its folder (keyed by its whole configuration) already holds
    every iteration; SystemExit with the run's exit status and its error when it fails."""
    out = study.run_dir(scheme, seed)
    if (out / "metrics.jsonl").exists() and len(_rows(out, study.iterations)) == study.iterations:
        return
    cmd = [sys.executable, "-m", "hgpo.train", *study.run_argv(scheme, seed)]
    print("+", " ".join(cmd[1:]), flush=True)
    # (the run dies with the study: a killed study leaves no trainer behind; --resume goes on)
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=set_parent_death_signal)
    if r.returncode == 2:  # the trainer's one-line error (a setting this machine cannot run)
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1].removeprefix("error: ")
        print(f"error: run {scheme} seed {seed}: {last}", file=sys.stderr)
        raise SystemExit(2)
    if r.returncode:
        print(f"error: run {scheme} seed {seed} failed ({r.returncode}):\n{r.stderr[-3000:]}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(r.returncode)


def _ci(x: np.ndarray) -> str:
    """mean ± 95% t half-width over seeds (mean only for one seed)."""
    if x.size < 2:
        return f"{x.mean():.3f}"
    h = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return f"{x.mean():.3f} ± {h:.3f}"


def _rows(out: Path, iterations: int) -> list[dict]:
    """The run's metric rows of iterations 1..``iterations`` (one each)."""
    rows = {r["iteration"]: r for r in read_metrics(out) if r.get("iteration", 0) <= iterations}
    return [rows[i] for i in sorted(rows)]


def _figures(out: Path, K: int, iterations: int) -> dict[str, float]:
    rows = _rows(out, iterations)
    if len(rows) != iterations:
        raise ValueError(f"{out}: {len(rows)} of {iterations} iterations in its metrics.jsonl")
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


def _print_tables(a: Study, figs: dict[str, list[dict[str, float]]]) -> None:
    """Per scheme: the mean over seeds ± 95% t, and the paired difference to independent."""
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


@one_line_stops()
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        a = parse(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    figs: dict[str, list[dict[str, float]]] = {}
    for scheme in a.schemes:
        for seed in a.seeds:
            _run(a, scheme, seed)
            figs.setdefault(scheme, []).append(_figures(a.run_dir(scheme, seed), a.K, a.iterations))
    _print_tables(a, figs)
    print(json.dumps({s: fs for s, fs in figs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
