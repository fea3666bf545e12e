"""What a float32 network changes in the exact truth the bias/variance study reads.

    python -m benchmarks.neural_precision                     # the cells below, one core
    python -m benchmarks.neural_precision --cells keydoor:size=5:2:0.3:transformer
    python -m benchmarks.neural_precision --speed             # forward / backward seconds

For each cell (env spec : K : success target : arch) the stage is made as the study makes it
(``neural_expert_stages`` with a float32 network, seed 0); then the same parameters are loaded
into a float64 network (exactly: a float32 number is a float64 number) and both exact truths
are solved. Printed per cell: the largest difference of the two logit tables the rollouts
would sample from, of A* over every chain node, J of each, and the relative error and cosine
of the float32 parameter gradients (discounted dJ/dtheta and undiscounted) against the
float64 ones. The table, the chain and the solver are float64 in both; the differences are
the network's float32 rounding, in its logits and in the gradients' pullback.

``--speed``: CPU seconds of a forward, and of a forward plus a backward, over 65,536 contexts
of the household at K = 4 (chunks of 8,192 rows, one thread), per arch and precision (the
float32 transformer computes only what its head reads, ``ContextNet.last_token_only``).
"""

from __future__ import annotations

import time

import numpy as np

import toyenvs
from hgpo.options import ArgumentParser
from studies.metrics import cosine_relerr
from studies.stages import parse_env
from studies.tabular import neural_expert_stages

HOUSEHOLD = "household:n_rooms=1,receptacles_per_room=5,n_tasks=4,horizon=8"
CELLS = (
    "keydoor:size=5:2:0.3:transformer",
    "keydoor:size=5:4:0.3:transformer",
    f"{HOUSEHOLD}:2:0.3:transformer",
    f"{HOUSEHOLD}:4:0.3:transformer",
    f"{HOUSEHOLD}:4:0.3:mlp",
)


def measure(cell: str) -> dict[str, float | str | int]:
    """The figures of one "env:K:target:arch" cell (module docstring)."""
    import torch

    torch.set_num_threads(1)
    env_spec, K, target, arch = cell.rsplit(":", 3)
    name, params = parse_env(env_spec)
    env = toyenvs.make(name, **params)
    t0 = time.perf_counter()
    (stage,) = neural_expert_stages(
        env, lambda: toyenvs.NeuralPolicy(env, int(K), arch, dtype="float32"), (float(target),)
    )
    p32 = stage.policy
    p64 = toyenvs.NeuralPolicy(env, int(K), arch, dtype="float64")
    p64.set_flat_parameters(p32.flat_parameters())
    g32, g64 = toyenvs.exact_ground_truth(env, p32), toyenvs.exact_ground_truth(env, p64)
    cos, rel = cosine_relerr(g32.parameter_gradient, g64.parameter_gradient)
    cos_u, rel_u = cosine_relerr(
        g32.parameter_gradient_undiscounted, g64.parameter_gradient_undiscounted
    )
    return {
        "cell": cell.replace(HOUSEHOLD, "household"), "contexts": p32.n_contexts,
        "success": stage.success, "logits": float(np.abs(p32.logits - p64.logits).max()),
        "A*": float(np.abs(g32.A - g64.A).max()), "J32": g32.J, "J64": g64.J,
        "grad rel": rel, "1-cos": 1 - cos, "undisc rel": rel_u, "1-cos u": 1 - cos_u,
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def speed(n: int = 65536, chunk: int = 8192) -> None:
    """Print the --speed figures (module docstring)."""
    import torch

    torch.set_num_threads(1)
    env = toyenvs.make("household", n_rooms=1, receptacles_per_room=5, n_tasks=4, horizon=8)
    for arch in ("mlp", "transformer"):
        for dtype in ("float64", "float32"):
            pol = toyenvs.NeuralPolicy(env, 4, arch, init_scale=1.0, dtype=dtype)
            rows = [np.arange(i, i + chunk) for i in range(0, n, chunk)]
            G = torch.ones((chunk, env.n_actions), dtype=getattr(torch, dtype))
            with torch.no_grad():
                pol.forward_rows(rows[0])  # warm
                t0 = time.process_time()
                for r in rows:
                    pol.forward_rows(r)
                fwd = time.process_time() - t0
            t0 = time.process_time()
            for r in rows:
                torch.autograd.grad(pol.forward_rows(r), pol.parameters(), G)
            both = time.process_time() - t0
            print(f"{arch:<12} {dtype}: forward {fwd:6.2f} s   forward + backward {both:6.2f} s"
                  f"   ({n:,} contexts, household K = 4)")  # fmt: skip


def main() -> None:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--cells", nargs="+", default=list(CELLS), help="env:K:target:arch ...")
    ap.add_argument("--speed", action="store_true", help="only the forward / backward seconds")
    args = ap.parse_args()
    if args.speed:
        return speed()
    for cell in args.cells:
        r = measure(cell)
        print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
