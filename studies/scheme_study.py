"""Rollout schemes at equal env-step cost: what branching buys HGPO and GiGPO on the exact truth.

    python -m studies.bias_variance --scheme independent branch:uniform branch:singleton \\
        branch:hard tree:2,4 --quick

For each cell (environment, K, policy stage) the reference is today's independent rollouts,
N = ``--rollouts`` per group; S0 = their mean env steps per group. Every scheme then runs at
``m * S0`` env steps per group for each budget multiplier m in ``--budgets`` (the share
``--branch-budget`` of them on branches, see toyenvs/branched_rollout.py), on the same tasks and seeds
batch by batch (common random numbers). Per (scheme, m), over ``--batches`` batches:

- level-K utilisation: share of steps whose level-K group (same K-step context) has >= 2
  members (HGPO's diagnostics; every step counts once, a branch's shared prefix is not a step
  of the branch);
- bias^2, variance, MSE of HGPO's and GiGPO's advantage (``norm=mean``, reward units) against
  A*(z, a), per (z, a) then averaged over the steps drawn (``studies.metrics.bias_variance``,
  95% jackknife intervals over blocks of batches);
- gradient cosine of the batch policy gradient (``norm=mean_std``, the paper's default) with
  the exact sum_t d_t(z) sum_a pi A* grad log pi, mean and 95% t interval over batches;
- MSE per step: the mean over the steps of a batch of (A_hat - A*)^2, mean and 95% t interval
  over batches. Unlike the (z, a) decomposition, whose average covers only the (z, a) met at
  least twice (a set that grows with the budget, towards rarer and harder states), it weighs
  every step drawn once, so it is comparable across budgets;
- the budget needed: the smallest m at which the MSE per step (and, separately, the gradient
  cosine) reaches that of independent N rollouts (linear interpolation in m between the
  budgets bracketing it; "> max" if none). The MSE per step need not fall with the budget: a
  step alone in all its groups gets 0, whose error A*^2 can be below that of a noisy group
  estimate, and a larger budget leaves fewer steps alone.

A branched batch over-samples the states it branches from; the MSE and cosine are measured on
the steps actually drawn, so that shift is part of what they report.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import toyenvs
from hgpo import EstimatorConfig, compute_advantages
from hgpo.options import bad, check_number
from studies import metrics as M
from studies.backend import SweepError, Task, run_tasks
from studies.compile_note import note_numba_compile
from studies.io import atomic_write_json, atomic_write_text, save_figure, write_csv
from studies.stages import parse_env, stage_policies
from studies.tabular import evaluate_success
from toyenvs.branched_rollout import parse_scheme

__all__ = ["SchemeStudy", "budget_needed", "run_scheme_cell", "run_scheme_study"]

DEFAULT_BUDGETS = (0.5, 0.75, 1.0, 1.5, 2.0)
QUICK_BUDGETS = (0.5, 1.0, 2.0)
MEASURED = (("hgpo", "HGPO"), ("gigpo", "GiGPO"))


@dataclass(frozen=True)
class SchemeStudy:
    """The scheme comparison's own settings (the rest comes from StudyConfig)."""

    schemes: tuple[str, ...]
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    """Multiples m of S0 (the env steps per group of N independent rollouts)."""
    branch_budget: float = 0.5
    """Share of each group's env steps spent on branches, in (0, 1]."""

    def check(self, envs: tuple[str, ...]) -> None:
        """Named errors for an unknown scheme, a tree depth beyond an env's horizon, a budget
        multiplier <= 0 or a branch share outside (0, 1], before any work."""
        check_number("--branch-budget", self.branch_budget, lo=0.0, hi=1.0, lo_open=True)
        for m in self.budgets:
            check_number("--budgets", m, lo=0.0, lo_open=True)
        if 1.0 not in self.budgets or list(self.budgets) != sorted(set(self.budgets)):
            raise bad(
                "--budgets",
                "ascending distinct multipliers including 1 (equal cost)",
                " ".join(map(str, self.budgets)),
            )
        for spec in envs:
            name, params = parse_env(spec)
            horizon = toyenvs.make(name, **params).horizon
            for s in self.schemes:
                parse_scheme(s, horizon)


def _measure(est: str, rb: Any, K: int, gamma: float, alpha: float) -> dict[str, Any]:
    base = EstimatorConfig(K=K, gamma=gamma, alpha=alpha)
    mean = compute_advantages(est, rb.batch, base.replace(norm="mean"))
    std = compute_advantages(est, rb.batch, base.replace(norm="mean_std"))
    return {"mean": mean, "std": std}


def run_scheme_cell(
    study: SchemeStudy, cfg: Any, env_spec: str, K: int, stage: str, cell_seed: int
) -> list[dict[str, Any]]:
    """Rows (scheme, budget, estimator) of one (environment, K, stage) cell."""
    name, params = parse_env(env_spec)
    env = toyenvs.make(name, **params)
    pol = dict(stage_policies(env, K, (stage,), cell_seed))[
        stage if not Path(stage).is_file() else Path(stage).stem
    ]
    success = evaluate_success(env, pol)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=cfg.gamma, max_nodes=cfg.max_nodes)
    probs = pol.probs(np.arange(pol.n_contexts))
    rng = np.random.default_rng(cell_seed)
    draws = [(rng.choice(env.tasks, cfg.groups), int(rng.integers(2**31)))
             for _ in range(cfg.n_batches)]  # fmt: skip

    def run(scheme: str | None, steps: int | None) -> dict[str, Any]:
        acc: dict[str, Any] = {"keys": [], "truth": [], "bid": [], "util": [], "steps": []}
        for b, (tasks, seed) in enumerate(draws):
            if scheme is None:
                rb = toyenvs.rollout(env, pol, tasks, cfg.rollouts, seed)
            else:
                rb = toyenvs.rollout(env, pol, tasks, seed=seed, scheme=scheme, steps=steps,
                                     branch_budget=study.branch_budget)  # fmt: skip
            node = gt.node_index(rb)
            acc["keys"].append(node * env.n_actions + rb.batch.action)
            acc["truth"].append(gt.Q[node, rb.batch.action] - gt.V[node])
            acc["bid"].append(np.full(rb.n_steps, b))
            acc["steps"].append(rb.n_steps / tasks.size)
            for est, _ in MEASURED:
                out = _measure(est, rb, K, cfg.gamma, cfg.alpha)
                adv = out["mean"].advantages
                acc.setdefault((est, "adv"), []).append(adv)
                acc.setdefault((est, "err"), []).append(
                    float(np.mean((adv - acc["truth"][-1]) ** 2))
                )
                cos, _ = M.gradient_compare(rb.context, rb.batch.action, out["std"].advantages,
                                            probs, rb.batch.n_traj, gt.policy_gradient_undiscounted)  # fmt: skip
                acc.setdefault((est, "cos"), []).append(cos)
                if est == "hgpo":
                    acc["util"].append(out["mean"].diagnostics["levels"][K]["utilisation"])
        return acc

    common = dict(env=env_spec, K=K, stage=stage, success=success, seed=cell_seed,
                  n_batches=cfg.n_batches, groups=cfg.groups, branch_budget=study.branch_budget)  # fmt: skip
    rows: list[dict[str, Any]] = []

    def rows_of(label: str, m: float, acc: dict[str, Any]) -> None:
        _, key = np.unique(np.concatenate(acc["keys"]), return_inverse=True)
        truth, bid = np.concatenate(acc["truth"]), np.concatenate(acc["bid"])
        u, u_lo, u_hi = M.mean_ci(np.asarray(acc["util"]))
        for est, est_label in MEASURED:
            bv = M.bias_variance(key, np.concatenate(acc[(est, "adv")]), truth, bid)
            c, c_lo, c_hi = M.mean_ci(np.asarray(acc[(est, "cos")]))
            e, e_lo, e_hi = M.mean_ci(np.asarray(acc[(est, "err")]))
            rows.append(dict(common, scheme=label, budget=m,
                             steps_per_group=float(np.mean(acc["steps"])), estimator=est_label,
                             util_K=u, util_K_lo=u_lo, util_K_hi=u_hi,
                             bias2=bv.bias2, bias2_lo=bv.bias2_ci[0], bias2_hi=bv.bias2_ci[1],
                             variance=bv.variance, variance_lo=bv.variance_ci[0],
                             variance_hi=bv.variance_ci[1], mse=bv.mse, mse_lo=bv.mse_ci[0],
                             mse_hi=bv.mse_ci[1], coverage=bv.coverage,
                             mse_step=e, mse_step_lo=e_lo, mse_step_hi=e_hi,
                             grad_cos=c, grad_cos_lo=c_lo, grad_cos_hi=c_hi))  # fmt: skip

    ref = run(None, None)
    s0 = float(np.mean(ref["steps"]))
    rows_of(f"independent N={cfg.rollouts}", 1.0, ref)
    for scheme in study.schemes:
        for m in study.budgets:
            rows_of(scheme, m, run(scheme, max(1, round(m * s0))))
    for r in rows:
        r["S0"] = s0
    return rows


def budget_needed(
    budgets: list[float], values: list[float], target: float, higher_is_better: bool = False
) -> float:
    """Smallest budget multiplier at which ``values`` (measured at ``budgets``, ascending)
    reach ``target`` (<= target for an error, >= for a cosine), interpolating linearly between
    the two budgets that bracket it; inf if they never do, the smallest budget if they already
    do there."""
    sign = -1.0 if higher_is_better else 1.0
    v = [sign * x for x in values]
    t = sign * target
    if v[0] <= t:
        return float(budgets[0])
    pts = list(zip(budgets, v, strict=True))
    for (m0, e0), (m1, e1) in itertools.pairwise(pts):
        if e1 <= t:
            return float(m0 + (m1 - m0) * (e0 - t) / (e0 - e1))
    return float("inf")


def summarise(rows: list[dict[str, Any]], budgets: tuple[float, ...]) -> tuple[str, list[dict]]:
    """The markdown tables (figures at m = 1, and the budget needed) and the needed rows."""
    lines = ["| env | K | stage | scheme | steps/group | util_K | estimator | bias^2 | variance "
             "| MSE [95% CI] | MSE per step [95% CI] | grad cos [95% CI] |", "|" + "---|" * 12]  # fmt: skip
    cells = sorted({(r["env"], r["K"], r["stage"]) for r in rows}, key=str)
    needed = []
    for env, K, stage in cells:
        cell = [r for r in rows if (r["env"], r["K"], r["stage"]) == (env, K, stage)]
        for r in cell:
            if r["budget"] != 1.0:
                continue
            lines.append(
                f"| {env} | {K} | {stage} | {r['scheme']} | {r['steps_per_group']:.1f} | "
                f"{r['util_K']:.3f} | {r['estimator']} | {r['bias2']:.3f} | {r['variance']:.3f} | "
                f"{r['mse']:.3f} [{r['mse_lo']:.3f}, {r['mse_hi']:.3f}] | "
                f"{r['mse_step']:.3f} [{r['mse_step_lo']:.3f}, {r['mse_step_hi']:.3f}] | "
                f"{r['grad_cos']:.3f} [{r['grad_cos_lo']:.3f}, {r['grad_cos_hi']:.3f}] |"
            )
        for metric, better in (("mse_step", False), ("grad_cos", True)):
            for est in ("HGPO", "GiGPO"):
                target = next(r[metric] for r in cell if r["estimator"] == est
                              and r["scheme"].startswith("independent N="))  # fmt: skip
                for scheme in dict.fromkeys(r["scheme"] for r in cell
                                            if not r["scheme"].startswith("independent N=")):  # fmt: skip
                    pts = sorted((r["budget"], r[metric]) for r in cell
                                 if r["scheme"] == scheme and r["estimator"] == est)  # fmt: skip
                    m = budget_needed([p[0] for p in pts], [p[1] for p in pts], target, better)
                    needed.append(dict(env=env, K=K, stage=stage, estimator=est, metric=metric,
                                       scheme=scheme, target=target, budget_needed=m))  # fmt: skip
    schemes = list(dict.fromkeys(n["scheme"] for n in needed))
    for metric, what in (("mse_step", "the MSE per step"), ("grad_cos", "the gradient cosine")):
        lines += ["", f"budget needed (x S0; measured at {', '.join(f'{b:g}' for b in budgets)}) "
                  f"to reach {what} of independent N rollouts:", "",
                  f"| env | K | stage | estimator | target {metric} | " + " | ".join(schemes) + " |",
                  "|" + "---|" * (5 + len(schemes))]  # fmt: skip
        for env, K, stage in cells:
            for est in ("HGPO", "GiGPO"):
                sel = {n["scheme"]: n for n in needed if n["metric"] == metric and
                       (n["env"], n["K"], n["stage"], n["estimator"]) == (env, K, stage, est)}  # fmt: skip
                vals = [sel[s]["budget_needed"] for s in schemes]
                txt = [f"> {max(budgets):g}" if v == float("inf") else f"{v:.2f}" for v in vals]
                lines.append(f"| {env} | {K} | {stage} | {est} | {sel[schemes[0]]['target']:.3f} | "
                             + " | ".join(txt) + " |")  # fmt: skip
    return "\n".join(lines), needed


def plot_schemes(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per (env, K, stage): HGPO's gradient cosine (top row) and level-K utilisation
    (bottom row) against env steps per group, a line per scheme; the reference is a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["env"], r["K"], r["stage"]) for r in rows}, key=str)
    fig, axes = plt.subplots(2, len(cells), figsize=(3.2 * len(cells), 5.6), squeeze=False)
    for c, (env, K, stage) in enumerate(cells):
        cell = [r for r in rows if (r["env"], r["K"], r["stage"]) == (env, K, stage)
                and r["estimator"] == "HGPO"]  # fmt: skip
        for i, (metric, label) in enumerate((("grad_cos", "HGPO gradient cosine"),
                                             ("util_K", f"level-{K} utilisation"))):  # fmt: skip
            ax = axes[i, c]
            for scheme in dict.fromkeys(r["scheme"] for r in cell):
                pts = sorted(
                    (r["steps_per_group"], r[metric]) for r in cell if r["scheme"] == scheme
                )
                if scheme.startswith("independent N="):
                    ax.plot(*zip(*pts, strict=True), "k*", ms=10, label=scheme)
                else:
                    ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=scheme)
            ax.set_xlabel("env steps per group")
            ax.set_ylabel(label)
            ax.set_title(f"{env.split(':')[0]} K={K} {stage}", fontsize=9)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def run_scheme_study(cfg: Any, study: SchemeStudy, progress: bool = True) -> str:
    """Every (env, K, stage) cell under every scheme and budget (``cfg.workers`` local
    processes, studies.backend; a progress bar counts the cells); writes ``schemes.csv``,
    ``schemes.json``, ``budget_needed.csv``, ``schemes.md`` and ``schemes.png`` into
    ``cfg.out``. :class:`studies.backend.SweepError` lists the cells that failed."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = out / ".write_test"
    probe.write_text("")  # not a result: an unwritable folder fails here, before any work
    probe.unlink()
    t0 = time.perf_counter()
    cells = [(e, K, s) for e in cfg.envs for K in cfg.Ks for s in cfg.stages]
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(cells))
    tasks = [Task(f"{e} K={K} stage={s}", (study, cfg, e, K, s, int(sq.generate_state(1)[0] % 2**31)))
             for (e, K, s), sq in zip(cells, seeds, strict=True)]  # fmt: skip
    note_numba_compile()
    got: dict[str, list[dict[str, Any]]] = {}
    sweep = run_tasks(run_scheme_cell, tasks, got.__setitem__, workers=cfg.workers,
                      progress=progress, desc="cells")  # fmt: skip
    if sweep.failures:
        raise SweepError(sweep.failures, len(tasks))
    results = [got[t.key] for t in tasks]  # (in the grid's order, whatever finished first)
    rows = [r for rs in results for r in rs]
    table, needed = summarise(rows, study.budgets)
    write_csv(out / "schemes.csv", rows)
    write_csv(out / "budget_needed.csv", needed)
    atomic_write_json(out / "schemes.json", {"rows": rows, "budget_needed": needed,
                                              "schemes": list(study.schemes),
                                              "budgets": list(study.budgets),
                                              "branch_budget": study.branch_budget,
                                              "seed": cfg.seed})  # fmt: skip
    atomic_write_text(out / "schemes.md", table + "\n")
    plot_schemes(rows, out / "schemes.png")
    return table + f"\n\nwrote {out}/ (schemes.csv, schemes.json, budget_needed.csv, schemes.md, schemes.png) " \
        f"in {time.perf_counter() - t0:.0f} s"  # fmt: skip
