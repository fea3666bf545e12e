"""Do the closed forms of hgpo.closed_form_bias predict the estimators' measured bias?

    python -m studies.closed_forms            # the default: results/closed_forms
    python -m studies.closed_forms --quick    # a smoke run: results/closed_forms/quick
    python -m studies.closed_forms --help     # every option

Per cell (env, policy stage, group size G) it computes the closed forms' predictions from the
exact POMDP quantities (studies/closed_forms_exact.py: each task's success probability p, the
probability S_k that a rollout takes turn k, the mean turn reward mu_k, the exact gamma = 1
advantages) and measures, over ``--batches`` independent batches (one rollout group of G per
training task), the estimators' actual advantages (hgpo.compute_advantages):

- grpo (norm "mean", no invalid penalty: the return is 10 x success, a binary reward): in the
  non-degenerate groups the mean of A_hat - A (A = 10 (success - p), the paper's expected
  advantage), against 10 x closed_form_bias.advantage_bias(p, G) ("grpo baseline"), and the mean
  A_hat of the successes against 10 x closed_form_bias.conditional_advantage(p, G, 1) ("grpo
  success"); pooled over tasks (ratio of sums, delta-method interval);
- mtgrpo (norm "mean", gamma 1) with mtgrpo_baseline "own_turns" (the natural construction,
  with and without leave_one_out) and "all_turns" (the fix, leave_one_out): the batch policy
  gradient (1 / n_traj) sum_t A_t grad log pi(a_t | c_t), projected on two unit directions: the
  predicted bias of own_turns (leave_one_out) and the exact undiscounted gradient. The fix is
  measured against the exact gradient (predicted difference 0: unbiased); each own_turns
  variant against the fix on the same batches (paired: the sampling noise they share cancels),
  predicted by the closed form's exact expected gradient (hgpo.closed_form_bias module docstring, 2);
  "RFC G->inf" gives the RFC's large-G form instead (hidden reward -mu_k per turn, c_k = 1).

A row **holds** when the prediction lies inside the measured 95% interval (a t interval over
batches; to 1e-9 x max(1, |prediction|), which also counts as a difference of 0 with p = 1: a
row without noise, such as G = 2's successes, has an interval of width 0, and a prediction
and a measurement that are both 0 but for float residues differ by about 1e-15). Each row
gives the difference, its two-sided p and the p Holm-adjusted over all rows (statsmodels).
Rows on the same batches are correlated: a cell's rows tend to fail together. Results:
results.csv, results.json, report.md in --out (written atomically), settings.json first.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

import toyenvs
from hgpo import EstimatorConfig, compute_advantages
from hgpo import closed_form_bias as cf
from hgpo.atomic import atomic_write_text
from hgpo.options import ArgumentParser, check_int
from studies.cli import apply_preset, check_out_dir, given_dests, one_line_stops
from studies.closed_forms_exact import TaskChain, expected_gradient, task_chain, weighted_q
from studies.io import atomic_write_json, check_results_dir, claim_results_dir, write_csv
from studies.stages import parse_env, stage_policies

__all__ = ["ClosedFormConfig", "main", "run_cell", "run_study"]

DEFAULT_ENVS = (
    "tmaze:length=2",
    "keydoor:size=4",
    "household:n_rooms=1,receptacles_per_room=5,n_tasks=4,horizon=8",
)
RESULTS = ("results.csv", "results.json", "report.md")
QUICK = dict(envs=("tmaze:length=1",), stages=("0.5",), group_sizes=(2, 4), batches=40)
MTGRPO = (
    ("mtgrpo own_turns loo", "own_turns", True),
    ("mtgrpo own_turns", "own_turns", False),
    ("mtgrpo all_turns loo (fix)", "all_turns", True),
)
"""(label, mtgrpo_baseline, leave_one_out) of the mtgrpo variants measured."""


@dataclass(frozen=True)
class ClosedFormConfig:
    """Settings of one run (each has a flag; lists take several values)."""

    envs: tuple[str, ...] = DEFAULT_ENVS
    K: int = 2
    """Memory length of the tabular policy, 0..6."""
    stages: tuple[str, ...] = ("untrained", "0.3", "0.7")
    """Policy stages: "untrained" or a success target in (0, 1) (expert imitation)."""
    group_sizes: tuple[int, ...] = (2, 4, 8)
    batches: int = 400
    """Independent batches per row, 10..1,000,000 (one group of G per training task each)."""
    seed: int = 0
    out: str = "results/closed_forms"

    def __post_init__(self) -> None:
        check_int("--K", self.K, lo=0, hi=6)
        check_int("--batches", self.batches, lo=10, hi=1_000_000)
        check_int("--seed", self.seed, lo=0, hi=2**31 - 1)
        for name in ("envs", "stages", "group_sizes"):
            if not getattr(self, name):
                raise ValueError(f"--{name.replace('_', '-')}: needs at least one value")
        for spec in self.envs:
            parse_env(spec)
        for s in self.stages:
            _check_stage(s)
        for G in self.group_sizes:
            if isinstance(G, bool) or not isinstance(G, int) or not 2 <= G <= 256:
                raise ValueError(f"--group-sizes: must be integers in 2..256, got {G!r}")


def _check_stage(stage: str) -> None:
    if stage == "untrained":
        return
    try:
        v = float(stage)
    except ValueError:
        raise ValueError(
            f"--stages: must be 'untrained' or a number in (0, 1), got {stage!r}"
        ) from None
    if not (math.isfinite(v) and 0.0 < v < 1.0):
        raise ValueError(f"--stages: must be 'untrained' or a number in (0, 1), got {stage!r}")


# ---------------------------------------------------------------------------- statistics


def _mean_row(x: np.ndarray, predicted: float) -> dict[str, Any]:
    """Mean of per-batch values with a 95% t interval, against ``predicted``."""
    n = x.size
    m = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return _verdict(m, se, n - 1, predicted)


MIN_EVENTS = 50
"""Fewest events (non-degenerate groups, successes in them) a ratio row is measured on: with
fewer, the delta-method interval is unreliable (with p near 0, every non-degenerate group may
hold exactly one success: an interval of width 0 around the rare-event average)."""


def _ratio_row(y: np.ndarray, z: np.ndarray, predicted: float) -> dict[str, Any]:
    """Ratio of sums sum y / sum z over batches with a delta-method 95% interval (``n``: the
    events, sum z; "too few events" below :data:`MIN_EVENTS`)."""
    n = y.size
    if z.sum() < MIN_EVENTS:
        return {"n": int(z.sum()), "measured": math.nan, "lo": math.nan, "hi": math.nan,
                "predicted": predicted, "diff": math.nan, "z": math.nan, "p": math.nan,
                "holds": "too few events"}  # fmt: skip
    R = float(y.sum() / z.sum())
    resid = y - R * z
    se = float(resid.std(ddof=1) / (math.sqrt(n) * z.mean())) if n > 1 else math.inf
    return {"n": int(z.sum()), **_verdict(R, se, n - 1, predicted)}


def holm(rows: list[dict]) -> None:
    """Add ``p_holm`` to every row: its p Holm-adjusted over the rows with a p (statsmodels)."""
    from statsmodels.stats.multitest import multipletests

    idx = [i for i, r in enumerate(rows) if not math.isnan(r["p"])]
    adj = multipletests([rows[i]["p"] for i in idx], method="holm")[1] if idx else []
    for r in rows:
        r["p_holm"] = math.nan
    for i, a in zip(idx, adj, strict=True):
        rows[i]["p_holm"] = float(a)


def _verdict(m: float, se: float, dof: int, predicted: float) -> dict[str, Any]:
    q = float(stats.t.ppf(0.975, max(dof, 1)))
    lo, hi = m - q * se, m + q * se
    diff = m - predicted
    # rounding: a prediction and a measurement both 0 but for float residues (own_turns with
    # leave_one_out equals the fix when every rollout of a group takes as many turns), or a
    # row without noise (G = 2's successes: an interval of width 0)
    tol = 1e-9 * max(1.0, abs(predicted))
    z = 0.0 if abs(diff) <= tol else (diff / se if se > 0 else math.inf)
    p = float(2 * stats.t.sf(abs(z), max(dof, 1))) if math.isfinite(z) else 0.0
    holds = "holds" if lo - tol <= predicted <= hi + tol else "does NOT hold"
    return {"measured": m, "lo": lo, "hi": hi, "predicted": predicted, "diff": diff, "z": z,
            "p": p, "holds": holds}  # fmt: skip


# ---------------------------------------------------------------------------- one cell


def _policy(env: Any, K: int, stage: str, seed: int) -> Any:
    return dict(stage_policies(env, K, (stage,), seed))[stage]


def _mtgrpo_predictions(
    chains: list[TaskChain], G: int, n_rows: int
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """(exact gradient, predicted expected gradient per variant and "rfc", the unit predicted
    bias direction of own_turns loo); gradients averaged over the tasks."""
    truth = np.zeros((n_rows, chains[0].pis[0].shape[1]))
    pred = {label: np.zeros_like(truth) for label, _, _ in MTGRPO}
    pred["rfc"] = np.zeros_like(truth)
    for tc in chains:
        H = len(tc.rows)
        ones, zeros = np.ones(H), np.zeros(H)
        g1 = expected_gradient(tc, weighted_q(tc, ones, zeros), n_rows)
        truth += g1
        for label, base, loo in MTGRPO:
            if base == "all_turns":
                pred[label] += cf.fix_scale(G, loo) * g1
                continue
            c = cf.mtgrpo_turn_weights(tc.alive, G, loo)
            pred[label] += expected_gradient(tc, weighted_q(tc, c, -c * tc.mu), n_rows)
        pred["rfc"] += g1 + expected_gradient(tc, weighted_q(tc, zeros, -tc.mu), n_rows)
    k = len(chains)
    truth /= k
    for v in pred.values():
        v /= k
    b = pred[MTGRPO[0][0]] - truth
    nb = float(np.linalg.norm(b))
    return truth, pred, (b / nb if nb > 0 else b)


def _batch_gradient(rb: Any, adv: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """The tabular batch gradient (1 / n_traj) sum_t A_t grad log pi(a_t | c_t)."""
    b = rb.batch
    g = np.zeros_like(probs)
    np.add.at(g, (rb.context, b.action), adv)
    g -= np.bincount(rb.context, weights=adv, minlength=probs.shape[0])[:, None] * probs
    return g / b.n_traj


def run_cell(cfg: ClosedFormConfig, env_spec: str, stage: str, cell_seed: int) -> list[dict]:
    """Every row of one (env, stage) cell, all group sizes."""
    name, params = parse_env(env_spec)
    env = toyenvs.make(name, **params)
    pol = _policy(env, cfg.K, stage, cell_seed)
    tasks = np.asarray(env.train_tasks)
    chains = [task_chain(env, pol, int(s)) for s in tasks]
    n_rows = pol.n_contexts  # every reachable context has its row now
    probs = pol.probs(np.arange(n_rows))
    p = np.array([tc.success for tc in chains])
    rows: list[dict] = []
    for G in cfg.group_sizes:
        common = {"env": env_spec, "stage": stage, "G": G, "success": float(p.mean())}
        rows += _paper_rows(cfg, env, pol, tasks, p, G, cell_seed, common)
        rows += _rfc_rows(cfg, env, pol, tasks, chains, probs, G, cell_seed, common)
    return rows


def _paper_rows(cfg: ClosedFormConfig, env: Any, pol: Any, tasks: np.ndarray, p: np.ndarray,
                G: int, seed: int, common: dict) -> list[dict]:  # fmt: skip
    """grpo's baseline bias and successes' advantage in non-degenerate groups."""
    ec = EstimatorConfig(norm="mean", invalid_penalty=0.0)
    rng = np.random.default_rng([seed, G, 1])
    yb, zb, ys, zs = (np.zeros(cfg.batches) for _ in range(4))
    for i in range(cfg.batches):
        rb = toyenvs.rollout(env, pol, tasks, G, int(rng.integers(2**31)))
        adv = compute_advantages("grpo", rb.batch, ec).advantages[rb.batch.traj_start]
        s = rb.success.astype(np.float64).reshape(len(tasks), G)
        a = adv.reshape(len(tasks), G)
        nd = (s.sum(axis=1) > 0) & (s.sum(axis=1) < G)
        truth = 10.0 * (s - p[:, None])
        yb[i] = ((a - truth).mean(axis=1) * nd).sum()
        zb[i] = nd.sum()
        ys[i] = (a * s * nd[:, None]).sum()
        zs[i] = (s * nd[:, None]).sum()
    w_nd = cf.nondegenerate_probability(p, G)
    w_s = G * (p - p**G)
    ok = w_nd > 0
    pred_b = float((w_nd * 10 * np.where(ok, cf.advantage_bias(np.where(ok, p, 0.5), G), 0)).sum()
                   / max(w_nd.sum(), 1e-300))  # fmt: skip
    ok_s = w_s > 0
    cond = np.where(ok_s, cf.conditional_advantage(np.where(ok_s, p, 0.5), G, 1), 0.0)
    pred_s = float((w_s * 10 * cond).sum() / max(w_s.sum(), 1e-300))
    truth_s = float((w_s * 10 * (1 - p)).sum() / max(w_s.sum(), 1e-300))
    return [
        {**common, "quantity": "grpo baseline: A_hat - A | non-degenerate", "truth": 0.0,
         "rfc_predicted": math.nan, **_ratio_row(yb, zb, pred_b)},
        {**common, "quantity": "grpo success: A_hat | non-degenerate, r = 1", "truth": truth_s,
         "rfc_predicted": math.nan, **_ratio_row(ys, zs, pred_s)},
    ]  # fmt: skip


def _rfc_rows(cfg: ClosedFormConfig, env: Any, pol: Any, tasks: np.ndarray,
              chains: list[TaskChain], probs: np.ndarray, G: int, seed: int,
              common: dict) -> list[dict]:  # fmt: skip
    """mtgrpo's gradient bias projected on the predicted bias and the exact gradient."""
    truth, pred, u = _mtgrpo_predictions(chains, G, probs.shape[0])
    nt = float(np.linalg.norm(truth))
    v = truth / nt if nt > 0 else truth
    configs = {label: EstimatorConfig(norm="mean", gamma=1.0, mtgrpo_baseline=base,
                                      leave_one_out=loo) for label, base, loo in MTGRPO}  # fmt: skip
    rng = np.random.default_rng([seed, G, 2])
    proj = {(label, d): np.zeros(cfg.batches) for label in configs for d in ("bias", "grad")}
    for i in range(cfg.batches):
        rb = toyenvs.rollout(env, pol, tasks, G, int(rng.integers(2**31)))
        for label, ec in configs.items():
            adv = compute_advantages("mtgrpo", rb.batch, ec).advantages
            e = _batch_gradient(rb, adv, probs) - truth
            proj[(label, "bias")][i] = float((e * u).sum())
            proj[(label, "grad")][i] = float((e * v).sum())
    fix = MTGRPO[2][0]
    rows = []
    for label in configs:
        for d, unit in (("bias", u), ("grad", v)):
            what = "predicted bias of own_turns loo" if d == "bias" else "exact gradient"
            if label == fix:  # unpaired: is the fix's expected gradient the exact one?
                x, predicted, rfc = proj[(label, d)], 0.0, math.nan
                q = f"{label}: gradient bias on the {what}"
            else:  # paired with the fix on the same batches: the sampling noise cancels
                x = proj[(label, d)] - proj[(fix, d)]
                predicted = float(((pred[label] - pred[fix]) * unit).sum())
                rfc = float(((pred["rfc"] - truth) * unit).sum())
                q = f"{label} minus the fix: gradient on the {what}"
            rows.append({**common, "quantity": q, "truth": 0.0, "rfc_predicted": rfc,
                         "n": int(x.size), **_mean_row(x, predicted)})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------- the study


def study_settings(cfg: ClosedFormConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "out"}


def run_study(cfg: ClosedFormConfig, progress: bool = True, fresh: bool = False) -> dict:
    """Every cell in turn; results.csv / results.json / report.md in ``cfg.out``."""
    out = check_out_dir(cfg.out)
    claim_results_dir(out, "closed_forms", study_settings(cfg), fresh, RESULTS)
    rows: list[dict] = []
    cells = [(e, s) for e in cfg.envs for s in cfg.stages]
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(cells))
    t0 = time.perf_counter()
    for (e, s), sq in zip(cells, seeds, strict=True):
        if progress:
            print(f"cell {e} stage={s} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        rows += run_cell(cfg, e, s, int(sq.generate_state(1)[0] % 2**31))
    seconds = time.perf_counter() - t0
    holm(rows)
    write_csv(out / "results.csv", rows)
    atomic_write_json(out / "results.json", {"settings": study_settings(cfg), "rows": rows,
                                             "seconds": seconds}, indent=1)  # fmt: skip
    report = render_report(rows, cfg, seconds)
    atomic_write_text(out / "report.md", report)
    return {"rows": rows, "report": report, "seconds": seconds}


def render_report(rows: list[dict], cfg: ClosedFormConfig, seconds: float) -> str:
    """A markdown table: one row per (cell, quantity), the verdict and how far off."""
    head = ("| env | stage | p | G | quantity | n | predicted | measured [95%] | diff (p, Holm p) "
            "| RFC G->inf | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [head]
    for r in rows:
        rfc = "" if math.isnan(r["rfc_predicted"]) else f"{r['rfc_predicted']:.4g}"
        lines.append(
            f"| {r['env'].split(':')[0]} | {r['stage']} | {r['success']:.2f} | {r['G']} | "
            f"{r['quantity']} | {r['n']} | {r['predicted']:.4g} | {r['measured']:.4g} "
            f"[{r['lo']:.4g}, {r['hi']:.4g}] | {r['diff']:+.3g} ({r['p']:.2g}, "
            f"{r['p_holm']:.2g}) | {rfc} | {r['holds']} |"
        )
    lines.append("\n" + summary_line(rows, cfg, seconds))
    return "\n".join(lines) + "\n"


def summary_line(rows: list[dict], cfg: ClosedFormConfig, seconds: float) -> str:
    """How many rows hold, how many are rejected after Holm, and the run's size."""
    data = [r for r in rows if r["holds"] in ("holds", "does NOT hold")]
    n_hold = sum(r["holds"] == "holds" for r in data)
    n_holm = sum(r["p_holm"] < 0.05 for r in data)
    return (f"{n_hold} of {len(data)} measured rows hold (prediction inside the 95% interval; "
            f"about 5% of true predictions fall outside by chance); {n_holm} differ after Holm's "
            f"correction over the {len(data)} rows (p_holm < 0.05); "
            f"{len(rows) - len(data)} rows with too few events. {cfg.batches} batches per row, "
            f"K = {cfg.K}, seed {cfg.seed}, {seconds:.0f} s.")  # fmt: skip


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    d = ClosedFormConfig()
    p = ArgumentParser(prog="python -m studies.closed_forms", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)  # fmt: skip
    p.add_argument("--envs", nargs="+", default=list(d.envs), help="(default: %(default)s)")
    p.add_argument("--K", type=int, default=d.K, help="memory length, 0..6 (default: 2)")
    p.add_argument("--stages", nargs="+", default=list(d.stages), help="(default: %(default)s)")
    p.add_argument("--group-sizes", type=int, nargs="+", default=list(d.group_sizes),
                   help="G values, 2..256 (default: %(default)s)")  # fmt: skip
    p.add_argument("--batches", type=int, default=d.batches,
                   help="batches per row, >= 10 (default: %(default)s)")  # fmt: skip
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help=f"results folder (default: {d.out}, "
                   f"--quick: {d.out}/quick)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a smoke run: T-maze length 1, one "
                   "stage, G 2 and 4, 40 batches (flags you give keep their values)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="replace another run's results in --out")
    p.add_argument("--no-progress", action="store_true")
    return p


@one_line_stops("nothing is kept; run it again")
def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    kw = {k: v for k, v in vars(a).items() if k not in ("quick", "fresh", "no_progress")}
    if a.quick:
        kw = apply_preset(kw, QUICK, given_dests(p, argv))
    for k in ("envs", "stages", "group_sizes"):
        kw[k] = tuple(kw[k])
    if kw["out"] is None:
        kw["out"] = ClosedFormConfig.out + ("/quick" if a.quick else "")
    try:
        cfg = ClosedFormConfig(**kw)
        check_out_dir(cfg.out)
        check_results_dir(Path(cfg.out), "closed_forms", study_settings(cfg), a.fresh, RESULTS)
    except ValueError as exc:
        p.error(str(exc))
    res = run_study(cfg, progress=not a.no_progress, fresh=a.fresh)
    print(res["report"])
    print(f"wrote {cfg.out}/: results.csv, results.json, report.md ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
