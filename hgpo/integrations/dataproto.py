"""The metadata contract: a verl ``DataProto`` of agent steps <-> this project's ``StepBatch``.

A row of the ``DataProto`` is one agent STEP (one LLM response). Its ``non_tensor_batch``
(numpy object arrays, verl-agent's names) carries:

========================  ========  ==========================================================
key                       needed    meaning
========================  ========  ==========================================================
``uid``                   always    the rollout group (the episodes of one task share it)
``traj_uid``              always    the trajectory (episode), unique across the batch
``anchor_obs``            always    the observation the step was taken from (equal = same state)
``step_index``            optional  int, the step t within its trajectory; when absent the rows
                                    of a trajectory are taken in the order the batch holds them
                                    (verl-agent emits them in step order), which must then be a
                                    readable one (below), else :class:`StepOrderError`
``rewards``               optional  float, the env reward of the step WITHOUT the invalid-action
                                    penalty; when absent ``token_level_rewards[row].sum()``
``is_action_valid``       optional  bool, False marks an invalid action (the estimators apply
                                    the penalty, ``EstimatorConfig.penalty_mode``)
``next_obs``              optional  the observation the step led to (GraphGPO's rollout loop sets
                                    it): the StepBatch's ``next_state``, keyed with the
                                    ``anchor_obs``; on every row but a trajectory's last it must
                                    be the next row's ``anchor_obs`` (checked), what it adds is
                                    the observation after the last step (graphgpo, 3spo, rewardflow)
========================  ========  ==========================================================

Without ``next_obs`` the batch has no ``next_state`` and graphgpo takes each failed trajectory to
end in a state seen nowhere else (its "dead_end" reading, ``diagnostics["graph"]["terminal"]``).
On a successful trajectory's last row ``next_obs`` is not read (the authors' loop puts
``'success'`` there). ``hgpo.integrations.verl_loop`` sets it on every output.

Token tensors (``batch``): ``response_mask`` (padding = 0) and ``token_level_rewards`` always;
``responses`` with ``include_actions`` (the action key is the step's unpadded response tokens).

The per-step inputs an estimator reads (``hgpo.estimator_reads``; :func:`step_inputs`), only for
an estimator that reads them:

- ``values`` (gae): ``batch['values']``, the critic's token values; the value at the step's first
  response token is V(s_t);
- ``entropy``: ``non_tensor_batch['step_entropy']`` (a float >= 0 per row, the policy's entropy
  at the step), or, when absent, ``batch['entropys']`` (verl's token entropies of the
  old-log-prob pass, ``compute_log_prob`` with ``calculate_entropy``) averaged over the step's
  response tokens (``response_mask``): the mean token entropy of the step's response. Both at
  once is an error (never one silently over the other). ``hgpo.integrations.verl`` fills
  ``step_entropy`` from verl 0.9's old-log-prob pass, in either trainer;
- ``observations``: ``non_tensor_batch['anchor_obs']``, each a str (the observation text).

With ``step_index`` the rows need not be contiguous or in order (verl's ``balance_batch``,
``trainer.balance_batch=True`` by default, permutes them). Without it the batch order must be one
a rollout emits: every trajectory's rows contiguous (trajectory-major, verl-agent's
``gather_rollout_data``), or step-major (each row's rank within its trajectory never smaller than
the row before's: all first steps, then all second steps, ...); any other order (a permuted
batch, rows appended after their trajectory, verl-agent's ``adjust_batch`` copies) is a
:class:`StepOrderError` naming ``step_index``, never a silently scrambled step order. The rows
are sorted stably by (trajectory in order of first appearance, step) into a ``StepBatch``, and
the per-step results are put back in the ``DataProto``'s row order, then broadcast to the
tokens exactly as verl-agent does: ``advantages[row] = A[row] * response_mask[row]``, in the
dtype of ``token_level_rewards``.

Needs torch (the DataProto's tensors); verl itself is not imported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo import StepBatch, state_ids

__all__ = [
    "NEEDED_KEYS",
    "OPTIONAL_KEYS",
    "STEP_ENTROPY_KEY",
    "SUPPLIED_INPUTS",
    "TOKEN_ENTROPY_KEY",
    "TOKEN_KEYS",
    "MissingMetadataError",
    "StepOrderError",
    "StepRows",
    "check_metadata",
    "check_step_inputs",
    "mean_over_response",
    "row_entropy",
    "step_batch_from_dataproto",
    "step_inputs",
    "to_tokens",
]

NEEDED_KEYS: tuple[str, ...] = ("uid", "traj_uid", "anchor_obs")
"""The ``non_tensor_batch`` keys every estimator of this project needs."""
OPTIONAL_KEYS: tuple[str, ...] = ("step_index", "rewards", "is_action_valid", "next_obs")
"""The ``non_tensor_batch`` keys read when present."""
TOKEN_KEYS: tuple[str, ...] = ("response_mask", "token_level_rewards")
"""The ``batch`` tensors every estimator needs."""
STEP_ENTROPY_KEY = "step_entropy"
"""``non_tensor_batch`` key of the policy's entropy per step (an estimator that reads entropy)."""
TOKEN_ENTROPY_KEY = "entropys"
"""``batch`` key of verl's token entropies (``compute_log_prob``'s ``entropys``), the fallback."""
SUPPLIED_INPUTS: tuple[str, ...] = ("values", "entropy", "observations")
"""The per-step inputs (``hgpo.STEP_INPUTS``) a DataProto supplies (:func:`step_inputs`)."""


class MissingMetadataError(KeyError):
    """A ``DataProto`` lacks keys of the metadata contract; the message lists them all.

    A ``KeyError`` (a key is missing) whose ``str`` is the plain one-line message.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StepOrderError(ValueError):
    """A ``DataProto`` without ``non_tensor_batch['step_index']`` whose row order is not one a
    rollout emits (trajectory-major or step-major), so the steps' order cannot be read from it
    (verl's ``balance_batch`` permuted it); the message names ``step_index``."""


@dataclass(frozen=True)
class StepRows:
    """A ``StepBatch`` built from a ``DataProto`` and the row order that links the two.

    Attributes:
        batch: the StepBatch, trajectories contiguous and in step order.
        order: int64[n], ``batch`` row i is the DataProto's row ``order[i]``.
    """

    batch: StepBatch
    order: np.ndarray

    def to_rows(self, per_step: np.ndarray) -> np.ndarray:
        """float64[n] per StepBatch row -> the same values in the DataProto's row order."""
        out = np.empty_like(per_step)
        out[self.order] = per_step
        return out


def _keys(mapping: Any) -> set[str]:
    try:
        return set(mapping.keys())
    except AttributeError:
        return set()


def check_metadata(
    data: Any, what: str, *, tokens: tuple[str, ...] = TOKEN_KEYS, extra: tuple[str, ...] = ()
) -> None:
    """:class:`MissingMetadataError` unless ``data`` has every key the contract needs.

    what: who asks (``"estimator 'hgpo'"``), for the message. tokens: the ``batch`` tensors
    needed; extra: further ``non_tensor_batch`` keys needed. Checks keys only: no work done.
    """
    non_tensor = _keys(getattr(data, "non_tensor_batch", None))
    tensors = _keys(getattr(data, "batch", None))
    gone = [k for k in (*NEEDED_KEYS, *extra) if k not in non_tensor]
    gone_t = [k for k in tokens if k not in tensors]
    if not gone and not gone_t:
        return
    parts = []
    if gone:
        parts.append(f"non_tensor_batch {', '.join(map(repr, gone))}")
    if gone_t:
        parts.append(f"batch {', '.join(map(repr, gone_t))}")
    optional = [k for k in OPTIONAL_KEYS if k not in extra]
    hint = ""
    if non_tensor <= {"uid"}:
        hint = (
            "; only 'uid' came: verl's v1 trainer passes the outputs' extra_fields only with "
            "hgpo.integrations.verl imported in the trainer's process (VERL_USE_EXTERNAL_MODULES)"
        )
    elif "anchor_obs" in gone:
        hint = "; an agent loop sets extra_fields['anchor_obs'] on every output"
    raise MissingMetadataError(
        f"{what}: the DataProto lacks {' and '.join(parts)}; it needs non_tensor_batch "
        f"{', '.join(map(repr, (*NEEDED_KEYS, *extra)))} (optional: "
        f"{', '.join(map(repr, optional))}) and batch {', '.join(map(repr, tokens))} "
        f"(one row per agent step; see hgpo.integrations.dataproto){hint}"
    )


def _column(non_tensor: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    col = np.asarray(non_tensor[key])
    if col.ndim != 1 or col.shape[0] != n:
        raise ValueError(
            f"non_tensor_batch[{key!r}]: must have one entry per row ({n}), got shape {col.shape}"
        )
    return col


def _check_row_order(traj: np.ndarray, rank: np.ndarray, uids: np.ndarray) -> None:
    """:class:`StepOrderError` unless the rows' order (no ``step_index``) is one a rollout emits:
    every trajectory contiguous, or ``rank`` (each row's rank within its trajectory in batch
    order) non-decreasing over the batch (step-major)."""
    n = traj.shape[0]
    starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]]) if n else np.zeros(0, int)
    if starts.shape[0] == np.unique(traj).shape[0] or bool((np.diff(rank) >= 0).all()):
        return
    runs = np.bincount(traj[starts])
    split = int(np.flatnonzero(runs > 1)[0])
    rows = np.flatnonzero(traj == split)
    shown = ", ".join(map(str, rows[:6].tolist())) + (", ..." if rows.shape[0] > 6 else "")
    raise StepOrderError(
        f"non_tensor_batch has no 'step_index', and the rows are neither trajectory by "
        f"trajectory nor step by step (trajectory {uids[rows[0]]!r} is in rows {shown}, with "
        "other trajectories' rows between them), so the step order cannot be read from the row "
        "order: the batch was reordered (verl's trainer.balance_batch permutes it) or rows were "
        "added; set non_tensor_batch['step_index'] (the step t of each row within its "
        "trajectory) on every row, or keep the rows in the order the rollout emits them"
    )


def _step_index(non_tensor: Mapping[str, Any], traj: np.ndarray) -> np.ndarray:
    """int64[n] step t of every row: ``step_index`` if given, else the row's rank within its
    trajectory in batch order (a :class:`StepOrderError` when that order is not readable)."""
    n = traj.shape[0]
    if "step_index" in non_tensor:
        col = _column(non_tensor, "step_index", n)
        for i, v in enumerate(col.tolist()):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
                raise ValueError(
                    f"non_tensor_batch['step_index'][{i}]: must be an integer >= 0, got {v!r}"
                )
        return col.astype(np.int64)
    by_traj = np.argsort(traj, kind="stable")
    sorted_traj = traj[by_traj]
    starts = np.flatnonzero(np.r_[True, sorted_traj[1:] != sorted_traj[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, n]))
    step = np.empty(n, dtype=np.int64)
    step[by_traj] = np.arange(n) - first
    _check_row_order(traj, step, _column(non_tensor, "traj_uid", n))
    return step


def _invalid(non_tensor: Mapping[str, Any], n: int) -> np.ndarray | None:
    if "is_action_valid" not in non_tensor:
        return None
    col = _column(non_tensor, "is_action_valid", n)
    values = col.tolist()
    for i, v in enumerate(values):
        if not (isinstance(v, bool | np.bool_) or (type(v) is int and v in (0, 1))):
            raise ValueError(f"non_tensor_batch['is_action_valid'][{i}]: must be a bool, got {v!r}")
    return ~np.asarray(values, dtype=bool)


def _rewards(data: Any, n: int) -> np.ndarray:
    """float64[n] the env reward of every row (``rewards``, else the row's token rewards
    summed in float64)."""
    if "rewards" in data.non_tensor_batch:
        col = _column(data.non_tensor_batch, "rewards", n)
        try:
            return col.astype(np.float64)
        except (TypeError, ValueError):
            bad = next(v for v in col.tolist() if not isinstance(v, int | float | np.number))
            raise ValueError(f"non_tensor_batch['rewards']: must be numbers, got {bad!r}") from None
    tlr = data.batch["token_level_rewards"]
    return tlr.double().sum(-1).cpu().numpy()


def _states(non_tensor: Mapping[str, Any], n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """int64[n] keys of ``anchor_obs`` and, when the batch has ``next_obs``, of ``next_obs``
    (one key space: equal observations, equal keys, the anchors keyed first)."""
    anchors = _column(non_tensor, "anchor_obs", n).tolist()
    if "next_obs" not in non_tensor:
        return state_ids(anchors), None
    keys = state_ids(anchors + _column(non_tensor, "next_obs", n).tolist())
    return keys[:n], keys[n:]


def _actions(data: Any, n: int) -> np.ndarray:
    """int64[n] keys of the steps' responses (the unpadded response tokens)."""
    if "responses" not in _keys(data.batch):
        raise MissingMetadataError(
            "include_actions: the DataProto lacks batch 'responses' (the action key of a step "
            "is its unpadded response tokens)"
        )
    import torch

    # (as int64 and bool first: numpy has no bf16, verl's tensors may be any dtype)
    tokens = data.batch["responses"].detach().to("cpu", torch.int64).numpy()
    mask = data.batch["response_mask"].detach().to("cpu", torch.bool).numpy()
    return state_ids([tokens[i][mask[i]].tobytes() for i in range(n)])


def step_batch_from_dataproto(
    data: Any, *, include_actions: bool = False, tokens: tuple[str, ...] = TOKEN_KEYS
) -> StepRows:
    """The ``StepBatch`` of a ``DataProto`` of agent steps (the contract in the module doc).

    Raises MissingMetadataError listing the keys it needs when any is missing (before any
    work), ValueError naming the key and the value for a bad entry, and StepBatch's own
    errors (prefixed with "DataProto -> StepBatch") for rows that do not form trajectories
    (a trajectory in two ``uid`` groups, a gap in ``step_index``, a repeated step), and
    :class:`StepOrderError` for rows without ``step_index`` in an order no rollout emits.
    ``tokens``: the ``batch`` tensors to require (:func:`check_metadata`).
    """
    check_metadata(data, "step_batch_from_dataproto", tokens=tokens)
    non_tensor = data.non_tensor_batch
    n = int(data.batch["response_mask"].shape[0])
    group = state_ids(_column(non_tensor, "uid", n).tolist())
    traj = state_ids(_column(non_tensor, "traj_uid", n).tolist())
    state, next_state = _states(non_tensor, n)
    step = _step_index(non_tensor, traj)
    invalid = _invalid(non_tensor, n)
    reward = _rewards(data, n)
    action = _actions(data, n) if include_actions else None
    order = np.lexsort((step, traj))

    def pick(col: np.ndarray | None) -> np.ndarray | None:
        return None if col is None else col[order]

    try:
        batch = StepBatch(
            group=group[order],
            traj=traj[order],
            step=step[order],
            reward=reward[order],
            state=state[order],
            action=pick(action),
            invalid=pick(invalid),
        )
    except ValueError as exc:
        raise ValueError(f"DataProto -> StepBatch: {exc}") from None
    if next_state is not None:
        try:
            batch = dataclasses.replace(batch, next_state=next_state[order])
        except ValueError as exc:
            raise ValueError(
                f"DataProto -> StepBatch: non_tensor_batch['next_obs'] (the observation each step "
                f"led to, the next step's anchor_obs within a trajectory): {exc}"
            ) from None
    return StepRows(batch, order)


def to_tokens(per_row: np.ndarray, response_mask: Any, like: Any) -> Any:
    """The token tensor ``per_row[row] * response_mask[row]`` (verl-agent's broadcast), in the
    dtype and on the device of the tensor ``like`` (``token_level_rewards``)."""
    import torch

    values = torch.as_tensor(per_row, dtype=like.dtype, device=like.device)
    return values.unsqueeze(-1) * response_mask.to(like.dtype)


# --------------------------------------------------------------------------- per-step inputs

_ENTROPY_HINT = (
    "hgpo.integrations.verl fills it from verl 0.9's old-log-prob pass "
    "(RayPPOTrainer._compute_old_log_prob; the v1 trainer's TransferQueue 'entropy'), which "
    "verl skips in bypass mode (algorithm.rollout_correction.bypass_mode: no entropy then); "
    "elsewhere keep verl's 'entropys' in the batch (verl-agent's fit pops them after its "
    "entropy metric) or set 'step_entropy'"
)


def check_step_inputs(data: Any, reads: tuple[str, ...], what: str) -> None:
    """:class:`MissingMetadataError` unless ``data`` carries every per-step input in ``reads``
    (the module docstring: ``values``, ``entropy``, ``observations``); checks keys only."""
    unknown = [k for k in reads if k not in SUPPLIED_INPUTS]
    if unknown:
        raise ValueError(
            f"{what}: reads {', '.join(unknown)}, which a DataProto does not carry (the verl "
            f"integration supplies {', '.join(SUPPLIED_INPUTS)})"
        )
    tensors = _keys(getattr(data, "batch", None))
    non_tensor = _keys(getattr(data, "non_tensor_batch", None))
    if "values" in reads and "values" not in tensors:
        raise MissingMetadataError(
            f"{what}: reads state values, but the DataProto lacks batch 'values' (the critic's "
            "token values; verl computes them with a critic: critic.enable=True)"
        )
    if "entropy" in reads:
        have = [k for k in (STEP_ENTROPY_KEY, TOKEN_ENTROPY_KEY) if k in non_tensor | tensors]
        if not have:
            raise MissingMetadataError(
                f"{what}: reads the policy's entropy, but the DataProto lacks non_tensor_batch "
                f"{STEP_ENTROPY_KEY!r} (a float >= 0 per step) and batch "
                f"{TOKEN_ENTROPY_KEY!r} (verl's token entropies); {_ENTROPY_HINT}"
            )
        if len(have) == 2:
            raise ValueError(
                f"{what}: the DataProto has both non_tensor_batch {STEP_ENTROPY_KEY!r} and batch "
                f"{TOKEN_ENTROPY_KEY!r}; give one (the policy's entropy per step, or verl's "
                "token entropies to average over each response)"
            )
    if "observations" in reads and "anchor_obs" not in non_tensor:
        raise MissingMetadataError(
            f"{what}: reads observations, but the DataProto lacks non_tensor_batch 'anchor_obs'"
        )


def mean_over_response(token_values: Any, response_mask: Any, what: str) -> np.ndarray:
    """float64[n]: each row's token values averaged over its response tokens,
    sum_j x[i, j] m[i, j] / sum_j m[i, j]; a row without a response token is a ValueError."""
    mask = response_mask.double()
    n = mask.sum(-1)
    if (n == 0).any():
        i = int((n == 0).nonzero()[0, 0])
        raise ValueError(f"{what}: row {i} has no response token (response_mask is all 0)")
    return ((token_values.double() * mask).sum(-1) / n).cpu().numpy()


def _step_values(data: Any) -> np.ndarray:
    """float64[n] V(s_t): the critic's value at each row's first response token."""
    import torch

    mask = data.batch["response_mask"]
    first = mask.to(dtype=data.batch["values"].dtype).argmax(dim=-1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    return data.batch["values"][rows, first].double().cpu().numpy()


def row_entropy(data: Any) -> np.ndarray:
    """float64[n] the policy's entropy per row of ``data`` (its row order): ``step_entropy``,
    else the mean of ``entropys`` over the row's response tokens (the module docstring)."""
    n = int(data.batch["response_mask"].shape[0])
    if STEP_ENTROPY_KEY in data.non_tensor_batch:
        col = _column(data.non_tensor_batch, STEP_ENTROPY_KEY, n)
        for i, v in enumerate(col.tolist()):
            if isinstance(v, bool) or not isinstance(v, int | float | np.number):
                raise ValueError(
                    f"non_tensor_batch[{STEP_ENTROPY_KEY!r}][{i}]: must be a number, got {v!r}"
                )
        return col.astype(np.float64)
    return mean_over_response(
        data.batch[TOKEN_ENTROPY_KEY], data.batch["response_mask"], f"batch[{TOKEN_ENTROPY_KEY!r}]"
    )


def _observations(data: Any, n: int) -> list[str]:
    col = _column(data.non_tensor_batch, "anchor_obs", n).tolist()
    for i, o in enumerate(col):
        if not isinstance(o, str):
            raise ValueError(
                f"non_tensor_batch['anchor_obs'][{i}]: an estimator that reads observations "
                f"needs the observation text (a str), got {type(o).__name__}"
            )
    return col


def step_inputs(data: Any, rows: StepRows, reads: tuple[str, ...]) -> dict[str, Any]:
    """The per-step inputs ``reads`` of an estimator (the module docstring), in the order of
    ``rows.batch``, by keyword for ``hgpo.compute_advantages``. Call
    :func:`check_step_inputs` first for the named errors of missing keys."""
    n = int(data.batch["response_mask"].shape[0])
    out: dict[str, Any] = {}
    if "values" in reads:
        out["values"] = _step_values(data)[rows.order]
    if "entropy" in reads:
        out["entropy"] = row_entropy(data)[rows.order]
    if "observations" in reads:
        obs = _observations(data, n)
        out["observations"] = [obs[i] for i in rows.order.tolist()]
    return out
