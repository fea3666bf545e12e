"""verl-agent's own ``compute_advantage``, rebuilt from a reference folder for a live check.

``HGPO_VERL_AGENT_REF=DIR`` names a folder written by ``python -m benchmarks.bench_verl_agent
--ref-dir DIR --from-git MIRROR`` (copies of johnhaofu/verl-agent at 796ed31; not shipped
here). From ``hgpo_ray_trainer.py`` (the HGPO recipe's trainer) this takes, by an ``ast``
walk, the ``AdvantageEstimator`` enum, ``compute_response_mask`` and ``compute_advantage``
exactly as written, and runs them in a module whose ``core_hgpo`` and ``core_gigpo`` are the
authors' files and whose ``core_algos`` holds the authors' ``compute_grpo_outcome_advantage``
and ``compute_rloo_outcome_advantage`` (taken from ``core_algos.py`` the same way): a trainer
module as verl-agent's, less its imports of Ray, vLLM and the rest of verl.
"""

from __future__ import annotations

import ast
import io
import os
import sys
import types
from collections import defaultdict
from contextlib import redirect_stdout
from enum import Enum
from pathlib import Path

import numpy as np
import torch

ENV = "HGPO_VERL_AGENT_REF"


def ref_dir() -> Path | None:
    """The folder named by $HGPO_VERL_AGENT_REF, or None when unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def _definitions(path: Path, names: set[str]) -> str:
    """The source of the top-level definitions ``names`` of ``path`` (every one must exist)."""
    src = path.read_text()
    found = {n.name: ast.get_source_segment(src, n) for n in ast.parse(src).body
             if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names}  # fmt: skip
    missing = names - set(found)
    if missing:
        raise ValueError(f"{path}: no top-level {', '.join(sorted(missing))}")
    return "\n\n".join(found[n] for n in sorted(names, key=list(found).index))


def _module(name: str, source: str, path: Path, **namespace) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(namespace)
    exec(compile(source, str(path), "exec"), mod.__dict__)
    return mod


def trainer_module(ref: Path) -> types.ModuleType:
    """The stand-in trainer module (see the module docstring)."""
    sys.path.insert(0, str(ref))  # the folder's verl stub, for ``from verl import DataProto``
    try:
        base = dict(np=np, torch=torch, defaultdict=defaultdict)
        core = {n: _module(f"ref_{n}", (ref / f"{n}.py").read_text(), ref / f"{n}.py")
                for n in ("core_hgpo", "core_gigpo")}  # fmt: skip
    finally:
        sys.path.remove(str(ref))
    algos = _definitions(ref / "core_algos.py",
                         {"compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage"})  # fmt: skip
    core_algos = _module("ref_core_algos", algos, ref / "core_algos.py", **base)
    trainer = _definitions(ref / "hgpo_ray_trainer.py",
                           {"AdvantageEstimator", "compute_response_mask", "compute_advantage"})  # fmt: skip
    return _module("ref_hgpo_ray_trainer", trainer, ref / "hgpo_ray_trainer.py", Enum=Enum,
                   DataProto=object, core_algos=core_algos, **core, **base)  # fmt: skip


def quiet(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the authors' prints (group sizes) swallowed."""
    with redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)
