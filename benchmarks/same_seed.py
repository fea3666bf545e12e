"""Whether one iteration of --preset smol-cpu repeats bit for bit in a second process.

Two processes, one after the other, the same seed and threads; where they first differ.

    python -m benchmarks.same_seed --groups 2 --group-size 4 --threads 2
    python -m benchmarks.same_seed --threads 2                       # the preset's 8 x 8 batch

Each process (``--worker FILE``) runs ``Trainer.iteration(1)`` as ``benchmarks.bench_smol``
does and writes, in float64 JSON, every step sample's response tokens, the rollout's old
log-probs and the reference's log-probs (the scoring phase), and the iteration's figures
(``pg_loss``, ``kl``, ``grad_norm``, ...; times and tokens/s left out). The report names the
first of these that differs between the two processes: the responses (the rollout sampled
other candidates), the log-probs (the scoring passes), or only the figures (the update). Exit
status 0 when all are bitwise equal, 1 when not. A check, not a test: it takes two iterations'
time (8 x 8: about 25 minutes on 2 cores). Needs the ``[smol]`` extra (docs/real_model.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hgpo.options import ArgumentParser

WORKER_TIMEOUT_S = 4 * 3600
"""The longest one process may run (the preset's 8 x 8 batch takes 12-15 minutes on 2 cores)."""

PHASES = (
    ("responses", "resp", "the rollout sampled other step samples"),
    ("old log-probs", "old", "the rollout's scoring differs"),
    ("reference log-probs", "ref", "the reference's scoring pass differs"),
    ("figures", "figures", "only the update (or the figures' sums) differs"),
)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.same_seed", description=__doc__.split("\n")[0])
    p.add_argument("--env", default="toy:tmaze:length=1", help="the env spec (default T-maze 1)")
    p.add_argument("--groups", type=int, default=8, help="rollout groups (default 8)")
    p.add_argument("--group-size", type=int, default=8, help="episodes per group (default 8)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both (default 2)")
    p.add_argument("--worker", metavar="FILE", help=argparse.SUPPRESS)  # one process's record
    return p


def run_iteration(args: Any) -> dict[str, Any]:
    """One iteration's samples, log-probs and figures (the module docstring)."""
    from hgpo.train.train_config import resolve
    from hgpo.train.trainer import Trainer

    got: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="same_seed-") as tmp:
        over = {"iterations": 1, "groups_per_iter": args.groups, "group_size": args.group_size,
                "seed": args.seed, "out_dir": tmp, "progress": False, "save_every": 0}  # fmt: skip
        trainer = Trainer(resolve(args.env, "smol-cpu", over))
        score = trainer._score

        def keep(roll: Any) -> Any:
            scored = score(roll)
            got["resp"] = [[int(t) for t in r] for r in roll.response_ids]
            got["old"] = [t.double().tolist() for t in scored.old]
            got["ref"] = None if scored.ref is None else [t.double().tolist() for t in scored.ref]
            return scored

        trainer._score = keep
        try:
            m = trainer.iteration(1)
        finally:
            trainer.close()
    got["figures"] = {k: float(v) for k, v in m.items()
                      if isinstance(v, (int, float)) and not k.startswith("time/")
                      and k != "tokens_per_s"}  # fmt: skip
    return got


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The report's line for the first phase whose record differs, None when none does."""
    for name, key, meaning in PHASES:
        if a[key] == b[key]:
            continue
        if key == "figures":
            diff = [f"{k} {a[key][k]!r} vs {b[key].get(k)!r}" for k in a[key]
                    if a[key][k] != b[key].get(k)]  # fmt: skip
            return f"{name} differ ({meaning}): " + "; ".join(diff[:6])
        rows = [i for i, (x, y) in enumerate(zip(a[key], b[key], strict=False)) if x != y]
        return f"{name} differ ({meaning}): {len(rows)} of {len(a[key])} samples, first #{rows[:1]}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.worker:
        Path(args.worker).write_text(json.dumps(run_iteration(args)))
        return 0
    for name, lo, hi in (("groups", 1, 64), ("group_size", 1, 64), ("threads", 1, 256)):
        if not lo <= getattr(args, name) <= hi:
            p.error(
                f"--{name.replace('_', '-')}: must be in [{lo}, {hi}], got {getattr(args, name)}"
            )
    from hgpo.train.preflight import validate_config
    from hgpo.train.train_config import resolve

    with tempfile.TemporaryDirectory(prefix="same_seed-") as tmp:
        over = {"groups_per_iter": args.groups, "group_size": args.group_size, "seed": args.seed,
                "out_dir": tmp}  # fmt: skip
        try:  # the CLI's checks, one line, before two processes load the model
            validate_config(resolve(args.env, "smol-cpu", over))
        except ValueError as e:
            p.error(str(e))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    flags = ["--env", args.env, "--groups", str(args.groups), "--group-size",
             str(args.group_size), "--seed", str(args.seed)]  # fmt: skip
    records = []
    with tempfile.TemporaryDirectory(prefix="same_seed-") as tmp:
        for i in (1, 2):
            out = Path(tmp) / f"run{i}.json"
            print(f"process {i} of 2: {args.groups} x {args.group_size} episodes, "
                  f"{args.threads} threads, seed {args.seed}", flush=True)  # fmt: skip
            cmd = [sys.executable, "-m", "benchmarks.same_seed", *flags, "--worker", str(out)]
            try:
                r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, timeout=WORKER_TIMEOUT_S, check=False)  # fmt: skip
            except subprocess.TimeoutExpired:
                print(f"error: process {i} ran past {WORKER_TIMEOUT_S} s (stopped)")
                return 2
            if r.returncode:
                print(f"error: process {i} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
                return 2
            records.append(json.loads(out.read_text()))
    diff = first_difference(*records)
    print(diff or f"bitwise the same: {len(records[0]['resp'])} samples' responses, old and "
          f"reference log-probs, and the figures (grad_norm {records[0]['figures']['grad_norm']!r})")  # fmt: skip
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
