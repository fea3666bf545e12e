"""The LLM part of studies.compare: every estimator against the exact advantage of an LLM policy.

``hgpo.train --preset tiny --env toy:... --action-mode score --truth-every N`` trains the tiny
model on a toy text env with one estimator (the comparison's baseline); every N iterations its
truth monitor (hgpo.train.truth_monitor) solves the exact V, Q and A* of the LLM policy itself
and runs *every* registered estimator on that iteration's batch, logging
``truth/<estimator>/<metric>``. So all estimators are measured on the same batches, and the
batch-by-batch differences between two of them are paired.

Each run is a child process forked from this one (so that estimators registered here with
``hgpo.register_estimator`` are registered there too), with one torch thread unless
``OMP_NUM_THREADS`` says otherwise and its output in ``<out>/<estimator>-s<seed>.log``; a run
whose metrics.jsonl holds every iteration is not run again (resume), an unfinished one is run
afresh (``--fresh``: the runs save no checkpoints).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LLMSettings", "check_llm", "llm_argv", "run_llm"]


@dataclass(frozen=True)
class LLMSettings:
    """The LLM runs of a comparison."""

    env: str
    estimator: str
    """The estimator the runs train with (the comparison's baseline)."""
    seeds: int
    iterations: int
    truth_every: int
    out: str

    def run_dir(self, seed: int) -> Path:
        """``<out>/<estimator>-s<seed>`` (the folder name studies.llm_truth_report reads)."""
        return Path(self.out) / f"{self.estimator}-s{seed}"


def llm_argv(s: LLMSettings, seed: int, horizon: int) -> list[str]:
    """``hgpo.train``'s command line of run ``seed``: the CPU demo of docs/train.md (score mode,
    4 groups x 8 rollouts, lr 1e-3, no KL term) with the env's whole horizon."""
    return [
        "--preset", "tiny", "--env", s.env, "--history-length", "2",
        "--max-steps", str(horizon), "--action-mode", "score", "--groups-per-iter", "4",
        "--group-size", "8", "--iterations", str(s.iterations), "--truth-every",
        str(s.truth_every), "--lr", "1e-3", "--kl-coef", "0", "--mini-batch-size", "64",
        "--micro-batch-size", "16", "--val-every", "0", "--save-every", "0",
        "--estimator", s.estimator, "--seed", str(seed), "--out-dir", str(s.run_dir(seed)),
        "--fresh",
    ]  # fmt: skip


def _horizon(env: str) -> int:
    from agentenvs.toytext import parse_toy_spec

    return int(parse_toy_spec(env, where="--llm-env").build().horizon)


def check_llm(s: LLMSettings) -> None:
    """Before any work: the trainer's extras are installed, the env is a toy env, and
    ``hgpo.train`` accepts the runs' settings (its own checks, the truth chain's size
    included); a ValueError naming the flag otherwise."""
    from hgpo.extras import require_extras

    require_extras("studies.compare --llm", "llm")
    horizon = _horizon(s.env)
    from hgpo.train.preflight import validate_config
    from hgpo.train.train_config import parse_args

    try:
        cfg, _ = parse_args(llm_argv(s, 0, horizon))
        validate_config(cfg)
    except SystemExit:  # argparse printed its message
        raise ValueError("--llm: hgpo.train refused the runs' settings (above)") from None
    except ValueError as exc:
        raise ValueError(f"--llm: {exc}") from None


def finished(run_dir: Path, iterations: int) -> bool:
    """True when ``run_dir``'s metrics.jsonl logged its last iteration."""
    from hgpo.train.run_metrics import read_metrics

    try:
        rows = read_metrics(run_dir)
    except ValueError:
        return False
    return any(r.get("iteration") == iterations for r in rows)


def _child(argv: list[str], log: str) -> None:
    """The forked run: output to ``log``, one torch thread by default, hgpo.train's main."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # (imported already by check_llm's checks: the variable alone would not do)

    threads = os.environ["OMP_NUM_THREADS"]
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    from hgpo.train import main

    sys.exit(main(argv))


def run_llm(s: LLMSettings, progress: bool = True, fresh: bool = False) -> dict[str, Any]:
    """Run the missing runs one after another; returns ``{"runs": [run folders], "data":
    studies.llm_truth_report.load(...)}``. A run that fails is a RuntimeError naming its log."""
    from studies.llm_truth_report import load

    Path(s.out).mkdir(parents=True, exist_ok=True)
    horizon = _horizon(s.env)
    dirs = [s.run_dir(seed) for seed in range(s.seeds)]
    ctx = mp.get_context("fork")
    for seed, d in enumerate(dirs):
        if not fresh and finished(d, s.iterations):
            if progress:
                print(f"  {d.name}: finished earlier (resumed)", file=sys.stderr)
            continue
        log = str(Path(s.out) / f"{d.name}.log")
        if progress:
            print(f"  {d.name}: hgpo.train, {s.iterations} iterations (log: {log})",
                  file=sys.stderr, flush=True)  # fmt: skip
        proc = ctx.Process(target=_child, args=(llm_argv(s, seed, horizon), log))
        proc.start()
        proc.join()
        if proc.exitcode != 0 or not finished(d, s.iterations):
            tail = Path(log).read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"the LLM run {d} failed (exit code {proc.exitcode}); its log {log} ends: "
                + " | ".join(tail)
            )
    return {"runs": [str(d) for d in dirs], "data": load([str(d) for d in dirs])}
