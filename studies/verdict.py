"""The words of every verdict a study prints: a claim "holds" only when it is significant.

A claimed ordering (HGPO > GiGPO > GRPO, "variance rises with k") is a chain of steps, each a
pair ``high > low`` with its measured difference ``high - low`` and the evidence for it: a
two-sided p-value (the studies give Holm-corrected ones) or a 95% interval of the difference.
The claim

- **holds** when every step is in the claimed direction and significant (p < alpha, or the
  interval above 0);
- **does NOT hold** when some step is significant in the other direction;
- is **not significant** when some tested step is within noise (whatever its direction);
- is **untested** when the only steps left are ones without a test (point figures only: the
  text then gives their measured direction, which is not evidence);

and the text gives every step's direction, difference and evidence, so that a Holm p = 0.81
reads as what it is: ``hgpo > gigpo (+0.008, not significant, Holm p = 0.81)``.

A study that makes many comparisons (estimators x figures x cells) corrects them as one family
with :func:`holm` (statsmodels' ``multipletests``); a comparison that comes with a 95% interval
only gets its p-value from the interval first (:func:`p_from_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DOES_NOT_HOLD",
    "HOLDS",
    "NOT_SIGNIFICANT",
    "UNTESTED",
    "Step",
    "holm",
    "ordering_verdict",
    "p_from_interval",
]

HOLDS = "holds"
NOT_SIGNIFICANT = "not significant"
DOES_NOT_HOLD = "does NOT hold"
UNTESTED = "untested"


TIE = 1e-12
"""A difference within this of 0 is written as a tie ("=", +0.000): equal means whose float sums
ran in other orders differ by about 1e-17, which is no direction."""


@dataclass(frozen=True)
class Step:
    """One step ``high > low`` of a claimed ordering.

    Args:
        high, low: the names of the two sides, the claimed larger one first.
        diff: the measured difference high - low.
        p: two-sided p-value of the difference (NaN with no ``ci``: no test, e.g. fewer than 2
            runs a side, or a figure without an interval).
        ci: a 95% interval of ``diff`` instead of a p-value (significant when it excludes 0).
        p_name: how the p-value is named in the text ("Holm p", "p").
    """

    high: str
    low: str
    diff: float
    p: float = math.nan
    ci: tuple[float, float] | None = None
    p_name: str = "Holm p"

    @property
    def tested(self) -> bool:
        """False for a step with neither a p-value nor an interval (point figures only)."""
        return self.ci is not None or not math.isnan(self.p)

    def significant(self, alpha: float = 0.05) -> bool:
        """True when the evidence separates the difference from 0 (either direction)."""
        if self.ci is not None:
            lo, hi = self.ci
            return bool(lo > 0 or hi < 0)
        return bool(self.p < alpha)  # NaN (no test) is never significant

    def text(self, alpha: float = 0.05, num: str = "+.3f") -> str:
        """``high > low (+0.008, not significant, Holm p = 0.81)``: the measured direction, the
        difference, whether it is significant (and against the claim), the evidence; ``num``
        formats the difference and the interval (e.g. "+.3g" for figures of any scale)."""
        diff = 0.0 if abs(self.diff) <= TIE else self.diff  # equal means, summed in two orders
        rel = ">" if diff > 0 else "<" if diff < 0 else "="
        head = f"{self.high} {rel} {self.low} ({diff:{num}}"
        if not self.tested:
            return head + ", no test)"
        if not self.significant(alpha):
            word = "not significant"
        else:
            word = "significant" if self.diff > 0 else "significant, against the claim"
        if self.ci is not None:
            evidence = f"95% CI [{self.ci[0]:{num}}, {self.ci[1]:{num}}]"
        else:
            evidence = f"{self.p_name} = {self.p:.2g}"
        return f"{head}, {word}, {evidence})"


def ordering_verdict(steps: list[Step], alpha: float = 0.05, num: str = "+.3f") -> tuple[str, str]:
    """(status, text) of a claimed ordering made of ``steps``.

    status is :data:`HOLDS` (every step in the claimed direction and significant),
    :data:`DOES_NOT_HOLD` (a step significant in the other direction), :data:`NOT_SIGNIFICANT`
    (a tested step within noise) or :data:`UNTESTED` (otherwise: some step has no test); text
    is ``"<status>: <step>; <step>; ..."`` with every step's :meth:`Step.text`. E.g. steps with p = 0.01 and 0.81 give "not significant: a > b (+0.100,
    significant, Holm p = 0.01); b > c (+0.050, not significant, Holm p = 0.81)".
    """
    if not steps:
        raise ValueError("steps: an ordering needs at least one step, got none")
    sig = [s.significant(alpha) for s in steps]
    if all(g and s.diff > 0 for g, s in zip(sig, steps, strict=True)):
        status = HOLDS
    elif any(g and s.diff < 0 for g, s in zip(sig, steps, strict=True)):
        status = DOES_NOT_HOLD
    elif any(s.tested and not g for g, s in zip(sig, steps, strict=True)):
        status = NOT_SIGNIFICANT
    else:
        status = UNTESTED
    return status, f"{status}: " + "; ".join(s.text(alpha, num) for s in steps)


def holm(p: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values of one family of comparisons (statsmodels ``multipletests``,
    method "holm"). A NaN p (a comparison that could not be tested) stays NaN and is not
    counted in the family; an empty family gives []."""
    from statsmodels.stats.multitest import multipletests

    for x in p:
        if not (math.isnan(x) or 0.0 <= x <= 1.0):
            raise ValueError(f"p: each p-value must be in [0, 1] or NaN, got {x!r}")
    tested = [i for i, x in enumerate(p) if not math.isnan(x)]
    out = [math.nan] * len(p)
    if tested:
        adj = multipletests([p[i] for i in tested], method="holm")[1]
        for i, q in zip(tested, adj, strict=True):
            out[i] = float(q)
    return out


def p_from_interval(diff: float, lo: float, hi: float, level: float = 0.95) -> float:
    """The two-sided p-value of ``diff`` = 0 read off a symmetric normal ``level`` interval
    [lo, hi] of it: se = (hi - lo) / (2 z), z the normal quantile of (1 + level) / 2. NaN when
    a figure is not finite; 1 (no difference) or 0 (its limit) for a zero-width interval."""
    if not all(math.isfinite(x) for x in (diff, lo, hi)):
        return math.nan
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    if hi < lo:
        raise ValueError(f"interval: lo must be <= hi, got [{lo!r}, {hi!r}]")
    from scipy.stats import norm

    se = (hi - lo) / (2.0 * float(norm.ppf((1.0 + level) / 2.0)))
    if se == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    return float(2.0 * norm.sf(abs(diff) / se))
