"""``python -m studies.compare``: every registered estimator side by side against the exact
truth of toy POMDPs (what it runs and writes: studies/compare_study.py, docs/compare.md)."""

from studies.compare_study import CompareConfig, check_config, main, run_compare

__all__ = ["CompareConfig", "check_config", "main", "run_compare"]
