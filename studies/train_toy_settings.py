"""The settings of the train_toy study and what each one changes, in one place.

``studies.train_toy`` (which runs them) and ``studies.train_toy_report`` (which labels and
groups them in the report) both import from here, so neither imports the other at module level.
"""

from __future__ import annotations

__all__ = [
    "ABLATIONS",
    "DEFAULT_SETTINGS",
    "FULL_SETTINGS",
    "MAIN_SETTINGS",
    "MEAN_NORM",
    "NO_PENALTY",
    "SETTING_NOTES",
]

MAIN_SETTINGS = ("grpo", "rloo", "gigpo", "hgpo", "hgpo:base_group=true")
ABLATIONS = ("oracle", "hgpo-nohog2", "hgpo-uniform", "hgpo:alpha=2")
# The same three estimators with mean-only (Dr.GRPO) normalisation: std-normalising a tiny
# group blows any return difference up to unit size, and HGPO's deep levels are tiny groups.
MEAN_NORM = ("grpo:norm=mean", "gigpo:norm=mean", "hgpo:norm=mean")
DEFAULT_SETTINGS = (*MAIN_SETTINGS, "hgpo:K=4", *ABLATIONS, "gae", *MEAN_NORM)
# Without the invalid-action penalty in the advantage (the env still charges it): isolates what
# std-normalising the penalty's small return differences does to each estimator.
NO_PENALTY = ("grpo:invalid_penalty=0", "gigpo:invalid_penalty=0", "hgpo:invalid_penalty=0")
FULL_SETTINGS = (*MAIN_SETTINGS, *ABLATIONS, "gae", *MEAN_NORM, *NO_PENALTY, "stepwise")
# What each ablation removes, for the report (hgpo-uniform is alpha = 0 exactly).
SETTING_NOTES = {
    "oracle": "w/o HoG-1 (G_K only)",
    "hgpo-nohog2": "w/o HoG-2 (G_K, else G_0)",
    "hgpo-uniform": "w/o adaptive weights (alpha = 0)",
    "hgpo:alpha=2": "alpha = 2",
    "hgpo": "alpha = 1",
    "hgpo:base_group=true": "+ episode level, as the public code",
    "hgpo:K=4": "memory K = 4",
    "grpo:norm=mean": "mean-only normalisation",
    "gigpo:norm=mean": "mean-only normalisation",
    "hgpo:norm=mean": "mean-only normalisation",
    "grpo:invalid_penalty=0": "penalty left out of the advantage",
    "gigpo:invalid_penalty=0": "penalty left out of the advantage",
    "hgpo:invalid_penalty=0": "penalty left out of the advantage",
    "gae": "PPO + value table",
}
