"""Do better advantages train better policies? Tabular PPO with every estimator on toyenvs.

    python -m studies.train_toy              # the default, a few minutes on 2 cores
    python -m studies.train_toy --full       # more envs, K = 2 and 4, more seeds and iterations
    python -m studies.train_toy --scheme independent branch:hard   # rollout schemes compared
                                                    # per env step (docs/branching.md)
    python -m studies.train_toy --help       # every option

The paper's training recipe in tabular form (studies/tabular_ppo.py): per iteration 16 tasks x
8 rollouts of the tabular softmax policy over the K-step context, one estimator's advantages,
PPO clip 0.2 (dual clip 3) with the k3 KL to the starting policy (0.01) and an entropy bonus
(0.001), Adam on the logits, gamma 0.95; ``gae`` trains a value table over the same contexts
(PPO with a critic). Each *setting* (an estimator with options: "hgpo", "hgpo:K=4",
"hgpo:alpha=2", ...) is trained on every environment with several seeds; every ``eval_every``
iterations the policy is evaluated at temperature 0.4 on the training tasks and on held-out
tasks (start states or task instances never trained on). Results land in a folder: runs/
(one JSON per finished run: this is what makes a killed study resume without redoing a run),
curves.csv, final.csv, results.json, report.md (the tables in the shape of the paper's Table 1
and Table 2, and Welch tests with Holm correction from statsmodels) and PNG learning curves.
Without --out the folder depends on what runs (results/train_toy, results/train_toy_quick,
results/train_toy_full; with --policy or --scheme a folder in it named after them, e.g.
results/train_toy/mlp-scheme), and a default folder that holds another study's results is
refused (give --out, or --fresh to replace them); an --out you name may hold several studies'
runs, keyed by their settings, and reports the current one's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import toyenvs
from hgpo import ESTIMATORS, EstimatorConfig, compute_advantages, estimator_reads
from hgpo.config import field_docs
from hgpo.fields import (
    FIELD_DEFAULT,
    add_flags,
    field_bounds,
    field_choices,
    field_types,
    in_section,
)
from hgpo.options import (
    ArgumentParser,
    bad,
    check_choice,
    check_int,
    check_number,
    parse_name_values,
)
from studies.backend import BACKENDS, SweepError, Task, check_backend, run_tasks
from studies.cli import NET_DTYPES, apply_preset, check_out_dir, given_dests, one_line_stops
from studies.compile_note import note_numba_compile
from studies.io import (
    atomic_write_json,
    check_results_dir,
    claim_results_dir,
    finished_dir,
    result_key,
)
from studies.metrics import gradient_estimate
from studies.stages import parse_env
from studies.step_inputs import StepInputs
from studies.tabular import expert_stages, neural_expert_stages
from studies.tabular_ppo import PPOSettings, TabularPPO, ValueTable
from studies.train_toy_report import write_results
from studies.train_toy_settings import DEFAULT_SETTINGS, FULL_SETTINGS
from toyenvs.branched_rollout import parse_scheme

__all__ = ["TrainToyConfig", "main", "parse_setting", "run_one", "run_study", "split_env"]

DEFAULT_ENVS = (
    "keydoor:size=4,horizon=40",
    "keydoor:size=5,horizon=40,start=0.03",
    "shop",
    "tmaze:length=3",
)
FULL_ENVS = (
    *DEFAULT_ENVS,
    "household:n_rooms=1,receptacles_per_room=5,n_tasks=8,horizon=12,start=0.005",
    "random:n_states=30,aliasing=0.7,n_tasks=8",
)


POLICIES = ("tabular", "mlp", "transformer")
NETWORK_EVALS = ("table", "visited")  # toyenvs.neural.EVALUATE, without importing torch


TABULAR_MAX_K = 6
"""Deepest memory of a tabular run (the context table grows as |O|^(K + 1) |A|^K)."""

# The --help sections of TrainToyConfig's flags (hgpo.fields.setting).
_grid = in_section("what to run")
_rollout = in_section("rollouts")
_train = in_section("training")
_eval = in_section("evaluation")
_policy = in_section("policy")
_runs_ = in_section("where and how it runs")


@dataclass(frozen=True)
class TrainToyConfig:
    """Settings of one train_toy study (every field has a command-line flag)."""

    envs: tuple[str, ...] = _grid(DEFAULT_ENVS)
    """Environments as "family:param=value,..." (toyenvs.make); an extra "start=..." overrides
    --start for that environment."""
    settings: tuple[str, ...] = _grid(DEFAULT_SETTINGS)
    """Estimators with options, "name" or "name:option=value,..." (hgpo.EstimatorConfig fields;
    K sets the policy's memory and the hierarchy depth together)."""
    Ks: tuple[int, ...] = _grid((2,), lo=0, hi=TABULAR_MAX_K)
    """Memory length K of every setting that does not set its own."""
    seeds: int = _runs_(8, lo=1)
    """Independent training runs per (env, setting, K)."""
    iterations: int = _train(100, lo=1)
    groups: int = _rollout(16, lo=1)
    """Tasks (rollout groups) per iteration."""
    rollouts: int = _rollout(8, lo=2)
    """Rollouts per group (N)."""
    gamma: float = _train(0.95, lo=0.0, hi=1.0)
    norm: str = _train("mean_std", choices=("mean", "mean_std"))
    """Group normalisation of every group estimator ("mean_std" or "mean")."""
    lr: float = _train(0.01, lo=0.0, lo_open=True)
    """Adam learning rate on the logits."""
    epochs: int = _train(1, lo=1)
    minibatches: int = _train(4, lo=1)
    clip: float = _train(0.2, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    kl_coef: float = _train(0.01, lo=0.0)
    entropy_coef: float = _train(0.001, lo=0.0)
    grad_clip: float = _train(1.0, lo=0.0)
    critic_lr: float = _train(0.1, lo=0.0, lo_open=True)
    """Adam learning rate of gae's value table."""
    gae_lambda: float = _train(0.95, lo=0.0, hi=1.0)
    eval_every: int = _eval(10, lo=1)
    eval_rollouts: int = _eval(32, lo=1)
    """Evaluation rollouts per task."""
    eval_temperature: float = _eval(0.4, lo=0.0, lo_open=True)
    start: str = _policy("uniform")
    """Starting (and reference) policy: "uniform", or a success rate in (0, 1) reached by expert
    imitation (studies.tabular.expert_stages), a warm start like the paper's instruct model."""
    seed: int = _runs_(0, lo=0)
    workers: int = _runs_(2, lo=1)
    """Local worker processes (backend "local"), or the CPUs of the Ray started here."""
    backend: str = _runs_("local", choices=BACKENDS)
    """Where the runs execute: "local" processes or "ray" tasks (studies/backend.py)."""
    ray_address: str = _runs_("")
    """Ray cluster to join with --backend ray (host:port, ray://host:port, auto); empty:
    $RAY_ADDRESS, else Ray started on this machine."""
    out: str = _runs_("results/train_toy")
    policy: str = _policy("tabular", choices=POLICIES)
    """The policy trained: "tabular" (one logits row per context), or a network over the
    context tokens that shares parameters across contexts, "mlp" or "transformer"
    (toyenvs.NeuralPolicy; one core per run)."""
    width: int = _policy(64, lo=1)
    """Width of the mlp / transformer."""
    layers: int = _policy(2, lo=1)
    """Hidden layers of the mlp / blocks of the transformer."""
    network_eval: str = _policy("table", choices=NETWORK_EVALS)
    """Where a network policy is evaluated after each update: "table", on every context the
    environment can reach (one batched forward); "visited", on the contexts its rollouts
    visit (toyenvs.NeuralPolicy.evaluate): the same probabilities up to float64 rounding, far
    less work where the reachable contexts outnumber the visited ones (shop at K = 4)."""
    net_dtype: str = _policy("float64", choices=NET_DTYPES)
    """A network policy's precision, "float64" or "float32" (toyenvs.NeuralPolicy dtype;
    4-6x faster forward and backward passes); the sampling table is float64 either way."""
    truth_every: int = _eval(0, lo=0)
    """Every N iterations, log against the exact truth of the current policy: the advantage
    MSE of the estimator being trained and the cosine of its parameter gradient to dJ/dtheta
    (0: never)."""
    schemes: tuple[str, ...] = _grid(())
    """Rollout schemes to compare (toyenvs/branched_rollout.py: independent, branch:uniform,
    branch:singleton, branch:hard, branch:3spo, tree:D1,...): every (env, setting) runs under
    each, at a per-group env-step budget equal to what --rollouts independent rollouts of the
    current policy use (empty: today's independent rollouts, no scheme in the run key)."""
    branch_budget: float = _rollout(0.5, lo=0.0, hi=1.0, lo_open=True)
    """Share of each group's env steps spent on branches with --scheme, in (0, 1]."""

    def __post_init__(self) -> None:
        _check_settings(self)
        if not self.envs or not self.settings or not self.Ks:
            raise ValueError("--envs, --settings and --K each need at least one value")
        for spec in self.envs:
            split_env(spec)
        _check_schemes(self.schemes, self.envs)
        for s in self.settings:
            _, K, ec = parse_setting(s, self)
            for k in self.Ks if K is None else (K,):  # the configs the runs will use
                try:
                    ec.replace(K=k)
                except ValueError as exc:
                    raise ValueError(f"--settings {s!r} at K={k}: {exc}") from None

    def run_fields(self) -> dict[str, Any]:
        """The fields that change a run's result (not envs/settings lists, workers or out)."""
        skip = {"envs", "settings", "Ks", "seeds", "workers", "backend", "ray_address", "out"}
        skip.add("network_eval")  # how the same probabilities are computed, not which
        # A run's scheme is in its run dict; without --scheme the branch share changes nothing,
        # and leaving both out keeps the keys (and resumable runs) of earlier studies.
        skip.add("schemes")
        if not self.schemes:
            skip.add("branch_budget")
        # The tabular policy ignores width / layers, and truth logging off changes nothing:
        # leaving them out keeps the keys (and resumable runs) of earlier tabular studies.
        if self.policy == "tabular":
            skip |= {"policy", "width", "layers"}
        if self.policy == "tabular" or self.net_dtype == "float64":
            skip.add("net_dtype")  # the runs before the option were float64
        if self.truth_every == 0:
            skip.add("truth_every")
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


def _flag(name: str) -> str:
    return "--" + _FLAGS.get(name, name).replace("_", "-")


def _check_settings(cfg: TrainToyConfig) -> None:
    """Check each field by the bounds and choices it declares (hgpo.fields.setting), in
    declaration order, errors named by its flag; each K of ``Ks`` in Ks' bounds; ``start``."""
    bounds, choices = field_bounds(TrainToyConfig), field_choices(TrainToyConfig)
    for name, kind in field_types(TrainToyConfig).items():
        where, value = _flag(name), getattr(cfg, name)
        if name == "Ks":
            for K in value:
                check_int(where, K, **bounds[name])
        elif kind is int:
            check_int(where, value, **bounds[name])
        elif kind is float:
            check_number(where, value, **bounds[name])
        elif name in choices:
            check_choice(where, value, choices[name])
        elif name == "start":
            _check_start(where, value)


def _check_start(where: str, value: Any) -> str:
    """ "uniform" or a success rate in (0, 1) (as text, the form run keys and caches use)."""
    if value == "uniform":
        return value
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if not 0 < rate < 1:
        raise bad(where, "'uniform' or a success rate in (0, 1)", value)
    return str(value)


def _check_schemes(schemes: tuple[str, ...], envs: tuple[str, ...]) -> None:
    """Named errors for an unknown scheme or a tree depth beyond an env's horizon."""
    if len(set(schemes)) != len(schemes):
        raise bad("--scheme", "distinct schemes", " ".join(schemes))
    for spec in envs if schemes else ():
        fam, params, _ = split_env(spec)
        horizon = toyenvs.make(fam, **params).horizon
        for s in schemes:
            try:
                parse_scheme(s, horizon)
            except ValueError as exc:
                raise ValueError(f"--scheme ({spec}): {exc}") from None


def split_env(spec: str) -> tuple[str, dict[str, Any], str | None]:
    """ "keydoor:size=5,start=0.03" -> ("keydoor", {"size": 5}, "0.03"), validated by toyenvs."""
    if not isinstance(spec, str):
        raise bad("--envs", 'a string "family:param=value,..."', spec)
    name, _, rest = spec.partition(":")
    params = parse_name_values(rest, where=f"--envs {spec!r}")
    start = params.pop("start", None)
    if start is not None:
        start = _check_start(f"--envs {spec!r}: start", start)
    kept = ",".join(f"{k}={v}" for k, v in params.items())
    fam, params = parse_env(f"{name}:{kept}" if kept else name)
    return fam, params, start


def parse_setting(spec: str, cfg: TrainToyConfig | None = None) -> tuple[str, int | None, Any]:
    """ "hgpo:K=4,alpha=2" -> ("hgpo", 4, EstimatorConfig(...)); errors name the setting.

    Returns (estimator, K or None when the setting does not fix it, EstimatorConfig without K).
    """
    if not isinstance(spec, str):
        raise bad("--settings", 'a string "estimator:option=value,..."', spec)
    cfg = cfg or TrainToyConfig.__new__(TrainToyConfig)
    name, _, rest = spec.partition(":")
    check_choice(f"--settings {spec!r}: estimator", name, ESTIMATORS)
    opts = parse_name_values(rest, where=f"--settings {spec!r}")
    K = opts.pop("K", None)
    if K is not None:
        K = check_int(f"--settings {spec!r}: K", K, lo=0, hi=TABULAR_MAX_K)
    base = dict(
        gamma=getattr(cfg, "gamma", 0.95), norm=getattr(cfg, "norm", "mean_std"),
        gae_lambda=getattr(cfg, "gae_lambda", 0.95),
    )  # fmt: skip
    try:
        ec = EstimatorConfig(**base).replace(**opts)
    except ValueError as exc:
        raise ValueError(f"--settings {spec!r}: {exc}") from None
    return name, K, ec


def _runs(cfg: TrainToyConfig) -> list[dict[str, Any]]:
    """Every (env, setting, K, seed) run, deduplicated, in a fixed order."""
    seen, out = set(), []
    for env in cfg.envs:
        for K in cfg.Ks:
            for s in cfg.settings:
                _, Ks, _ = parse_setting(s, cfg)
                k_eff = K if Ks is None else Ks
                if (env, s, k_eff) in seen:
                    continue
                seen.add((env, s, k_eff))
                for seed in range(cfg.seeds):
                    run = {"env": env, "setting": s, "K": k_eff, "seed": seed}
                    if not cfg.schemes:  # no "scheme" entry: the run key of earlier studies
                        out.append(run)
                    out += [{**run, "scheme": sc} for sc in cfg.schemes]
    return out


def _run_key(cfg: TrainToyConfig, run: dict[str, Any]) -> str:
    slug = f"{run['env']}_{run['setting']}_K{run['K']}_s{run['seed']}"
    if "scheme" in run:
        slug += f"_{run['scheme']}"
    return result_key(slug, {"cfg": cfg.run_fields(), **run})


# ---------------------------------------------------------------------------- one run


_START_CACHE: dict[tuple[str, int, str, int], Any] = {}


def _new_policy(cfg: TrainToyConfig, env: Any, K: int, seed: int) -> Any:
    """A fresh policy of cfg.policy: uniform table, or a network at the uniform policy."""
    if cfg.policy == "tabular":
        return toyenvs.TabularPolicy(env, K=K)
    return toyenvs.NeuralPolicy(
        env, K=K, arch=cfg.policy, width=cfg.width, layers=cfg.layers, seed=seed,
        evaluate=cfg.network_eval, dtype=cfg.net_dtype,
    )  # fmt: skip


def _start_policy(
    env_spec: str, start: str, env: Any, K: int, seed: int, cfg: TrainToyConfig | None = None
) -> Any:
    """The starting policy; warm starts are cached per process (every seed starts the same)."""
    cfg = cfg or TrainToyConfig()
    if start == "uniform":
        return _new_policy(cfg, env, K, seed)
    key = (env_spec, K, start, seed, cfg.policy, cfg.width, cfg.layers, cfg.network_eval,
           cfg.net_dtype)  # fmt: skip
    if key not in _START_CACHE:
        if cfg.policy == "tabular":
            (stage,) = expert_stages(env, K, (float(start),), seed=seed)
        else:
            make = lambda: _new_policy(cfg, env, K, seed)  # noqa: E731
            (stage,) = neural_expert_stages(env, make, (float(start),), seed=seed)
        _START_CACHE[key] = stage.policy
    return _START_CACHE[key].copy()


def _evaluate(env: Any, pol: Any, tasks: np.ndarray, cfg: TrainToyConfig, seed: int) -> float:
    if tasks.size == 0:
        return float("nan")
    t0 = pol.temperature
    pol.temperature = cfg.eval_temperature
    try:
        return float(toyenvs.rollout(env, pol, tasks, cfg.eval_rollouts, seed).success.mean())
    finally:
        pol.temperature = t0


TRUTH_KEYS = ("truth_J", "truth_adv_mse", "truth_grad_cos")
TRUTH_MAX_NODES = 1_000_000  # beyond it --truth-every logs nan (hgpo:K=4 on shop: 3M nodes)


def _truth_figures(
    env: Any, pol: Any, rb: Any, adv: np.ndarray, tasks: np.ndarray, cfg: TrainToyConfig
) -> dict[str, float]:
    """The exact figures of one batch under the policy that collected it (before the update).

    truth_J: exact J over the training tasks; truth_adv_mse: mean over the steps of
    (A_hat - A*)^2, A_hat the advantages PPO receives; truth_grad_cos: cosine between the
    batch's policy-gradient estimate pushed to the parameters, pullback(sum_t A_hat_t
    grad_logits log pi(a_t | c_t)) / n_traj, and the exact dJ/dtheta (discounted).
    """
    try:
        gt = toyenvs.exact_ground_truth(
            env, pol, gamma=cfg.gamma, tasks=tasks, max_nodes=TRUTH_MAX_NODES
        )
    except toyenvs.ChainTooLarge:
        return {}
    A_true = gt.advantage(rb)
    b = rb.batch
    probs = pol.probs(np.arange(pol.n_contexts))
    g_logits = gradient_estimate(rb.context, b.action, adv, probs, b.n_traj) / pol.temperature
    g_hat = pol.pullback(g_logits)
    g = gt.parameter_gradient
    den = float(np.linalg.norm(g_hat) * np.linalg.norm(g))
    return {
        "truth_J": gt.J,
        "truth_adv_mse": float(np.mean((adv - A_true) ** 2)),
        "truth_grad_cos": float(g_hat @ g / den) if den > 0 else float("nan"),
    }


def _collect(
    env: Any, pol: Any, tasks: np.ndarray, seed: int, scheme: str | None, cfg: TrainToyConfig
) -> Any:
    """One iteration's batch: N independent rollouts per task, or ``scheme`` at their cost.

    The budget S per group is the mean env steps per group of the N independent rollouts the
    current policy draws with the same seed (so every scheme pays what ``independent`` pays,
    iteration by iteration); a branched group may overshoot S by less than the horizon, and
    the batch's rows (``env_steps`` in the curve) are the cost actually paid.
    """
    rb = toyenvs.rollout(env, pol, tasks, cfg.rollouts, seed)
    if scheme is None or scheme == "independent":
        return rb
    steps = max(1, math.ceil(rb.batch.n_steps / tasks.size))
    return toyenvs.rollout(
        env, pol, tasks, cfg.rollouts, seed, scheme=scheme, steps=steps,
        branch_budget=cfg.branch_budget,
    )  # fmt: skip


@dataclass(frozen=True)
class _RunSetup:
    """One run's environment, estimator, policy and trainers, built before its first iteration."""

    env: Any
    estimator: str
    config: Any
    """The setting's hgpo.EstimatorConfig with the run's K."""
    pol: Any
    """The policy being trained (TabularPolicy or NeuralPolicy), updated in place."""
    ppo: Any
    """studies.tabular_ppo.TabularPPO or studies.neural_ppo.NeuralPPO on ``pol``."""
    critic: Any | None
    """studies.tabular_ppo.ValueTable for an estimator that reads values (gae), else None."""
    train_tasks: np.ndarray
    """int64[n]: the tasks trained on (and evaluated as "train")."""
    held_tasks: np.ndarray
    """int64[m]: held-out tasks, evaluated only."""


@dataclass(frozen=True)
class _IterationAdvantages:
    """One iteration's advantages as PPO receives them, and the critic's figures (gae)."""

    A: np.ndarray
    """float[n_steps]: the estimator's advantages (gae: whitened over the batch)."""
    util_top: float
    """Step utilisation of the deepest level (HGPO-family diagnostics), else nan."""
    critic_loss: float
    critic_ev: float
    """Explained variance of the returns by the critic before its update; nan without one."""


def run_one(cfg: TrainToyConfig, run: dict[str, Any]) -> dict[str, Any]:
    """Train one (env, setting, K, seed); returns its per-iteration curve and evaluations."""
    t_start = time.perf_counter()
    setup = _setup_run(cfg, run)
    # The same seed gives every setting the same task draws and rollout seeds (paired runs).
    rng = np.random.default_rng([cfg.seed, run["seed"], 0])
    upd_rng = np.random.default_rng([cfg.seed, run["seed"], 1])
    curve: list[dict[str, Any]] = []
    evals = [_evaluation(cfg, setup, 0)]
    for it in range(1, cfg.iterations + 1):
        curve.append(_train_iteration(cfg, setup, it, run.get("scheme"), rng, upd_rng))
        if it % cfg.eval_every == 0 or it == cfg.iterations:
            evals.append(_evaluation(cfg, setup, it))
    return {
        **run,
        "estimator": setup.estimator,
        "curve": curve,
        "evals": evals,
        "seconds": time.perf_counter() - t_start,
        "n_train_tasks": int(setup.train_tasks.size),
        "n_heldout_tasks": int(setup.held_tasks.size),
    }


def _setup_run(cfg: TrainToyConfig, run: dict[str, Any]) -> _RunSetup:
    """The run's environment, setting (its K on the estimator config), starting policy, PPO
    trainer of cfg.policy, and the value table when the estimator reads values (gae)."""
    fam, params, start = split_env(run["env"])
    env = toyenvs.make(fam, **params)
    est, _, ec = parse_setting(run["setting"], cfg)
    K = int(run["K"])
    ec = ec.replace(K=K)
    pol = _start_policy(run["env"], start or cfg.start, env, K, cfg.seed, cfg)
    if cfg.policy != "tabular":
        import torch

        from studies.neural_ppo import NeuralPPO

        torch.set_num_threads(1)  # one core per run: the study runs `workers` runs at once
    trainer = TabularPPO if cfg.policy == "tabular" else NeuralPPO
    ppo = trainer(
        pol,
        PPOSettings(
            lr=cfg.lr, epochs=cfg.epochs, minibatches=cfg.minibatches, clip=cfg.clip,
            kl_coef=cfg.kl_coef, entropy_coef=cfg.entropy_coef, grad_clip=cfg.grad_clip,
            critic_lr=cfg.critic_lr,
        ),
    )  # fmt: skip
    critic = ValueTable(pol, cfg.critic_lr) if "values" in estimator_reads(est) else None
    return _RunSetup(
        env=env,
        estimator=est,
        config=ec,
        pol=pol,
        ppo=ppo,
        critic=critic,
        train_tasks=np.asarray(env.train_tasks, dtype=np.int64),
        held_tasks=np.asarray(env.heldout_tasks, dtype=np.int64),
    )


def _evaluation(cfg: TrainToyConfig, setup: _RunSetup, it: int) -> dict[str, Any]:
    """Success of the current policy at cfg.eval_temperature on the training and held-out
    tasks (seeds fixed per iteration, so every setting meets the same episodes)."""
    return {
        "iteration": it,
        "train_success": _evaluate(setup.env, setup.pol, setup.train_tasks, cfg, 10**6 + it),
        "heldout_success": _evaluate(setup.env, setup.pol, setup.held_tasks, cfg, 2 * 10**6 + it),
    }


def _train_iteration(
    cfg: TrainToyConfig,
    setup: _RunSetup,
    it: int,
    scheme: str | None,
    rng: np.random.Generator,
    upd_rng: np.random.Generator,
) -> dict[str, Any]:
    """Iteration ``it``: collect a batch, its advantages (and the critic's update), the exact
    figures every cfg.truth_every iterations (before the update), one PPO update; returns the
    curve's row."""
    tasks = rng.choice(setup.train_tasks, size=cfg.groups, replace=True)
    rb = _collect(setup.env, setup.pol, tasks, int(rng.integers(2**31)), scheme, cfg)
    try:  # a non-finite loss (PPO's, or the critic's) stops the run, which is then not saved
        adv = _iteration_advantages(cfg, setup, rb, upd_rng)
        truth = (
            _truth_figures(setup.env, setup.pol, rb, adv.A, setup.train_tasks, cfg)
            if cfg.truth_every and (it == 1 or it % cfg.truth_every == 0)
            else {}
        )
        old_lp = setup.ppo.old_log_probs(rb.context, rb.batch.action)
        st = setup.ppo.update(rb.context, rb.batch.action, adv.A, old_lp, upd_rng)
    except FloatingPointError as e:
        raise FloatingPointError(f"iteration {it}: {e}") from None
    return _curve_row(cfg, it, rb, adv, st, setup.pol.n_contexts, truth)


def _iteration_advantages(
    cfg: TrainToyConfig, setup: _RunSetup, rb: Any, upd_rng: np.random.Generator
) -> _IterationAdvantages:
    """The setting's advantages of batch ``rb``, given the per-step inputs its estimator reads
    (studies.step_inputs: the critic's values, the policy's exact entropy at each step's
    context before the update, the observation texts); with a critic (an estimator that reads
    values, e.g. gae) it is then fitted to the estimator's returns (gae: A + V) and the
    advantages are whitened."""
    critic, pol = setup.critic, setup.pol
    values = critic.values(rb.context) if critic is not None else None
    inputs = StepInputs(setup.env, rb, values, probs=lambda: pol.probs(rb.context))
    adv = compute_advantages(
        setup.estimator, rb.batch, config=setup.config, **inputs.of(setup.estimator)
    )
    A = adv.advantages
    critic_loss = critic_ev = float("nan")
    if critic is not None:
        targets = adv.returns
        # explained variance of the returns by the critic, before this update
        critic_ev = float(1.0 - np.var(targets - values) / max(np.var(targets), 1e-12))
        critic_loss = critic.update(rb.context, targets, cfg.minibatches, cfg.epochs, upd_rng)
        A = (A - A.mean()) / (A.std() + 1e-8)  # verl whitens GAE advantages per batch
    levels = adv.diagnostics.get("levels", [])
    util = [lv.get("utilisation", np.nan) for lv in levels if lv.get("level", "").isdigit()]
    util_top = float(util[-1]) if util else float("nan")
    return _IterationAdvantages(A, util_top, critic_loss, critic_ev)


def _curve_row(
    cfg: TrainToyConfig,
    it: int,
    rb: Any,
    adv: _IterationAdvantages,
    st: Any,
    n_contexts: int,
    truth: dict[str, float],
) -> dict[str, Any]:
    """The curve's row of iteration ``it``: the batch's episodes, the advantages, PPO's
    statistics ``st`` (UpdateStats), the critic's figures and the exact ones (nan if not run)."""
    b, A = rb.batch, adv.A
    ep_reward = np.bincount(b.traj, weights=rb.true_reward, minlength=b.n_traj)
    return {
        "iteration": it,
        "success": float(rb.success.mean()),
        "reward": float(ep_reward.mean()),
        "episode_length": float(b.n_steps / b.n_traj),
        "env_steps": int(b.n_steps),
        "invalid_rate": float(b.invalid.mean()),
        "adv_mean": float(A.mean()),
        "adv_abs": float(np.abs(A).mean()),
        "pg_loss": st.pg_loss,
        "kl": st.kl,
        "clip_frac": st.clip_frac,
        "entropy": st.entropy,
        "grad_norm": st.grad_norm,
        "critic_loss": adv.critic_loss,
        "critic_ev": adv.critic_ev,
        "util_top": adv.util_top,
        "n_contexts": n_contexts,
        **(dict.fromkeys(TRUTH_KEYS, float("nan")) if cfg.truth_every else {}),
        **truth,
    }


# ---------------------------------------------------------------------------- the study


def run_study(cfg: TrainToyConfig, progress: bool = True, fresh: bool = False) -> dict[str, Any]:
    """Run every missing run (``workers`` processes, or Ray tasks: studies.backend), then write
    the results folder; :class:`studies.backend.SweepError` lists the runs that failed.

    Finished runs are kept in ``out/runs/<key>.json`` (key = run + a hash of every setting that
    changes its result), so a killed study resumes where it stopped; ``fresh`` deletes them.
    """
    out = check_out_dir(cfg.out)  # before any run: a folder that cannot be written fails now
    runs_dir = finished_dir(out / "runs", fresh)
    note_numba_compile(cfg.backend == "local")
    runs = _runs(cfg)
    paths = [runs_dir / f"{_run_key(cfg, r)}.json" for r in runs]
    todo = [Task(p.stem, (cfg, r)) for r, p in zip(runs, paths, strict=True) if not p.exists()]
    done = len(runs) - len(todo)
    if done and progress:
        print(f"resuming: {done} of {len(runs)} runs already in {runs_dir}", file=sys.stderr)
    sweep = run_tasks(
        run_one, todo, lambda key, res: atomic_write_json(runs_dir / f"{key}.json", res),
        backend=cfg.backend, workers=cfg.workers, ray_address=cfg.ray_address,
        progress=progress, desc="runs", total=len(runs),
    )  # fmt: skip
    if sweep.failures:
        raise SweepError(sweep.failures, len(runs))
    results = [json.loads(p.read_text()) for p in paths]

    return write_results(cfg, results)


# ---------------------------------------------------------------------------- command line

_FLAGS = {"Ks": "K", "schemes": "scheme"}


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m studies.train_toy", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
    )  # fmt: skip

    help_format = "{doc} (default: %(default)s)"
    lists = ("envs", "settings", "Ks", "schemes")  # nargs="+" flags, two named unlike their field
    groups = add_flags(p, TrainToyConfig, help_format=help_format, default=FIELD_DEFAULT,
                       skip=lists, type_metavar=False)  # fmt: skip
    doc = field_docs(TrainToyConfig)
    for f in dataclasses.fields(TrainToyConfig):
        if f.name in lists:
            groups["what to run"].add_argument(
                _flag(f.name), dest=f.name, nargs="+", type=int if f.name == "Ks" else str,
                default=list(f.default), help=help_format.format(doc=doc.get(f.name, "")),
            )  # fmt: skip
    preset = p.add_mutually_exclusive_group()
    preset.add_argument(
        "--full", action="store_true",
        help="6 envs, 17 settings, K = 2 and 4 for each, 8 seeds, 200 iterations (see docs); "
        "flags you give keep their values",
    )  # fmt: skip
    preset.add_argument(
        "--quick",
        action="store_true",
        help="one env, 3 settings, 2 seeds, 20 iterations: a smoke run; flags you give keep "
        "their values",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="discard finished runs in --out first (and, in a default folder, the settings of "
        "the study there)",
    )
    p.add_argument("--no-progress", action="store_true")
    return p


FULL = dict(
    envs=list(FULL_ENVS), settings=list(FULL_SETTINGS), Ks=[2, 4], seeds=8, iterations=200,
    out="results/train_toy_full",
)  # fmt: skip
SCHEME_SETTINGS = ("grpo", "gigpo", "hgpo")
"""The settings of a --scheme study unless --settings is given (issue 15)."""
QUICK = dict(
    envs=["tmaze:length=3"], settings=["grpo", "gigpo", "hgpo"], seeds=2, iterations=20,
    eval_every=10, out="results/train_toy_quick",
)  # fmt: skip


RESULTS = ("final.csv", "curves.csv", "results.json", "report.md")
"""Files of a results folder that another study would replace (runs/ is keyed by settings)."""


def study_settings(cfg: TrainToyConfig) -> dict[str, Any]:
    """Every setting but where and how the study runs: a default folder's settings.json."""
    how = {"workers", "backend", "ray_address", "out"}
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in how}


def default_out(base: str, policy: str, schemes: bool) -> str:
    """The results folder when --out is not given: the preset's ``base``, or a folder in it
    named after the network policy and ``scheme`` (e.g. ``results/train_toy/mlp-scheme``)."""
    parts = [name for name, on in ((policy, policy != "tabular"), ("scheme", schemes)) if on]
    return f"{base}/{'-'.join(parts)}" if parts else base


@one_line_stops()
def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    kw = {f.name: getattr(a, f.name) for f in dataclasses.fields(TrainToyConfig)}
    if a.full or a.quick:
        kw = apply_preset(kw, FULL if a.full else QUICK, given_dests(p, argv))
    given = given_dests(p, argv)
    if "out" not in given:  # the preset's folder, or one in it named after the policy / scheme
        kw["out"] = default_out(kw["out"], kw["policy"], bool(kw["schemes"]))
    if kw["schemes"] and "settings" not in given:
        kw["settings"] = list(SCHEME_SETTINGS)
    for k in ("envs", "settings", "Ks", "schemes"):
        kw[k] = tuple(kw[k])
    try:
        if not kw["schemes"] and "branch_budget" in given:  # it would change nothing
            raise bad("--branch-budget", "given with --scheme (it does nothing without one)",
                      a.branch_budget)  # fmt: skip
        cfg = TrainToyConfig(**kw)
        check_out_dir(cfg.out)
        if "out" not in given:  # a default folder holds one study (a named one may hold many)
            check_results_dir(Path(cfg.out), "train_toy", study_settings(cfg), a.fresh, RESULTS)
        check_backend(cfg.backend, cfg.ray_address)
    except ValueError as exc:
        p.error(str(exc))
    if "out" not in given:
        claim_results_dir(Path(cfg.out), "train_toy", study_settings(cfg), a.fresh, RESULTS)
    t0 = time.perf_counter()
    try:
        summary = run_study(cfg, progress=not a.no_progress, fresh=a.fresh)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary["table"])
    print()
    print("The paper's orderings on learning speed (auc); report.md has final success too:")
    print(summary["orderings_text_auc"])
    if cfg.schemes:
        print("\nLearning speed per env step (auc_steps, Welch + Holm):")
        print(summary["schemes_text"])
    print(
        f"\nwrote {cfg.out}/ (curves.csv, final.csv, results.json, report.md, *.png) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
