"""``python -m hgpo.train``: parse, validate, train."""

from __future__ import annotations

import json
import os
import sys

from agentenvs.registry import benchmark
from hgpo.extras import exit_on_missing_extras
from hgpo.train.logs import configure_logging
from hgpo.train.preflight import note_resume, validate_config
from hgpo.train.train_config import TrainConfigError, parse_args


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    cfg, ns = parse_args(argv)
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
