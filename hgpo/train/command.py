"""``python -m hgpo.train``'s command: parse, validate, train (:func:`main`, public as
``hgpo.train.main``; hgpo/train/__main__.py only calls it)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from agentenvs.registry import benchmark
from hgpo.atomic import FILE_ERRNOS
from hgpo.extras import exit_on_missing_extras
from hgpo.train.logs import configure_logging
from hgpo.train.preflight import note_resume, validate_config
from hgpo.train.rundir import stop_line
from hgpo.train.train_config import TrainConfig, TrainConfigError, parse_args


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    cfg, ns = parse_args(argv)
    for flag in ("plan_gpus", "plan_gpu_gib"):
        if getattr(ns, flag) is not None and not ns.plan:
            name = "--" + flag.replace("_", "-")
            print(f"error: {name} does nothing without --plan; give --plan or leave {name} out",
                  file=sys.stderr)  # fmt: skip
            return 2
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        return 0
    if ns.plan:
        return print_plan(cfg, ns)
    # the trainer's packages (torch, ...) and the env's, before any import of them
    extras = ("llm", *benchmark(cfg.env).extras)
    exit_on_missing_extras(f"python -m hgpo.train --env {cfg.env}", *extras)

    configure_logging(rank0=os.environ.get("RANK", "0") == "0")

    try:
        validate_config(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    note = note_resume(cfg)
    if note and os.environ.get("RANK", "0") == "0":
        print(f"note: {note}", file=sys.stderr)
    from hgpo.train.trainer import EnvCrashError, NonFiniteError, train

    try:
        rows = train(cfg)
    except TrainConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NonFiniteError, EnvCrashError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyboardInterrupt) as e:  # a full disk, a read-only folder, Ctrl-C
        if isinstance(e, OSError) and e.errno not in FILE_ERRNOS:
            raise
        if os.environ.get("RANK", "0") == "0":  # one line, not one per rank
            print(stop_line(cfg.out_dir, e), file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    if rows:
        last = rows[-1]
        keys = [k for k in ("success_rate", "reward_mean", "pg_loss", "kl") if k in last]
        print(
            f"done: {len(rows)} iterations, last " + ", ".join(f"{k}={last[k]:.4g}" for k in keys)
        )
        print(f"metrics: {os.path.join(cfg.out_dir, 'metrics.jsonl')}")
    return 0


def print_plan(cfg: TrainConfig, ns: argparse.Namespace) -> int:
    """``--plan``: the memory plan of ``cfg`` (pure arithmetic, no model built); exit 2 with a
    one-line error for a bad --plan-gpus / --plan-gpu-gib or an unreadable model config."""
    from hgpo.train.memory_plan import check_plan_flags, plan_for_config

    try:  # a bad flag or model config (ModelConfigError) is a ValueError
        check_plan_flags(ns.plan_gpus, ns.plan_gpu_gib)
        plan = plan_for_config(cfg, ns.preset, ns.plan_gpus, ns.plan_gpu_gib)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(plan.render())
    return 0
