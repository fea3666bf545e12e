"""The LLM trainer: ``python -m hgpo.train --env alfworld|webshop`` (see docs/train.md).

Importing this package is light; torch, transformers and DeepSpeed load with
:mod:`hgpo.train.trainer`. ``import hgpo`` never imports this package.
"""

from hgpo.train.train_config import PRESETS, TrainConfig, parse_args, resolve

__all__ = ["PRESETS", "TrainConfig", "main", "parse_args", "resolve"]


def main(argv: list[str] | None = None) -> int:
    """``python -m hgpo.train ARGV``: parse, validate and train (or --plan, --print-config);
    returns the exit status. The public entry point for a program that runs the trainer in
    its own process (studies.compare_llm); its imports load on the first call."""
    from hgpo.train.command import main as command_main

    return command_main(argv)
