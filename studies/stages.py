"""The environments and the policies of the studies' cells: ``--envs`` specs ("keydoor:size=5")
and ``--stages`` ("untrained", a success target, a snapshot file), shared by
:mod:`studies.bias_variance` (which re-exports :func:`parse_env`), :mod:`studies.scheme_study`
and :mod:`studies.train_toy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import toyenvs
from hgpo.options import bad, parse_name_values
from studies.tabular import expert_stages, neural_expert_stages

__all__ = ["parse_env", "stage_policies"]


def parse_env(spec: str) -> tuple[str, dict[str, Any]]:
    """ "keydoor:size=5,slip=0.1" -> ("keydoor", {"size": 5, "slip": 0.1}); validated by toyenvs.

    The parameters go through the project's one parser (hgpo.options.parse_name_values); a bad
    family or value is a ValueError naming ``--envs`` and the spec.
    """
    if not isinstance(spec, str):
        raise bad("--envs", 'a string "family:param=value,..."', spec)
    name, _, rest = spec.partition(":")
    params = parse_name_values(rest, where=f"--envs {spec!r}")
    try:
        toyenvs.make(name, **params)  # raises a ValueError naming a bad family / parameter
    except ValueError as exc:
        raise ValueError(f"--envs {spec!r}: {exc}") from None
    return name, params


def _load_snapshot(path: str) -> Any:
    """A TabularPolicy or NeuralPolicy snapshot (a neural one stores its parameters)."""
    with np.load(path, allow_pickle=False) as data:
        neural = any(k.startswith("param.") for k in data.files)
    return (toyenvs.NeuralPolicy if neural else toyenvs.TabularPolicy).load(path)


def stage_policies(
    env: Any, K: int, stages: tuple[str, ...], seed: int, cfg: Any = None
) -> list[tuple[str, Any]]:
    """(name, policy) per entry of ``stages`` (--stages: "untrained", a success target in (0, 1)
    or a snapshot file) on ``env`` with context length ``K``. ``cfg``: the study's
    :class:`studies.bias_variance.StudyConfig` (its policy, network, seed and imitation steps);
    None plays the table (the StudyConfig default)."""
    tabular = cfg is None or cfg.policy == "tabular"

    def fresh() -> Any:
        if tabular:
            return toyenvs.TabularPolicy(env, K=K)
        return toyenvs.NeuralPolicy(
            env, K, cfg.policy, cfg.width, cfg.layers, seed=cfg.seed, dtype=cfg.net_dtype
        )

    targets = tuple(float(s) for s in stages if s != "untrained" and not Path(s).is_file())
    if not targets:
        got = []
    elif tabular:
        got = expert_stages(env, K, targets, seed=seed)
    else:
        got = neural_expert_stages(env, fresh, targets, seed=seed, fit_steps=cfg.fit_steps)
    trained = {st.target: st.policy for st in got}
    out = []
    for s in stages:
        if s == "untrained":
            out.append((s, fresh()))
        elif Path(s).is_file():
            pol = _load_snapshot(s)
            if pol.K != K:
                raise ValueError(f"--stages: snapshot {s} has K={pol.K}, the cell K={K}")
            out.append((Path(s).stem, pol))
        else:
            out.append((s, trained[float(s)]))
    return out
