"""One run of studies.real_model: ``python -m hgpo.train`` in a child process, watched, and its
record (the figures the report reads) written when it has finished.

The child writes its output to ``OUT/runs/<estimator>-s<seed>.log``, runs with
``OMP_NUM_THREADS`` = ``--threads``, dies with the study (``PR_SET_PDEATHSIG``) and is stopped
after ``--run-timeout`` seconds. Its exit is collected with ``os.wait4``, whose resource usage
gives the run's own peak RSS and CPU seconds. While it runs, each iteration it finishes is
printed (read from its metrics.jsonl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hgpo.train.run_metrics import read_metrics
from studies.backend import set_parent_death_signal
from studies.io import atomic_write_json
from studies.real_model_settings import Study

__all__ = ["TRAIN", "RunFailed", "machine", "read_record", "run_one", "run_rows"]

TRAIN = [sys.executable, "-m", "hgpo.train"]
"""The trainer's command (a test may put a stand-in here)."""

POLL_S = 1.0
"""Seconds between two looks at the running child."""


class RunFailed(Exception):
    """A run that failed, or a record that cannot be used: one line, and the exit status the
    study returns (2: a setting or a record the user can fix; 1: the run itself failed)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def machine() -> dict[str, Any]:
    """The CPU model, the cores and the memory of this machine (for the timings)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    gib = pages * os.sysconf("SC_PAGE_SIZE") / 2**30 if pages > 0 else float("nan")
    return {"cpu": model or "unknown", "cores": os.cpu_count(), "memory_gib": round(gib, 1)}


def run_rows(run_dir: Path, iterations: int) -> list[dict[str, Any]]:
    """The run's metric rows of iterations 1..``iterations``, the last of each (a resumed run
    writes an iteration again); [] while it has none."""
    try:
        rows = read_metrics(run_dir)
    except ValueError:
        return []
    last = {r["iteration"]: r for r in rows if 1 <= r.get("iteration", 0) <= iterations}
    return [last[i] for i in sorted(last)]


def read_record(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a finished run, or None when there is none; RunFailed (status 2) when it
    cannot be read or was made with settings other than ``config``."""
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
        made_with = rec["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RunFailed(
            f"{path} cannot be read ({type(e).__name__}); rerun with --fresh", 2
        ) from None
    if made_with != config:
        diff = sorted(k for k in {*made_with, *config} if made_with.get(k) != config.get(k))
        raise RunFailed(
            f"{path} was made with other settings ({', '.join(diff)}); rerun with --fresh", 2
        )
    return rec


def _wait(proc: subprocess.Popen, deadline: float, tick: Any) -> tuple[int, Any]:
    """The child's exit status and resource usage (``os.wait4``), calling ``tick()`` between
    looks; RunFailed when ``deadline`` (monotonic seconds) passes first."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > deadline:
            raise RunFailed("ran past --run-timeout; stopped")
        tick()
        time.sleep(POLL_S)


def _failure(name: str, status: int, log: Path) -> RunFailed:
    """The error of a run that exited with ``status``: the trainer's own line for a setting it
    refused (2), the end of the log otherwise."""
    tail = log.read_text(errors="replace").strip().splitlines() or ["(empty log)"]
    if status == 2:
        return RunFailed(f"run {name}: {tail[-1].removeprefix('error: ')}", 2)
    return RunFailed(f"run {name} failed (exit status {status}); its log {log} ends: "
                     + " | ".join(tail[-3:]))  # fmt: skip


def _start(s: Study, argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(s.threads), "MKL_NUM_THREADS": str(s.threads)}
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return subprocess.Popen([*TRAIN, *argv], stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                env=env, preexec_fn=set_parent_death_signal)  # fmt: skip
    finally:
        os.close(fd)


def run_one(s: Study, estimator: str, seed: int, argv: list[str], tag: str) -> dict[str, Any]:
    """Run ``hgpo.train argv`` (one run of the study), print its progress, write and return
    its record; RunFailed when it fails."""
    name, run_dir = s.name(estimator, seed), s.run_dir(estimator, seed)
    log = run_dir.parent / f"{name}.log"
    its = f"{s.iterations} iteration{'s' if s.iterations > 1 else ''}"
    print(f"{tag}: hgpo.train, {its} (log: {log})", file=sys.stderr, flush=True)
    load_before, started, t0 = os.getloadavg(), _now(), time.monotonic()
    before = 0 if "--fresh" in argv else len(run_rows(run_dir, s.iterations))
    seen = [before]  # (iterations logged: a resumed run goes on after its checkpoint)

    def tick() -> None:
        rows = run_rows(run_dir, s.iterations)
        for r in rows[seen[0] :]:
            print(f"{tag}: iteration {r['iteration']}/{s.iterations}: success "
                  f"{r.get('success_rate', float('nan')):.2f}, {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        seen[0] = max(seen[0], len(rows))

    proc = _start(s, argv, log)
    try:
        status, usage = _wait(proc, t0 + s.run_timeout, tick)
    except RunFailed as e:
        raise RunFailed(f"run {name} {e} after {s.run_timeout:g} s (log: {log})") from None
    finally:
        if proc.returncode is None:  # (stopped: past the timeout, or Ctrl-C)
            proc.kill()
            proc.wait(timeout=60)
    wall = time.monotonic() - t0
    if status != 0:
        raise _failure(name, status, log)
    tick()
    rows = run_rows(run_dir, s.iterations)
    if len(rows) != s.iterations:
        raise RunFailed(f"run {name} exited 0 with {len(rows)} of {s.iterations} iterations in "
                        f"{run_dir / 'metrics.jsonl'}")  # fmt: skip
    rec = {
        "config": s.run_config(estimator, seed), "rows": rows, "iterations_before": before,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024,
        "load_before": list(load_before), "load_after": list(os.getloadavg()),
        "threads": s.threads, "machine": machine(), "started": started, "finished": _now(),
    }  # fmt: skip
    atomic_write_json(s.record_path(estimator, seed), rec, indent=1)
    print(f"{tag}: done in {wall:.0f} s ({wall / s.iterations:.0f} s per iteration), peak RSS "
          f"{rec['peak_rss_bytes'] / 2**30:.2f} GiB", file=sys.stderr, flush=True)  # fmt: skip
    return rec


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
