"""Process-group setup: one code path for a single CPU process, torchrun and the deepspeed launcher."""

from __future__ import annotations

import os
import socket
from typing import Any


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_launcher_env() -> None:
    """Set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for a single process when no
    launcher did (DeepSpeed otherwise looks for MPI)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def init(device: str) -> tuple[int, int, Any]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on GPU).

    Returns (rank, world_size, torch.device).
    """
    import deepspeed
    import deepspeed.ops
    import torch

    ensure_launcher_env()
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not use_cuda and os.environ.get("HGPO_DS_SHM_COMM", "0") != "1":
        # DeepSpeed compiles a shared-memory all-reduce with g++ (about 30 s) when its CPU
        # backend starts; gloo alone serves this trainer's few collectives.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if use_cuda else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), dev


def barrier() -> None:
    """Wait for every rank."""
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (on every rank)."""
    import torch

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def all_max(value: int) -> int:
    """The largest ``value`` over ranks."""
    return max(gather(int(value)))
