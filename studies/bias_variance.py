"""How biased, how noisy and how useful for the policy gradient is each advantage estimator?

    python -m studies.bias_variance                 # the small default: results/bias_variance
    python -m studies.bias_variance --quick         # a smoke run: results/bias_variance/quick
    python -m studies.bias_variance --help          # every option

On toyenvs POMDPs the true advantage A*(z, a) = Q(z, a) - V(z) of every step is known exactly
(z = hidden state, the policy's K-step context, t). The study draws many independent batches
(groups x rollouts) under a policy, runs every estimator on each batch and compares each step's
estimate with A*: bias^2 / variance / MSE (reward units, the mean-centred variants), sign
agreement and Spearman correlation (every variant), and the batch policy gradient against the
exact one (cosine, relative error); per level k of the hierarchy the same, plus step
utilisation and group sizes; and it checks Proposition 4.1. Results land in a folder:
results.csv / results.json (every figure with its settings and seed), levels.csv, report.md
and PNG plots; cells/ keeps every finished cell, so a killed study resumes (--fresh: anew).
The default folder depends on what runs (--quick, --policy, --scheme: results/bias_variance/
quick-mlp, ...); settings.json records the run's settings, and a folder holding another run's
results is refused (another --out, or --fresh to replace them).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import toyenvs
from hgpo import ESTIMATORS, EstimatorConfig, compute_advantages, estimator_reads
from hgpo.estimator_registry import get_spec
from hgpo.fields import (
    FIELD_DEFAULT,
    add_flags,
    field_bounds,
    field_choices,
    field_types,
    in_section,
    sections,
    setting,
)
from hgpo.options import (
    ArgumentParser,
    bad,
    check_choice,
    check_int,
    check_number,
    parse_name_values,
)
from studies import metrics as M
from studies.backend import (
    ADDRESS_HELP,
    BACKEND_HELP,
    BACKENDS,
    SweepError,
    Task,
    check_backend,
    run_tasks,
)
from studies.bias_variance_report import write_results
from studies.cli import NET_DTYPES, apply_preset, check_out_dir, given_dests, one_line_stops
from studies.compile_note import note_numba_compile
from studies.io import (
    atomic_write_json,
    check_results_dir,
    claim_results_dir,
    finished_dir,
    result_key,
)
from studies.scheme_study import DEFAULT_BUDGETS, QUICK_BUDGETS, SchemeStudy, run_scheme_study
from studies.stages import parse_env, stage_policies
from studies.step_inputs import StepInputs
from studies.tabular import evaluate_success

__all__ = ["StudyConfig", "main", "parse_env", "run_cell", "run_study"]

DEFAULT_ENVS = (
    "keydoor:size=5",
    "household:n_rooms=1,receptacles_per_room=5,n_tasks=4,horizon=8",
)
STUDY_ESTIMATORS = (
    "grpo", "rloo", "stepwise", "gigpo", "oracle", "hgpo", "hgpo-nohog2", "hgpo-uniform", "gae",
)  # fmt: skip
ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0)


# The --help sections of StudyConfig's flags (hgpo.fields.setting); max_nodes and extra have
# no flag.
_cells = in_section("cells (envs x K x stages) and what each measures")
_policy = in_section("policy (a table or a network, and its imitation)")
_run = in_section("seed, estimator options, where the cells run, the output")
_FLAGS = {"Ks": "--K", "n_batches": "--batches", "max_nodes": "StudyConfig.max_nodes"}
_LISTS = ("envs", "Ks", "stages", "estimators", "norms")
"""StudyConfig's nargs="+" fields."""


@dataclass(frozen=True)
class StudyConfig:
    """Settings of one study run (every field has a command-line flag)."""

    envs: tuple[str, ...] = _cells(DEFAULT_ENVS)
    """Environments as "family:param=value,..." (toyenvs.make)."""
    Ks: tuple[int, ...] = _cells((2, 4), lo=0, hi=8)
    """Memory length = hierarchy depth K of the policy and the estimators."""
    stages: tuple[str, ...] = _cells(("untrained", "0.3", "0.7"))
    """Policy stages: "untrained" (uniform), a success target in (0, 1) reached by expert
    imitation (studies.tabular.expert_stages), or a snapshot file (TabularPolicy.snapshot)."""
    estimators: tuple[str, ...] = _cells(STUDY_ESTIMATORS)
    """Estimators to measure, any registered one (one that reads values gets the exact V as its
    critic, lambda = 1; entropy: the policy's exact entropy at the step's context;
    observations: the toy text env's observation text, studies/step_inputs.py)."""
    norms: tuple[str, ...] = _cells(("mean", "mean_std"), choices=("mean", "mean_std"))
    """Normalisation modes; bias/variance/MSE are reported for "mean" (reward units)."""
    alpha: float = _cells(1.0, lo=0.0, help="HGPO alpha (default: %(default)s)")
    """HGPO's alpha (the alpha sweep uses 0, 0.5, 1, 2, 4 besides)."""
    gamma: float = _cells(0.95, lo=0.0, hi=1.0, help="")
    n_batches: int = _cells(40, lo=10)
    """Independent batches per cell."""
    groups: int = _cells(16, lo=1, help="groups per batch (default: %(default)s)")
    """Rollout groups (tasks) per batch."""
    rollouts: int = _cells(8, lo=2, help="rollouts per group (default: %(default)s)")
    """Rollouts per group (N)."""
    seed: int = _run(0, lo=0, help="(>= 0, default: %(default)s)")
    workers: int = _run(2, lo=1)
    backend: str = _run("local", choices=BACKENDS, help=BACKEND_HELP + " (default: %(default)s)")
    """Where the cells execute: "local" processes or "ray" tasks (studies/backend.py)."""
    ray_address: str = _run("", help=ADDRESS_HELP)
    """Ray cluster to join with --backend ray; empty: $RAY_ADDRESS, else Ray started here."""
    out: str = _run("results/bias_variance")
    max_nodes: int = setting(3_000_000, lo=1)
    """Largest exact chain; beyond it the cell is skipped with a message."""
    estimator_options: str = _run(
        "", help="EstimatorConfig options of every estimator, e.g. leave_one_out=true"
    )
    """Options of every estimator's EstimatorConfig, "name=value,..." (e.g. leave_one_out=true);
    K, alpha, gamma, norm and gae_lambda are the study's own."""
    policy: str = _policy(
        "tabular", choices=("tabular", "mlp", "transformer"),
        help="tabular, mlp or transformer (default: %(default)s)",
    )  # fmt: skip
    """"tabular", or a toyenvs.NeuralPolicy "mlp" / "transformer" (stages by the same
    imitation, studies.tabular.neural_expert_stages; gradients then w.r.t. its parameters)."""
    width: int = _policy(64, lo=1, help="network width (default: %(default)s)")
    layers: int = _policy(2, lo=1, help="network layers (default: %(default)s)")
    fit_steps: int = _policy(
        150,
        lo=1,
        help="Adam steps per imitation fit of a network policy (default: %(default)s; --quick 50)",
    )
    """Adam steps of each imitation fit of a network policy (neural_expert_stages); --quick: 50."""
    net_dtype: str = _policy(
        "float32", choices=NET_DTYPES,
        help="a network's precision, float32 or float64 (default: %(default)s)",
    )  # fmt: skip
    """A network policy's precision (toyenvs.NeuralPolicy dtype). The table its rollouts and
    its exact truth read holds float64 logits either way; float32 makes the forward and
    backward passes over every reachable context 4-6x faster (docs/bias_variance.md)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_settings(self)
        if not (self.envs and self.Ks and self.stages and self.estimators and self.norms):
            raise ValueError("--envs, --K, --stages, --estimators and --norms each need a value")
        for spec in self.envs:
            parse_env(spec)
        for alpha in (self.alpha, *ALPHAS):  # every config a cell makes, at its deepest K
            self.estimator_config(max(self.Ks), alpha=alpha)

    def estimator_config(self, K: int, norm: str = "mean", alpha: float | None = None) -> Any:
        """The EstimatorConfig of a cell: K, alpha (default ``self.alpha``), gamma, ``norm`` and
        ``estimator_options``."""
        opts = parse_name_values(self.estimator_options, where="--estimator-options")
        own = {"K", "alpha", "gamma", "norm", "gae_lambda"} & set(opts)
        if own:
            raise ValueError(
                f"--estimator-options: {', '.join(sorted(own))} is set by the study's own flags"
            )
        try:
            return EstimatorConfig.from_options(
                K=K,
                alpha=self.alpha if alpha is None else alpha,
                gamma=self.gamma,
                norm=norm,
                **opts,
            )
        except ValueError as exc:
            flag = "--estimator-options" if opts else "--alpha"  # the study's checks ran first
            raise ValueError(f"{flag}: {exc}") from None


def _check_stage(stage: str) -> None:
    if stage == "untrained" or Path(stage).is_file():
        return
    try:
        v = float(stage)
    except ValueError:
        raise ValueError(
            f"--stages: {stage!r} is neither 'untrained', a success target in (0, 1), "
            "nor an existing snapshot file"
        ) from None
    check_number("--stages: success target", v, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


def _check_settings(cfg: StudyConfig) -> None:
    """Check each field by the bounds and choices it declares (hgpo.fields.setting), each
    item of a list field alike, in declaration order, errors named by its flag; each stage."""
    bounds, choices = field_bounds(StudyConfig), field_choices(StudyConfig)
    for name, kind in field_types(StudyConfig).items():
        where = _FLAGS.get(name, "--" + name.replace("_", "-"))
        values = getattr(cfg, name) if name in _LISTS else (getattr(cfg, name),)
        for value in values:
            if name == "stages":
                _check_stage(value)
            elif name == "estimators":  # the registry as it is now (a user's estimator too)
                if isinstance(value, str) and value not in ESTIMATORS:
                    try:  # a broken entry point says why it failed to load
                        get_spec(value)
                    except ValueError as e:
                        if "failed to load" in str(e):
                            raise ValueError(f"{where}: {e}") from None
                check_choice(where, value, ESTIMATORS)
            elif name == "Ks" or kind is int:
                check_int(where, value, **bounds[name])
            elif kind is float:
                check_number(where, value, **bounds[name])
            elif name in choices:
                check_choice(where, value, choices[name])


# ---------------------------------------------------------------------------- one cell


@dataclass(frozen=True)
class _Variant:
    """One estimator configuration a cell measures on every batch."""

    label: str
    """Its row's ``estimator`` name: the estimator, or "alpha=a" / "K=k" for HGPO's sweeps."""
    estimator: str
    config: Any
    """Its hgpo.EstimatorConfig."""
    figures: bool
    """True for the (estimator x norm) grid: sign, Spearman and gradient figures per batch;
    False for a sweep point, measured for bias/variance only."""


@dataclass(frozen=True)
class _CellPolicy:
    """The cell's environment, its policy at the stage, and that policy's exact truth."""

    env: Any
    family: str
    pol: Any
    success: float
    """Success rate of ``pol`` (studies.tabular.evaluate_success)."""
    gt: Any
    """toyenvs.exact_ground_truth of ``pol``: V, Q, A* and the exact gradients."""
    gt_seconds: float
    probs: np.ndarray
    """float[n_contexts, n_actions]: pi(a | context) of ``pol``."""


@dataclass
class _Draws:
    """What a cell's batches produced, batch by batch (filled by :func:`_draw_batches`)."""

    K: int
    samples: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)
    """(label, norm) -> each batch's advantages, for every variant and sweep point."""
    per_batch: dict[tuple[str, str], dict[str, list[float]]] = field(default_factory=dict)
    """(label, norm) -> figure name -> its value on each batch (the grid variants only)."""
    keys: list[np.ndarray] = field(default_factory=list)
    """int[n_steps] per batch: node * n_actions + action, the (z, a) of each step."""
    truths: list[np.ndarray] = field(default_factory=list)
    """float[n_steps] per batch: A*(z, a) of each step."""
    batch_ids: list[np.ndarray] = field(default_factory=list)
    levels_est: list[list[np.ndarray]] = field(init=False)
    """Per level k, each batch's level-k advantages of hgpo (mean norm)."""
    level_sizes: list[list[np.ndarray]] = field(init=False)
    """Per level k, each batch's level-k group sizes."""
    util: list[list[float]] = field(init=False)
    """Per level k, each batch's step utilisation."""
    level_support: list[np.ndarray] = field(default_factory=list)
    """bool[n_steps] per batch: the step's level-K group has >= 2 members."""

    def __post_init__(self) -> None:  # one list per level k = 0..K
        self.levels_est = [[] for _ in range(self.K + 1)]
        self.level_sizes = [[] for _ in range(self.K + 1)]
        self.util = [[] for _ in range(self.K + 1)]

    def steps(self) -> _Steps:
        """The batches' steps concatenated, (z, a) keys renumbered 0..n-1."""
        _, key = np.unique(np.concatenate(self.keys), return_inverse=True)
        support = np.concatenate(self.level_support) if self.level_support else np.zeros(0, bool)
        return _Steps(
            key=key,
            truth=np.concatenate(self.truths),
            batch=np.concatenate(self.batch_ids),
            support=support,
        )


@dataclass(frozen=True)
class _Steps:
    """Every step of a cell's batches, one entry a step (batches in order)."""

    key: np.ndarray
    """int[n]: the step's (z, a), numbered 0..n_keys-1."""
    truth: np.ndarray
    """float[n]: A*(z, a)."""
    batch: np.ndarray
    """int[n]: the batch the step came from."""
    support: np.ndarray
    """bool[n] (empty without hgpo/mean): the common support of the per-level figures."""


def run_cell(cfg: StudyConfig, env_spec: str, K: int, stage: str, cell_seed: int) -> dict[str, Any]:
    """Measure every estimator on one (environment, K, policy stage). Returns rows + levels."""
    cell = _cell_policy(cfg, env_spec, K, stage, cell_seed)
    draws = _draw_batches(cfg, cell, K, _cell_variants(cfg, K), cell_seed)
    steps = draws.steps()
    common = dict(env=env_spec, family=cell.family, K=K, stage=stage, success=cell.success,
                  policy=cfg.policy,
                  gt_nodes=cell.gt.n_nodes, gt_seconds=cell.gt_seconds, seed=cell_seed,
                  n_batches=cfg.n_batches, groups=cfg.groups, rollouts=cfg.rollouts,
                  steps=int(steps.key.size))  # fmt: skip
    rows = _estimator_rows(common, draws, steps)
    level_rows = _level_rows(common, draws, steps)
    prop = _cell_proposition_41(cfg, env_spec, stage, draws, steps, level_rows)
    versus = [dict(env=env_spec, K=K, stage=stage, **v) for v in _versus(draws)]
    return {"rows": rows, "levels": level_rows, "prop41": prop, "versus": versus}


VERSUS = ("grpo", "gigpo")
"""The estimators HGPO is compared with, batch by batch, in every cell (the project's question:
does HGPO estimate the advantage better than GRPO and GiGPO?)."""

VERSUS_FIGURES = (("mse_batch", "mean"), ("sign", "mean"), ("grad_cos", "mean_std"))
"""(per-batch figure, norm) of those comparisons: a batch's MSE against A* (reward units), its
sign agreement, and its gradient cosine at the paper's default normalisation."""


def _versus(draws: _Draws) -> list[dict[str, Any]]:
    """HGPO against each of :data:`VERSUS` on each of :data:`VERSUS_FIGURES`, paired batch by
    batch (both ran on the same batches): :func:`paired_difference` of hgpo's figure minus the
    other's. A pair not measured in this run (an estimator or norm left out) is skipped."""
    out = []
    for other in VERSUS:
        for figure, norm in VERSUS_FIGURES:
            a = draws.per_batch.get(("hgpo", norm), {}).get(figure)
            b = draws.per_batch.get((other, norm), {}).get(figure)
            if a is not None and b is not None:
                out.append(dict(other=other, figure=figure, norm=norm, **paired_difference(a, b)))
    return out


def paired_difference(a: list[float], b: list[float]) -> dict[str, float]:
    """Mean of a_i - b_i over the pairs where both are finite, its 95% t interval and the
    two-sided p-value of a paired t-test (statsmodels), n the pairs. Fewer than 2 pairs: no
    test (NaN interval and p); every difference equal: p = 1 if it is 0, else 0 (the limit of
    t; statsmodels gives NaN)."""
    if len(a) != len(b):
        raise ValueError(f"a, b: paired figures need equal lengths, got {len(a)} and {len(b)}")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    d = d[np.isfinite(d)]
    nan = float("nan")
    if d.size < 2:
        return {"diff": float(d.mean()) if d.size else nan, "lo": nan, "hi": nan, "p": nan,
                "n": int(d.size)}  # fmt: skip
    m, lo, hi = M.mean_ci(d)
    if np.ptp(d) == 0:
        p = 1.0 if d[0] == 0 else 0.0
    else:
        from statsmodels.stats.weightstats import DescrStatsW

        p = float(DescrStatsW(d).ttest_mean(0.0)[1])
    return {"diff": m, "lo": lo, "hi": hi, "p": p, "n": int(d.size)}


def _cell_policy(
    cfg: StudyConfig, env_spec: str, K: int, stage: str, cell_seed: int
) -> _CellPolicy:
    """Build the cell's environment and its policy at ``stage``, then solve its exact truth."""
    name, params = parse_env(env_spec)
    env = toyenvs.make(name, **params)
    if cfg.policy != "tabular":
        import torch

        torch.set_num_threads(1)  # one core per cell: the study runs `workers` cells at once
    pol = dict(stage_policies(env, K, (stage,), cell_seed, cfg))[
        stage if not Path(stage).is_file() else Path(stage).stem
    ]
    success = evaluate_success(env, pol)
    t0 = time.perf_counter()
    gt = toyenvs.exact_ground_truth(env, pol, gamma=cfg.gamma, max_nodes=cfg.max_nodes)
    gt_seconds = time.perf_counter() - t0
    probs = pol.probs(np.arange(pol.n_contexts))
    return _CellPolicy(env, name, pol, success, gt, gt_seconds, probs)


def _cell_variants(cfg: StudyConfig, K: int) -> list[_Variant]:
    """The grid (every estimator x norm; gae: mean norm, lambda = 1), then HGPO's alpha and K
    sweeps (mean norm). Their order is the rows' order."""
    base = cfg.estimator_config(K)
    variants: list[_Variant] = []
    for est in cfg.estimators:
        critic = "values" in estimator_reads(est)
        for norm in cfg.norms:
            if est == "gae" and norm != "mean":  # gae does not normalise: the same at any norm
                continue
            opts: dict[str, Any] = {"norm": norm}
            if critic:  # the exact V as its critic, lambda = 1 (only gae reads gae_lambda)
                opts["gae_lambda"] = 1.0
            variants.append(_Variant(est, est, base.replace(**opts), figures=True))
    for a in ALPHAS:
        config = base.replace(norm="mean", alpha=a)
        variants.append(_Variant(f"alpha={a:g}", "hgpo", config, figures=False))
    for k in range(0, K + 1):
        config = base.replace(norm="mean", K=k)
        variants.append(_Variant(f"K={k}", "hgpo", config, figures=False))
    return variants


def _draw_batches(
    cfg: StudyConfig, cell: _CellPolicy, K: int, variants: list[_Variant], cell_seed: int
) -> _Draws:
    """Draw ``cfg.n_batches`` independent batches (groups x rollouts) and run every variant
    on each; the truth of each step is A*(z, a) = Q(z, a) - V(z) at its hidden node z."""
    env, gt = cell.env, cell.gt
    rng = np.random.default_rng(cell_seed)
    draws = _Draws(K)
    for b in range(cfg.n_batches):
        tasks = rng.choice(env.tasks, cfg.groups)
        rb = toyenvs.rollout(env, cell.pol, tasks, cfg.rollouts, int(rng.integers(2**31)))
        node = gt.node_index(rb)
        A_true = gt.Q[node, rb.batch.action] - gt.V[node]
        draws.keys.append(node * env.n_actions + rb.batch.action)
        draws.truths.append(A_true)
        draws.batch_ids.append(np.full(rb.n_steps, b))
        graded, advs = [], []  # the grid variants: their gradient figures come in one go
        inputs = StepInputs(env, rb, values=gt.V[node], probs=lambda rb=rb: cell.probs[rb.context])
        for v in variants:
            adv = _measure_variant(draws, rb, inputs, A_true, v)
            if adv is not None:
                graded.append(v)
                advs.append(adv)
        figs = _gradient_figures(cell.pol, rb, advs, cell.probs, cell.gt)
        for v, f in zip(graded, figs, strict=True):
            fig = draws.per_batch[(v.label, v.config.norm)]
            for gname, (cos, rel) in f.items():
                fig[f"{gname}_cos"].append(cos)
                fig[f"{gname}_relerr"].append(rel)
    return draws


def _measure_variant(
    draws: _Draws, rb: Any, inputs: StepInputs, A_true: np.ndarray, v: _Variant
) -> np.ndarray | None:
    """Run one variant on batch ``rb`` with the per-step inputs its estimator reads
    (studies.step_inputs: the exact V as a critic, the policy's exact entropy, the observation
    texts) and record its advantages, its per-batch figures (grid variants) and, for
    hgpo/mean, its levels. Returns the advantages of a grid variant, whose gradient figures the
    caller adds (all of the batch's variants at once: one forward pass of a network policy for
    all of them)."""
    out = compute_advantages(v.estimator, rb.batch, v.config, **inputs.of(v.estimator))
    adv = out.advantages
    norm = v.config.norm
    draws.samples.setdefault((v.label, norm), []).append(adv)
    if not v.figures:
        return None
    fig = draws.per_batch.setdefault((v.label, norm), {})
    for gname in ("grad", "grad_J"):  # filled by the caller; first, as the columns' order
        fig.setdefault(f"{gname}_cos", [])
        fig.setdefault(f"{gname}_relerr", [])
    fig.setdefault("sign", []).append(M.sign_agreement(adv, A_true))
    fig.setdefault("spearman", []).append(M.spearman(adv, A_true))
    fig.setdefault("mse_batch", []).append(float(np.mean((adv - A_true) ** 2)))
    if v.estimator == "hgpo" and norm == "mean":
        _record_levels(draws, out)
    return adv


def _record_levels(draws: _Draws, out: Any) -> None:
    """Keep hgpo's per-level advantages, group sizes and utilisation of one batch, and which
    steps are on the common support (level-K group of >= 2 members)."""
    K = draws.K
    for k in range(K + 1):
        draws.levels_est[k].append(out.level_advantages[k])
        gr = out.level_groups[k]
        draws.level_sizes[k].append(np.bincount(gr[gr >= 0]))
        draws.util[k].append(out.diagnostics["levels"][k]["utilisation"])
    size_K = np.bincount(out.level_groups[K][out.level_groups[K] >= 0])
    draws.level_support.append(
        (out.level_groups[K] >= 0) & (size_K[np.maximum(out.level_groups[K], 0)] >= 2)
    )


def _estimator_rows(common: dict[str, Any], draws: _Draws, steps: _Steps) -> list[dict[str, Any]]:
    """One row per (variant, norm): bias^2 / variance / MSE with intervals (mean norm, reward
    units) and the mean and interval of every per-batch figure."""
    rows = []
    for (label, norm), arrs in draws.samples.items():
        est_all = np.concatenate(arrs)
        row = dict(common, estimator=label, norm=norm)
        if norm == "mean":
            bv = M.bias_variance(steps.key, est_all, steps.truth, steps.batch)
            row.update(bias2=bv.bias2, bias2_lo=bv.bias2_ci[0], bias2_hi=bv.bias2_ci[1],
                       variance=bv.variance, variance_lo=bv.variance_ci[0],
                       variance_hi=bv.variance_ci[1], mse=bv.mse, mse_lo=bv.mse_ci[0],
                       mse_hi=bv.mse_ci[1], coverage=bv.coverage)  # fmt: skip
        for metric, vals in draws.per_batch.get((label, norm), {}).items():
            m, lo, hi = M.mean_ci(np.asarray(vals))
            row.update({metric: m, f"{metric}_lo": lo, f"{metric}_hi": hi})
        rows.append(row)
    return rows


def _level_rows(common: dict[str, Any], draws: _Draws, steps: _Steps) -> list[dict[str, Any]]:
    """Per level k of the hierarchy (hgpo, mean norm): bias/variance over all steps and on the
    common support (steps whose level-K group has >= 2 members, hence every level's too:
    Prop. 4.1's setting), utilisation, group sizes, and v_k - v_{k-1} with a paired interval."""
    key, truth, bid, support = steps.key, steps.truth, steps.batch, steps.support
    level_rows: list[dict[str, Any]] = []
    for k in range(draws.K + 1):
        if not draws.levels_est[k]:
            break
        Ak = np.concatenate(draws.levels_est[k])
        sizes = np.concatenate(draws.level_sizes[k])
        hist = np.bincount(sizes, weights=sizes)
        allbv = M.bias_variance(key, Ak, truth, bid)
        sup = (
            M.bias_variance(key[support], Ak[support], truth[support], bid[support])
            if support.any()
            else None
        )
        level_rows.append(dict(common, level=k, utilisation=float(np.mean(draws.util[k])),
                               mean_group_size=float(sizes.mean()),
                               size_hist=(hist / hist.sum()).tolist(),
                               bias2_all=allbv.bias2, variance_all=allbv.variance, mse_all=allbv.mse,
                               bias2=sup.bias2 if sup else np.nan,
                               variance=sup.variance if sup else np.nan,
                               variance_lo=sup.variance_ci[0] if sup else np.nan,
                               variance_hi=sup.variance_ci[1] if sup else np.nan,
                               mse=sup.mse if sup else np.nan,
                               support=float(support.mean())))  # fmt: skip
        if k > 0 and sup:  # v_k - v_{k-1} with a paired interval: does the variance rise?
            prev = np.concatenate(draws.levels_est[k - 1])[support]
            d, lo, hi = M.variance_difference(key[support], prev, Ak[support], truth[support],
                                              bid[support])  # fmt: skip
            level_rows[-1].update(dvar=d, dvar_lo=lo, dvar_hi=hi)
    return level_rows


def _cell_proposition_41(
    cfg: StudyConfig,
    env_spec: str,
    stage: str,
    draws: _Draws,
    steps: _Steps,
    level_rows: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """Proposition 4.1 checked on the common support (:func:`proposition_41`); None when hgpo
    (mean norm) was not measured or no step is on the support."""
    hgpo_mean = draws.samples.get(("hgpo", "mean"))
    support = steps.support
    if hgpo_mean is None or not level_rows or not support.any():
        return None
    H = np.concatenate(hgpo_mean)
    hb = M.bias_variance(steps.key[support], H[support], steps.truth[support], steps.batch[support])
    prop = proposition_41([r["bias2"] for r in level_rows], [r["variance"] for r in level_rows],
                          hb.bias2, hb.variance, draws.K, cfg.alpha)  # fmt: skip
    prop.update(env=env_spec, K=draws.K, stage=stage,
                dvar=[[r["dvar"], r["dvar_lo"], r["dvar_hi"]] for r in level_rows[1:]])  # fmt: skip
    return prop


def _gradient_figures(
    pol: Any, rb: Any, advs: list[np.ndarray], probs: np.ndarray, gt: Any
) -> list[dict[str, tuple[float, float]]]:
    """Per advantage vector of ``advs`` (one batch): (cosine, relative error) of the batch
    gradient against the exact ones, "grad" (no gamma^t, what stepwise estimators target) and
    "grad_J" (dJ/dtheta).

    Tabular: on the logits (the parameters), visited rows only. Neural: the logit estimates
    (studies.metrics.visited_gradient_estimate / temperature, on the batch's rows) pushed to the
    parameters by ``pol.pullbacks`` (one forward pass for all), against
    ``gt.parameter_gradient(_undiscounted)``.
    """
    b = rb.batch
    exact = (("grad", gt.policy_gradient_undiscounted), ("grad_J", gt.policy_gradient))
    if isinstance(pol, toyenvs.TabularPolicy):
        return [
            {name: M.gradient_compare(rb.context, b.action, adv, probs, b.n_traj, g)
             for name, g in exact}
            for adv in advs
        ]  # fmt: skip
    estimates = [M.visited_gradient_estimate(rb.context, b.action, adv, probs, b.n_traj)
                 for adv in advs]  # fmt: skip
    g_hats = pol.pullbacks([g / pol.temperature for _, g in estimates], rows=estimates[0][0])
    return [
        {"grad": M.cosine_relerr(g_hat, gt.parameter_gradient_undiscounted),
         "grad_J": M.cosine_relerr(g_hat, gt.parameter_gradient)}
        for g_hat in g_hats
    ]  # fmt: skip


def proposition_41(
    bias2: list[float], var: list[float], h_bias2: float, h_var: float, K: int, alpha: float
) -> dict[str, Any]:
    """Check Proposition 4.1 on measured per-level figures (the common support).

    Conditions: |bias| falls with k (b_0 >= ... >= b_K) and variance rises (v_0 <= ... <= v_K).
    Conclusions: b_K <= b_H <= b_0 and sum w_k^2 v_0 <= v_H <= sum w_k^2 v_K, with
    b = sqrt(bias^2) and w_k = (k + 1)^alpha / sum (k' + 1)^alpha.
    """
    b = np.sqrt(np.maximum(bias2, 0.0))
    v = np.asarray(var)
    w = (np.arange(K + 1) + 1.0) ** alpha
    w /= w.sum()
    s = float((w**2).sum())
    bH = float(np.sqrt(max(h_bias2, 0.0)))
    return {
        "b": b.tolist(), "v": v.tolist(), "b_H": bH, "v_H": h_var, "sum_w2": s,
        "bias_falls": bool(np.all(np.diff(b) <= 0)),
        "variance_rises": bool(np.all(np.diff(v) >= 0)),
        "bias_between": bool(min(b[0], b[-1]) <= bH <= max(b[0], b[-1])),
        "variance_between": bool(s * min(v[0], v[-1]) <= h_var <= s * max(v[0], v[-1])),
    }  # fmt: skip


def run_study(cfg: StudyConfig, progress: bool = True, fresh: bool = False) -> dict[str, Any]:
    """Run every missing (env, K, stage) cell (``workers`` processes, or Ray tasks:
    studies.backend) and write the results folder; :class:`studies.backend.SweepError` lists
    the cells that failed.

    Finished cells are kept in ``out/cells/<key>.json`` (key = the cell and a hash of every
    setting that changes its result, :func:`cell_key`), so a killed study resumes where it
    stopped, with the same numbers; ``fresh`` deletes them first.
    """
    out = check_out_dir(cfg.out)  # before any cell: a folder that cannot be written fails now
    claim_results_dir(out, "bias_variance", study_settings(cfg), fresh, RESULTS)
    cells_dir = finished_dir(out / "cells", fresh)
    note_numba_compile(cfg.backend == "local")
    cells = [(e, K, s) for e in cfg.envs for K in cfg.Ks for s in cfg.stages]
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(cells))
    tasks = [
        Task(f"{e} K={K} stage={s}", (cfg, e, K, s, int(sq.generate_state(1)[0] % 2**31)))
        for (e, K, s), sq in zip(cells, seeds, strict=True)
    ]
    paths = {t.key: cells_dir / f"{cell_key(*t.args)}.json" for t in tasks}
    todo = [t for t in tasks if not paths[t.key].exists()]
    if len(todo) < len(tasks) and progress:
        print(f"resuming: {len(tasks) - len(todo)} of {len(tasks)} cells already in {cells_dir}",
              file=sys.stderr)  # fmt: skip
    # Handed out the likely longest first (larger K, then an imitated stage before the
    # untrained one), so that no worker ends alone on a long cell; seeds and rows keep the grid.
    todo.sort(key=lambda t: (-t.args[2], t.args[3] == "untrained"))
    sweep = run_tasks(
        run_cell, todo, lambda key, res: atomic_write_json(paths[key], res),
        backend=cfg.backend, workers=cfg.workers, ray_address=cfg.ray_address,
        progress=progress, desc="cells", total=len(tasks),
    )  # fmt: skip
    if sweep.failures:
        raise SweepError(sweep.failures, len(tasks))
    # (every cell read back from its file: a fresh study and a resumed one report the same)
    results = [json.loads(paths[t.key].read_text()) for t in tasks]

    return write_results(cfg, results)


RESULTS = ("results.csv", "results.json", "report.md", "schemes.csv", "schemes.json")
"""Files of a results folder that another run would replace (cells/ is keyed by settings)."""

HOW = ("workers", "backend", "ray_address", "out")
"""StudyConfig fields that change where and how a study runs, not its results."""


def study_settings(cfg: StudyConfig, scheme: Any = None) -> dict[str, Any]:
    """What the results folder of a study holds: every setting but where and how it ran (and,
    with --scheme, the scheme comparison's settings): its settings.json."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in HOW}
    if scheme is not None:
        settings["scheme"] = dataclasses.asdict(scheme)
    return settings


_GRID = ("envs", "Ks", "stages", "workers", "backend", "ray_address", "out")
"""StudyConfig fields that do not change a cell's result (its own env, K and stage and its
seed enter the key themselves)."""


def cell_key(cfg: StudyConfig, env: str, K: int, stage: str, cell_seed: int) -> str:
    """The file name of a cell's result: the cell, and a hash of every setting that changes
    it (a snapshot stage: the file's bytes too)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _GRID}
    cell = {"env": env, "K": K, "stage": stage, "seed": cell_seed}
    if Path(stage).is_file():
        cell["snapshot"] = hashlib.sha1(Path(stage).read_bytes()).hexdigest()
    key = {"settings": settings, "format": CELL_FORMAT, **cell}
    return result_key(f"{env}_K{K}_{stage}"[:80], key)


CELL_FORMAT = 2
"""The version of a cell file's contents, in its key: 2 added "versus" (HGPO against GRPO and
GiGPO, :func:`_versus`), so a cell kept by an older version is computed again, not read
without it."""


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    d = StudyConfig()
    p = ArgumentParser(
        prog="python -m studies.bias_variance", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
    )  # fmt: skip
    # One flag per field (its help and checks in the field's setting), but these, written here:
    # the nargs lists, --batches (named unlike n_batches), --workers (capped by the CPUs),
    # --out (its default depends on other flags); max_nodes and extra have none.
    hand = (*_LISTS, "n_batches", "workers", "out", "max_nodes", "extra")
    groups = add_flags(p, StudyConfig, help_format="{doc}", default=FIELD_DEFAULT, skip=hand,
                       type_metavar=False)  # fmt: skip
    _add_grid_options(groups[_section_of("Ks")], d)
    _add_run_options(groups[_section_of("out")], p, d)
    _add_scheme_options(p)
    return p


def _section_of(name: str) -> str:
    return next(t for t, names in sections(StudyConfig).items() if name in names)


def _add_grid_options(g: Any, d: StudyConfig) -> None:
    """The cells' hand-written flags (checked by the fields' settings)."""
    g.add_argument(
        "--envs",
        nargs="+",
        default=list(d.envs),
        help="family:param=value,... (default: %(default)s)",
    )
    g.add_argument(
        "--K",
        dest="Ks",
        type=int,
        nargs="+",
        default=list(d.Ks),
        help="memory length / hierarchy depth (default: %(default)s)",
    )
    g.add_argument(
        "--stages",
        nargs="+",
        default=list(d.stages),
        help="'untrained', success targets, or snapshot files (default: %(default)s)",
    )
    g.add_argument("--estimators", nargs="+", default=list(d.estimators), help="(default: all)")
    g.add_argument("--norms", nargs="+", default=list(d.norms), help="(default: %(default)s)")
    g.add_argument(
        "--batches",
        dest="n_batches",
        type=int,
        default=d.n_batches,
        help="independent batches per cell (default: %(default)s)",
    )


def _add_run_options(g: Any, p: argparse.ArgumentParser, d: StudyConfig) -> None:
    """--workers and --out (in ``g``), --quick, --no-progress, --fresh (in ``p``)."""
    g.add_argument("--workers", type=int, default=min(d.workers, os.cpu_count() or 1))
    g.add_argument("--out", default=None,
                   help=f"results folder (default: {d.out}; with --quick, --policy or --scheme "
                   f"a folder in it named after them, e.g. {d.out}/quick-mlp)")  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help="one env (keydoor 4x4), K=2, 2 stages, 12 batches, 50 fit steps: a smoke run (flags you give "
        "keep their values)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--fresh", action="store_true",
                   help="discard the finished cells in --out first, and replace the settings.json "
                   "of another run there (a study resumes otherwise)")  # fmt: skip


def _add_scheme_options(p: argparse.ArgumentParser) -> None:
    """Rollout schemes compared at equal env-step cost (studies/scheme_study.py)."""
    p.add_argument("--scheme", nargs="+", default=None,
                   help="compare rollout schemes at equal env-step cost instead (independent, "
                        "branch:uniform, branch:singleton, branch:hard, branch:3spo, tree:D1,D2,...)")  # fmt: skip
    p.add_argument("--budgets", type=float, nargs="+", default=None,
                   help="with --scheme: env-step budgets as multiples of N independent rollouts' "
                        "(default 0.5 0.75 1 1.5 2; --quick 0.5 1 2)")  # fmt: skip
    p.add_argument(
        "--branch-budget",
        type=float,
        default=0.5,
        help="with --scheme: share of the steps spent on branches, in (0, 1]",
    )


# fit_steps: the transformer's imitation fits were most of --quick's time (62 s at 150 steps)
QUICK = dict(
    envs=["keydoor:size=4"], Ks=[2], stages=["untrained", "0.5"], n_batches=12, fit_steps=50
)


def default_out(quick: bool, policy: str, scheme: bool) -> str:
    """The results folder when --out is not given: the main job's, or a folder in it named
    after what differs (``quick``, the network policy, ``scheme``), e.g. ``.../quick-mlp``."""
    parts = [name for name, on in (("quick", quick), (policy, policy != "tabular"),
                                   ("scheme", scheme)) if on]  # fmt: skip
    base = StudyConfig.out
    return f"{base}/{'-'.join(parts)}" if parts else base


@one_line_stops()
def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    branching = ("scheme", "budgets", "branch_budget")  # [branching]
    kw = {k: v for k, v in vars(a).items()
          if k not in ("quick", "no_progress", "fresh", *branching)}  # fmt: skip
    if a.quick:
        kw = apply_preset(kw, QUICK, given_dests(p, argv))
    for k in ("envs", "Ks", "stages", "estimators", "norms"):
        kw[k] = tuple(kw[k])
    if kw["out"] is None:
        kw["out"] = default_out(a.quick, kw["policy"], bool(a.scheme))
    try:
        if not a.scheme:  # [branching] (a flag that would change nothing is an error)
            for name in sorted({"budgets", "branch_budget"} & given_dests(p, argv)):
                flag = "--" + name.replace("_", "-")
                raise bad(flag, "given with --scheme (it does nothing without one)",
                          getattr(a, name))  # fmt: skip
        cfg = StudyConfig(**kw)
        if a.scheme:  # [branching] the rollout-scheme comparison, studies/scheme_study.py
            return _scheme_main(p, a, cfg)
        check_out_dir(cfg.out)
        check_results_dir(Path(cfg.out), "bias_variance", study_settings(cfg), a.fresh, RESULTS)
        check_backend(cfg.backend, cfg.ray_address)
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.perf_counter()
    try:
        summary = run_study(cfg, progress=not a.no_progress, fresh=a.fresh)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # (the table and every cell's Proposition 4.1 checks are in report.md, not here)
    print(summary["terminal"])
    print(f"\nwrote {cfg.out}/ in {time.perf_counter() - t0:.0f} s: report.md (this summary, "
          "every estimator's figures, HGPO against GRPO and GiGPO per cell, Proposition 4.1 per "
          "cell), results.csv, results.json, levels.csv and the plots (*.png)")  # fmt: skip
    return 0


def _scheme_main(p: argparse.ArgumentParser, a: argparse.Namespace, cfg: StudyConfig) -> int:
    """[branching] ``--scheme``: checks every scheme option, then runs the comparison."""
    budgets = a.budgets or (QUICK_BUDGETS if a.quick else DEFAULT_BUDGETS)
    study = SchemeStudy(tuple(a.scheme), tuple(budgets), a.branch_budget)
    try:
        if cfg.policy != "tabular":  # (run_scheme_cell plays the tabular policy)
            raise bad("--policy", "tabular with --scheme (the scheme comparison plays the table)",
                      cfg.policy)  # fmt: skip
        study.check(cfg.envs)
        check_out_dir(cfg.out)  # after the scheme options, before any work
        settings = study_settings(cfg, study)
        check_results_dir(Path(cfg.out), "bias_variance", settings, a.fresh, RESULTS)
    except ValueError as exc:
        p.error(str(exc))
    claim_results_dir(Path(cfg.out), "bias_variance", settings, a.fresh, RESULTS)
    try:
        print(run_scheme_study(cfg, study, progress=not a.no_progress))
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
