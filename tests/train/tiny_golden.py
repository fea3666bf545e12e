"""The tiny run's first 3 iterations, recorded: the figures the trainer must keep giving.

``tests/train/test_golden.py`` runs the same commands and compares every metric (timings and
rates aside) with ``tests/train/data/tiny_golden.json``. The file was written by the code
before the loop's redesign (commit 90cbbc7), so the test shows the redesign changed no figure:

    git archive 90cbbc7 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    PYTHONPATH=$PWD python -m tests.train.tiny_golden --root /tmp/base

Without ``--root`` it records the current code (after a deliberate change of the figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hgpo.options import ArgumentParser
from tests.train.conftest import ROOT, run_env

DATA = Path(__file__).parent / "data" / "tiny_golden.json"

COMMON = ["--preset", "tiny", "--env", "webshop", "--iterations", "3", "--seed", "3"]
RUNS: dict[str, list[str]] = {
    "hgpo": [*COMMON, "--val-every", "3"],
    "gae": [*COMMON, "--estimator", "gae", "--val-every", "0", "--ppo-epochs", "2"],
}
"""Two runs: HGPO with the KL reference and a validation; gae (the critic), two PPO epochs."""

VOLATILE = ("time/", "tokens_per_s")
"""Metric keys that vary from run to run (wall-clock figures)."""


def stable(row: dict) -> dict:
    """``row`` without its timings."""
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def run(args: list[str], root: Path, out: Path) -> list[dict]:
    """Run the trainer from ``root`` into ``out``; its metrics rows without timings."""
    env = run_env()
    env["PYTHONPATH"] = str(root)
    r = subprocess.run(
        [sys.executable, "-m", "hgpo.train", *args, "--out-dir", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode:
        raise RuntimeError(f"exit {r.returncode}\n{r.stderr[-3000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [stable(json.loads(x)) for x in lines if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--root", default=str(ROOT), help="the code to record (a checkout)")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in RUNS.items():
            out[name] = {"args": cli, "rows": run(cli, Path(args.root), Path(tmp) / name)}
    DATA.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DATA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
