"""The README's timed commands, timed again, with the machine and its load beside each figure.

Run: ``python -m benchmarks.readme_timings [--only main_job tiny_webshop] [--out DIR]``.

Each command of the README that comes with a time is run as the README gives it (output
redirected to a temporary folder, or ``--out``), and one line is printed per command::

    main_job      41.2 s wall   2 cores (AMD EPYC ...), load average 0.9 before, 1.4 after

The load average (``os.getloadavg()``, one minute) is read before and after, and the number of
other busy processes is what it says: a figure taken at load 4 on 2 cores runs 2-3x longer than
one taken alone. The README and docs quote these lines with their load.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hgpo.options import ArgumentParser

#: name -> (the README's command after ``python -m``, the flag that takes the output folder)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "main_job": (["studies.bias_variance"], "--out"),
    "tiny_webshop": (["hgpo.train", "--preset", "tiny", "--env", "webshop"], "--out-dir"),
}


def machine() -> str:
    """'N cores (CPU model)': what the figures were measured on."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model})"


def time_command(argv: list[str], out_flag: str, out: Path, timeout_s: float) -> float:
    """Wall seconds of ``python -m ARGV OUT_FLAG OUT``; a failing command is an error."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", *argv, out_flag, str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        raise SystemExit(f"python -m {' '.join(argv)} failed (exit {proc.returncode}): {tail[0]}")
    return wall


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m benchmarks.readme_timings", description=__doc__)
    ap.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=sorted(COMMANDS))
    ap.add_argument("--out", default=None, help="folder for the runs' output (default: a temp)")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per command (default 1800)")
    args = ap.parse_args(argv)
    where = machine()
    with tempfile.TemporaryDirectory(prefix="readme_timings_") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        for name in args.only:
            cmd, flag = COMMANDS[name]
            before = os.getloadavg()[0]
            wall = time_command(cmd, flag, root / name, args.timeout_s)
            after = os.getloadavg()[0]
            print(
                f"{name:<13} {wall:7.1f} s wall   {where}, load average {before:.1f} before, "
                f"{after:.1f} after",
                flush=True,
            )


if __name__ == "__main__":
    main()
