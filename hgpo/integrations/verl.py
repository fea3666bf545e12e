"""Every estimator of this project inside verl (0.9.x), loaded with ``VERL_USE_EXTERNAL_MODULES``.

``import verl`` imports the modules named in ``VERL_USE_EXTERNAL_MODULES``; importing this one

1. checks verl's version (tested: 0.9.x; another is a one-line ``UnsupportedVerlVersion`` at
   import, unless ``HGPO_VERL_ANY_VERSION=1`` turns it into a warning);
2. registers every estimator of ``hgpo.ESTIMATORS`` in verl's ``ADV_ESTIMATOR_REGISTRY``
   (``@register_adv_est``) under ``hgpo.<name>`` (``hgpo.hgpo``, ``hgpo.grpo``,
   ``hgpo.hgpo-nohog2``) and under its plain name with ``-`` as ``_`` (``hgpo``, ``gigpo``,
   ``hgpo_nohog2``) ONLY where verl has no estimator of that name: verl's own ``grpo``,
   ``rloo``, ``gae`` are never replaced, ours are ``hgpo.grpo``, ``hgpo.rloo``, ``hgpo.gae``.
   ``NAMES`` maps ours to the name to pass as ``algorithm.adv_estimator``
   (:func:`verl_name`), ``REGISTERED`` every name registered here;
3. installs :func:`compute_advantage`, a wrapper of verl's
   ``verl.trainer.ppo.ray_trainer.compute_advantage``, into that module (and into any module
   already holding verl's function under that name), and, when verl imports its v1 trainer
   (``trainer.use_v1=True``, the default), the two wrappers of :mod:`hgpo.integrations.verl_v1`
   that hand our path the agent-loop outputs' ``extra_fields`` the v1 trainer leaves behind.

Why a wrapped ``compute_advantage`` and not a ``RayPPOTrainer`` subclass: verl's
``compute_advantage`` hands a registered estimator only ``token_level_rewards``,
``response_mask``, ``config``, ``index`` and ``reward_baselines``, while these estimators need
each step's trajectory, step and observation (``non_tensor_batch['traj_uid']``,
``['anchor_obs']``: the metadata contract of :mod:`hgpo.integrations.dataproto`). The wrapper
sees the whole ``DataProto``; for our names it runs our estimator on it, for every other name
it calls verl's function unchanged. It is one function replaced at import, so it works with
verl's own entry point (``python -m verl.trainer.main_ppo``: the TaskRunner imports verl, so
VERL_USE_EXTERNAL_MODULES loads us there too) and with every trainer that calls
``ray_trainer.compute_advantage`` (the legacy ``RayPPOTrainer.fit``, verl's recipes, the v1
trainer's ``compute_advantage_for_multi_trajectories``), where a subclass would need its own
entry point (main_ppo builds verl's classes) and would cover one trainer class only.

Options: ``algorithm.gamma`` is the estimators' ``gamma``, ``algorithm.lam`` gae's
``gae_lambda``, ``algorithm.norm_adv_by_std_in_grpo=False`` sets ``norm="mean"``; every other
option of :class:`hgpo.EstimatorConfig` goes under ``algorithm.hgpo`` (``+algorithm.hgpo.K=4``).
Giving ``gamma``, ``gae_lambda`` or ``norm`` there too is an error naming verl's key.

Without ``non_tensor_batch['step_index']`` a batch whose rows verl's ``balance_batch``
(``trainer.balance_batch=True``, the default) permuted is a :class:`StepOrderError` naming
``step_index``: the step order is read from the row order only when that is a rollout's.

A registered estimator called the plain verl way (``get_adv_estimator_fn("hgpo")(...)``,
without the ``DataProto``) raises :class:`MissingMetadataError` naming the keys it needs.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hgpo import ESTIMATORS, EstimatorConfig, compute_advantages, estimator_reads
from hgpo.extras import require_extras
from hgpo.integrations import verl_v1
from hgpo.integrations.dataproto import (
    STEP_ENTROPY_KEY,
    MissingMetadataError,
    StepOrderError,
    check_metadata,
    check_step_inputs,
    mean_over_response,
    step_batch_from_dataproto,
    step_inputs,
    to_tokens,
)

__all__ = [
    "NAMES",
    "NAMESPACE",
    "OPTIONS_KEY",
    "REGISTERED",
    "TESTED_VERSIONS",
    "MissingMetadataError",
    "StepOrderError",
    "UnsupportedVerlVersion",
    "advantages_for",
    "check_verl_version",
    "compute_advantage",
    "estimator_config",
    "install",
    "install_entropy_hook",
    "our_name",
    "reads_entropy",
    "sync",
    "verl_name",
]

NAMESPACE = "hgpo."
"""Prefix of the namespaced names (verl 0.9 takes any string as an estimator name)."""
OPTIONS_KEY = "hgpo"
"""``algorithm.<OPTIONS_KEY>``: the EstimatorConfig options (``+algorithm.hgpo.K=4``)."""
TESTED_VERSIONS = "0.9.x"
_TESTED = re.compile(r"0\.9(\.|$)")
_ANY_VERSION = "HGPO_VERL_ANY_VERSION"
_FROM_VERL = {"gamma": "algorithm.gamma", "gae_lambda": "algorithm.lam"}
_FROM_VERL_NORM = "algorithm.norm_adv_by_std_in_grpo"


class UnsupportedVerlVersion(ImportError):
    """verl's version is outside the tested range (0.9.x)."""


def check_verl_version(version: str) -> None:
    """:class:`UnsupportedVerlVersion` (one line) unless ``version`` is 0.9.x; with
    ``HGPO_VERL_ANY_VERSION=1`` a warning instead."""
    if _TESTED.match(str(version)):
        return
    msg = (
        f"hgpo.integrations.verl: verl {version} is outside the tested range {TESTED_VERSIONS} "
        f'(pip install -e ".[verl]" installs one); set {_ANY_VERSION}=1 to load it anyway'
    )
    if os.environ.get(_ANY_VERSION) == "1":
        warnings.warn(msg, stacklevel=2)
        return
    raise UnsupportedVerlVersion(msg)


def _plain(name: str) -> str:
    return name.replace("-", "_")


# --------------------------------------------------------------------------- options


def _as_dict(config: Any) -> dict[str, Any]:
    """``config[OPTIONS_KEY]`` as a plain dict ({} when absent; config may be None, a dict,
    an omegaconf DictConfig or verl's AlgoConfig)."""
    if config is None:
        return {}
    try:
        options = config.get(OPTIONS_KEY, None)
    except (AttributeError, TypeError):
        options = getattr(config, OPTIONS_KEY, None)
    if options is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(options, DictConfig):
            options = OmegaConf.to_container(options, resolve=True)
    except ImportError:  # (verl needs omegaconf; a plain dict works without it)
        pass
    if not isinstance(options, Mapping):
        raise ValueError(
            f"algorithm.{OPTIONS_KEY}: must be a mapping of EstimatorConfig options "
            f"(+algorithm.{OPTIONS_KEY}.K=4), got {options!r}"
        )
    return dict(options)


def estimator_config(
    config: Any = None, gamma: float = 1.0, lam: float = 1.0, norm_by_std: bool = True
) -> EstimatorConfig:
    """The EstimatorConfig of a verl call: ``config[OPTIONS_KEY]`` options, with verl's own
    ``gamma``, ``lam`` (gae's lambda) and ``norm_adv_by_std_in_grpo`` (False: norm="mean").

    An option that verl's own key sets, given under ``algorithm.hgpo`` too, is a ValueError
    naming verl's key (never silently one or the other); an unknown option a ValueError naming
    it (EstimatorConfig's).
    """
    options = _as_dict(config)
    for ours, theirs in {**_FROM_VERL, "norm": _FROM_VERL_NORM}.items():
        if ours in options:
            raise ValueError(
                f"algorithm.{OPTIONS_KEY}.{ours}: set by verl's {theirs}; give it there "
                f"(got {options[ours]!r} here)"
            )
    if not isinstance(norm_by_std, bool):
        raise ValueError(f"{_FROM_VERL_NORM}: must be a bool, got {norm_by_std!r}")
    return EstimatorConfig.from_options(
        **options,
        gamma=float(gamma),
        gae_lambda=float(lam),
        norm="mean_std" if norm_by_std else "mean",
    )


# --------------------------------------------------------------------------- our path


def our_name(adv_estimator: Any) -> str | None:
    """Our estimator's name for a verl estimator name registered here, else None. An
    estimator registered after this module was imported (``hgpo.register_estimator``) is
    registered in verl at the first call that does not find a name (:func:`sync`)."""
    name = getattr(adv_estimator, "value", adv_estimator)  # (an Enum member)
    if not isinstance(name, str):
        return None
    if _out_of_sync():
        sync()
    return _OURS.get(name)


def reads_entropy(adv_estimator: Any) -> bool:
    """Whether ``adv_estimator`` is one of ours that reads the policy's entropy."""
    name = our_name(adv_estimator)
    return name is not None and "entropy" in estimator_reads(name)


def advantages_for(name: str, data: Any, cfg: EstimatorConfig) -> tuple[Any, Any]:
    """(advantages, returns) token tensors of our estimator ``name`` on a verl ``DataProto``.

    The StepBatch comes from the metadata contract, and the per-step inputs the estimator
    reads (``hgpo.estimator_reads``: the critic's ``values``, the policy's ``entropy``, the
    ``anchor_obs`` observations) from :func:`~hgpo.integrations.dataproto.step_inputs`
    (MissingMetadataError listing the keys when one is missing, before any work); the step
    advantages A and returns R go to the tokens as ``A[row] * response_mask[row]``, in
    ``token_level_rewards``' dtype.
    """
    reads = estimator_reads(name)
    what = f"estimator {name!r}"
    tokens = ("response_mask", "token_level_rewards")
    tokens += ("values",) * ("values" in reads) + ("responses",) * cfg.include_actions
    check_metadata(data, what, tokens=tokens)
    check_step_inputs(data, reads, what)
    rows = step_batch_from_dataproto(data, include_actions=cfg.include_actions)
    out = compute_advantages(name, rows.batch, cfg, **step_inputs(data, rows, reads))
    mask, like = data.batch["response_mask"], data.batch["token_level_rewards"]
    return (
        to_tokens(rows.to_rows(out.advantages), mask, like),
        to_tokens(rows.to_rows(out.returns), mask, like),
    )


def compute_advantage(
    data: Any,
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> Any:
    """verl's ``ray_trainer.compute_advantage``, with our estimators on the whole DataProto.

    For a name registered here (``hgpo``, ``hgpo.grpo``, ...) it sets ``data.batch
    ["advantages"]`` and ``["returns"]`` from :func:`advantages_for` and returns ``data``;
    for any other name it is verl's function, called with the same arguments.
    """
    name = our_name(adv_estimator)
    if name is None:
        return _ORIGINAL["compute_advantage"](
            data,
            adv_estimator=adv_estimator,
            gamma=gamma,
            lam=lam,
            num_repeat=num_repeat,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    cfg = estimator_config(config, gamma, lam, norm_adv_by_std_in_grpo)
    if "response_mask" not in set(data.batch.keys()):  # (as verl's own function does)
        from verl.trainer.ppo.ray_trainer import compute_response_mask

        data.batch["response_mask"] = compute_response_mask(data)
    advantages, returns = advantages_for(name, data, cfg)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


# --------------------------------------------------------------------------- registration


def _registered(name: str) -> Callable[..., Any]:
    """The function registered in verl under our names: verl's plain call hands it no
    DataProto, so it only says what is missing and how our path gets it."""

    def estimator(token_level_rewards: Any = None, response_mask: Any = None, **kwargs: Any) -> Any:
        raise MissingMetadataError(
            f"estimator {name!r} needs the DataProto's non_tensor_batch 'uid', 'traj_uid', "
            "'anchor_obs', which verl's plain call to a registered estimator does not pass "
            f"(it got {', '.join(sorted(['token_level_rewards', 'response_mask', *kwargs]))}); "
            "call hgpo.integrations.verl.compute_advantage(data, ...), which importing "
            "hgpo.integrations.verl (VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl) installs "
            "as verl.trainer.ppo.ray_trainer.compute_advantage"
        )

    estimator.__name__ = f"hgpo_{_plain(name)}"
    estimator.__qualname__ = estimator.__name__
    estimator.hgpo_estimator = name  # type: ignore[attr-defined]
    return estimator


def _verl_has(core_algos: Any, name: str) -> bool:
    own = {e.value for e in core_algos.AdvantageEstimator}
    fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    return name in own or (fn is not None and getattr(fn, "hgpo_estimator", None) is None)


def _register(core_algos: Any) -> tuple[dict[str, str], dict[str, str]]:
    """Register every estimator; returns (NAMES: ours -> the name to use, every registered
    verl name -> ours). Idempotent (a second import finds our own functions)."""
    names: dict[str, str] = {}
    ours: dict[str, str] = {}
    for name in ESTIMATORS:
        candidates = [NAMESPACE + name]
        if not _verl_has(core_algos, _plain(name)):
            candidates.append(_plain(name))
        for verl_key in candidates:
            if _verl_has(core_algos, verl_key):  # (a namespaced name verl took: never replaced)
                continue
            existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_key)
            fn = existing if existing is not None else _registered(name)
            core_algos.register_adv_est(verl_key)(fn)
            ours[verl_key] = name
            names[name] = verl_key  # the plain name when we hold it, else hgpo.<name>
    return names, ours


_ORIGINAL: dict[str, Callable[..., Any]] = {}


def install() -> None:
    """Replace ``compute_advantage`` in ``verl.trainer.ppo.ray_trainer`` and in every loaded
    ``verl.*`` module holding verl's function under that name (idempotent). A module imported
    later (``from verl.trainer.ppo.ray_trainer import compute_advantage``) gets ours."""
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_advantage
    while getattr(original, "hgpo_original", None) is not None:  # (a wrapper of ours)
        original = original.hgpo_original
    _ORIGINAL["compute_advantage"] = original
    compute_advantage.hgpo_original = original  # type: ignore[attr-defined]
    for mod_name, module in list(sys.modules.items()):
        if not (mod_name == "verl" or mod_name.startswith("verl.")):
            continue  # (another package's lazy module could import on getattr)
        current = getattr(module, "compute_advantage", None)
        if current is original or getattr(current, "hgpo_original", None) is original:
            module.compute_advantage = compute_advantage


def _keep_step_entropy(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl 0.9's ``RayPPOTrainer._compute_old_log_prob``, which also, for our estimator that
    reads entropy, puts each row's mean token entropy of that pass (its ``entropys`` averaged
    over ``response_mask``) in ``non_tensor_batch['step_entropy']`` of its output: ``fit``
    pops ``entropys`` after its metric, the non-tensor column reaches ``compute_advantage``
    through ``batch.union``."""

    @functools.wraps(original)
    def _compute_old_log_prob(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, batch, *args, **kwargs)
        if not reads_entropy(self.config.algorithm.adv_estimator):
            return out
        old = out[0] if isinstance(out, tuple) else out
        step = mean_over_response(
            old.batch["entropys"], batch.batch["response_mask"], "old_log_prob['entropys']"
        )
        old.non_tensor_batch[STEP_ENTROPY_KEY] = np.array(step.tolist(), dtype=object)
        return out

    _compute_old_log_prob.hgpo_original = original  # type: ignore[attr-defined]
    return _compute_old_log_prob


def install_entropy_hook(trainer_cls: Any) -> None:
    """Wrap ``trainer_cls._compute_old_log_prob`` (:func:`_keep_step_entropy`; idempotent)."""
    current = trainer_cls._compute_old_log_prob
    if getattr(current, "hgpo_original", None) is None:
        trainer_cls._compute_old_log_prob = _keep_step_entropy(current)


def sync() -> None:
    """Bring verl's registry in line with ours: register the estimators registered since this
    module was imported (the ``hgpo.estimators`` entry points are loaded at import;
    ``register_estimator`` calls made later are registered here), and remove from verl's
    ``ADV_ESTIMATOR_REGISTRY`` the names of ours that were unregistered since.
    :func:`our_name` calls it when it does not find a name."""
    from verl.trainer.ppo import core_algos

    global REGISTERED
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for key, fn in list(registry.items()):
        gone = getattr(fn, "hgpo_estimator", None)
        if gone is not None and gone not in ESTIMATORS:
            del registry[key]
    names, ours = _register(core_algos)
    NAMES.clear()
    NAMES.update(names)
    _OURS.clear()
    _OURS.update(ours)
    REGISTERED = tuple(_OURS)


def _out_of_sync() -> bool:
    """Whether an estimator was registered or unregistered since the last registration."""
    return any(n not in NAMES for n in ESTIMATORS) or any(n not in ESTIMATORS for n in NAMES)


def verl_name(name: str) -> str:
    """The ``algorithm.adv_estimator`` value of our estimator ``name`` ("hgpo" -> "hgpo",
    "grpo" -> "hgpo.grpo"); ValueError listing ours for an unknown one."""
    if _out_of_sync():
        sync()
    try:
        return NAMES[name]
    except KeyError:
        raise ValueError(
            f"verl_name: unknown estimator {name!r}; ours: {', '.join(NAMES)}"
        ) from None


def _load() -> tuple[dict[str, str], dict[str, str]]:
    require_extras("hgpo.integrations.verl", "verl")
    import verl

    check_verl_version(getattr(verl, "__version__", "unknown"))
    from verl.trainer.ppo import core_algos

    names, ours = _register(core_algos)
    install()
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    install_entropy_hook(RayPPOTrainer)
    verl_v1.on_import(
        verl_v1.V1_MODULE,
        lambda m: verl_v1.patch_trainer_base(m, our_name, compute_advantage, reads_entropy),
    )
    return names, ours


NAMES, _OURS = _load()
"""NAMES: our estimator -> its name in verl (see :func:`verl_name`)."""
REGISTERED: tuple[str, ...] = tuple(_OURS)
"""Every name this module registered in verl's ADV_ESTIMATOR_REGISTRY."""
