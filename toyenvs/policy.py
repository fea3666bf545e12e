"""The tabular softmax policy over the K-step context, and the context encoding.

A context is c_t = (o_{t-K}, a_{t-K}, ..., o_{t-1}, a_{t-1}, o_t): the observations and actions
of the last K steps plus the current observation, the same context an LLM agent's memory-module
prompt holds. Positions before t = 0 hold a padding symbol, so the context also tells how far
the episode has run when t < K. Each context is encoded exactly as one int64 (mixed radix, see
:func:`encode_context`) and owns one row of the logits table; rows are created when a context is
first met, with initial logits that depend only on (seed, context code), never on visit order.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hgpo.options import bad, check_choice, check_int, check_int_array, check_number
from toyenvs import _kernels as kn
from toyenvs._kernels import SEED_MAX
from toyenvs.core import POMDP, check_tasks

__all__ = ["TabularPolicy", "context_radix", "decode_context", "encode_context"]

_INT64_MAX = 2**63 - 1
_INITS = ("uniform", "random")


def context_radix(n_obs: int, n_actions: int, K: int) -> tuple[int, int]:
    """(M, largest code + 1) of the encoding; M = (n_obs + 1) * (n_actions + 1).

    Raises:
        ValueError when M^K * n_obs does not fit in int64.
    """
    n_obs = check_int("n_obs", n_obs, lo=1)
    n_actions = check_int("n_actions", n_actions, lo=1)
    K = check_int("K", K, lo=0)
    M = (n_obs + 1) * (n_actions + 1)
    # (M^K is computed only once it is known to need at most ~64 bits: K = 2**40 would not end)
    fits = K * math.log2(M) <= 64
    size = M**K * n_obs if fits else None
    if size is None or size - 1 > _INT64_MAX:
        bits = size.bit_length() if size is not None else math.ceil(K * math.log2(M))
        raise ValueError(
            f"K={K} contexts over {n_obs} observations and {n_actions} actions need "
            f"{bits} bits; the int64 context code holds 63. Use a smaller K"
        )
    return M, size


def check_temperature(value: Any, where: str = "temperature") -> float:
    """A temperature: a finite number > 0 whose inverse is finite too (1e-320 is not)."""
    value = check_number(where, value, lo=0.0, lo_open=True)
    if not math.isfinite(1.0 / value):
        raise bad(where, "a number > 0 whose inverse is finite", value)
    return value


def encode_context(
    past_obs: Sequence[int], past_actions: Sequence[int], obs: int, *, K: int, n_obs: int,
    n_actions: int,
) -> int:  # fmt: skip
    """Exact int64 code of (o_{t-K}, a_{t-K}, ..., o_{t-1}, a_{t-1}, o_t).

    ``past_obs`` / ``past_actions``: the earlier steps, oldest first, at most K of them (only
    the last K are used); missing older positions are padding. With M = (n_obs+1)(n_actions+1)
    and the pair code o * (n_actions + 1) + a (padding pair M - 1):
    code = (sum_{j<K} pair_{t-1-j} M^j) * n_obs + o_t.
    """
    M, _ = context_radix(n_obs, n_actions, K)
    if len(past_obs) != len(past_actions):
        raise ValueError(
            f"past_obs has {len(past_obs)} entries but past_actions {len(past_actions)}"
        )
    check_int("obs", obs, lo=0, hi=n_obs - 1)
    for i, (o, a) in enumerate(zip(past_obs, past_actions, strict=True)):
        check_int(f"past_obs[{i}]", o, lo=0, hi=n_obs - 1)
        check_int(f"past_actions[{i}]", a, lo=0, hi=n_actions - 1)
    pairs = [int(o) * (n_actions + 1) + int(a) for o, a in zip(past_obs, past_actions, strict=True)]
    pairs = ([M - 1] * K + pairs)[len(pairs) :] if K else []
    P = 0
    for j, pair in enumerate(reversed(pairs)):
        P += pair * M**j
    return P * n_obs + int(obs)


def decode_context(
    code: int, *, K: int, n_obs: int, n_actions: int
) -> tuple[list[int], list[int], int]:
    """Inverse of :func:`encode_context`: (past_obs, past_actions, obs), padding as -1."""
    M, size = context_radix(n_obs, n_actions, K)
    check_int("code", code, lo=0, hi=size - 1)
    P, obs = divmod(int(code), n_obs)
    past_obs, past_actions = [], []
    for _ in range(K):
        P, pair = divmod(P, M)
        if pair == M - 1:
            past_obs.append(-1)
            past_actions.append(-1)
        else:
            o, a = divmod(pair, n_actions + 1)
            past_obs.append(o)
            past_actions.append(a)
    return past_obs[::-1], past_actions[::-1], obs


class TabularPolicy:
    """pi(a | c) = softmax(logits[c] / temperature) over the K-step context c.

    Args:
        env: the POMDP (only its observation and action counts are used).
        K: history length (0 = reactive policy on the current observation).
        temperature: > 0, divides the logits.
        init: "uniform" (zero logits) or "random" (N(0, init_scale^2) per entry, drawn from a
            hash of (seed, context code, action)).
        seed: seed of the random initialisation.
        init_scale: standard deviation of random initial logits.
        capacity: initial number of table rows (grows by doubling).

    Attributes:
        logits: float64[n_contexts, A] writable view of the table (row = dense context index).
        codes: int64[n_contexts] context code of each row.
    """

    def __init__(
        self,
        env: POMDP,
        K: int = 2,
        temperature: float = 1.0,
        init: str = "uniform",
        seed: int = 0,
        init_scale: float = 1.0,
        capacity: int = 1024,
    ) -> None:
        if not isinstance(env, POMDP):
            raise ValueError(f"env must be a toyenvs.POMDP, got {type(env).__name__}")
        self._setup(env.n_obs, env.n_actions, K, temperature, init, seed, init_scale, capacity)
        self.env_name = env.name

    def _setup(
        self, n_obs: int, n_actions: int, K: int, temperature: float, init: str, seed: int,
        init_scale: float, capacity: int,
    ) -> None:  # fmt: skip
        K = check_int("K", K, lo=0)
        temperature = check_temperature(temperature)
        init = check_choice("init", init, _INITS)
        seed = check_int("seed", seed, lo=0, hi=SEED_MAX)
        init_scale = check_number("init_scale", init_scale, lo=0.0)
        capacity = check_int("capacity", capacity, lo=1)
        self.M, self.n_codes = context_radix(n_obs, n_actions, int(K))
        self.n_obs, self.n_actions, self.K = int(n_obs), int(n_actions), int(K)
        self._temperature = float(temperature)
        self._dirty = True
        self.init, self.seed, self.init_scale = init, int(seed), float(init_scale)
        self.powM = np.array([self.M**k for k in range(self.K + 1)], dtype=np.int64)
        self.env_name = ""
        cap = 1 << max(int(capacity) - 1, 1).bit_length()
        self._count = np.zeros(1, dtype=np.int64)
        self._alloc(cap)

    def _alloc(self, cap: int) -> None:
        n = int(self._count[0])
        codes = np.empty(cap, dtype=np.int64)
        logits = np.zeros((cap, self.n_actions))
        if n:
            codes[:n] = self._codes[:n]
            logits[:n] = self._logits[:n]
        self._codes, self._logits = codes, logits
        self._cdf = np.empty((cap, self.n_actions))
        self._htab = np.full(4 * cap, -1, dtype=np.int64)  # 2 * cap slots of (code, row)
        kn.rehash(self._codes, n, self._htab)
        self._dirty = True

    def _grow(self) -> None:
        self._alloc(2 * self._codes.shape[0])

    # ---- table views -------------------------------------------------------------------
    @property
    def n_contexts(self) -> int:
        return int(self._count[0])

    @property
    def capacity(self) -> int:
        return int(self._codes.shape[0])

    @property
    def logits(self) -> np.ndarray:
        # A caller may write through this view: refresh the sampling table before next use.
        self._dirty = True
        return self._logits[: self.n_contexts]

    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_temperature(value)
        self._dirty = True

    @property
    def codes(self) -> np.ndarray:
        return self._codes[: self.n_contexts]

    def kernel_tables(self) -> tuple[Any, ...]:
        """Arguments the kernels take for the table, with the cdf refreshed from the logits."""
        inv_temp = 1.0 / self.temperature
        if self._dirty:
            kn.fill_cdf(self._logits, self._cdf, self.n_contexts, inv_temp)
            self._dirty = False
        mode = kn.INIT_RANDOM if self.init == "random" else kn.INIT_UNIFORM
        return (
            self._htab, self._codes, self._logits, self._cdf, self._count, mode,
            self.seed, self.init_scale, inv_temp,
        )  # fmt: skip

    def run_growing(self, call: Any) -> Any:
        """Run ``call(tables)`` until it succeeds (returns something other than -1/False)."""
        while True:
            out = call(self.kernel_tables())
            ok = out[0] if isinstance(out, tuple) else out
            if ok is not False and not (isinstance(ok, (int, np.integer)) and ok == -1):
                return out
            self._grow()

    def run_visited(self, call: Any, rows_of: Any) -> Any:
        """:meth:`run_growing` (the table is the parameters: nothing to evaluate)."""
        return self.run_growing(call)

    def cover(self, env: POMDP, tasks: np.ndarray) -> None:
        """Nothing to do (the table adds a row when a kernel first meets a context) but check
        ``tasks``."""
        check_tasks(env, tasks)

    def pullback(self, logit_grad: np.ndarray) -> np.ndarray:
        """float64[n_contexts * A]: the parameters are the logits, so dJ/dtheta = dJ/dlogits."""
        return np.asarray(logit_grad, dtype=np.float64).reshape(-1).copy()

    def pullbacks(self, logit_grads: Sequence[np.ndarray]) -> np.ndarray:
        """float64[len(logit_grads), n_contexts * A]: :meth:`pullback` of each."""
        return np.stack([self.pullback(G) for G in logit_grads])

    # ---- lookups -----------------------------------------------------------------------
    def index_of(self, codes: np.ndarray, insert: bool = True) -> np.ndarray:
        """int64 dense rows of context codes; new codes get a row (or -1 when ``insert=False``)."""
        codes = np.ascontiguousarray(check_int_array("codes", codes))
        if codes.size and (codes.min() < 0 or codes.max() >= self.n_codes):
            raise ValueError(f"context codes must lie in 0..{self.n_codes - 1}")
        if not insert:
            return kn.table_find_many(codes, self._htab)
        while True:
            rows, ok = kn.table_insert_many(codes, *self.kernel_tables())
            if ok:
                return rows
            self._grow()

    def _rows(self, context_ids: np.ndarray) -> np.ndarray:
        ids = check_int_array("context_ids", context_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_contexts):
            raise ValueError(f"context_ids must lie in 0..{self.n_contexts - 1}")
        return ids

    def logits_of(self, context_ids: np.ndarray) -> np.ndarray:
        """float64[..., A] logits of dense context rows."""
        return self._logits[self._rows(context_ids)]

    def probs(self, context_ids: np.ndarray) -> np.ndarray:
        """float64[..., A] action probabilities softmax(logits / temperature) of dense rows."""
        z = self.logits_of(context_ids) / self.temperature
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)

    def log_probs(self, context_ids: np.ndarray) -> np.ndarray:
        z = self.logits_of(context_ids) / self.temperature
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))

    def encode(self, past_obs: Sequence[int], past_actions: Sequence[int], obs: int) -> int:
        """Context code of a history (see :func:`encode_context`)."""
        return encode_context(
            past_obs, past_actions, obs, K=self.K, n_obs=self.n_obs, n_actions=self.n_actions
        )

    def decode(self, code: int) -> tuple[list[int], list[int], int]:
        return decode_context(code, K=self.K, n_obs=self.n_obs, n_actions=self.n_actions)

    def copy(self) -> TabularPolicy:
        new = TabularPolicy.__new__(TabularPolicy)
        new.__dict__.update(self.__dict__)
        new._count = self._count.copy()
        new._codes, new._logits = self._codes.copy(), self._logits.copy()
        new._cdf, new._htab = self._cdf.copy(), self._htab.copy()
        return new

    # ---- persistence -------------------------------------------------------------------
    def snapshot(self, path: str | os.PathLike[str]) -> None:
        """Save codes, logits and settings to an ``.npz`` file."""
        meta = {
            "n_obs": self.n_obs, "n_actions": self.n_actions, "K": self.K,
            "temperature": self.temperature, "init": self.init, "seed": self.seed,
            "init_scale": self.init_scale, "env_name": self.env_name,
        }  # fmt: skip
        with open(path, "wb") as f:
            np.savez(f, codes=self.codes, logits=self.logits, meta=np.array(json.dumps(meta)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TabularPolicy:
        """Load a policy saved by :meth:`snapshot` (same rows, same order)."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            codes, logits = data["codes"], data["logits"]
        pol = cls.__new__(cls)
        pol._setup(
            meta["n_obs"], meta["n_actions"], meta["K"], meta["temperature"], meta["init"],
            meta["seed"], meta["init_scale"], max(codes.shape[0], 1),
        )  # fmt: skip
        pol.env_name = meta["env_name"]
        pol.index_of(codes)
        pol.logits[:] = logits
        return pol

    def __repr__(self) -> str:
        return (
            f"TabularPolicy(K={self.K}, temperature={self.temperature}, init={self.init!r}, "
            f"n_contexts={self.n_contexts}, n_obs={self.n_obs}, n_actions={self.n_actions})"
        )
