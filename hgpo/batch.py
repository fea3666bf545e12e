"""The step batch: the flat per-step arrays every estimator reads.

One row per environment step. A *rollout group* is the N rollouts of one task; a *trajectory*
is one rollout. Rows of a trajectory are contiguous and ordered by step (0, 1, ..., T-1), which
is how every rollout loop naturally emits them and lets returns and context keys be computed
with segment arithmetic instead of Python loops.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hgpo.branched_batch import BranchLayout, bad_parent_change, branch_layout

__all__ = ["ARRAY_FIELDS", "StateIndexer", "StepBatch", "state_ids"]


_INT64 = np.iinfo(np.int64)
_KEY_HINT = {
    "state": "; turn observations into keys with hgpo.state_ids(observations)",
    "next_state": "; turn observations into keys with the StateIndexer of the states",
    "action": "; turn actions into keys with hgpo.state_ids(actions)",
}


def _as_int_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a one-dimensional int64 array, or a ValueError naming the field and the
    first value that is not an int64 integer (strings, None, 1.5, 2**70, a bool array)."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:  # ragged nesting
        raise ValueError(f"StepBatch.{name}: must be a sequence of integers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"StepBatch.{name} must be one-dimensional, got shape {arr.shape}")
    if not arr.size or arr.dtype == np.int64:
        return np.ascontiguousarray(arr, dtype=np.int64)
    hint = _KEY_HINT.get(name, "")
    if arr.dtype == np.bool_:
        raise ValueError(f"StepBatch.{name} must hold integers, got dtype bool")
    if arr.dtype.kind not in "iufO":  # strings, bytes, dates...
        raise ValueError(
            f"StepBatch.{name} must hold integers, got {arr.dtype} values such as "
            f"{arr[0].item()!r}{hint}"
        )
    if arr.dtype.kind == "O":  # Python objects (None, ints past int64): check one by one
        values = arr.tolist()
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"StepBatch.{name} must hold integers, got {v!r} at [{i}]{hint}")
            if v != int(v):
                raise ValueError(f"StepBatch.{name} must hold integers, got {v!r} at [{i}]{hint}")
            if not _INT64.min <= v <= _INT64.max:
                raise ValueError(f"StepBatch.{name}[{i}] is {v!r}, outside the int64 range{hint}")
        return np.asarray(values, dtype=np.int64)
    if arr.dtype.kind == "f":
        whole = np.isfinite(arr) & (np.floor(arr) == arr)
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise ValueError(f"StepBatch.{name} must hold integers, got {arr[i].item()!r}{hint}")
    outside = (arr < _INT64.min) | (arr > _INT64.max)  # exact for ints; floats: 2**63 is out
    if arr.dtype.kind == "f":
        outside |= arr >= 2.0**63
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise ValueError(
            f"StepBatch.{name}[{i}] is {arr[i].item()!r}, outside the int64 range{hint}"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def _trajectory_starts(step: np.ndarray, traj: np.ndarray, group: np.ndarray) -> np.ndarray:
    """int64 first row of each trajectory of an unbranched batch.

    A trajectory starts where step == 0; every other row continues the previous row's
    trajectory with step + 1 and the same traj and group. Checked on shifted slices
    (contiguous, no gathers): this runs on every batch.
    """
    if step[0] != 0:
        raise ValueError(f"StepBatch.step[0] is {step[0]}; a trajectory must start at step 0")
    is_start = step == 0
    cont = ~is_start[1:]  # row i + 1 continues row i
    bad = cont & ((step[1:] != step[:-1] + 1) | (traj[1:] != traj[:-1]))
    if bad.any():
        _bad_order(int(np.flatnonzero(bad)[0]) + 1, step, traj)
    badg = cont & (group[1:] != group[:-1])
    if badg.any():
        _bad_group(int(np.flatnonzero(badg)[0]) + 1, traj, group)
    return np.flatnonzero(is_start).astype(np.int64, copy=False)


def _parented_starts(
    step: np.ndarray, traj: np.ndarray, group: np.ndarray, parent: np.ndarray
) -> np.ndarray:
    """[branching] int64 first row of each trajectory of a batch with a parent column: where
    the trajectory id changes (a branch starts after step 0, see hgpo/branched_batch.py). Every
    other row steps by one and keeps the group and the parent pointer of the row before it:
    one combined pass; the error path names the first fault as the separate checks would."""
    new = traj[1:] != traj[:-1]
    bad = step[1:] != step[:-1] + 1
    bad |= group[1:] != group[:-1]
    bad |= parent[1:] != parent[:-1]
    if np.greater(bad, new).any():  # a fault on a row that continues its trajectory
        if (parent == -1).all():  # roots only: the unbranched batch's checks and messages
            return _trajectory_starts(step, traj, group)
        _bad_continuation(step, traj, group, parent, new)
    starts = np.empty(np.count_nonzero(new) + 1, dtype=np.int64)
    starts[0] = 0
    np.add(np.flatnonzero(new), 1, out=starts[1:])
    return starts


def _bad_order(i: int, step: np.ndarray, traj: np.ndarray) -> None:
    raise ValueError(
        f"StepBatch.step[{i}] is {step[i]} (traj {traj[i]}) after step "
        f"{step[i - 1]} (traj {traj[i - 1]}): the rows of a trajectory must be "
        "contiguous and ordered 0..T-1"
    )


def _bad_group(i: int, traj: np.ndarray, group: np.ndarray) -> None:
    raise ValueError(
        f"StepBatch.group[{i}] is {group[i]} but trajectory {traj[i]} started in "
        f"group {group[i - 1]}: a trajectory lies in one rollout group"
    )


def _bad_continuation(step, traj, group, parent, new) -> None:
    """(error path of _parented_starts) The first row out of order, else the first that
    changes group, else the first that changes parent."""
    cont = ~new

    def first(fault: np.ndarray) -> int:  # the row of the first fault, 0 for none
        return int(np.argmax(fault)) + 1 if fault.any() else 0

    if i := first(cont & (step[1:] != step[:-1] + 1)):
        _bad_order(i, step, traj)
    if i := first(cont & (group[1:] != group[:-1])):
        _bad_group(i, traj, group)
    bad_parent_change(first(cont & (parent[1:] != parent[:-1])), parent, traj, new)


@dataclass(frozen=True)
class StepBatch:
    """Flat per-step arrays of a batch of rollouts, validated at construction.

    Attributes (n = number of steps):
        group: int64[n] rollout-group id (one task rolled out N times). Grouping never crosses it.
        traj: int64[n] trajectory id, unique across the batch; a trajectory lies in one group.
        step: int64[n] step index t within its trajectory. The rows of one trajectory are
            contiguous and read 0, 1, ..., T-1.
        reward: float64[n] environment reward r_t of the step, *excluding* the invalid-action
            penalty (the estimators apply it, see ``EstimatorConfig.penalty_mode``). Finite.
        state: int64[n] key of the current observation s_t (equal observations, equal keys;
            :func:`state_ids` turns strings or arrays into keys).
        action: int64[n] or None, key of the action a_t (used when context keys include actions).
        invalid: bool[n] or None, True where a_t was invalid (no tag, unparseable, inadmissible).
        parent: int64[n] or None, branched batches only (see :mod:`hgpo.branched_batch`): the traj
            id of the trajectory this one branches from, -1 for a root. A branch's rows start at
            its branch step b (not 0) and its steps 0..b-1 are its parent's.
        next_state: int64[n] or None, key of the observation s'_t that step t led to (same keys
            as ``state``). On every row but a trajectory's last it is the next row's state
            (checked); what it adds is the observation after a trajectory's last step, which
            the other columns lack. Read by ``graphgpo`` (its transition graph), ``3spo``
            (the state score after the last step) and ``rewardflow`` (its state graph); the
            other estimators ignore it.
        branches: derived, the :class:`hgpo.branched_batch.BranchLayout` of a batch with at least
            one branch, else None (then every computation takes the unbranched path).

    Raises:
        ValueError naming the field and the offending value when lengths differ, a reward is
        NaN/inf, a trajectory's rows are not contiguous and ordered 0..T-1, or a next_state
        differs from the state of the next row of its trajectory.
    """

    group: np.ndarray
    traj: np.ndarray
    step: np.ndarray
    reward: np.ndarray
    state: np.ndarray
    action: np.ndarray | None = None
    invalid: np.ndarray | None = None
    parent: np.ndarray | None = None  # [branching] hgpo/branched_batch.py
    next_state: np.ndarray | None = None  # [graphgpo] hgpo/graphgpo.py
    # Derived segment layout, filled in __post_init__.
    traj_start: np.ndarray = field(init=False, repr=False)  # int64[n_traj] first row of each traj
    traj_len: np.ndarray = field(init=False, repr=False)  # int64[n_traj]
    traj_index: np.ndarray = field(init=False, repr=False)  # int64[n] dense trajectory index
    branches: BranchLayout | None = field(init=False, repr=False)  # [branching]

    def __post_init__(self) -> None:
        self._coerce_columns()
        self._check_values()
        self._set_trajectories()
        if self.next_state is not None:
            self._check_next_state()

    def _coerce_columns(self) -> None:
        """Every column as a contiguous array of its dtype (named errors)."""
        set_ = object.__setattr__
        for name in ("group", "traj", "step", "state"):
            set_(self, name, _as_int_array(name, getattr(self, name)))
        reward = np.asarray(self.reward)
        if reward.ndim != 1:
            raise ValueError(f"StepBatch.reward must be one-dimensional, got shape {reward.shape}")
        if reward.size and not (
            np.issubdtype(reward.dtype, np.floating) or np.issubdtype(reward.dtype, np.integer)
        ):
            raise ValueError(f"StepBatch.reward must be numeric, got dtype {reward.dtype}")
        reward = np.ascontiguousarray(reward, dtype=np.float64)
        set_(self, "reward", reward)
        if self.action is not None:
            set_(self, "action", _as_int_array("action", self.action))
        # [branching] checked with the trajectories (hgpo/branched_batch.py: branch_layout)
        if self.parent is not None:
            set_(self, "parent", _as_int_array("parent", self.parent))
        if self.next_state is not None:
            set_(self, "next_state", _as_int_array("next_state", self.next_state))
        if self.invalid is not None:
            inv = np.asarray(self.invalid)
            if inv.ndim != 1:
                raise ValueError(
                    f"StepBatch.invalid must be one-dimensional, got shape {inv.shape}"
                )
            if inv.size and inv.dtype != np.bool_:
                values = inv.tolist()  # (Python values: None or 2**70 in an object array too)
                if inv.dtype.kind in "iuf":
                    ok = (inv == 0) | (inv == 1)
                else:
                    ok = np.array([type(v) in (int, float) and v in (0, 1) for v in values])
                if not ok.all():
                    bad = values[int(np.flatnonzero(~ok)[0])]
                    raise ValueError(f"StepBatch.invalid must be boolean, got {bad!r}")
            set_(self, "invalid", np.ascontiguousarray(inv, dtype=np.bool_))

    def _check_values(self) -> None:
        """Equal lengths, a non-empty batch, finite rewards, step indices >= 0."""
        reward = self.reward
        n = self.group.shape[0]
        columns = ("traj", "step", "reward", "state", "action", "invalid", "parent")
        for name in (*columns, "next_state"):
            arr = getattr(self, name)
            if arr is not None and arr.shape[0] != n:
                raise ValueError(
                    f"StepBatch.{name} has length {arr.shape[0]}, expected {n} (the length of group)"
                )
        if n == 0:
            raise ValueError("StepBatch is empty: group has length 0")
        finite = np.isfinite(reward)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise ValueError(f"StepBatch.reward[{i}] is {float(reward[i])}; rewards must be finite")
        if self.step.min() < 0:  # (a reduction: half the time of a comparison and any())
            i = int(np.flatnonzero(self.step < 0)[0])
            raise ValueError(f"StepBatch.step[{i}] is {self.step[i]}; step indices start at 0")

    def _set_trajectories(self) -> None:
        """traj_start / traj_len / traj_index (and the branch layout), checking that every
        trajectory's rows are contiguous, ordered and in one rollout group."""
        set_ = object.__setattr__
        n = self.group.shape[0]
        step, traj, group = self.step, self.traj, self.group
        if self.parent is None:
            starts = _trajectory_starts(step, traj, group)
        else:  # [branching] a trajectory starts where its id changes (a branch after step 0)
            starts = _parented_starts(step, traj, group, self.parent)
        traj_at_start = traj[starts]
        # Ids that rise from one trajectory to the next are unique; only others need a count.
        rising = starts.size == 1 or bool((traj_at_start[1:] > traj_at_start[:-1]).all())
        if not rising:
            vals, counts = np.unique(traj_at_start, return_counts=True)
            if counts.max() > 1:
                dup = vals[np.flatnonzero(counts > 1)[0]]
                raise ValueError(
                    f"StepBatch.traj value {dup} labels two separate runs of rows; trajectory "
                    "ids must be unique across the batch"
                )
        traj_len = np.empty_like(starts)  # (np.diff with append= costs 10x more)
        np.subtract(starts[1:], starts[:-1], out=traj_len[:-1])
        traj_len[-1] = n - starts[-1]
        set_(self, "traj_start", starts)
        set_(self, "traj_len", traj_len)
        # (np.repeat: a third of the time of a cumsum of is_start)
        set_(self, "traj_index", np.repeat(np.arange(starts.size, dtype=np.int64), traj_len))
        layout = None
        if self.parent is not None:  # [branching] None when every trajectory is a root
            layout = branch_layout(
                self.parent, traj, group, self.state, step, starts, traj_len, rising
            )
        set_(self, "branches", layout)

    def _check_next_state(self) -> None:
        """[graphgpo] next_state equals the next row's state on every row but a trajectory's
        last (a branch's rows are contiguous too, so the same shifted comparison holds)."""
        ns, state = self.next_state, self.state
        cont = np.ones(ns.shape[0] - 1, dtype=np.bool_)  # row i + 1 continues row i
        cont[self.traj_start[1:] - 1] = False
        bad = cont & (ns[:-1] != state[1:])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"StepBatch.next_state[{i}] is {ns[i]} but the next step of trajectory "
                f"{self.traj[i]} (row {i + 1}) has state {state[i + 1]}: next_state is the "
                "observation a step led to, the next row's state except after a trajectory's "
                "last step"
            )

    def read_only(self, writable_copies_except: str | None = None) -> StepBatch:
        """This batch with every array a read-only view (no copy, no checks rerun): what the
        registry hands an estimator, so that a write into the batch raises instead of
        changing what every later estimator reads.

        ``writable_copies_except`` (the registry's error path, naming the field an estimator
        wrote into): every array a writable copy except that one field (a name of
        :data:`ARRAY_FIELDS`; "": none), which stays a read-only view."""
        out = object.__new__(StepBatch)
        out.__dict__.update(self.__dict__)
        lock = (
            _read_only if writable_copies_except is None else _copy_unless(writable_copies_except)
        )
        for name in _COLUMNS:
            arr = self.__dict__[name]
            if arr is not None:
                out.__dict__[name] = lock(name, arr)
        if self.branches is not None:  # [branching] the layout's arrays too
            out.__dict__["branches"] = _layout_view(self.branches, lock)
        return out

    @property
    def n_steps(self) -> int:
        return int(self.group.shape[0])

    @property
    def n_traj(self) -> int:
        return int(self.traj_start.shape[0])

    @classmethod
    def from_trajectories(
        cls,
        groups: Iterable[int],
        rewards: Iterable[Iterable[float]],
        states: Iterable[Iterable[int]],
        actions: Iterable[Iterable[int]] | None = None,
        invalid: Iterable[Iterable[bool]] | None = None,
        terminal_states: Iterable[int] | None = None,
    ) -> StepBatch:
        """Build a batch from per-trajectory lists (trajectory i gets traj id i).

        groups: the rollout-group id of each trajectory; rewards/states/actions/invalid: one
        sequence per trajectory, of that trajectory's length. terminal_states: one key per
        trajectory, the observation after its last step; with it the batch's ``next_state``
        is each trajectory's states shifted by one, then its terminal state.
        """
        groups = list(groups)
        rewards = [list(r) for r in rewards]
        states = [list(s) for s in states]
        if not (len(groups) == len(rewards) == len(states)):
            raise ValueError(
                f"from_trajectories: groups ({len(groups)}), rewards ({len(rewards)}) and states "
                f"({len(states)}) must list the same number of trajectories"
            )
        if not groups:
            raise ValueError(
                "from_trajectories: no trajectories (groups, rewards and states are empty); a "
                "batch needs at least one step"
            )
        lens = _checked_lengths(groups, rewards, states)

        def flat(name: str, seqs: Iterable[Iterable[Any]] | None) -> np.ndarray | None:
            """One sequence per trajectory, each of that trajectory's length, concatenated."""
            if seqs is None:
                return None
            seqs = list(seqs)
            for i, x in enumerate(seqs):
                if isinstance(x, str | bytes) or not isinstance(x, Iterable):
                    raise ValueError(
                        f"from_trajectories: {name}[{i}] must be a sequence, got {x!r}"
                    )
            seqs = [list(x) for x in seqs]
            if len(seqs) != len(lens):
                raise ValueError(
                    f"from_trajectories: {name} lists {len(seqs)} trajectories, expected "
                    f"{len(lens)} (one per group entry)"
                )
            for i, (x, n) in enumerate(zip(seqs, lens, strict=True)):
                if len(x) != n:
                    raise ValueError(
                        f"from_trajectories: trajectory {i} has {len(x)} {name} but {n} rewards"
                    )
            return np.concatenate([np.asarray(x) for x in seqs])

        state = flat("states", states)
        next_state = None if terminal_states is None else _next_states(state, terminal_states, lens)
        return cls(
            group=np.repeat(np.asarray(groups, dtype=np.int64), lens),
            traj=np.repeat(np.arange(len(lens), dtype=np.int64), lens),
            step=np.concatenate([np.arange(n, dtype=np.int64) for n in lens]),
            reward=np.concatenate([np.asarray(r, dtype=np.float64) for r in rewards]),
            state=state,
            action=flat("actions", actions),
            invalid=flat("invalid", invalid),
            next_state=next_state,
        )


def _checked_lengths(
    groups: list[Any], rewards: list[list[Any]], states: list[list[Any]]
) -> list[int]:
    """from_trajectories: each trajectory's length, after checking that its rewards and states
    agree, it is not empty, its rewards are real numbers and its group is an integer."""
    for i, (r, s) in enumerate(zip(rewards, states, strict=True)):
        if len(r) != len(s):
            raise ValueError(
                f"from_trajectories: trajectory {i} has {len(r)} rewards but {len(s)} states"
            )
        if len(r) == 0:
            raise ValueError(f"from_trajectories: trajectory {i} is empty")
        if not all(isinstance(x, numbers.Real) for x in r):
            bad = next(x for x in r if not isinstance(x, numbers.Real))
            raise ValueError(f"from_trajectories: trajectory {i} has a reward {bad!r}")

    for i, g in enumerate(groups):  # (np.asarray would read 1.5 as 1 and True as 1)
        if isinstance(g, bool | np.bool_) or not isinstance(g, numbers.Integral):
            raise ValueError(f"from_trajectories: groups[{i}] must be an integer, got {g!r}")
    return [len(r) for r in rewards]


def _next_states(state: np.ndarray, terminal_states: Iterable[int], lens: list[int]) -> np.ndarray:
    """from_trajectories: each trajectory's states shifted by one, then its terminal state."""
    terminal = list(terminal_states)
    if len(terminal) != len(lens):
        raise ValueError(
            f"from_trajectories: terminal_states lists {len(terminal)} states, expected "
            f"{len(lens)} (one per trajectory)"
        )
    try:
        term = _as_int_array("next_state", terminal)
    except ValueError as exc:
        raise ValueError(f"from_trajectories: terminal_states: {exc}") from None
    keys = _as_int_array("state", state)
    next_state = np.empty_like(keys)
    next_state[:-1] = keys[1:]
    next_state[np.cumsum(lens) - 1] = term
    return next_state


_COLUMNS = (
    "group", "traj", "step", "reward", "state", "action", "invalid", "parent", "next_state",
    "traj_start", "traj_len", "traj_index",
)  # fmt: skip
_LAYOUT = ("parent", "branch_step", "virtual_len", "first", "virtual_rows")
ARRAY_FIELDS: tuple[str, ...] = (*_COLUMNS, *(f"branches.{a}" for a in _LAYOUT))
"""The arrays of a StepBatch (``branches.*``: its branch layout's), as
:meth:`StepBatch.read_only` names them."""


def _read_only(name: str, arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _copy_unless(locked: str) -> Any:
    def lock(name: str, arr: np.ndarray) -> np.ndarray:
        return _read_only(name, arr) if name == locked else arr.copy()

    return lock


def _layout_view(layout: BranchLayout, lock: Any) -> BranchLayout:
    """[branching] A copy of ``layout`` whose arrays pass through ``lock``; its virtual rows
    are built here, once, on the batch's own layout (the estimators read them)."""
    out = object.__new__(BranchLayout)
    out.__dict__.update(layout.__dict__)
    for name in _LAYOUT:
        out.__dict__[name] = lock(f"branches.{name}", getattr(layout, name))
    return out


class StateIndexer:
    """Interns observations (strings, bytes, numpy arrays, tuples) as dense integer keys.

    Equal observations get equal keys (exact equality, as the reference code's ``to_hashable``);
    arrays are compared by dtype, shape and bytes. Reuse one indexer across batches to keep keys
    stable.
    """

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    @staticmethod
    def _hashable(obs: Any) -> Hashable:
        if isinstance(obs, np.ndarray):
            return ("__ndarray__", obs.dtype.str, obs.shape, obs.tobytes())
        if isinstance(obs, list):
            return tuple(StateIndexer._hashable(o) for o in obs)
        if isinstance(obs, dict):
            return tuple(sorted((k, StateIndexer._hashable(v)) for k, v in obs.items()))
        try:
            hash(obs)
        except TypeError as exc:
            raise ValueError(
                f"state_ids: observation of type {type(obs).__name__} is not hashable"
            ) from exc
        return obs

    def __call__(self, observations: Iterable[Any]) -> np.ndarray:
        if isinstance(observations, str | bytes):  # (it would be split into characters)
            raise ValueError(
                "state_ids: observations must be a sequence of observations, got one "
                f"{type(observations).__name__} ({observations[:40]!r}); pass [text] for one"
            )
        ids = self._ids
        out = [ids.setdefault(self._hashable(o), len(ids)) for o in observations]
        return np.asarray(out, dtype=np.int64)


def state_ids(observations: Iterable[Any]) -> np.ndarray:
    """int64 keys of observations for one batch: equal observations, equal keys (first seen = 0)."""
    return StateIndexer()(observations)
