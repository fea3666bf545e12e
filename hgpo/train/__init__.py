"""The LLM trainer: ``python -m hgpo.train --env alfworld|webshop`` (see docs/train.md).

Importing this package is light; torch, transformers and DeepSpeed load with
:mod:`hgpo.train.trainer`. ``import hgpo`` never imports this package.
"""

from hgpo.train.train_config import PRESETS, TrainConfig, parse_args, resolve

__all__ = ["PRESETS", "TrainConfig", "parse_args", "resolve"]
