"""Every registered estimator side by side: how biased, how noisy, how good a gradient, and
how fast it trains, against the exact truth of toy POMDPs.

    python -m studies.compare                   # every registered estimator, tabular and MLP
    python -m studies.compare --quick           # a smoke run: results/compare/quick
    python -m studies.compare --estimators grpo gigpo hgpo mine --baseline hgpo
    python -m studies.compare --policies tabular mlp transformer --llm   # everything (slow)
    python -m studies.compare --help            # every option

For each policy kind (``--policies``: a table, an MLP or a transformer over the K-step
context) it runs

1. the bias/variance study's default cells (studies.bias_variance: keydoor 5x5 and a household,
   K = 2 and 4, the policy untrained and at 30% / 70% success, 40 batches of 16 x 8 per cell)
   with every chosen estimator on the same batches: bias^2, variance and MSE against the exact
   A* (norm = mean, reward units), sign agreement and the cosine of the batch policy gradient
   with the exact one, pooled over the cells;
2. the training study (studies.train_toy): PPO with each estimator, ``--seeds`` seeds per
   environment, the area under the learning curve (auc: mean train-task success over the
   evaluations), each estimator against ``--baseline`` by Welch t-tests, Holm-corrected;

and with ``--llm`` the LLM policy on a toy text env (``hgpo.train --preset tiny --env toy:...
--truth-every N``, trained with the baseline), whose truth monitor evaluates every registered
estimator on the same batches against the exact advantage of the LLM policy itself.

Any registered estimator (built in, ``hgpo.register_estimator``, or an ``hgpo.estimators``
entry point) is one more row; the inputs it reads (values, entropy, observations) are supplied
by studies/step_inputs.py. Results land in ``--out`` (default results/compare, --quick
results/compare/quick): table.csv / table.md (the one table), diffs.csv (each estimator
against the baseline), tests.csv (Welch + Holm on auc), results.json, report.md (opening with
a plain summary), metrics.png and auc.png, and the sub-studies' own folders (bias_variance/
<policy>/, train_toy/<policy>/, llm/), from whose cached cells and runs a killed or repeated
run resumes. settings.json records the run's settings; a folder holding another run's results
is refused (another --out, or --fresh to replace them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hgpo import ESTIMATORS
from hgpo.fields import FIELD_DEFAULT, add_flags, check_field, field_types, in_section
from hgpo.options import ArgumentParser, bad
from studies import bias_variance as BV
from studies import train_toy as TT
from studies.backend import SweepError
from studies.cli import apply_preset, check_out_dir, given_dests, one_line_stops
from studies.compare_cache import (
    cell_estimators,
    check_llm_code,
    drop_stale,
    record_llm_code,
    run_estimators,
)
from studies.compare_guard import guarded
from studies.compare_llm import LLMSettings, check_llm, run_llm
from studies.compare_report import RESULTS, write_report
from studies.io import check_results_dir, claim_results_dir

__all__ = ["CompareConfig", "main", "run_compare"]

POLICIES = ("tabular", "mlp", "transformer")
NETWORK_TRAIN_ENVS = ("tmaze:length=3", "keydoor:size=4,horizon=40")
"""train_toy's environments for a network policy unless --train-envs is given: its two
cheapest (an MLP run on keydoor 5x5 or shop costs 3-7 times one on these two)."""

_what = in_section("what is compared")
_train = in_section("training (studies.train_toy)")
_llm = in_section("the LLM policy (--llm: hgpo.train on a toy text env)")
_run = in_section("where it runs, the output")
_LISTS = ("estimators", "policies", "train_envs")
HOW = ("workers", "cell_timeout", "out")
"""CompareConfig fields that change where and how it runs, not its results."""


@dataclass(frozen=True)
class CompareConfig:
    """Settings of one comparison (every field has a command-line flag)."""

    estimators: tuple[str, ...] = ()
    """Estimators to compare, any registered ones (empty: every registered estimator)."""
    baseline: str = _what("hgpo")
    """The estimator every other one is tested against (one of --estimators)."""
    policies: tuple[str, ...] = ("tabular", "mlp")
    """Policy kinds: tabular, mlp, transformer (the transformer's part took 81 min on 2 cores)."""
    quick: bool = _what(False)
    """A smoke run: the bias/variance study's --quick cells (keydoor 4x4, K = 2, 2 stages, 12
    batches), training on the T-maze only for 20 iterations."""
    seeds: int = _train(8, lo=2, hi=64)
    """Training runs per (estimator, environment) (Welch's test needs 2 a side)."""
    iterations: int = _train(100, lo=1, hi=10_000)
    """PPO iterations per training run (--quick: 20)."""
    train_envs: tuple[str, ...] = ()
    """Training environments (empty: train_toy's four defaults for the table, the T-maze and
    keydoor 4x4 for a network; --quick: the T-maze)."""
    llm: bool = _llm(False)
    """Also run the LLM policy (hgpo.train, tiny model) with --truth-every (minutes a run)."""
    llm_env: str = _llm("toy:tmaze:length=1")
    """The toy text env of the LLM runs (toy:FAMILY:param=value,...)."""
    llm_seeds: int = _llm(2, lo=1, hi=16)
    """LLM training runs (each trained with --baseline; every estimator on its batches)."""
    llm_iterations: int = _llm(12, lo=1, hi=1000)
    llm_truth_every: int = _llm(3, lo=1, hi=1000)
    """The exact truth (and every estimator's error) every this many iterations."""
    workers: int = _run(2, lo=1, hi=256)
    """Worker processes of the sub-studies."""
    cell_timeout: float = _run(3600.0, lo=1.0, hi=86_400.0)
    """Seconds one bias/variance cell or one training run may take; past it, it fails naming
    the estimator it was in (studies/compare_guard.py). The longest here: a transformer cell,
    about 7 min with 2 workers on 2 cores."""
    out: str = _run("results/compare")

    def __post_init__(self) -> None:
        kinds = field_types(CompareConfig)
        for f in dataclasses.fields(self):
            where = "--" + f.name.replace("_", "-")
            if f.name in _LISTS:
                continue
            check_field(where, kinds[f.name], f.metadata["hgpo.setting"], getattr(self, f.name))
        _check_estimators(self.estimators, self.baseline)
        for p in self.policies:
            if p not in POLICIES:
                raise bad("--policies", "tabular, mlp or transformer", p)
        if not self.policies or len(set(self.policies)) != len(self.policies):
            raise bad("--policies", "distinct policy kinds, at least one", " ".join(self.policies))

    def estimator_names(self) -> tuple[str, ...]:
        """The estimators compared: the chosen ones, or every registered one."""
        return self.estimators or tuple(ESTIMATORS)

    def settings(self) -> dict[str, Any]:
        """What the results folder holds (its settings.json): every setting but where and how
        it runs, with the estimator list resolved."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in HOW}
        out["estimators"] = list(self.estimator_names())
        return out

    def study_config(self, policy: str) -> Any:
        """The bias/variance study of ``policy`` (its default cells; --quick: its quick ones)."""
        kw: dict[str, Any] = {"estimators": self.estimator_names(), "policy": policy,
                              "workers": self.workers, "out": f"{self.out}/bias_variance/{policy}"}  # fmt: skip
        if self.quick:
            kw = apply_preset(kw, dict(BV.QUICK), set())
            kw.update(envs=tuple(kw["envs"]), Ks=tuple(kw["Ks"]), stages=tuple(kw["stages"]))
        return BV.StudyConfig(**kw)

    def train_config(self, policy: str) -> Any:
        """The training study of ``policy``: every estimator with its default options."""
        envs = self.train_envs or (
            ("tmaze:length=3",) if self.quick
            else TT.DEFAULT_ENVS if policy == "tabular" else NETWORK_TRAIN_ENVS
        )  # fmt: skip
        return TT.TrainToyConfig(
            envs=tuple(envs), settings=self.estimator_names(), seeds=self.seeds,
            iterations=self.iterations, policy=policy, workers=self.workers,
            out=f"{self.out}/train_toy/{policy}",
        )  # fmt: skip

    def llm_settings(self) -> LLMSettings:
        return LLMSettings(env=self.llm_env, estimator=self.baseline, seeds=self.llm_seeds,
                           iterations=self.llm_iterations, truth_every=self.llm_truth_every,
                           out=f"{self.out}/llm")  # fmt: skip


def _check_estimators(estimators: tuple[str, ...], baseline: str) -> None:
    """Unknown names list the registered ones; the baseline must be among those compared."""
    known = list(ESTIMATORS)
    for name in (*estimators, baseline):
        if name not in known:
            where = "--estimators" if name in estimators else "--baseline"
            raise ValueError(
                f"{where}: unknown estimator {name!r}; registered estimators: {', '.join(known)} "
                "(add one with hgpo.register_estimator or an hgpo.estimators entry point)"
            )
    if len(set(estimators)) != len(estimators):
        raise bad("--estimators", "distinct names", " ".join(estimators))
    if estimators and baseline not in estimators:
        raise bad("--baseline", f"one of the estimators compared ({', '.join(estimators)})",
                  baseline)  # fmt: skip
    if len(estimators or known) < 2:
        raise bad("--estimators", "at least two estimators to compare", " ".join(estimators))


def check_config(cfg: CompareConfig, fresh: bool) -> None:
    """Every check before any work: each sub-study's settings, the LLM run's, the output
    folder (writable, and not another run's results)."""
    out = check_out_dir(cfg.out)
    check_results_dir(out, "compare", cfg.settings(), fresh, RESULTS)
    for p in cfg.policies:
        cfg.study_config(p)
        try:
            cfg.train_config(p)
        except ValueError as exc:  # the environments are the one list given for it here
            raise ValueError(str(exc).replace("--envs", "--train-envs", 1)) from None
    if cfg.llm:
        check_llm(cfg.llm_settings())
        check_llm_code(Path(cfg.llm_settings().out), cfg.estimator_names(), fresh)


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def run_compare(cfg: CompareConfig, progress: bool = True, fresh: bool = False) -> dict[str, Any]:
    """Run every part (resuming from the sub-studies' finished cells and runs) and write the
    results folder; returns the report's summary (studies.compare_report.write_report)."""
    out = Path(cfg.out)
    claim_results_dir(out, "compare", cfg.settings(), fresh, RESULTS)
    parts = [(f"bias/variance, {p} policy", "bv", p) for p in cfg.policies]
    parts += [(f"training, {p} policy, {cfg.seeds} seeds", "tt", p) for p in cfg.policies]
    if cfg.llm:  # first: it forks the trainer before this process has loaded torch
        parts.insert(0, ("LLM policy (hgpo.train --truth-every)", "llm", "llm"))
    bv: dict[str, list[dict[str, Any]]] = {}
    tt: dict[str, list[dict[str, Any]]] = {}
    llm: dict[str, Any] | None = None
    ests = cfg.estimator_names()
    with guarded(cfg.cell_timeout):
        for i, (title, kind, policy) in enumerate(parts, start=1):
            t0 = time.perf_counter()
            _say(progress, f"[{i}/{len(parts)}] {title}")
            if kind == "bv":
                scfg = cfg.study_config(policy)
                drop_stale(Path(scfg.out), "cells", ests, cell_estimators)
                bv[policy] = BV.run_study(scfg, progress, fresh)["rows"]
            elif kind == "tt":
                tcfg = cfg.train_config(policy)
                claim_results_dir(Path(tcfg.out), "train_toy", TT.study_settings(tcfg), fresh,
                                  TT.RESULTS)  # fmt: skip
                drop_stale(Path(tcfg.out), "runs", ests, run_estimators)
                tt[policy] = TT.run_study(tcfg, progress, fresh)["final"]
            else:
                record_llm_code(Path(cfg.llm_settings().out), ests)
                llm = run_llm(cfg.llm_settings(), progress, fresh)
            _say(progress, f"[{i}/{len(parts)}] {title}: {time.perf_counter() - t0:.0f} s")
        return write_report(cfg, bv, tt, llm)


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m studies.compare", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
    )  # fmt: skip
    groups = add_flags(p, CompareConfig, help_format="{doc} (default: %(default)s)",
                       default=FIELD_DEFAULT, skip=(*_LISTS, "quick", "out"),
                       type_metavar=False)  # fmt: skip
    what = groups["what is compared"]
    what.add_argument("--estimators", nargs="+", default=[], metavar="NAME",
                      help="estimators to compare (default: every registered one: "
                      "hgpo.ESTIMATORS)")  # fmt: skip
    what.add_argument("--policies", nargs="+", default=list(CompareConfig.policies),
                      help="tabular, mlp, transformer (default: %(default)s)")  # fmt: skip
    what.add_argument("--quick", action="store_true",
                      help="a smoke run (under 2 minutes on 2 cores): the bias/variance study's "
                      "quick cells, the table policy only, training on the T-maze for 20 "
                      "iterations; flags you give keep their values")  # fmt: skip
    groups["training (studies.train_toy)"].add_argument(
        "--train-envs", nargs="+", default=[],
        help="training environments (default: train_toy's four for the table, "
        f"{' '.join(NETWORK_TRAIN_ENVS)} for a network)",
    )  # fmt: skip
    run = groups["where it runs, the output"]
    run.add_argument("--out", default=None,
                     help="results folder (default: results/compare; --quick: "
                     "results/compare/quick)")  # fmt: skip
    p.add_argument("--fresh", action="store_true",
                   help="discard the finished cells and runs in --out first, and replace the "
                   "settings.json of another run there (a run resumes otherwise)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")
    return p


QUICK = dict(policies=["tabular"], iterations=20)


@one_line_stops()
def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    kw = {f.name: getattr(a, f.name) for f in dataclasses.fields(CompareConfig)}
    if a.quick:
        kw = apply_preset(kw, QUICK, given_dests(p, argv))
    if kw["out"] is None:
        kw["out"] = "results/compare/quick" if a.quick else "results/compare"
    for k in _LISTS:
        kw[k] = tuple(kw[k])
    try:
        cfg = CompareConfig(**kw)
        check_config(cfg, a.fresh)
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.perf_counter()
    try:
        summary = run_compare(cfg, progress=not a.no_progress, fresh=a.fresh)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # an LLM run that failed (its log named)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(summary["summary"]).replace("**", ""))
    print()
    print(summary["table_text"])
    print(f"\nwrote {cfg.out}/ (table.csv, table.md, diffs.csv, tests.csv, results.json, "
          f"report.md, *.png) in {time.perf_counter() - t0:.0f} s")  # fmt: skip
    return 0
