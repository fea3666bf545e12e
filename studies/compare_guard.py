"""studies.compare's bound on every cell and run, and errors that name the estimator.

``python -m studies.compare`` runs any registered estimator, a user's too, inside the
sub-studies' cells (studies.bias_variance) and training runs (studies.train_toy). While it runs
them (:func:`guarded`):

- an exception raised by an estimator fails its cell or run with
  ``estimator 'mine' raised ZeroDivisionError: division by zero`` (the sub-study lists the
  failed cells and runs at the end; the others finish and are kept);
- a cell or run that takes longer than ``--cell-timeout`` seconds fails with
  ``... ran past --cell-timeout 600 s, in estimator 'mine'`` (or "not in an estimator" when the
  time ran out in the study's own work): an alarm (``SIGALRM``) in the process running it
  raises in the Python code running then. Code that never returns to Python (a loop in native
  code) cannot be interrupted that way: 30 s later a watcher thread prints the same message,
  "killing its worker process", and kills the process, which the sub-study reports as "its
  worker process died (signal 9: SIGKILL)" (with ``--workers 1`` the process is the command's
  own: the command ends there).

The hooks are the sub-studies' module names ``run_cell``, ``run_one`` and
``compute_advantages``, replaced for the duration of :func:`guarded` and restored after; the
worker processes are forked inside it and inherit them (and the bound).
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hgpo.estimator_registry import EstimatorError
from studies import bias_variance as BV
from studies import train_toy as TT

__all__ = ["CellTimeout", "EstimatorError", "bounded", "guarded"]

GRACE_S = 30.0
"""Seconds past the bound before a cell stuck in native code has its process killed."""

_state: dict[str, Any] = {"timeout": None, "estimator": None}
"""The bound, the estimator running, and (within :func:`guarded`) the functions replaced."""


class CellTimeout(RuntimeError):
    """A cell or run went past ``--cell-timeout`` (the message names the estimator running)."""


def _where() -> str:
    name = _state["estimator"]
    return f"in estimator {name!r}" if name else "not in an estimator (the study's own work)"


def _compute(original: Callable[..., Any]) -> Callable[..., Any]:
    """``compute_advantages`` that records which estimator runs and names it in an error."""

    def compute_advantages(name: str, *args: Any, **kwargs: Any) -> Any:
        before, _state["estimator"] = _state["estimator"], name
        try:
            return original(name, *args, **kwargs)
        except CellTimeout:
            raise
        except EstimatorError as exc:  # the registry's error already names a user's estimator
            if isinstance(exc.__cause__, CellTimeout):  # the alarm rang inside the estimator
                raise exc.__cause__ from None
            raise
        except Exception as exc:
            raise EstimatorError(f"estimator {name!r} raised {type(exc).__name__}: {exc}") from exc
        finally:
            _state["estimator"] = before

    return compute_advantages


def bounded(fn: Callable[..., Any], what: str, *args: Any) -> Any:
    """``fn(*args)`` within :func:`guarded`'s bound (none outside it): a :class:`CellTimeout`
    naming ``what`` and the estimator running when the time ran out."""
    limit = _state["timeout"]
    if limit is None or threading.current_thread() is not threading.main_thread():
        return fn(*args)
    text = f"{what} ran past --cell-timeout {limit:g} s"

    def alarm(signum: int, frame: Any) -> None:
        raise CellTimeout(f"{text}, {_where()}")

    def kill() -> None:  # the alarm could not interrupt it: native code that never returns
        line = (f"studies.compare: {text}, {_where()}, and did not stop {GRACE_S:g} s later "
                "(native code?); killing its worker process\n")  # fmt: skip
        os.write(2, line.encode())  # the fd itself: this process is about to die
        os.kill(os.getpid(), signal.SIGKILL)

    old = signal.signal(signal.SIGALRM, alarm)
    watcher = threading.Timer(limit + GRACE_S, kill)
    watcher.daemon = True
    signal.setitimer(signal.ITIMER_REAL, limit)
    watcher.start()
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        watcher.cancel()
        signal.signal(signal.SIGALRM, old)


def run_cell(cfg: Any, env: str, K: int, stage: str, cell_seed: int) -> Any:
    """studies.bias_variance.run_cell within the bound."""
    return bounded(
        _state["run_cell"], f"cell {env} K={K} stage={stage}", cfg, env, K, stage, cell_seed
    )


def run_one(cfg: Any, run: dict[str, Any]) -> Any:
    """studies.train_toy.run_one within the bound."""
    what = f"training run {run['env']} {run['setting']} K={run['K']} seed={run['seed']}"
    return bounded(_state["run_one"], what, cfg, run)


@contextmanager
def guarded(timeout_s: float) -> Iterator[None]:
    """Within: every bias/variance cell and training run bounded by ``timeout_s`` seconds, and
    an estimator's exception named (module docstring); everything restored after."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"--cell-timeout: must be a positive number of seconds, got {timeout_s}")
    saved = (BV.run_cell, TT.run_one, BV.compute_advantages, TT.compute_advantages)
    before = dict(_state)
    _state.update(timeout=float(timeout_s), run_cell=saved[0], run_one=saved[1])
    BV.run_cell, TT.run_one = run_cell, run_one
    BV.compute_advantages, TT.compute_advantages = _compute(saved[2]), _compute(saved[3])
    try:
        yield
    finally:
        BV.run_cell, TT.run_one, BV.compute_advantages, TT.compute_advantages = saved
        _state.clear()
        _state.update(before)
