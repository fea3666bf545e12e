"""Learning with a real pretrained model, with intervals: SmolLM2-135M trained by
``python -m hgpo.train`` with each estimator on a toy text env (the exact truth every few
iterations) or on ALFWorld or WebShop (no exact truth), e.g. after a warm start.

    python -m studies.real_model --out results/real_model --estimators hgpo gigpo grpo \\
        --seeds 2 --iterations 3 --truth-every 1 --groups-per-iter 4 --group-size 8
    python -m studies.real_model --out results/rm-alfworld --env alfworld \\
        --model runs/warm_alfworld/model --action-mode generate \\
        --override alfworld_games_dir=DIR --override max_prompt_tokens=1024

One ``hgpo.train`` run per (estimator, seed), one after another (SmolLM2 needs 6+ GiB), seed
by seed: ``--preset smol-cpu`` (SmolLM2-135M-Instruct, LoRA rank 8, lr 2e-5, score mode;
docs/real_model.md) or ``--preset tiny`` (a tiny random model, for trying the study in
seconds), with ``--action-mode score`` (the model scores the admissible actions) or
``generate`` (free text; a warm-started ``--model`` writes the format). On a toy env in score
mode, ``--truth-every N`` (default 1): every N iterations the run's truth monitor solves the
exact advantage of the LLM policy itself and measures *every* registered estimator on that
iteration's batch (docs/train.md, "Toy POMDPs"); anywhere else ``--truth-every`` is 0 (no
truth). ``--override FIELD=VALUE`` (repeatable) sets any other TrainConfig field of the runs.

Every flag is checked first, the runs' settings by ``hgpo.train``'s own checks, each bad
value one line. ``OUT/settings.json`` holds the runs' resolved settings: a later command with
other settings is refused (``--fresh`` replaces the results). Each finished run's figures go
to ``OUT/results/<estimator>-s<seed>.json`` (its metric rows, wall and CPU seconds, peak RSS,
the load average before and after, the machine): a finished run is read back, never run
again; an unfinished one goes on from its last checkpoint (``--resume``; a checkpoint every
iteration). The runs are in ``OUT/runs/<estimator>-s<seed>/`` with their logs beside them.

The report (``OUT/report.md``, ``learning.png``, ``truth.png``, ``runs.csv``, ``tests.csv``,
``truth.csv``: studies/real_model_report.py): success per iteration, the final and the
area-under-curve success, the valid-action rate and (with the truth) the final exact J per
estimator with 95% t intervals over seeds, Welch's t-tests between estimators with Holm's
correction, the pooled truth figures (bias², variance, MSE, sign agreement, gradient cosine of
every estimator on the real model's batches, 95% t intervals over batches, paired
differences), seconds per iteration, the KL to the base model and peak memory. Without the
truth, report.md says so and has no truth section (no ``truth.png``, no ``truth.csv``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hgpo.options import ArgumentParser, bad, check_choice, check_int, check_number
from studies.cli import check_out_dir, one_line_stops
from studies.io import SETTINGS_FILE, claim_results_dir, finished_dir
from studies.real_model_settings import (
    ACTION_MODES,
    NAME,
    PRESETS,
    STUDY,
    STUDY_SETS,
    UNKEYED,
    Study,
    train_argv,
)

__all__ = ["main", "parse"]


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog=f"python -m {STUDY}", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", default="results/real_model", help="the results folder")
    ap.add_argument("--preset", default="smol-cpu", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--env", default="toy:tmaze:length=1",
                    help="a benchmark hgpo.train runs: toy:FAMILY:..., alfworld or webshop")  # fmt: skip
    ap.add_argument("--estimators", nargs="+", default=["hgpo", "gigpo", "grpo"],
                    help="the estimators the runs train with (registered names)")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per estimator")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--truth-every", type=int, default=None,
                    help="the exact truth every N iterations (0: none; a toy env in score mode "
                    "only); default: 1 there, else 0")  # fmt: skip
    ap.add_argument("--action-mode", default="score",
                    help=f"the runs' action mode: {' or '.join(ACTION_MODES)} (free text)")  # fmt: skip
    ap.add_argument("--groups-per-iter", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--history-length", type=int, default=2, help="K")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="default: a toy env's horizon, else the preset's (or the benchmark's)")  # fmt: skip
    ap.add_argument("--lr", type=float, default=None, help="default: the preset's")
    ap.add_argument(
        "--mini-batch-size",
        type=int,
        default=None,
        help="step samples per optimizer step (default: the preset's)",
    )
    ap.add_argument(
        "--ppo-epochs",
        type=int,
        default=None,
        help="passes over an iteration's samples (default: the preset's)",
    )
    ap.add_argument("--model", default=None,
                    help="default: the preset's; e.g. a warm start's model folder")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the runs (1: best on a shared machine)")  # fmt: skip
    ap.add_argument("--run-timeout", type=float, default=6 * 3600.0,
                    help="seconds one run may take before it is stopped")  # fmt: skip
    ap.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE",
                    help="a TrainConfig field of the runs (hgpo.train --field-name VALUE), one a "
                    "flag, e.g. alfworld_games_dir=DIR; repeatable")  # fmt: skip
    ap.add_argument("--fresh", action="store_true", help="replace the results in --out")
    return ap


def _check_flags(a: argparse.Namespace) -> int | None:
    """Every flag of the study on its own (one-line ValueErrors); sets ``a.truth_every``'s
    default; returns a toy env's horizon (None for another benchmark)."""
    from hgpo import ESTIMATORS

    check_choice("--preset", a.preset, PRESETS)
    for est in a.estimators:
        check_choice("--estimators", est, tuple(ESTIMATORS))
        if not NAME.fullmatch(est):
            raise bad("--estimators", "names of letters, digits and _.=+- (folder names)", est)
    if len(set(a.estimators)) != len(a.estimators):
        raise bad("--estimators", "distinct names", a.estimators)
    check_int("--seeds", a.seeds, lo=1, hi=1000)
    check_int("--iterations", a.iterations, lo=1, hi=100_000)
    horizon = _check_env(a)
    check_int("--groups-per-iter", a.groups_per_iter, lo=1, hi=4096)
    check_int("--group-size", a.group_size, lo=1, hi=4096)
    check_int("--history-length", a.history_length, lo=0, hi=64)
    if a.max_steps is not None:
        check_int("--max-steps", a.max_steps, lo=1 if horizon is None else horizon, hi=100_000)
    if a.lr is not None:
        check_number("--lr", a.lr, lo=0.0, hi=1.0, lo_open=True)
    if a.mini_batch_size is not None:
        check_int("--mini-batch-size", a.mini_batch_size, lo=1, hi=1_048_576)
    if a.ppo_epochs is not None:
        check_int("--ppo-epochs", a.ppo_epochs, lo=1, hi=100)
    check_int("--threads", a.threads, lo=1, hi=1024)
    check_number("--run-timeout", a.run_timeout, lo=1.0, hi=30 * 86400.0)
    return horizon


def _check_env(a: argparse.Namespace) -> int | None:
    """``--env``, ``--action-mode`` and ``--truth-every`` (its default: 1 where the env has an
    exact truth and the mode is score, else 0); a toy env's horizon, None for another."""
    from agentenvs.registry import benchmark
    from agentenvs.toytext import parse_toy_spec

    check_choice("--action-mode", a.action_mode, ACTION_MODES)
    bench = benchmark(a.env, "--env")
    bench.check(a.env, "--env")
    # a benchmark whose envs end at their own horizon (the toy POMDPs) has a horizon to default to
    own = bench.own_horizon
    horizon = int(parse_toy_spec(a.env, where="--env").build().horizon) if own else None
    exact = bench.exact_truth and a.action_mode == "score"
    if a.truth_every is None:
        a.truth_every = 1 if exact else 0
    if not bench.exact_truth and a.truth_every != 0:
        raise bad("--truth-every", f"0 (no exact truth: --env {a.env} has none)", a.truth_every)
    if not exact and a.truth_every != 0:
        raise bad("--truth-every", "0 with --action-mode generate (the exact truth needs score "
                  "mode's finite action set)", a.truth_every)  # fmt: skip
    check_int("--truth-every", a.truth_every, lo=0, hi=a.iterations)
    return horizon


def _overrides(items: list[str]) -> tuple[tuple[str, str], ...]:
    """``--override FIELD=VALUE`` items as (field, value) pairs: each a TrainConfig field that
    the study does not set itself, given once, with a value (hgpo.train converts and checks it)."""
    from dataclasses import fields

    from hgpo.train.train_config import TrainConfig

    known = {f.name for f in fields(TrainConfig)}
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not value.strip():
            raise bad("--override", "FIELD=VALUE (a TrainConfig field and its value)", item)
        if name not in known:
            raise bad("--override", "a TrainConfig field (python -m hgpo.train --help)", name)
        if name in STUDY_SETS:
            by = STUDY_SETS[name]
            raise bad("--override", f"a field the study does not set ({name}: "
                      + (f"give {by}" if by else "fixed by the study") + ")", item)  # fmt: skip
        if name in out:
            raise bad("--override", f"each field once ({name} is given twice)", item)
        out[name] = value.strip()
    return tuple(out.items())


def _resolved(s: Study, estimator: str) -> dict[str, Any]:
    """The validated TrainConfig of ``estimator``'s runs (``hgpo.train``'s own checks: the
    model, the truth chain's size, ...); a ValueError with the trainer's one line. Checked in
    a temporary folder: nothing is written in ``--out`` before its settings are claimed."""
    from hgpo.train.preflight import validate_config
    from hgpo.train.train_config import parse_args

    where = f"the runs' settings (--estimators {estimator})"
    err = io.StringIO()
    try:
        with tempfile.TemporaryDirectory(prefix="real_model-") as tmp:
            argv = train_argv(s, estimator, 0, start="--fresh", out_dir=Path(tmp) / "run")
            with contextlib.redirect_stderr(err):
                cfg, _ = parse_args(argv)
            validate_config(cfg)
    except SystemExit:  # argparse's one line
        last = (err.getvalue().strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(f"{where}: {last.split('error: ', 1)[-1]}") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return {k: v for k, v in cfg.to_dict().items() if k not in UNKEYED}


def parse(argv: list[str] | None) -> Study:
    """The study of ``argv``, checked before any run (ValueError: one line naming the flag)."""
    from hgpo.extras import require_extras

    a = _parser().parse_args(argv)
    horizon = _check_flags(a)
    overrides = _overrides(a.override)
    require_extras(f"python -m {STUDY}", "llm")
    check_out_dir(a.out)
    s = Study(Path(a.out), a.preset, a.env, tuple(a.estimators), a.seeds, a.iterations,
              a.truth_every, a.groups_per_iter, a.group_size, a.history_length,
              horizon if a.max_steps is None else a.max_steps, a.lr, a.model, a.threads,
              float(a.run_timeout), a.fresh, {}, a.mini_batch_size, a.ppo_epochs,
              a.action_mode, overrides)  # fmt: skip
    common: dict[str, Any] = {}
    for est in s.estimators:
        cfg = _resolved(s, est)
        rest = {k: v for k, v in cfg.items() if k not in ("estimator", "seed")}
        if common and rest != common:  # (only the estimator differs between the runs)
            diff = sorted(k for k in rest if rest[k] != common.get(k))
            raise ValueError(f"--estimators: {est}'s runs differ in {', '.join(diff)}")
        common = rest
    s = replace(s, config=common)
    results = ("results", "runs", "report.md")
    claim_results_dir(s.out, STUDY, s.settings(), s.fresh, results)
    return s


def _records(s: Study) -> dict[tuple[str, int], dict[str, Any]]:
    """Every run's record, seed by seed (every estimator's seed 0 first): read back when
    finished earlier, else run (studies.real_model_run)."""
    from studies.real_model_run import read_record, run_one

    finished_dir(s.out / "results", s.fresh)
    pairs = [(est, seed) for seed in range(s.seeds) for est in s.estimators]
    out = {}
    for i, (est, seed) in enumerate(pairs, start=1):
        tag = f"[{i}/{len(pairs)}] {s.name(est, seed)}"
        rec = None if s.fresh else read_record(s.record_path(est, seed), s.run_config(est, seed))
        if rec is not None:
            print(f"{tag}: finished earlier, read back", file=sys.stderr, flush=True)
        else:
            start = "--fresh" if s.fresh else "--resume"
            rec = run_one(s, est, seed, train_argv(s, est, seed, start), tag)
        out[(est, seed)] = rec
    return out


@one_line_stops()
def main(argv: list[str] | None = None) -> int:
    """Command line: check, run (or read back) every run, write the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        s = parse(argv)
    except ValueError as e:
        print(f"python -m {STUDY}: error: {e} (see --help)", file=sys.stderr)
        return 2
    from studies.real_model_report import write_report
    from studies.real_model_run import RunFailed

    try:
        records = _records(s)
    except RunFailed as e:
        print(f"error: {e}; {SETTINGS_FILE} and the finished runs are kept", file=sys.stderr)
        return e.status
    for path in write_report(s, records, " ".join(["python", "-m", STUDY, *argv])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
