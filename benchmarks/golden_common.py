"""What the ``make_*_golden.py`` scripts share: their command line, loading the authors' code
in float32 and float64, classing our rows against the two runs, the summary line, the cases
kept for the file and writing it.

Each script keeps what is its method's own: how to import and call the authors' code, how to
build a random case, and what else it compares (shaped rewards, allocations, several outputs).
The replay tests in ``tests/hgpo`` class rows with :func:`classify` too, under their own
tolerances (``tests/hgpo/golden_replay.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hgpo import StepBatch
from hgpo.atomic import atomic_write_text
from hgpo.options import ArgumentParser

DATA = Path(__file__).resolve().parent.parent / "tests" / "hgpo" / "data"
# Agreement thresholds, relative to max(1, |advantage|): float32 rounding of returns up to 10
# and of a normalisation stays within a few 1e-7; the float64 run's own residues (a tied
# group's mean off by an ulp, divided by std + 1e-6) stay below 1e-8.
F32_TOL = 1e-6
F64_TOL = 1e-7
CLASSES = ("both", "float64 only", "float32 only", "neither")
"""Row classes of :func:`classify`, by number."""


def golden_path(name: str) -> Path:
    """``tests/hgpo/data/<name>_golden.json``."""
    return DATA / f"{name}_golden.json"


def golden_parser(
    doc: str | None,
    golden: Path,
    *,
    ref_help: str = "folder with the copied reference modules",
    cases: int = 400,
    cases_help: str = "random cases",
    estimators: dict[str, Any] | None = None,
    golden_cases: int,
    golden_help: str,
    extra_cases: int | None = None,
) -> argparse.ArgumentParser:
    """The options every maker takes: ``--ref-dir``, ``--cases``, ``--estimators`` (where
    ``estimators`` gives its ``add_argument`` keywords), ``--seed``, ``--write``,
    ``--golden-cases`` and, where ``extra_cases`` is given, ``--extra-cases``."""
    p = ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref-dir", type=Path, required=True, help=ref_help)
    p.add_argument("--cases", type=int, default=cases, help=cases_help)
    if estimators is not None:
        p.add_argument("--estimators", nargs="+", **estimators)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help=f"write {golden.name}")
    p.add_argument("--golden-cases", type=int, default=golden_cases, help=golden_help)
    if extra_cases is not None:
        p.add_argument(
            "--extra-cases", type=int, default=extra_cases,
            help="later cases in the file, of those with a row that is not equal to both runs",
        )  # fmt: skip
    return p


def require_files(p: argparse.ArgumentParser, ref_dir: Path, needed: tuple[str, ...]) -> None:
    """Exit with a usage error naming the files of ``needed`` that ``ref_dir`` lacks."""
    missing = [name for name in needed if not (ref_dir / name).is_file()]
    if missing:
        p.error(f"--ref-dir {ref_dir}: no {', '.join(missing)}; copy them there as this "
                "script's docstring says")  # fmt: skip


def exec_source(path: Path, name: str, float64: bool, register: bool = False) -> types.ModuleType:
    """The module ``name`` run from the source at ``path``, with float32 replaced by float64
    where ``float64``; ``register`` puts it in ``sys.modules`` first (for a dataclass)."""
    src = path.read_text()
    if float64:
        src = src.replace("float32", "float64")
    mod = types.ModuleType(name)
    if register:
        sys.modules[name] = mod
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


@contextlib.contextmanager
def torch_default_dtype(float64: bool) -> Iterator[None]:
    """torch's default dtype float64 (or float32) inside the block, float32 after it."""
    import torch

    torch.set_default_dtype(torch.float64 if float64 else torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


def classify(
    a: np.ndarray,
    f32: np.ndarray,
    f64: np.ndarray,
    f32_tol: float = F32_TOL,
    f64_tol: float = F64_TOL,
) -> np.ndarray:
    """Per row: 0 equal to both runs, 1 to the float64 run only, 2 to the float32 run only,
    3 to neither (a semantic mismatch); equal within ``tol`` x max(1, |a|)."""
    scale = np.maximum(1.0, np.abs(a))
    ok64 = np.abs(a - f64) <= f64_tol * scale
    ok32 = np.abs(a - f32) <= f32_tol * scale
    return np.where(ok64 & ok32, 0, np.where(ok64, 1, np.where(ok32, 2, 3)))


@dataclass
class Tally:
    """Our rows against the float32 and float64 runs, over cases."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int64))
    """Rows per class (:data:`CLASSES`)."""
    worst: np.ndarray = field(default_factory=lambda: np.zeros(3))
    """max |ours - f32| on "both" rows, on "float64 only" rows; max |ours - f64| on both."""

    def add(self, a: np.ndarray, f32: np.ndarray, f64: np.ndarray) -> np.ndarray:
        """Count one case's rows; returns their classes (:func:`classify`)."""
        cls = classify(a, f32, f64)
        self.counts += np.bincount(cls, minlength=4)
        d32, d64 = np.abs(a - f32), np.abs(a - f64)
        self.worst = np.maximum(self.worst, [d32[cls == 0].max(initial=0.0),
                                             d32[cls == 1].max(initial=0.0),
                                             d64[cls <= 1].max(initial=0.0)])  # fmt: skip
        return cls

    def summary(self, label: str, cases: int) -> str:
        """``<label> <cases> cases, <rows> rows; ours equals: both n, ...``."""
        shares = ", ".join(f"{name} {n}" for name, n in zip(CLASSES, self.counts, strict=True))
        return f"{label} {cases} cases, {self.counts.sum()} rows; ours equals: {shares}"

    def worst_text(self) -> str:
        """The largest differences, as one clause."""
        return (
            f"max |ours - f32|: {self.worst[0]:.2g} where both agree, {self.worst[1]:.2g} where"
            f" only the float64 run agrees; max |ours - f64| on those rows: {self.worst[2]:.2g}"
        )


def golden_entry(
    case: dict[str, Any], f32: np.ndarray, f64: np.ndarray, cls: np.ndarray, **extra: Any
) -> dict[str, Any]:
    """One case of the file: its inputs, both runs' outputs, ``extra`` and its row classes."""
    return {**case, "reference_f32": [float(np.float32(x)) for x in f32],
            "reference_f64": f64.tolist(), **extra,
            "classes": np.bincount(cls, minlength=4).tolist()}  # fmt: skip


@dataclass
class Comparison(Tally):
    """A :class:`Tally` with the cases that differ from both runs and those for the file."""

    bad: list[dict[str, Any]] = field(default_factory=list)
    """The first row of each case with a row equal to neither run, or to the float32 one only."""
    golden: list[dict[str, Any]] = field(default_factory=list)


def compare_cases(
    args: argparse.Namespace,
    random_case: Callable[[np.random.Generator], dict[str, Any]],
    ours: Callable[[dict[str, Any]], np.ndarray],
    reference: Callable[[dict[str, Any], bool], np.ndarray],
) -> Comparison:
    """``args.cases`` random cases: ``ours`` against ``reference(case, float64)`` run in
    float32 and float64. With ``args.write``, the file keeps the first ``args.golden_cases``
    cases and up to ``args.extra_cases`` later ones with a row not equal to both runs."""
    rng = np.random.default_rng(args.seed)
    rep = Comparison()
    for c in range(args.cases):
        case = random_case(rng)
        a = ours(case)
        f32, f64 = reference(case, False), reference(case, True)
        cls = rep.add(a, f32, f64)
        if (cls >= 2).any():
            i = int(np.flatnonzero(cls >= 2)[0])
            rep.bad.append(dict(case=c, rows=int((cls >= 2).sum()), row=i, ours=a[i], f32=f32[i],
                                f64=f64[i]))  # fmt: skip
        extra = (cls != 0).any() and len(rep.golden) < args.golden_cases + args.extra_cases
        if args.write and (c < args.golden_cases or extra):
            rep.golden.append(golden_entry(case, f32, f64, cls))
    return rep


def episode_rewards(case: dict[str, Any], float64: bool) -> dict[int, Any]:
    """verl-agent's rollout loop's ``episode_rewards`` by trajectory: the env rewards summed
    step by step in float32 (in the float64 run, float64)."""
    ndt = np.float64 if float64 else np.float32
    episode: dict[int, Any] = {}
    for t, r in zip(np.asarray(case["traj"]).tolist(), np.asarray(case["reward"], dtype=ndt),
                    strict=True):  # fmt: skip
        episode[t] = ndt(episode.get(t, ndt(0.0)) + r)
    return episode


def trainer_scores(
    case: dict[str, Any], episode: dict[int, Any], float64: bool
) -> tuple[Any, Any, list[Any]]:
    """(response_mask, scores, penalty) as verl-agent's trainer makes them, in the run's float
    type: the mask [n, L] of each step's ``resp_len`` tokens; the episode reward at each step's
    last response token (reward_manager/episode.py) less 0.1 x invalid
    (``apply_invalid_action_penalty``); that penalty's 0 or 1 per step (0-d tensors), which
    some trainers take off the step rewards too."""
    import torch

    fdt = torch.float64 if float64 else torch.float32
    n, L = len(case["group"]), max(case["resp_len"])
    traj, resp_len = case["traj"], case["resp_len"]
    valid = ~np.asarray(case["invalid"], dtype=bool)
    response_mask = torch.zeros((n, L), dtype=fdt)
    scores = torch.zeros((n, L), dtype=fdt)
    penalty = []
    for i in range(n):
        response_mask[i, : resp_len[i]] = 1.0
        scores[i, resp_len[i] - 1] = torch.tensor(episode[int(traj[i])], dtype=fdt)
        penalty.append(torch.tensor(1 - np.float32(valid[i]), dtype=fdt))
        scores[i, resp_len[i] - 1] -= 0.1 * penalty[i]
    return response_mask, scores, penalty


def case_step_batch(case: dict[str, Any], **fields: Any) -> StepBatch:
    """The StepBatch of a golden case's ``group``, ``traj``, ``step``, ``reward`` (float64) and
    ``state``; ``fields`` add to or replace those."""
    cols = {k: np.asarray(case[k]) for k in ("group", "traj", "step", "state") if k in case}
    cols["reward"] = np.asarray(case["reward"], dtype=np.float64)
    return StepBatch(**(cols | fields))


def terminal_next_state(case: dict[str, Any]) -> np.ndarray:
    """The ``next_state`` of a case's rows: the next row's state within a trajectory, the
    case's ``terminal[traj]`` after its last step."""
    state, traj = np.asarray(case["state"]), np.asarray(case["traj"])
    next_state = np.empty_like(state)
    next_state[:-1] = state[1:]
    last = np.flatnonzero(np.r_[traj[1:] != traj[:-1], True])
    next_state[last] = np.asarray(case["terminal"])[traj[last]]
    return next_state


def write_golden(
    path: Path, about: str, reference: Any, seed: int, cases: list[dict[str, Any]]
) -> None:
    """The golden file, written atomically: the cases with the reference outputs, and what
    made them (the authors' commit, torch, numpy, the seed)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"about": about, "reference": reference, "torch": torch.__version__,
           "numpy": np.__version__, "seed": seed, "cases": cases}  # fmt: skip
    atomic_write_text(path, json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB, {len(cases)} cases)")
