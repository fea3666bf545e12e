"""``python -m hgpo.train``'s command: parse, validate, train (:func:`main`, public as
``hgpo.train.main``; hgpo/train/__main__.py only calls it)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from agentenvs.registry import benchmark
from hgpo.extras import exit_on_missing_extras
from hgpo.train.logs import configure_logging
from hgpo.train.preflight import note_resume, validate_config
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
    from hgpo.train.memory_plan import plan_for_config
    from hgpo.train.model_shapes import ModelConfigError

    if ns.plan_gpus is not None and ns.plan_gpus < 1:
        print(f"error: --plan-gpus: must be >= 1, got {ns.plan_gpus}", file=sys.stderr)
        return 2
    gib = ns.plan_gpu_gib
    if gib is not None and not (math.isfinite(gib) and gib > 0):
        print(f"error: --plan-gpu-gib: must be a positive number, got {gib}", file=sys.stderr)
        return 2
    try:
        plan = plan_for_config(cfg, ns.preset, ns.plan_gpus, gib)
    except ModelConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(plan.render())
    return 0
