"""A neural policy over the K-step context (MLP or small transformer) that the kernels sample.

``NeuralPolicy(env, K, arch="mlp" | "transformer", width=64, layers=2, seed=0)`` reads the same
context as :class:`toyenvs.TabularPolicy`, c_t = (o_{t-K}, a_{t-K}, ..., o_{t-1}, a_{t-1}, o_t),
as 2K + 1 tokens: token j = embedding of its observation (or action) + embedding of position j,
with a padding observation / action before t = 0. Unlike the table, contexts share parameters,
so what is learnt in one context moves the others: the policy generalises, like an LLM agent's.

How rollouts stay fast (the choice): the set of contexts a chain can reach does not depend on
the policy (a softmax gives every action a positive probability), so the policy enumerates
every context reachable from the start states once (a breadth-first search over (hidden state,
context) pairs, :func:`toyenvs._kernels.reachable_contexts`), evaluates the network on that
table in one batched forward whenever its parameters have changed, and hands the numba kernels
the resulting logits and cumulative probabilities: the same table layout the tabular policy
uses, so ``rollout``, ``exact_ground_truth`` and ``mc_ground_truth`` run unchanged and a
rollout step costs what a tabular one costs. One forward per iteration over a few hundred to a
few thousand contexts costs less than a batched forward per time step would (one per step of
the horizon, each paying torch's per-call overhead), and the sampling probabilities are the
network's own, held in float64 (the network computes in ``dtype``, float64 by default). The
table is full by construction: a kernel that met a context outside it could not insert one
(:meth:`NeuralPolicy.run_growing` raises instead of inventing logits).

The exact gradient of J with respect to the parameters is the exact gradient with respect to
the logits pushed through the network: dJ/dtheta = sum_{c, b} dJ/dl_b(c) dl_b(c)/dtheta
(:meth:`NeuralPolicy.pullback`, one backward pass over the rows with a non-zero logit
gradient; :meth:`NeuralPolicy.pullbacks` shares the forward pass among several gradients).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hgpo.options import bad, check_choice, check_int, check_int_array, check_number
from toyenvs import _kernels as kn
from toyenvs._kernels import SEED_MAX
from toyenvs.core import POMDP, check_tasks
from toyenvs.policy import check_temperature, context_radix, decode_context, encode_context

__all__ = ["ARCHS", "DTYPES", "ContextNet", "NeuralPolicy", "check_neural"]

ARCHS = ("mlp", "transformer")
EVALUATE = ("table", "visited")
DTYPES = ("float64", "float32")
_CHUNK = 8192  # rows per forward pass: bounds the memory of a transformer over a large table


class _Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN x), then x + MLP(LN x) (GELU, 2x width)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor, qkv: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, L, w] -> [n, L, w]; ``qkv``: qkv(LN x) when the caller already has it."""
        n, L, w = x.shape
        if qkv is None:
            qkv = self.qkv(self.ln1(x))
        q, k, v = qkv.view(n, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (n, heads, L, w / heads)
        x = x + self.proj(y.transpose(1, 2).reshape(n, L, w))
        return x + self.ff(self.ln2(x))

    def last(self, x: torch.Tensor, qkv: torch.Tensor | None = None) -> torch.Tensor:
        """``forward(x, qkv)[:, -1]`` at a fraction of the cost: every token's key and value,
        but only the last token's query, projection and MLP (the head reads nothing else)."""
        n, L, w = x.shape
        if qkv is None:
            h = self.ln1(x)
            wq, wkv = self.qkv.weight.split([w, 2 * w])
            bq, bkv = self.qkv.bias.split([w, 2 * w])
            q, kv = F.linear(h[:, -1], wq, bq), F.linear(h, wkv, bkv)
        else:
            q, kv = qkv[:, -1, :w], qkv[:, :, w:]
        k, v = kv.reshape(n, L, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q.reshape(n, self.heads, 1, -1), k, v)
        x = x[:, -1] + self.proj(y.reshape(n, w))  # y: (n, heads, 1, w / heads)
        return x + self.ff(self.ln2(x))


class ContextNet(nn.Module):
    """Logits over the actions from the 2K + 1 context tokens.

    "mlp": the token embeddings concatenated, ``layers`` tanh layers of ``width``, a linear head.
    "transformer": ``layers`` pre-norm blocks of ``width`` (heads: the largest of 4, 2, 1 that
    divides ``width``), attention over the whole window, the head reads the last token (o_t).
    The head's weights are N(0, init_scale^2 / width) and its bias 0: init_scale = 0 starts at
    the uniform policy, like TabularPolicy's default.

    ``last_token_only`` (transformer): compute only what the head reads, the same function up
    to rounding in about 0.6x the time (:meth:`forward`). Off, every block runs over every
    token: the computation behind the documented float64 runs, which it keeps bit for bit
    (NeuralPolicy turns it on with float32 only: a changed rounding sends a long training
    run down another path).
    """

    def __init__(
        self, n_obs: int, n_actions: int, K: int, arch: str, width: int, layers: int,
        init_scale: float,
    ) -> None:  # fmt: skip
        super().__init__()
        self.K, self.arch = K, arch
        self.last_token_only = False
        L = 2 * K + 1
        self.obs_emb = nn.Embedding(n_obs + 1, width)  # id n_obs = padding
        self.act_emb = nn.Embedding(n_actions + 1, width)  # id n_actions = padding
        self.pos_emb = nn.Parameter(0.1 * torch.randn(L, width))
        if arch == "mlp":
            dims = [L * width] + [width] * layers
            self.trunk = nn.Sequential(
                *(m for i in range(layers) for m in (nn.Linear(dims[i], dims[i + 1]), nn.Tanh()))
            )
        else:
            heads = next(h for h in (4, 2, 1) if width % h == 0)
            self.trunk = nn.Sequential(*(_Block(width, heads) for _ in range(layers)))
            self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, n_actions)
        with torch.no_grad():
            self.head.weight.normal_(0.0, init_scale / width**0.5)
            self.head.bias.zero_()

    def forward(self, obs_tok: torch.Tensor, act_tok: torch.Tensor) -> torch.Tensor:
        """obs_tok int64[n, K + 1] (oldest first, o_t last), act_tok int64[n, K] -> logits[n, A].

        With ``last_token_only``, the transformer's first block reads its LayerNorm and
        query/key/value projections of token j from a table over (j, token id), computed once
        per call (:meth:`window_table`), and its last block computes the last token only."""
        n, K = obs_tok.shape[0], self.K
        eo, ea = self.obs_emb(obs_tok), self.act_emb(act_tok)
        pairs = torch.stack([eo[:, :K], ea], dim=2).reshape(n, 2 * K, eo.shape[2])
        x = torch.cat([pairs, eo[:, K:]], dim=1) + self.pos_emb
        if self.arch == "mlp":
            return self.head(self.trunk(x.reshape(n, -1)))
        if not self.last_token_only:
            return self.head(self.ln_f(self.trunk(x))[:, -1])
        first, *rest = self.trunk
        qkv = first.qkv(first.ln1(self.window_table()))[self.window_rows(obs_tok, act_tok)]
        if not rest:
            return self.head(self.ln_f(first.last(x, qkv)))
        x = first(x, qkv)
        *middle, last = rest
        for block in middle:
            x = block(x)
        return self.head(self.ln_f(last.last(x)))

    def window_table(self) -> torch.Tensor:
        """[L V, w]: row j V + i is the input (embedding + position embedding) of token id i at
        position j; ids 0..n_obs are observations, n_obs + 1 + a is action a (V = n_obs +
        n_actions + 2, the paddings included)."""
        emb = torch.cat([self.obs_emb.weight, self.act_emb.weight])
        return (emb[None] + self.pos_emb[:, None]).reshape(-1, emb.shape[1])

    def window_rows(self, obs_tok: torch.Tensor, act_tok: torch.Tensor) -> torch.Tensor:
        """int64[n, L] rows of :meth:`window_table` of each context's tokens."""
        n_o = self.obs_emb.num_embeddings
        V = n_o + self.act_emb.num_embeddings
        ids = torch.empty((obs_tok.shape[0], 2 * self.K + 1), dtype=torch.int64)
        ids[:, 0::2], ids[:, 1::2] = obs_tok, act_tok + n_o
        return ids + V * torch.arange(2 * self.K + 1)


def check_neural(env: Any, K: Any, arch: Any, width: Any, layers: Any, seed: Any) -> None:
    """Every argument of :class:`NeuralPolicy`, checked before any work (OptionError)."""
    if not isinstance(env, POMDP):
        raise bad("NeuralPolicy.env", "a toyenvs.POMDP", type(env).__name__)
    check_int("NeuralPolicy.K", K, lo=0)
    check_choice("NeuralPolicy.arch", arch, ARCHS)
    check_int("NeuralPolicy.width", width, lo=1)
    check_int("NeuralPolicy.layers", layers, lo=1)
    check_int("NeuralPolicy.seed", seed, lo=0, hi=SEED_MAX)
    try:
        context_radix(env.n_obs, env.n_actions, int(K))
    except ValueError:
        raise bad(
            "NeuralPolicy.K",
            f"small enough that the context code of {env.n_obs} observations and "
            f"{env.n_actions} actions fits in int64",
            K,
        ) from None


def _tokens(codes: np.ndarray, K: int, n_obs: int, n_actions: int) -> tuple[np.ndarray, ...]:
    """Context codes -> (obs tokens int64[n, K + 1], action tokens int64[n, K]), padding = n."""
    M = (n_obs + 1) * (n_actions + 1)
    P, o_t = np.divmod(codes, n_obs)
    obs = np.empty((codes.size, K + 1), dtype=np.int64)
    act = np.empty((codes.size, K), dtype=np.int64)
    obs[:, K] = o_t
    for j in range(K):  # pair of step t-1-j sits at digit j; the padding pair M - 1 decodes
        P, pair = np.divmod(P, M)  # to (n_obs, n_actions), the padding ids of the embeddings
        obs[:, K - 1 - j], act[:, K - 1 - j] = np.divmod(pair, n_actions + 1)
    return obs, act


class NeuralPolicy:
    """pi(a | c) = softmax(net(c) / temperature), net an MLP or a transformer (see module doc).

    Args:
        env: the POMDP; its tasks' reachable contexts are enumerated at once (other start states
            are added when a rollout first uses them, :meth:`cover`).
        K: history length. arch: "mlp" or "transformer". width: hidden / model width (also the
            embedding width). layers: hidden layers (mlp) or blocks (transformer).
        seed: seed of the initial parameters. temperature: > 0, divides the logits.
        init_scale: standard deviation of the initial logits (0: the uniform policy).
        evaluate: "table" or "visited" (:attr:`evaluate`).
        dtype: the network's precision, "float64" or "float32" (4-6x faster forward and
            backward passes on CPU, docs/toyenvs.md). The table holds its logits in float64
            either way, and the kernels and the exact truth read that table: the truth is exact
            for the policy the rollouts sample. Only the parameter gradients (:meth:`pullbacks`,
            training) carry the network's rounding.

    Raises:
        hgpo.options.OptionError (a ValueError) naming the argument, before any work.

    Attributes:
        net: the torch module (in ``dtype``). logits / codes: float64[n_contexts, A] / int64
        views of the table the kernels sample from (read-only; refreshed when the parameters
        change).
    """

    def __init__(
        self, env: POMDP, K: int = 2, arch: str = "mlp", width: int = 64, layers: int = 2,
        seed: int = 0, temperature: float = 1.0, init_scale: float = 0.0,
        evaluate: str = "table", dtype: str = "float64",
    ) -> None:  # fmt: skip
        check_neural(env, K, arch, width, layers, seed)
        check_choice("NeuralPolicy.evaluate", evaluate, EVALUATE)
        check_choice("NeuralPolicy.dtype", dtype, DTYPES)
        check_temperature(temperature, "NeuralPolicy.temperature")
        check_number("NeuralPolicy.init_scale", init_scale, lo=0)
        meta = {
            "n_obs": env.n_obs, "n_actions": env.n_actions, "K": int(K), "arch": arch,
            "width": int(width), "layers": int(layers), "seed": int(seed),
            "temperature": float(temperature), "init_scale": float(init_scale),
            "env_name": env.name, "evaluate": evaluate, "dtype": dtype,
        }  # fmt: skip
        self._setup(meta)
        self.cover(env, env.tasks)

    def _setup(self, meta: dict[str, Any]) -> None:
        self.meta = dict(meta)
        self.n_obs, self.n_actions, self.K = meta["n_obs"], meta["n_actions"], meta["K"]
        self.arch, self.width, self.layers = meta["arch"], meta["width"], meta["layers"]
        self.seed, self.init_scale, self.env_name = (
            meta["seed"],
            meta["init_scale"],
            meta["env_name"],
        )
        self.M, self.n_codes = context_radix(self.n_obs, self.n_actions, self.K)
        self.powM = np.array([self.M**k for k in range(self.K + 1)], dtype=np.int64)
        self._temperature = float(meta["temperature"])
        self.meta.setdefault("evaluate", "table")  # snapshots from before these options
        self.meta.setdefault("dtype", "float64")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            net = ContextNet(self.n_obs, self.n_actions, self.K, self.arch, self.width,
                             self.layers, self.init_scale)  # fmt: skip
        self.net = net.to(getattr(torch, self.meta["dtype"]))
        self.net.last_token_only = self.meta["dtype"] == "float32"  # see ContextNet
        self._covered: dict[int, set[int]] = {}
        self._set_table(np.zeros(0, dtype=np.int64))

    # ---- the table the kernels read ---------------------------------------------------------
    def _set_table(self, codes: np.ndarray) -> None:
        """Rows for exactly ``codes`` (no spare row: a kernel cannot insert a context)."""
        n = codes.size
        cap = 1 << max(n - 1, 1).bit_length()
        self._codes = np.ascontiguousarray(codes, dtype=np.int64)
        self._count = np.array([n], dtype=np.int64)
        self._htab = np.full(4 * cap, -1, dtype=np.int64)
        kn.rehash(self._codes, n, self._htab)
        obs, act = _tokens(self._codes, self.K, self.n_obs, self.n_actions)
        self._obs_tok, self._act_tok = torch.from_numpy(obs), torch.from_numpy(act)
        self._logits = np.zeros((n, self.n_actions))
        self._cdf = np.zeros((n, self.n_actions))
        self._synced: tuple | None = None  # the version every row was evaluated at
        self._fresh = np.zeros(n, dtype=np.bool_)  # "visited": rows evaluated at _fresh_of
        self._fresh_of: tuple | None = None

    def _version(self) -> tuple:
        # In-place updates (optimizer steps, load_state_dict, copy_) bump a tensor's version.
        return (self._temperature, *(p._version for p in self.net.parameters()))

    def refresh(self) -> None:
        """Re-evaluate the network on every row now (automatic after in-place updates)."""
        with torch.no_grad():
            out = [self.net(self._obs_tok[i : i + _CHUNK], self._act_tok[i : i + _CHUNK])
                   for i in range(0, self.n_contexts, _CHUNK)]  # fmt: skip
        if out:
            self._logits[:] = torch.cat(out).numpy()
        kn.fill_cdf(self._logits, self._cdf, self.n_contexts, 1.0 / self._temperature)
        self._synced = self._fresh_of = self._version()
        self._fresh[:] = True

    def _sync(self) -> None:
        if self._synced != self._version():
            self.refresh()

    @property
    def n_contexts(self) -> int:
        return int(self._codes.size)

    @property
    def capacity(self) -> int:
        return self.n_contexts

    @property
    def codes(self) -> np.ndarray:
        return self._codes

    @property
    def logits(self) -> np.ndarray:
        self._sync()
        view = self._logits.view()
        view.setflags(write=False)
        return view

    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_temperature(value, "NeuralPolicy.temperature")

    def kernel_tables(self) -> tuple[Any, ...]:
        """The kernels' table arguments (same layout as TabularPolicy), refreshed if stale."""
        self._sync()
        return self._tables()

    def _tables(self) -> tuple[Any, ...]:
        return (
            self._htab, self._codes, self._logits, self._cdf, self._count, kn.INIT_UNIFORM,
            self.seed, 0.0, 1.0 / self._temperature,
        )  # fmt: skip

    def run_growing(self, call: Callable[[tuple], Any]) -> Any:
        """Run ``call(tables)`` once; a full-table signal means a context was never enumerated."""
        return self._run(call, self.kernel_tables())

    @staticmethod
    def _run(call: Callable[[tuple], Any], tables: tuple) -> Any:
        out = call(tables)
        ok = out[0] if isinstance(out, tuple) else out
        if ok is False or (isinstance(ok, (int, np.integer)) and ok == -1):
            raise RuntimeError(
                "NeuralPolicy met a context outside its enumerated table; call "
                "pol.cover(env, tasks) with the start states first"
            )
        return out

    @property
    def evaluate(self) -> str:
        """Where the network is evaluated after its parameters change: "table", every row at
        once (the kernels' tables are always whole); "visited", for rollouts only the rows
        they visit (:meth:`run_visited`), any other reader of the whole table still gets it
        whole. The same probabilities either way, up to rounding (a forward over a
        different set of rows can differ in the last bit)."""
        return self.meta["evaluate"]

    @evaluate.setter
    def evaluate(self, value: str) -> None:
        self.meta["evaluate"] = check_choice("NeuralPolicy.evaluate", value, EVALUATE)

    def run_visited(
        self, call: Callable[[tuple], Any], rows_of: Callable[[Any], np.ndarray]
    ) -> Any:
        """Run a rollout kernel ``call(tables)``; ``rows_of(out)``: the table rows it visited.

        "table": :meth:`run_growing`. "visited": the rows not evaluated at the current
        parameters hold NaN probabilities (the kernel then draws action 0, a wrong step); after
        each run the visited rows among them are evaluated in one batched forward and the
        rollout is run again, until it visits no unevaluated row. Trajectories draw from their
        own streams, so each run repeats the previous one up to the first unevaluated row of
        each trajectory and goes at least one step further: at most horizon + 1 runs, and the
        last one is the rollout of the whole table's probabilities.
        """
        if self.evaluate == "table" or self._synced == self._version():
            return self.run_growing(call)
        self._start_visited()
        tables = self._tables()
        while True:
            out = self._run(call, tables)
            if not self._evaluate_rows(rows_of(out)):
                return out

    def _start_visited(self) -> None:
        """Mark every row unevaluated (NaN) when the parameters changed since the last marking."""
        if self._fresh_of != self._version():
            self._fresh[:] = False
            self._logits[:] = np.nan
            self._cdf[:] = np.nan
            self._fresh_of, self._synced = self._version(), None

    def _evaluate_rows(self, rows: np.ndarray) -> int:
        """Evaluate the unevaluated rows among ``rows`` (one batched forward); how many."""
        rows = np.unique(rows)
        rows = rows[~self._fresh[rows]]
        if rows.size:
            with torch.no_grad():
                z = torch.cat([self.forward_rows(rows[i : i + _CHUNK])
                               for i in range(0, rows.size, _CHUNK)]).double().numpy()  # fmt: skip
            cdf = np.empty_like(z)
            kn.fill_cdf(z, cdf, rows.size, 1.0 / self._temperature)
            self._logits[rows], self._cdf[rows] = z, cdf
            self._fresh[rows] = True
        return int(rows.size)

    def cover(self, env: POMDP, tasks: np.ndarray) -> None:
        """Add rows for every context reachable from the start states ``tasks`` of ``env``."""
        tasks = check_tasks(env, tasks)
        done = self._covered.setdefault(id(env), set())
        new = sorted({int(s) for s in tasks} - done)
        if not new:
            return
        codes = kn.reachable_contexts(
            np.array(new, dtype=np.int64), self.K, self.n_obs, self.powM, env.obs_of_state,
            env.next_state, env.next_prob, env.terminal,
        )  # fmt: skip
        self.index_of(codes)
        done.update(new)

    def index_of(self, codes: np.ndarray, insert: bool = True) -> np.ndarray:
        """int64 rows of context codes; new codes get rows (or -1 when ``insert=False``)."""
        codes = np.ascontiguousarray(check_int_array("codes", codes))
        if codes.size and (codes.min() < 0 or codes.max() >= self.n_codes):
            raise ValueError(f"context codes must lie in 0..{self.n_codes - 1}")
        rows = kn.table_find_many(codes, self._htab)
        if insert and (rows < 0).any():
            fresh = codes[rows < 0]
            _, first = np.unique(fresh, return_index=True)
            self._set_table(np.concatenate([self._codes, fresh[np.sort(first)]]))
            rows = kn.table_find_many(codes, self._htab)
        return rows

    # ---- probabilities, torch forward, gradients ------------------------------------------
    def _rows(self, context_ids: np.ndarray) -> np.ndarray:
        ids = check_int_array("context_ids", context_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_contexts):
            raise ValueError(f"context_ids must lie in 0..{self.n_contexts - 1}")
        return ids

    def logits_of(self, context_ids: np.ndarray) -> np.ndarray:
        """float64[..., A] logits of table rows ("visited": only these rows are evaluated)."""
        rows = self._rows(context_ids)
        if self.evaluate == "table":
            self._sync()
        else:
            self._start_visited()
            self._evaluate_rows(rows.ravel())
        return self._logits[rows]

    def log_probs(self, context_ids: np.ndarray) -> np.ndarray:
        z = self.logits_of(context_ids) / self.temperature
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))

    def probs(self, context_ids: np.ndarray) -> np.ndarray:
        """float64[..., A] softmax(logits / temperature) of table rows."""
        return np.exp(self.log_probs(context_ids))

    def forward_rows(self, context_ids: np.ndarray, net: ContextNet | None = None) -> torch.Tensor:
        """[n, A] logits of table rows as a torch tensor (the network's dtype) with autograd.

        ``net``: another network of the same shape to evaluate on these rows (a reference copy).
        """
        r = torch.from_numpy(self._rows(context_ids))
        return (net or self.net)(self._obs_tok[r], self._act_tok[r])

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.net.parameters())

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    def pullback(self, logit_grad: np.ndarray) -> np.ndarray:
        """float64[n_parameters] sum_{c, b} G[c, b] d logit_b(c) / d theta, G = ``logit_grad``.

        ``logit_grad``: float64[n_rows, A] over the first n_rows table rows (dJ/dlogits gives
        dJ/dtheta). Parameters in ``net.parameters()`` order, flattened.
        """
        return self.pullbacks([logit_grad])[0]

    def pullbacks(
        self, logit_grads: Sequence[np.ndarray], rows: np.ndarray | None = None
    ) -> np.ndarray:
        """float64[len(logit_grads), n_parameters]: :meth:`pullback` of each, over the union of
        their non-zero rows with one forward pass per chunk of rows and one backward per
        gradient (the graph is kept between them): a forward costs about what a backward does.

        ``rows``: int64[m] the table rows the gradients are given on (each [m, A]; zero on the
        other rows), so a gradient on a few visited rows of a large table costs no full array;
        default the first rows 0..m-1 (a gradient over the table).
        """
        Gs = [np.asarray(G, dtype=np.float64) for G in logit_grads]
        if not Gs:
            return np.zeros((0, self.n_parameters))
        at = np.arange(Gs[0].shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
        if any(G.shape != (at.size, self.n_actions) for G in Gs):
            shapes = sorted({G.shape for G in Gs})
            raise ValueError(
                f"NeuralPolicy.pullbacks: each gradient must have shape ({at.size}, "
                f"{self.n_actions}) (rows x actions), got {shapes}"
            )
        keep = np.flatnonzero(np.any([np.any(G != 0, axis=1) for G in Gs], axis=0))
        params = self.parameters()
        total = torch.zeros((len(Gs), self.n_parameters), dtype=torch.float64)
        for i in range(0, keep.size, _CHUNK):
            k = keep[i : i + _CHUNK]
            z = self.forward_rows(at[k])
            for j, G in enumerate(Gs):
                grads = torch.autograd.grad(
                    z, params, torch.from_numpy(G[k]).to(z.dtype), retain_graph=j + 1 < len(Gs),
                    allow_unused=True,
                )  # fmt: skip
                total[j] += torch.cat([  # chunks summed in float64
                    torch.zeros(p.numel(), dtype=p.dtype) if g is None else g.reshape(-1)
                    for p, g in zip(params, grads, strict=True)
                ])  # fmt: skip
        return total.numpy()

    def flat_parameters(self) -> np.ndarray:
        """float64[n_parameters] (``net.parameters()`` order, flattened)."""
        vec = nn.utils.parameters_to_vector(self.net.parameters()).detach()
        return vec.double().numpy().copy()

    def set_flat_parameters(self, vec: np.ndarray) -> None:
        """Overwrite the parameters from a flat vector (``flat_parameters`` order); every
        value finite."""
        vec = np.asarray(vec)
        n = sum(p.numel() for p in self.net.parameters())
        if vec.shape != (n,) or vec.dtype.kind not in "iuf":
            raise bad("set_flat_parameters", f"a float vector of the {n} parameters",
                      f"{vec.dtype} of shape {vec.shape}")  # fmt: skip
        if not np.isfinite(vec).all():
            i = int(np.flatnonzero(~np.isfinite(vec))[0])
            raise bad(f"set_flat_parameters: parameter {i}", "a finite number", float(vec[i]))
        with torch.no_grad():
            dtype = next(self.net.parameters()).dtype  # the network keeps its precision
            nn.utils.vector_to_parameters(torch.as_tensor(vec, dtype=dtype),
                                          self.net.parameters())  # fmt: skip
        self._synced = None  # vector_to_parameters assigns .data: versions do not move
        self._fresh_of = None

    # ---- contexts, copies, persistence ------------------------------------------------------
    def encode(self, past_obs: Sequence[int], past_actions: Sequence[int], obs: int) -> int:
        return encode_context(
            past_obs, past_actions, obs, K=self.K, n_obs=self.n_obs, n_actions=self.n_actions
        )

    def decode(self, code: int) -> tuple[list[int], list[int], int]:
        return decode_context(code, K=self.K, n_obs=self.n_obs, n_actions=self.n_actions)

    def copy(self) -> NeuralPolicy:
        new = NeuralPolicy.__new__(NeuralPolicy)
        new._setup({**self.meta, "temperature": self._temperature})
        new.net.load_state_dict(self.net.state_dict())
        new._set_table(self._codes.copy())
        new._covered = {k: set(v) for k, v in self._covered.items()}
        return new

    def snapshot(self, path: str | os.PathLike[str]) -> None:
        """Save settings, parameters and table codes to an ``.npz`` file."""
        meta = {**self.meta, "temperature": self._temperature}
        params = {f"param.{k}": v.detach().numpy() for k, v in self.net.state_dict().items()}
        with open(path, "wb") as f:
            np.savez(f, codes=self._codes, meta=np.array(json.dumps(meta)), **params)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NeuralPolicy:
        """Load a policy saved by :meth:`snapshot` (same parameters, same rows in order)."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            codes = data["codes"]
            state = {k[6:]: torch.from_numpy(data[k]) for k in data.files if k.startswith("param.")}
        pol = cls.__new__(cls)
        pol._setup(meta)
        pol.net.load_state_dict(state)
        pol._set_table(codes)
        return pol

    def __repr__(self) -> str:
        return (
            f"NeuralPolicy(K={self.K}, arch={self.arch!r}, width={self.width}, "
            f"layers={self.layers}, n_parameters={self.n_parameters}, "
            f"n_contexts={self.n_contexts}, temperature={self.temperature})"
        )
