"""Shared helpers of the trainer tests: CLI runs in subprocesses, offline, on one thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[2]
GAMES = ROOT / "tests" / "agentenvs" / "data" / "alfworld_games"


def run_env() -> dict[str, str]:
    """Environment of a trainer subprocess: offline, one thread, no launcher variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(
    args: list[str], extra_env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m hgpo.train ARGS`` from the repository root."""
    env = run_env()
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "hgpo.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
