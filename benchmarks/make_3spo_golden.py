"""Run the 3SPO authors' public code next to our ``3spo`` estimator and freeze the result.

    python -m benchmarks.make_3spo_golden --ref-dir /tmp/3spo_ref [--cases 400] [--write]

This is NOT run in CI: it needs torch and a local copy of the authors' functions, which this
repository does not ship. On random batches built to hit the edge cases (states revisited
within a trajectory and shared across trajectories and groups, singleton and tied step
groups, successful and failed trajectories, intermediate and negative rewards, counts past
the truncation threshold xi, several rollout groups, both count scopes, both normalisations)
it checks that ``compute_advantages("3spo", batch, <the case's options>)`` gives the
authors' numbers, and with ``--write`` stores the inputs and their outputs in
``tests/hgpo/data/3spo_golden.json`` for ``tests/hgpo/test_3spo_golden.py``.

Reference code (genalyu/3SPO at commit da38445778f859b0e7e3a740cc5afa92540b47c7, read with the
public-code tools; copy into ``--ref-dir`` only, never into this repository):
- ``gigpo/core_3spo.py`` (``StateScoreManager``, ``compute_3spo_step_reward``,
  ``compute_3spo_advantage``) and ``gigpo/core_gigpo.py`` (``to_hashable``,
  ``build_step_group``, ``step_norm_reward``), whole, into ``<ref-dir>/gigpo/``, with an empty
  ``<ref-dir>/gigpo/__init__.py`` (core_3spo imports core_gigpo relatively);
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (a class with ``.batch`` and
  ``.non_tensor_batch`` dicts), the only verl name core_gigpo imports.

The glue below does what the authors' code would do with one batch, since their trainer never
calls these functions at that commit (docs/estimators.md, "3spo": ``main_3spo.py``
monkey-patches ``rollout_loop.TrajectoryCollector`` in the driver, which neither the Ray
``TaskRunner`` nor ``agent_system.multi_turn_rollout.TrajectoryCollector`` sees, nothing calls
``spo3_dfs_rollout`` or ``compute_3spo_advantage``, and the scripts train with
``algorithm.adv_estimator=grpo``):

1. a fresh ``StateScoreManager(alpha, xi, zeta)`` (epsilon 1e-6, G_max 8, its JSON file in a
   temporary folder), one for the batch or one per rollout group (``spo3_count_scope``);
2. ``update_statistics(observations of the trajectory, last reward > 0)`` for every
   trajectory, in batch order;
3. ``compute_3spo_step_reward(s_t, s_t+1, r_t, manager, omega_k)`` for every step, s_t+1 the
   next step's observation; after the last step, in half the cases a terminal observation no
   trajectory visited (our batch has no ``next_state``), in the others a drawn observation,
   often one that trajectories acted from (our batch's ``next_state`` holds it);
4. ``compute_3spo_advantage(step_rewards, response_mask, build_step_group(observations,
   group ids), epsilon=1e-6, remove_std)``; ``remove_std`` True is their default (our
   ``norm="mean"``), False divides by torch's sample std (``norm="mean_std"``, ``std="sample"``);
5. ``get_n_rollouts(state)`` (Eq. 3, G_max 8) of every step's state, for ``branch:3spo``.

Observations are strings ("obs 3"), as ALFWorld's anchors are (their ``to_hashable`` keys and
the manager's ``str(...)`` keys then agree). Step 4 runs twice: with the step rewards and
torch's default dtype in float32 (as a verl trainer would hold them) and in float64. Rows are
classed as in make_verl_agent_golden: equal to both runs (float32 to 1e-6 x max(1, |A|),
float64 to 1e-7 x max(1, |A|)), to the float64 run only (float32 rounding throws their code
off: a tied group whose float32 mean is not the tied value, or a near-tie), or a mismatch
(reported; the script exits 1). The shaped rewards (step 3, Python floats) must equal ours to
1e-12 x max(1, |R|) and the allocations (step 5) exactly.
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
import tempfile
import types
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    Tally,
    case_step_batch,
    golden_entry,
    golden_parser,
    golden_path,
    terminal_next_state,
    torch_default_dtype,
    write_golden,
)
from hgpo import EstimatorConfig, StepBatch, compute_advantages
from hgpo.threespo import SPO3_SOURCE, rollout_allocation, state_score, state_visits

GOLDEN = golden_path("3spo")
G_MAX = 8  # StateScoreManager's default, which main_3spo.py keeps
EPS = 1e-6  # StateScoreManager's epsilon and compute_3spo_advantage's
SHAPED_TOL = 1e-12


def load_reference(ref_dir: Path) -> types.ModuleType:
    """Import ``<ref-dir>/gigpo/core_3spo.py`` (with its core_gigpo and the verl stub)."""
    sys.path.insert(0, str(ref_dir))
    return importlib.import_module("gigpo.core_3spo")


def random_case(rng: np.random.Generator) -> dict[str, Any]:
    """Inputs of one case: a batch plus the 3SPO options."""
    n_states = int(rng.integers(2, 6))
    group, traj, step, reward, state = [], [], [], [], []
    tid = 0
    for g in rng.choice(100, int(rng.integers(1, 5)), replace=False):
        for _ in range(int(rng.integers(1, 7))):
            T = int(rng.integers(1, 10))
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice([0.0, 0.0, 0.0, 0.0, 1.0, 0.1, -0.5], T)
            r[-1] = 10.0 if rng.random() < 0.4 else float(rng.choice([0.0, 0.0, -0.5, 1.0]))
            reward += [float(x) for x in r]
            state += [int(s) for s in rng.integers(0, n_states, T)]
            tid += 1
    terminal = None
    if rng.random() < 0.5:  # the observation after each last step: seen before, or new
        terminal = [int(x) for x in rng.integers(0, n_states + 1, tid)]
    return dict(
        terminal=terminal,
        alpha=float(rng.choice([50.0, 50.0, 1.0, 0.5, 0.0])),
        xi=float(rng.choice([10.0, 2.0, 1.0])),
        zeta=float(rng.choice([0.1, 0.5])),
        omega_k=float(rng.choice([0.1, 0.1, 1.0])),
        scope=str(rng.choice(["batch", "group"])),
        remove_std=bool(rng.random() < 0.5),
        resp_len=[int(x) for x in rng.integers(1, 5, len(group))],
        group=group, traj=traj, step=step, reward=reward, state=state,
    )  # fmt: skip


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_3spo_golden.py); with
    the case's terminal observations as the ``next_state`` of each trajectory's last step."""
    has_terminal = case.get("terminal") is not None
    return case_step_batch(case, next_state=terminal_next_state(case) if has_terminal else None)


def case_config(case: dict[str, Any]) -> EstimatorConfig:
    """Our options for the authors' settings of one case."""
    return EstimatorConfig(
        norm="mean" if case["remove_std"] else "mean_std", std="sample", eps=EPS,
        spo3_alpha=case["alpha"], spo3_xi=case["xi"], spo3_zeta=case["zeta"],
        spo3_omega_k=case["omega_k"], spo3_eps=EPS, spo3_count_scope=case["scope"],
        spo3_target="reward", spo3_terminal_score=1.0, spo3_g_max=G_MAX,
    )  # fmt: skip


def ours(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(advantages, shaped rewards, allocations n(s_t)) of our code on one case."""
    batch, cfg = case_batch(case), case_config(case)
    out = compute_advantages("3spo", batch, cfg)
    v = state_visits(batch, cfg.spo3_count_scope)
    n = rollout_allocation(state_score(v.n_total, v.n_success, v.t, cfg), cfg.spo3_g_max)
    return out.advantages, out.returns, n


@dataclass(frozen=True)
class Reference:
    """The authors' outputs on one case."""

    shaped: np.ndarray
    n_rollouts: np.ndarray
    f32: np.ndarray
    f64: np.ndarray


def run_reference(case: dict[str, Any], core: types.ModuleType) -> Reference:
    """Steps 1-5 of the module docstring on one case."""
    n = len(case["group"])
    obs = [f"obs {s}" for s in case["state"]]
    rows: dict[int, list[int]] = {}
    for i, t in enumerate(case["traj"]):
        rows.setdefault(t, []).append(i)
    with tempfile.TemporaryDirectory() as tmp, redirect_stdout(io.StringIO()):
        managers: dict[Any, Any] = {}

        def manager(row: int) -> Any:
            key = None if case["scope"] == "batch" else case["group"][row]
            if key not in managers:
                managers[key] = core.StateScoreManager(
                    alpha=case["alpha"], xi=case["xi"], zeta=case["zeta"], epsilon=EPS,
                    g_max=G_MAX, persistence_path=str(Path(tmp) / f"stats_{len(managers)}.json"),
                )  # fmt: skip
            return managers[key]

        for rs in rows.values():
            manager(rs[0]).update_statistics([obs[i] for i in rs], case["reward"][rs[-1]] > 0)
        shaped = np.empty(n)
        n_rollouts = np.empty(n, dtype=np.int64)
        for t, rs in rows.items():
            for j, i in enumerate(rs):
                if j + 1 < len(rs):
                    nxt = obs[rs[j + 1]]
                elif case["terminal"] is None:
                    nxt = f"terminal of trajectory {t}"
                else:
                    nxt = f"obs {case['terminal'][t]}"
                shaped[i] = core.compute_3spo_step_reward(
                    obs[i], nxt, case["reward"][i], manager(i), omega_k=case["omega_k"]
                )
                n_rollouts[i] = manager(i).get_n_rollouts(str(core.to_hashable(obs[i])))
        f32 = _advantage(case, core, shaped, obs, float64=False)
        f64 = _advantage(case, core, shaped, obs, float64=True)
    return Reference(shaped, n_rollouts, f32, f64)


def _advantage(
    case: dict[str, Any], core: types.ModuleType, shaped: np.ndarray, obs: list[str], float64: bool
) -> np.ndarray:
    """compute_3spo_advantage on the shaped rewards, in float32 or float64 ([n] per step)."""
    import torch

    build_step_group = importlib.import_module("gigpo.core_gigpo").build_step_group  # --ref-dir
    dt = torch.float64 if float64 else torch.float32
    with torch_default_dtype(float64):
        n, L = len(shaped), max(case["resp_len"])
        mask = torch.zeros((n, L), dtype=dt)
        for i, m in enumerate(case["resp_len"]):
            mask[i, :m] = 1.0
        uid = np.array([f"g{g}" for g in case["group"]], dtype=object)
        groups = build_step_group(np.array(obs, dtype=object), uid)
        adv = core.compute_3spo_advantage(
            torch.tensor(shaped, dtype=dt), mask, groups, epsilon=EPS,
            remove_std=case["remove_std"],
        )  # fmt: skip
    return adv[:, 0].double().numpy()  # every row has >= 1 response token


CAUSES = ("tied", "near-tie", "cancellation")


def f32_causes(case: dict[str, Any], shaped: np.ndarray, rows: np.ndarray) -> list[str]:
    """Why the float32 run is off on ``rows``: the step group is tied (its float32 mean is not
    the tied value, divided by 0 + eps), a near-tie float32 cannot resolve (the values differ
    in float64 only), or cancellation (x - mean is small next to x: float32's relative error
    of 6e-8 on x becomes more than 1e-6 on x - mean)."""
    g, s = np.asarray(case["group"]), np.asarray(case["state"])
    out = []
    for i in rows:
        vals = shaped[(g == g[i]) & (s == s[i])]
        if np.unique(vals).size == 1:
            out.append("tied")
        elif np.unique(vals.astype(np.float32)).size == 1:
            out.append("near-tie")
        else:
            out.append("cancellation")
    return out


@dataclass
class _Report(Tally):
    shaped_worst: float = 0.0
    """max relative |shaped - theirs|."""
    bad: list[str] = field(default_factory=list)
    golden: list[dict[str, Any]] = field(default_factory=list)
    truncated: int = 0
    causes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    """Why the float32 run is off on the "float64 only" rows (:func:`f32_causes`)."""
    """Rows whose state scores 0 (Eq. 3 allocates no rollout): the truncation test was hit."""


def _compare(args: argparse.Namespace, core: types.ModuleType) -> _Report:
    rng = np.random.default_rng(args.seed)
    rep = _Report()
    for c in range(args.cases):
        case = random_case(rng)
        a, shaped, n = ours(case)
        ref = run_reference(case, core)
        cls = rep.add(a, ref.f32, ref.f64)
        rel = np.abs(shaped - ref.shaped) / np.maximum(1.0, np.abs(ref.shaped))
        rep.shaped_worst = max(rep.shaped_worst, float(rel.max()))
        rep.truncated += int((ref.n_rollouts == 0).sum())
        for cause in f32_causes(case, ref.shaped, np.flatnonzero(cls == 1)):
            rep.causes[cause] += 1
        if (cls >= 2).any() or (rel > SHAPED_TOL).any() or (n != ref.n_rollouts).any():
            rep.bad.append(
                f"case {c}: rows {np.flatnonzero(cls >= 2).tolist()} (advantage), "
                f"{np.flatnonzero(rel > SHAPED_TOL).tolist()} (shaped reward), "
                f"{np.flatnonzero(n != ref.n_rollouts).tolist()} (allocation)"
            )
        if args.write and (c < args.golden_cases or (cls >= 1).any()):
            rep.golden.append(golden_entry(case, ref.f32, ref.f64, cls,
                                           reference_shaped=ref.shaped.tolist(),
                                           reference_n_rollouts=ref.n_rollouts.tolist()))  # fmt: skip
    return rep


ABOUT = (
    "Inputs and the outputs of the 3SPO authors' code (gigpo/core_3spo.py: "
    "StateScoreManager, compute_3spo_step_reward, get_n_rollouts, "
    "compute_3spo_advantage) made by benchmarks/make_3spo_golden.py; reference_f32 "
    "with float32 step rewards, reference_f64 the same in float64; reference_shaped "
    "the step rewards of Eq. 2, reference_n_rollouts the allocation of Eq. 3 (G_max 8)."
)


def main(argv: list[str] | None = None) -> int:
    args = golden_parser(
        __doc__, GOLDEN, golden_cases=24, golden_help="cases in the file (at least)",
        ref_help="folder with gigpo/core_3spo.py, gigpo/core_gigpo.py and verl/__init__.py",
    ).parse_args(argv)  # fmt: skip
    import torch

    torch.set_num_threads(1)
    core = load_reference(args.ref_dir)
    rep = _compare(args, core)
    print(rep.summary("3spo  ", args.cases)
          + f"; rows whose state the authors truncate (n = 0): {rep.truncated}")  # fmt: skip
    print(f"       {rep.worst_text()}; shaped rewards: max relative difference "
          f"{rep.shaped_worst:.2g}; allocations: " + ("all equal" if not rep.bad else "see below"))  # fmt: skip
    print("       float64-only rows by cause: "
          + ", ".join(f"{k} {v}" for k, v in rep.causes.items()))  # fmt: skip
    for line in rep.bad:
        print("MISMATCH", line)
    if args.write:
        write_golden(GOLDEN, ABOUT, SPO3_SOURCE, args.seed, rep.golden)
    return 1 if rep.bad else 0


if __name__ == "__main__":
    sys.exit(main())
