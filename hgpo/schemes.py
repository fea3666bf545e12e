"""The rollout scheme spec: a scheme string such as ``"branch:singleton"`` or ``"tree:2,4"``
parsed and checked into a small :class:`Scheme`, before any rollout.

How each scheme draws its branch points, per rollout group at a budget of env steps, is the
rollout's business (``toyenvs.branched_rollout`` for the toy POMDPs, ``hgpo.train.branched_play`` for the
trainer, see docs/branching.md); this module holds only the names and the checks, so that a
config can name a scheme without loading either.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hgpo.options import bad, check_int

__all__ = ["RULES", "SCHEMES", "Scheme", "check_budget", "parse_scheme"]

RULES = ("independent", "branch:uniform", "branch:singleton", "branch:hard", "tree", "branch:3spo")
"""Rule names (their order is the rollout kernels' rule codes)."""
SCHEMES = (
    "independent", "branch:uniform", "branch:singleton", "branch:hard", "branch:3spo", "tree:D",
)  # fmt: skip
"""Scheme names; ``tree:D`` stands for ``tree:`` followed by comma-separated depths."""


@dataclass(frozen=True)
class Scheme:
    """A parsed rollout scheme: ``rule`` one of :data:`RULES`, ``depths`` for ``tree``."""

    rule: str
    depths: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"tree:{','.join(map(str, self.depths))}" if self.rule == "tree" else self.rule


def parse_scheme(text: str, horizon: int | None = None, where: str = "scheme") -> Scheme:
    """``"branch:singleton"`` -> Scheme; OptionError naming ``where`` and the scheme when it is
    unknown or a tree depth lies outside 1..horizon - 1."""
    if isinstance(text, str):  # (every rollout parses its scheme: remembered)
        return _parse_scheme(text, horizon, where)
    raise bad(where, "one of " + ", ".join(SCHEMES), text)


@lru_cache(maxsize=256)
def _parse_scheme(text: str, horizon: int | None, where: str) -> Scheme:
    if text.startswith("tree:"):
        parts = text[5:].split(",")
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise bad(where, "tree:D with D comma-separated depths >= 1, e.g. tree:2,4", text)
        depths = tuple(sorted({int(p) for p in parts}))
        hi = None if horizon is None else horizon - 1
        for d in depths:
            check_int(f"{where} {text!r}: depth", d, lo=1, hi=hi)
        return Scheme("tree", depths)
    if text not in RULES or text == "tree":
        raise bad(where, "one of " + ", ".join(SCHEMES), text)
    return Scheme(text)


def check_budget(scheme: Scheme, steps: int | None) -> None:
    """Named errors for a step budget the scheme cannot use, before any work (the branch share
    is checked by ``toyenvs.rollout`` under every scheme)."""
    if steps is None:
        if scheme.rule != "independent":
            raise bad(
                f"steps (scheme {scheme.name!r})", "an integer >= 1 env steps per group", None
            )
        return
    check_int("steps", steps, lo=1)
