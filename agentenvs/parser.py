"""Action parser ("projection") of the paper's reference implementation (verl-agent).

The policy answers ``<think>...</think><action>...</action>``. The environment receives the text
inside the first ``<action>...</action>`` pair, lower-cased and stripped. A response without the
action tags, or without the ``<think>`` tags, is *invalid*: it costs :data:`INVALID_ACTION_PENALTY`
and the environment receives the reference implementation's fallback text, the last 30
(ALFWorld) or 20 (WebShop) characters of the lower-cased response. On ALFWorld that fallback is
almost never an admissible command, so the engine answers "Nothing happens."; on WebShop it is
almost never ``search[...]``/``click[...]`` of the page, so it is a no-op.

Notation: the reference also marks a response invalid when it holds CJK characters; we keep that.
The reference finds the first ``</action>`` anywhere in the text, so ``</action><action>x``
yields an empty "valid" action there; we look for the closing tag after the opening one, so that
case is invalid here. The reference never checks admissibility; pass ``admissible`` to do so
(hgpo-spec: "not admissible" also costs the penalty).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hgpo.options import bad, check_bool, check_choice

INVALID_ACTION_PENALTY = 0.1
"""Cost of an invalid response at its step (verl-agent ``invalid_action_penalty_coef``)."""

FALLBACK_CHARS: dict[str, int] = {"alfworld": 30, "webshop": 20}
"""How many trailing characters of an unparseable response the reference sends to the env."""

_CJK = re.compile(r"[\u4e00-\u9fff]")
_START, _END = "<action>", "</action>"


@dataclass(frozen=True)
class ParsedAction:
    """What the parser makes of one response.

    action: the text sent to the environment (the tagged action or the fallback text).
    valid: False when the response is malformed (costs the penalty at this step).
    """

    action: str
    valid: bool

    @property
    def penalty(self) -> float:
        """The reward adjustment of this step: 0 when valid, ``INVALID_ACTION_PENALTY`` else."""
        return 0.0 if self.valid else INVALID_ACTION_PENALTY


def parse_action(
    response: str,
    env: str = "alfworld",
    admissible: Sequence[str] | None = None,
    require_think: bool = True,
) -> ParsedAction:
    """Extract the action of one LLM response; never raises on any string.

    response: str the model's full text.
    env: "alfworld" or "webshop" (picks the fallback length, 30 or 20 characters).
    admissible: optional list of admissible actions; when given, an action not in it (after
        strip + lower-case) is invalid too.
    require_think: demand ``<think>`` and ``</think>`` (the reference always does).
    """
    check_choice("env", env, sorted(FALLBACK_CHARS))
    check_bool("require_think", require_think)
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got response={type(response).__name__}")
    lowered = response.lower()
    start = lowered.find(_START)
    end = lowered.find(_END, start + len(_START)) if start != -1 else -1
    if start == -1 or end == -1:
        return ParsedAction(lowered[-FALLBACK_CHARS[env] :], False)
    action = lowered[start + len(_START) : end].strip()
    valid = True
    if require_think and (response.find("<think>") == -1 or response.find("</think>") == -1):
        valid = False
    if _CJK.search(response):
        valid = False
    if admissible is not None and action not in _admissible_set(admissible):
        valid = False
    return ParsedAction(action, valid)


def _admissible_set(admissible: Sequence[str]) -> set[str]:
    """The admissible actions, stripped and lowercased; an error for one string or a
    non-string entry (a string would be read as a set of letters)."""
    if isinstance(admissible, str):
        raise bad("admissible", "a list of actions, not one string", admissible)
    try:
        return {a.strip().lower() for a in admissible}
    except AttributeError:
        bad_one = next(a for a in admissible if not isinstance(a, str))
        raise bad("admissible", "a list of str actions", bad_one) from None


def project_actions(
    responses: Sequence[str],
    env: str = "alfworld",
    admissible: Sequence[Sequence[str]] | None = None,
    require_think: bool = True,
) -> tuple[list[str], list[int]]:
    """Batched :func:`parse_action` with the reference's return shape ``(actions, valids)``."""
    if admissible is not None and len(admissible) != len(responses):
        raise ValueError(
            f"admissible must have one list per response: len(admissible)={len(admissible)}, "
            f"len(responses)={len(responses)}"
        )
    out = [
        parse_action(r, env, None if admissible is None else admissible[i], require_think)
        for i, r in enumerate(responses)
    ]
    return [p.action for p in out], [int(p.valid) for p in out]
