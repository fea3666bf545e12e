"""The metadata contract through verl 0.9's v1 trainer (``trainer.use_v1=True``, the default).

verl's v1 trainer keeps every agent-loop output in its TransferQueue under the key
``{uid}_{session}_{index}`` (one episode = one session; ``index`` counts the episode's outputs,
one per step for a stepwise agent loop), and ``PPOTrainer._compute_advantage`` builds the
``DataProto`` handed to ``compute_advantage_for_multi_trajectories`` from ``uid`` and fixed
tensors only: the outputs' ``extra_fields`` (where an agent loop puts ``anchor_obs``,
``rewards``, ``is_action_valid``) are left in the queue. So, for our estimator names only:

- ``PPOTrainer._compute_advantage`` is wrapped to fetch the batch's ``extra_fields`` from the
  queue (``tq.kv_batch_get(keys, partition_id, select_fields=["extra_fields"])``, as verl's
  own validation code does) and hold them, with the keys, while verl's method runs;
- ``compute_advantage_for_multi_trajectories`` (as ``trainer_base`` imported it) is wrapped to
  fill the contract's keys from them (:func:`attach_v1_metadata`: ``traj_uid`` =
  ``{uid}_{session}``, ``step_index`` = ``index``, and ``anchor_obs`` / ``rewards`` /
  ``is_action_valid`` / ``next_obs`` from each output's ``extra_fields``), then to call our
  ``compute_advantage``.

For an estimator that reads the policy's entropy, the first wrapper also fetches the queue's
``entropy`` (the token entropies verl's ``_compute_old_log_prob`` writes back, with
``calculate_entropy``) and ``response_mask``, and ``step_entropy`` is each row's mean over its
response tokens (none in bypass mode, which skips that pass: a MissingMetadataError).

Any other estimator runs verl's code unchanged. ``trainer_base`` needs the TransferQueue package
and is heavy, so the wrappers are put in when verl imports it (a ``sys.meta_path`` hook on that
one module name), not at ``import verl``.

Tested on CPU against verl 0.9.1's real ``trainer_base`` and TransferQueue 0.1.11
(tests/integrations/test_verl_chain.py: a real queue on a local Ray, verl's v1 worker code
storing the stepwise loop's outputs, verl's ``_compute_advantage`` reading them back).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from hgpo.integrations.dataproto import STEP_ENTROPY_KEY, MissingMetadataError, mean_over_response

__all__ = ["V1_MODULE", "attach_v1_metadata", "on_import"]

V1_MODULE = "verl.trainer.ppo.v1.trainer_base"
FROM_EXTRA_FIELDS = ("anchor_obs", "rewards", "is_action_valid", "step_index", "next_obs")
"""The contract keys read from an output's ``extra_fields`` (``step_index`` there wins over the
key's index)."""

_HELD: contextvars.ContextVar[tuple[list[str], list[Any], Any] | None] = contextvars.ContextVar(
    "hgpo_v1_metadata", default=None
)


def attach_v1_metadata(
    data: Any, keys: list[str], extra_fields: list[Any], step_entropy: Any = None
) -> None:
    """Fill ``data.non_tensor_batch`` with the contract's keys of v1 outputs.

    keys: ``{uid}_{session}_{index}`` of every row (verl's TransferQueue keys, row order);
    extra_fields: each row's ``extra_fields`` dict. Sets ``traj_uid`` = ``{uid}_{session}``,
    ``step_index`` = ``index`` and every key of :data:`FROM_EXTRA_FIELDS` that all rows carry
    (a key some rows carry and others not is a ValueError naming it and a row without it).
    ``rewards`` is needed here (MissingMetadataError): the v1 agent loop copies the episode's
    reward to every output, so the token rewards' fallback would count it once per step.
    step_entropy: float64[n] the policy's entropy per row (row order), set as
    ``step_entropy`` when given.
    """
    n = len(keys)
    if len(extra_fields) != n:
        raise ValueError(f"v1 metadata: {len(extra_fields)} extra_fields for {n} keys")
    if step_entropy is not None:
        if len(step_entropy) != n:
            raise ValueError(f"v1 metadata: {len(step_entropy)} step entropies for {n} keys")
        data.non_tensor_batch[STEP_ENTROPY_KEY] = np.array(
            np.asarray(step_entropy, dtype=np.float64).tolist(), dtype=object
        )
    traj, step = [], []
    for key in keys:
        parts = str(key).rsplit("_", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"v1 metadata: key {key!r} is not '{{uid}}_{{session}}_{{index}}'")
        traj.append(f"{parts[0]}_{parts[1]}")
        step.append(int(parts[2]))
    out = data.non_tensor_batch
    out["traj_uid"] = np.array(traj, dtype=object)
    out["step_index"] = np.array(step, dtype=object)
    fields = [f if isinstance(f, dict) else {} for f in extra_fields]
    for name in FROM_EXTRA_FIELDS:
        have = [name in f for f in fields]
        if not any(have):
            continue
        if not all(have):
            row = have.index(False)
            raise ValueError(
                f"v1 metadata: extra_fields[{name!r}] is set on some outputs but not on "
                f"{keys[row]!r}; an agent loop sets it on every output or on none"
            )
        column = np.empty(n, dtype=object)
        column[:] = [f[name] for f in fields]
        out[name] = column
    if "rewards" not in out:
        raise MissingMetadataError(
            "v1 metadata: the agent-loop outputs' extra_fields lack 'rewards' (the env reward "
            "of each step): verl's v1 agent loop gives every output of an episode the "
            "episode's reward_score, so token_level_rewards cannot tell the step rewards"
        )


def _queue_step_entropy(tq: Any, batch: Any) -> np.ndarray:
    """float64[n] each row's mean token entropy of the old-log-prob pass, from the queue's
    ``entropy`` and ``response_mask`` (nested per row; padded as verl's own reads pad them)."""
    try:
        got = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["entropy", "response_mask"],
        )
        padded = got.to_padded_tensor()
        entropy, mask = padded["entropy"], padded["response_mask"]
    except (KeyError, RuntimeError, ValueError) as e:
        raise MissingMetadataError(
            "v1 metadata: the estimator reads the policy's entropy, but the TransferQueue has "
            f"no 'entropy' for this batch ({type(e).__name__}: {e}); verl's "
            "_compute_old_log_prob writes it, and skips it in bypass mode "
            "(algorithm.rollout_correction.bypass_mode)"
        ) from None
    return mean_over_response(entropy, mask, "TransferQueue 'entropy'")


def _wrap_method(
    original: Callable[..., Any],
    ours: Callable[[Any], str | None],
    reads_entropy: Callable[[Any], bool] | None = None,
) -> Callable:
    @functools.wraps(original)
    def _compute_advantage(self: Any, batch: Any, metrics: dict) -> Any:
        adv_estimator = self.config.algorithm.adv_estimator
        if ours(adv_estimator) is None:
            return original(self, batch, metrics)
        import transfer_queue as tq

        got = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        entropy = None
        if reads_entropy is not None and reads_entropy(adv_estimator):
            entropy = _queue_step_entropy(tq, batch)
        # (as verl's own reads of it, trainer_base.py:1909: got["extra_fields"] is a
        # tensordict LinkedList without .tolist(); pop gives the NonTensorStack)
        token = _HELD.set((list(batch.keys), list(got.pop("extra_fields").tolist()), entropy))
        try:
            return original(self, batch, metrics)
        finally:
            _HELD.reset(token)

    _compute_advantage.hgpo_original = original  # type: ignore[attr-defined]
    return _compute_advantage


def _wrap_multi(original: Callable[..., Any], ours: Callable[[Any], str | None], ca: Callable):
    @functools.wraps(original)
    def compute_advantage_for_multi_trajectories(data: Any, batch_keys: Any, adv_estimator: Any,
                                                 **kwargs: Any) -> Any:  # fmt: skip
        if ours(adv_estimator) is None:
            return original(data, batch_keys=batch_keys, adv_estimator=adv_estimator, **kwargs)
        held = _HELD.get()
        if held is None or list(held[0]) != list(batch_keys):
            raise RuntimeError(
                "hgpo.integrations.verl: compute_advantage_for_multi_trajectories was called "
                "for our estimator outside verl's PPOTrainer._compute_advantage (which fetches "
                "the outputs' extra_fields); call it from there, or attach_v1_metadata first"
            )
        attach_v1_metadata(data, held[0], held[1], held[2])
        return ca(data, adv_estimator=adv_estimator, **kwargs)

    compute_advantage_for_multi_trajectories.hgpo_original = original  # type: ignore[attr-defined]
    return compute_advantage_for_multi_trajectories


def patch_trainer_base(
    module: Any,
    ours: Callable[[Any], str | None],
    compute_advantage: Callable,
    reads_entropy: Callable[[Any], bool] | None = None,
) -> None:
    """Put the two wrappers into verl's ``trainer_base`` module (idempotent). reads_entropy:
    whether an ``adv_estimator`` of ours reads the policy's entropy (then the first wrapper
    fetches the queue's ``entropy`` too)."""
    cls = module.PPOTrainer
    if getattr(cls._compute_advantage, "hgpo_original", None) is None:
        cls._compute_advantage = _wrap_method(cls._compute_advantage, ours, reads_entropy)
    multi = module.compute_advantage_for_multi_trajectories
    if getattr(multi, "hgpo_original", None) is None:
        module.compute_advantage_for_multi_trajectories = _wrap_multi(
            multi, ours, compute_advantage
        )


class _After(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once module ``name`` has been executed (a one-name hook)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module, then = spec.loader.exec_module, self.then

        def run_then(module: Any) -> None:
            exec_module(module)
            then(module)

        spec.loader.exec_module = run_then  # type: ignore[method-assign]
        return spec


def on_import(name: str, then: Callable[[Any], None]) -> None:
    """``then(module)`` now if module ``name`` is loaded, else right after it is imported."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    if not any(isinstance(f, _After) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _After(name, then))
