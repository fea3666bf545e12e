"""``python -m hgpo.train``: :func:`hgpo.train.main` (hgpo/train/command.py)."""

import sys

from hgpo.train.command import main, print_plan

__all__ = ["main", "print_plan"]

if __name__ == "__main__":
    sys.exit(main())
