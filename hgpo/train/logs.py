"""The trainer's log: what a user reads, without the libraries' noise.

:func:`configure_logging` is called once by ``python -m hgpo.train`` (and by
``python -m hgpo.train.warmstart``) before anything heavy is imported. What it removes, and why each is there otherwise:

- bm25s sets its own logger to DEBUG on import (``logger.setLevel(logging.DEBUG)``), so with a
  root handler of level NOTSET its "Building index from IDs objects" lines pass an INFO root:
  the root handler here has the run's level, so a library's DEBUG records stop at it.
- transformers draws a progress bar per model load ("Loading weights") and save ("Writing model
  shards"), several per run on a tiny model: turned off (transformers' and huggingface_hub's).
- huggingface_hub puts its own stderr handler on its logger *and* propagates to the root, so each
  of its warnings (the 5 "Retrying in 1s [Retry 1/5]" of an offline model lookup) was printed
  twice: its propagation is turned off, so each is printed once.
- DeepSpeed warns "Setting accelerator to CPU. If you have GPU or other accelerator, we were
  unable to detect it." on import wherever torch sees no CUDA device: there, the accelerator is
  named (``DS_ACCELERATOR=cpu``, unless the user set one), which skips its detection.
"""

from __future__ import annotations

import logging
import os

from hgpo.extras import installed

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(rank0: bool, fmt: str = FORMAT) -> None:
    """Root logging at INFO on rank 0 (WARNING on the others) in ``fmt``, and the libraries'
    noise off."""
    level = logging.INFO if rank0 else logging.WARNING
    handler = logging.StreamHandler()  # stderr
    handler.setLevel(level)  # (a library's logger set to DEBUG stops here)
    logging.basicConfig(level=level, format=fmt, handlers=[handler])
    quiet_libraries()


def quiet_libraries() -> None:
    """Progress bars of transformers and huggingface_hub off, huggingface_hub's warnings once,
    and DeepSpeed's accelerator named where torch sees no CUDA device."""
    if installed("transformers"):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if installed("huggingface_hub"):
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils import logging as hub_logging

        disable_progress_bars()
        hub_logging.disable_propagation()  # it has its own handler: printed once, not twice
    if "DS_ACCELERATOR" not in os.environ and installed("torch"):
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
