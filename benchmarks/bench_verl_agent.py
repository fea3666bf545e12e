"""Side-by-side timing: the authors' verl-agent advantage functions and ours, same inputs.

    python -m benchmarks.bench_verl_agent --ref-dir DIR [--repeat 3] [--steps 3259]
    python -m benchmarks.bench_verl_agent --ref-dir DIR --from-git MIRROR [--commit 796ed31]

The paper's batch shape: 3,259 agent steps (16 tasks x 8 rollouts of ALFWorld), history
length K = 4, response length 512. The batch imitates ALFWorld (mostly zero rewards, 10 on
success at the last step, 5% invalid actions, states from a small per-phase alphabet so that
contexts repeat) and goes through the authors' trainer glue (their
``compute_step_discounted_returns``, the episode reward at the last response token, the 0.1
invalid-action penalty; see benchmarks/make_verl_agent_golden.py), in float32 as published.
Then each estimator is called through the same signature twice: the authors' function
(``gigpo/core_gigpo.py``, ``recipe/hgpo/core_hgpo.py``) and ours
(``hgpo.integrations.verl_agent``). Printed per estimator: the median wall time of
``--repeat`` calls of each (after one untimed call), the ratio ours / theirs, and the largest
difference of the outputs, |theirs - ours| / max(1, |ours|) (the authors' code works in
float32, ours in float64). torch runs on one thread (``torch.set_num_threads(1)``); ours is numpy.

The authors' code is not shipped here. ``--ref-dir`` holds copies: ``core_hgpo.py`` and
``core_gigpo.py`` (whole files) and ``verl/__init__.py`` (a stub defining ``DataProto``, the
only verl name they import). ``--from-git MIRROR`` writes them into ``--ref-dir`` from a
local git clone of johnhaofu/verl-agent at ``--commit``, with ``hgpo_ray_trainer.py`` and
``core_algos.py`` (read by the live test of ``install()``: ``HGPO_VERL_AGENT_REF=DIR pytest
tests/integrations/test_verl_agent.py``).
"""

from __future__ import annotations

import argparse
import functools
import io
import subprocess
import sys
import time
import types
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

from hgpo.options import ArgumentParser

FILES = {"core_hgpo.py": "recipe/hgpo/core_hgpo.py", "core_gigpo.py": "gigpo/core_gigpo.py"}
EXTRA_FILES = {
    "hgpo_ray_trainer.py": "recipe/hgpo/hgpo_ray_trainer.py",
    "core_algos.py": "verl/trainer/ppo/core_algos.py",
}
"""Also copied by --from-git, for tests/integrations/test_verl_agent.py's live check of
install() against the authors' own compute_advantage (HGPO_VERL_AGENT_REF=DIR)."""
VERL_STUB = '''"""Stub of verl for the copied reference functions: they only name DataProto."""


class DataProto:
    def __init__(self, batch=None, non_tensor_batch=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
'''


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref-dir", type=Path, required=True,
                   help="folder with the copied reference modules (see above)")  # fmt: skip
    p.add_argument("--from-git", type=Path, default=None, metavar="MIRROR",
                   help="write --ref-dir from this git clone of johnhaofu/verl-agent first")  # fmt: skip
    p.add_argument("--commit", default="796ed31", help="commit of --from-git (default 796ed31)")
    p.add_argument("--steps", type=int, default=3259, help="agent steps in the batch")
    p.add_argument("--K", type=int, default=4, help="history length (HGPO's K)")
    p.add_argument("--response-length", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3, help="calls per function (median)")
    p.add_argument("--seed", type=int, default=0)
    return p


def write_ref_dir(mirror: Path, commit: str, ref_dir: Path) -> None:
    """Copy the authors' two modules out of a git clone (``git show COMMIT:PATH``)."""
    ref_dir.mkdir(parents=True, exist_ok=True)
    for name, path in {**FILES, **EXTRA_FILES}.items():
        src = subprocess.run(["git", "-C", str(mirror), "show", f"{commit}:{path}"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        if src.returncode != 0:
            raise SystemExit(f"error: --from-git: git show {commit}:{path}: {src.stderr.strip()}")
        (ref_dir / name).write_text(src.stdout)
    (ref_dir / "verl").mkdir(exist_ok=True)
    (ref_dir / "verl" / "__init__.py").write_text(VERL_STUB)


def load_reference(ref_dir: Path) -> dict[str, types.ModuleType]:
    """The copied modules, imported from ``ref_dir`` (its verl stub first on the path)."""
    missing = [n for n in (*FILES, "verl/__init__.py") if not (ref_dir / n).is_file()]
    if missing:
        raise SystemExit(
            f"error: --ref-dir {ref_dir} lacks {', '.join(missing)}; build it with "
            "--from-git MIRROR (a clone of johnhaofu/verl-agent) or copy them there"
        )
    sys.path.insert(0, str(ref_dir))
    mods = {}
    for name in FILES:
        mod = types.ModuleType(f"ref_{name[:-3]}")
        exec(compile((ref_dir / name).read_text(), str(ref_dir / name), "exec"), mod.__dict__)
        mods[name[:-3]] = mod
    return mods


def paper_case(n_steps: int, K: int, L: int, seed: int) -> dict[str, Any]:
    """An ALFWorld-like batch of ``n_steps`` steps in 16 groups of 8 trajectories, in the
    case format of make_verl_agent_golden.py."""
    rng = np.random.default_rng(seed)
    n_traj = min(16 * 8, n_steps)
    lens = np.full(n_traj, n_steps // n_traj)
    lens[: n_steps - lens.sum()] += 1
    t = np.concatenate([np.arange(m) for m in lens])
    traj = np.repeat(np.arange(n_traj), lens)
    reward = np.zeros(n_steps)
    last = np.cumsum(lens) - 1
    reward[last] = 10.0 * (rng.random(n_traj) < 0.4)
    resp_len = rng.integers(min(32, L), L + 1, n_steps)
    resp_len[0] = L
    return dict(estimator="hgpo", env="alfworld", K=K, gamma=0.95, alpha=1.0,
                base_group=False, group=(traj // 8).tolist(), traj=traj.tolist(),
                step=t.tolist(), reward=reward.tolist(),
                state=((t // 5) * 4 + rng.integers(0, 4, n_steps)).tolist(),
                invalid=(rng.random(n_steps) < 0.05).tolist(),
                resp_len=resp_len.tolist())  # fmt: skip


def _median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median seconds of ``repeat`` calls after one untimed warm-up call, the output)."""
    with redirect_stdout(io.StringIO()):
        out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with redirect_stdout(io.StringIO()):  # the authors' code prints group sizes
            out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for flag, value, lo in (("--steps", args.steps, 1), ("--K", args.K, 0),
                            ("--response-length", args.response_length, 1),
                            ("--repeat", args.repeat, 1)):  # fmt: skip
        if value < lo:
            parser.error(f"{flag}: must be >= {lo}, got {value}")
    if args.from_git is not None:
        write_ref_dir(args.from_git, args.commit, args.ref_dir)
    mods = load_reference(args.ref_dir)
    import os

    import torch

    from benchmarks.make_verl_agent_golden import _reference_inputs
    from hgpo.integrations import verl_agent

    torch.set_num_threads(1)
    case = paper_case(args.steps, args.K, args.response_length, args.seed)
    x = _reference_inputs(case, {**mods, "core_hgpo": mods["core_hgpo"]}, float64=False)
    common = dict(token_level_rewards=x.scores, step_rewards=x.step_rewards,
                  response_mask=x.response_mask, anchor_obs=x.anchor_obs, index=x.uid,
                  traj_index=x.traj_uid)  # fmt: skip
    runs = {
        "hgpo": ("core_hgpo", "compute_hgpo_outcome_advantage",
                 dict(history_length=args.K, mode="mean_std_norm")),
        "hgpo base_group": ("core_hgpo", "compute_hgpo_outcome_advantage",
                            dict(history_length=args.K, mode="mean_std_norm", base_group=True)),
        "gigpo": ("core_gigpo", "compute_gigpo_outcome_advantage", dict(mode="mean_std_norm")),
    }  # fmt: skip
    print(f"batch: {args.steps} steps, K = {args.K}, response length {args.response_length}, "
          f"median of {args.repeat}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(
        f"{'estimator':<16} {'theirs s':>9} {'ours s':>9} {'ours/theirs':>12} {'max rel diff':>13}"
    )
    for label, (mod, fn, opts) in runs.items():
        theirs_fn = functools.partial(getattr(mods[mod], fn), **common, **opts)
        ours_fn = functools.partial(getattr(verl_agent, fn), **common, **opts)
        theirs_t, theirs = _median_time(theirs_fn, args.repeat)
        ours_t, ours = _median_time(ours_fn, args.repeat)
        a, b = theirs[0].double(), ours[0].double()
        diff = float(((a - b).abs() / b.abs().clamp(min=1.0)).max())
        print(
            f"{label:<16} {theirs_t:>9.3f} {ours_t:>9.3f} {ours_t / theirs_t:>12.4f} {diff:>13.2g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
