"""The estimator registry: every estimator by name, the built-in ones and users' own.

An estimator is a function ``fn(batch, config, values=None, **inputs)`` of a
:class:`~hgpo.batch.StepBatch` and an :class:`~hgpo.config.EstimatorConfig` that returns an
:class:`~hgpo.estimators.Advantages` (or, for a user's estimator, just the float64[n]
advantages). Besides the batch, an estimator may read per-step *inputs* that only the caller
has (:data:`STEP_INPUTS`): a critic's state values, the policy's entropy, the observation
text. It declares them when it is registered (``reads``), and :func:`compute_advantages`
checks them: a missing one is a named error before any work, and one it does not read is
refused rather than ignored.

Users add estimators with :func:`register_estimator` or, from an installed package, with an
entry point in the ``hgpo.estimators`` group (``name = "package.module:function"``); both
appear by name everywhere an estimator is chosen (``compute_advantages``, the studies'
``--estimators``, ``hgpo.train --estimator``, the verl integration). Entry points are loaded
the first time the registry is read; a broken one is skipped with a warning.

:func:`compute_advantages` hands an estimator read-only views of the batch and of the
per-step arrays (one batch is shared by every estimator a study runs): a write into them is
an :class:`EstimatorWriteError` naming the estimator and the field, and a user's estimator
that raises is an :class:`EstimatorError` naming it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from hgpo.batch import ARRAY_FIELDS, StepBatch
from hgpo.config import EstimatorConfig
from hgpo.ecpo import ecpo
from hgpo.empg import empg
from hgpo.estimators import (
    Advantages,
    check_inputs,
    gae,
    gigpo,
    grpo,
    hgpo,
    hgpo_nohog2,
    hgpo_uniform,
    oracle,
    rloo,
    step_returns,
    stepwise,
)
from hgpo.gigpo_variants import gigpo_dynamic, gigpo_similarity
from hgpo.graphgpo import graphgpo
from hgpo.returns import check_finite, check_step_texts, check_step_values
from hgpo.threespo import threespo

__all__ = [
    "ENTRY_POINT_GROUP",
    "ESTIMATORS",
    "STEP_INPUTS",
    "EstimatorError",
    "EstimatorRegistrationError",
    "EstimatorSpec",
    "EstimatorWriteError",
    "compute_advantages",
    "estimator_reads",
    "get_estimator",
    "register_estimator",
    "unregister_estimator",
]

ENTRY_POINT_GROUP = "hgpo.estimators"

STEP_INPUTS: Mapping[str, str] = {
    "values": "float64[n] state values V(s_t) of every step (a critic's output)",
    "entropy": (
        "float64[n] >= 0, the policy's entropy at every step (for an LLM, the mean token "
        "entropy of the step's response)"
    ),
    "observations": "a sequence of n str, the observation text of every step",
}
"""The per-step inputs an estimator may read beyond the batch, and what each must be."""

_LABELS = {
    "values": "state values",
    "entropy": "the policy's entropy",
    "observations": "observations",
}

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")

Estimator = Callable[..., Any]


class EstimatorRegistrationError(ValueError):
    """A name, function or entry point that cannot be registered as an estimator."""


class EstimatorError(RuntimeError):
    """A user's estimator that raised (its name and origin in the message, the original
    error chained as ``__cause__``)."""


class EstimatorWriteError(EstimatorError):
    """An estimator that wrote into its input batch or per-step arrays (read-only views)."""


@dataclass(frozen=True)
class EstimatorSpec:
    """One registered estimator."""

    name: str
    fn: Estimator
    reads: tuple[str, ...] = ()
    """The per-step inputs it reads (keys of :data:`STEP_INPUTS`)."""
    origin: str = "hgpo"
    """"hgpo" (built in), "register_estimator", or "entry point VALUE" for a package's."""

    @property
    def builtin(self) -> bool:
        return self.origin == "hgpo"


# --------------------------------------------------------------------------- the registry


class _Registry(Mapping[str, Estimator]):
    """name -> estimator function, in registration order; the ``hgpo.estimators`` entry
    points are loaded on first read."""

    def __init__(self) -> None:
        self._specs: dict[str, EstimatorSpec] = {}
        self._broken: dict[str, str] = {}  # entry points that failed to load: name -> why
        self._entry_points_loaded = False
        self._loading = False

    def _load(self) -> dict[str, EstimatorSpec]:
        if not self._entry_points_loaded and not self._loading:
            self._loading = True  # an entry point's module may read the registry itself
            try:
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    self._add_entry_point(ep)
                self._entry_points_loaded = True
            finally:
                self._loading = False
        return self._specs

    def _add_entry_point(self, ep: metadata.EntryPoint) -> None:
        """Register one entry point; a broken one (its module missing or failing to import,
        not a function, a name taken) is skipped with one warning naming it and why, and
        choosing it by name later is an error saying the same (:meth:`spec`)."""
        where = f"entry point {ep.name!r} ({ENTRY_POINT_GROUP}: {ep.value})"
        try:
            obj = ep.load()
            if ep.name in self._specs and self._specs[ep.name].origin != f"entry point {ep.value}":
                raise EstimatorRegistrationError(
                    f"the name {ep.name!r} is taken by {self._specs[ep.name].origin}; give the "
                    "entry point another name"
                )
            if isinstance(obj, EstimatorSpec):
                fn, reads = obj.fn, obj.reads
            else:
                fn, reads = obj, tuple(getattr(obj, "reads", ()))
            spec = _make_spec(ep.name, fn, reads, f"entry point {ep.value}", where)
        except Exception as exc:
            msg = " ".join(str(exc).split()).removeprefix(f"{where}: ")
            reason = msg if isinstance(exc, EstimatorRegistrationError) else (
                f"{type(exc).__name__}: {msg}")  # fmt: skip
            if ep.name not in self._specs:  # (a taken name keeps the estimator it names)
                self._broken[ep.name] = f"{where} failed to load: {reason}"
            warnings.warn(
                f"hgpo: skipping estimator {where}: {reason}", RuntimeWarning, stacklevel=2
            )
            return
        self._specs[ep.name] = spec

    def spec(self, name: str) -> EstimatorSpec:
        specs = self._load()
        if isinstance(name, str) and name in specs:
            return specs[name]
        if isinstance(name, str) and name in self._broken:
            raise ValueError(f"estimator {name!r}: {self._broken[name]}")
        raise ValueError(f"unknown estimator {name!r}; known estimators: {', '.join(specs)}")

    def __getitem__(self, name: str) -> Estimator:
        try:
            return self._load()[name].fn
        except TypeError:  # an unhashable key
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._load()))

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"ESTIMATORS({', '.join(self._load())})"


ESTIMATORS: Mapping[str, Estimator] = _Registry()
"""Every estimator by name (a read-only mapping; add one with :func:`register_estimator`)."""

_REGISTRY: _Registry = ESTIMATORS  # type: ignore[assignment]


def _check_reads(where: str, reads: Any) -> tuple[str, ...]:
    if isinstance(reads, str) or not isinstance(reads, Sequence):
        raise EstimatorRegistrationError(
            f"{where}: reads must be a tuple of input names ({', '.join(STEP_INPUTS)}), "
            f"got {reads!r}"
        )
    for r in reads:
        if r not in STEP_INPUTS:
            raise EstimatorRegistrationError(
                f"{where}: reads: unknown input {r!r}; an estimator may read "
                f"{', '.join(STEP_INPUTS)}"
            )
    return tuple(dict.fromkeys(reads))


def _check_signature(where: str, fn: Any, reads: tuple[str, ...]) -> None:
    """fn must take (batch, config, values=None) and each read input by keyword."""
    if not callable(fn):
        raise EstimatorRegistrationError(
            f"{where}: the estimator must be a function fn(batch, config, values=None), "
            f"got {type(fn).__name__}"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: checked by its first call
    kwargs = {r: None for r in reads if r != "values"}
    try:
        sig.bind(None, None, None, **kwargs)
    except TypeError as exc:
        keywords = "".join(f", {r}=None" for r in kwargs)
        raise EstimatorRegistrationError(
            f"{where}: the estimator must accept (batch, config, values=None{keywords}), "
            f"but {getattr(fn, '__qualname__', fn)!r}{sig} does not ({exc})"
        ) from None


def _make_spec(
    name: Any, fn: Any, reads: Any, origin: str, where: str | None = None
) -> EstimatorSpec:
    where = where or f"register_estimator({name!r})"
    if not isinstance(name, str) or not _NAME.match(name):
        raise EstimatorRegistrationError(
            f"{where}: the name must be letters, digits, '_', '-' or '.' (not starting with "
            f"'-' or '.'), got {name!r}"
        )
    reads = _check_reads(where, reads)
    _check_signature(where, fn, reads)
    return EstimatorSpec(name, fn, reads, origin)


def register_estimator(
    name: str,
    fn: Estimator | None = None,
    *,
    reads: Sequence[str] = (),
    replace: bool = False,
) -> Any:
    """Register ``fn`` as estimator ``name`` (or, without ``fn``, a decorator that does).

    ``fn(batch, config, values=None, **inputs)`` returns an ``Advantages`` or the float64[n]
    advantages of every step; ``reads`` names the per-step inputs it needs
    (:data:`STEP_INPUTS`: "values", "entropy", "observations"), which it then takes as keyword
    arguments (``values`` as the third positional one). A name already registered is an
    EstimatorRegistrationError unless ``replace=True``.
    """
    if fn is None:
        return lambda f: register_estimator(name, f, reads=reads, replace=replace)
    spec = _make_spec(name, fn, reads, "register_estimator")
    specs = _REGISTRY._load()
    if name in specs and not replace:
        raise EstimatorRegistrationError(
            f"register_estimator({name!r}): the name is already registered "
            f"({specs[name].origin}); pass replace=True to replace it"
        )
    specs[name] = spec
    return fn


def unregister_estimator(name: str) -> None:
    """Remove estimator ``name`` (a ValueError listing the known names if there is none)."""
    _REGISTRY.spec(name)
    del _REGISTRY._specs[name]


def get_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``; ValueError listing the known names otherwise."""
    return _REGISTRY.spec(name).fn


def get_spec(name: str) -> EstimatorSpec:
    """The :class:`EstimatorSpec` of ``name``; ValueError listing the known names otherwise."""
    return _REGISTRY.spec(name)


def estimator_reads(name: str) -> tuple[str, ...]:
    """The per-step inputs estimator ``name`` reads (e.g. ``("values",)`` for gae)."""
    return _REGISTRY.spec(name).reads


def readers_of(key: str) -> list[str]:
    """The registered estimators that read input ``key``."""
    return [n for n, s in _REGISTRY._load().items() if key in s.reads]


# --------------------------------------------------------------------------- running one


def _checked_inputs(
    name: str, spec: EstimatorSpec, batch: StepBatch, given: dict[str, Any]
) -> dict[str, Any]:
    """The inputs ``spec`` reads, checked; named errors for one missing or one not read."""
    for key, value in given.items():
        if value is not None and key not in spec.reads:
            readers = readers_of(key)
            raise ValueError(
                f"{key}: estimator {name!r} does not read {_LABELS[key]} (only "
                f"{', '.join(readers) if readers else 'no estimator'} "
                f"{'does' if len(readers) == 1 else 'do'}); leave {key} out"
            )
    out: dict[str, Any] = {}
    for key in spec.reads:
        value = given.get(key)
        if value is None:
            raise ValueError(f"estimator {name!r} needs {key}: {STEP_INPUTS[key]}")
        where = f"{name}: {key}"
        if key == "observations":
            out[key] = check_step_texts(batch, value, where)
            continue
        arr = check_step_values(batch, value, where)
        if key == "entropy" and (arr < 0).any():
            i = int(np.flatnonzero(arr < 0)[0])
            raise ValueError(f"{where}[{i}] is {float(arr[i])}; an entropy is >= 0")
        out[key] = arr
    return out


def _checked_output(
    name: str, spec: EstimatorSpec, batch: StepBatch, cfg: EstimatorConfig, out: Any
) -> Advantages:
    """An estimator's result as Advantages; for a user's estimator a named error when it is
    not one value per step or not finite."""
    n = batch.n_steps
    if not isinstance(out, Advantages):
        arr = np.asarray(out) if isinstance(out, np.ndarray | list | tuple) else None
        if arr is None or arr.dtype.kind not in "iuf":
            raise ValueError(
                f"estimator {name!r} ({spec.origin}) returned {type(out).__name__}; it must "
                f"return an hgpo.Advantages or float64[{n}], one advantage per step"
            )
        out = Advantages(np.asarray(arr, dtype=np.float64), step_returns(batch, cfg))
    for field in ("advantages", "returns"):
        arr = np.asarray(getattr(out, field))
        if arr.shape != (n,):
            raise ValueError(
                f"estimator {name!r} ({spec.origin}) returned {field} of shape {arr.shape}; "
                f"it must be one value per step, shape ({n},)"
            )
    if spec.builtin:  # a built-in estimator is finite unless the rewards overflow
        check_finite(
            batch, out.advantages, "advantage", "for this estimator", f"estimator {name!r}: "
        )
        return out
    for field, what in (("advantages", "advantage"), ("returns", "return")):
        arr = np.asarray(getattr(out, field))
        if arr.dtype.kind not in "iuf":
            raise ValueError(
                f"estimator {name!r} ({spec.origin}) returned {field} of dtype {arr.dtype}; "
                "it must be real numbers, float64"
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"estimator {name!r} ({spec.origin}) returned a non-finite {what} "
                f"{float(arr[i])} at row {i} (step {int(batch.step[i])} of trajectory "
                f"{int(batch.traj[i])}) of {field}; an estimator must return finite values"
            )
    return _writable(out)


def _writable(out: Advantages) -> Advantages:
    """``out`` with its own writable arrays where a user's estimator returned one of its
    read-only inputs (``return batch.reward``): the caller may change what it gets back."""
    fix = {}
    for f in ("advantages", "returns"):
        arr = getattr(out, f)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float64 or not arr.flags.writeable:
            fix[f] = np.array(arr, dtype=np.float64)
    return dataclasses.replace(out, **fix) if fix else out


def compute_advantages(
    name: str,
    batch: StepBatch,
    config: EstimatorConfig | None = None,
    values: np.ndarray | None = None,
    *,
    entropy: np.ndarray | None = None,
    observations: Sequence[str] | None = None,
    **options: Any,
) -> Advantages:
    """Run estimator ``name`` on ``batch``.

    ``options`` override fields of ``config`` (or of the paper defaults). ``values``,
    ``entropy`` and ``observations`` are the per-step inputs of the estimators that read them
    (:data:`STEP_INPUTS`; gae reads values, empg entropy, gigpo_similarity observations): one
    that the estimator needs and is not given, or that is given and not read, is a ValueError
    naming it. An unknown estimator or option, a batch that is not a StepBatch or a config
    that is not an EstimatorConfig raises ValueError naming it, and so does an advantage past
    float64's range (rewards so large that A = n / (n - 1) (R - mean) or GiGPO's sum of two
    terms overflows) or, from a user's estimator, a result (advantages or returns) that is not
    one finite value per step.

    The estimator gets read-only views of the batch's arrays and of ``values`` and
    ``entropy``: one that writes into them raises :class:`EstimatorWriteError` naming it and
    the field. A user's estimator that raises is an :class:`EstimatorError` naming it (the
    original error as ``__cause__``).
    """
    spec = _REGISTRY.spec(name)
    cfg = config if config is not None else EstimatorConfig()
    check_inputs(name, batch, cfg)
    given = {"values": values, "entropy": entropy, "observations": observations}
    inputs = _checked_inputs(name, spec, batch, given)
    if options:
        cfg = cfg.replace(**options)
    out = _run(name, spec, batch, cfg, inputs)
    return _checked_output(name, spec, batch, cfg, out)


def _run(
    name: str, spec: EstimatorSpec, batch: StepBatch, cfg: EstimatorConfig, inputs: dict
) -> Any:
    """``spec.fn`` on read-only views of the batch and the per-step arrays (a write into
    them is an :class:`EstimatorWriteError` naming the field); a user's estimator that
    raises is an :class:`EstimatorError` naming it, the original error chained."""
    views = {k: _read_only(v) if k in _ARRAY_INPUTS else v for k, v in inputs.items()}
    positional = views.pop("values", None)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported later
            return spec.fn(batch.read_only(), cfg, positional, **views)
    except ValueError as exc:
        written = _written_fields(spec, batch, cfg, inputs) if _is_read_only_error(exc) else []
        if written:  # (none: a read-only array of the estimator's own)
            raise EstimatorWriteError(
                f"estimator {name!r} ({spec.origin}) wrote into its input "
                f"{' and '.join(written)}: estimators get read-only views, shared with every "
                f"other estimator; copy before changing one (e.g. r = batch.reward.copy()) "
                f"[{exc}]"
            ) from exc
        if spec.builtin:
            raise
        raise _failed(name, spec, exc) from exc
    except Exception as exc:
        if spec.builtin:
            raise
        raise _failed(name, spec, exc) from exc


_ARRAY_INPUTS = ("values", "entropy")


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _is_read_only_error(exc: ValueError) -> bool:
    """numpy's error for a write into a read-only array ("assignment destination is
    read-only", "output array is read-only", "array is read-only")."""
    return "read-only" in str(exc)


def _failed(name: str, spec: EstimatorSpec, exc: Exception) -> EstimatorError:
    msg = " ".join(str(exc).split()) or "(no message)"
    return EstimatorError(f"estimator {name!r} ({spec.origin}) raised {type(exc).__name__}: {msg}")


def _written_fields(
    spec: EstimatorSpec, batch: StepBatch, cfg: EstimatorConfig, inputs: dict
) -> list[str]:
    """(error path) The fields the estimator writes into: it is run again on writable copies
    of every array (if it still hits a read-only array, that one is its own: none), then once
    per field, that field a read-only view and every other array a writable copy."""
    fields = [f for f in ARRAY_FIELDS if _field(batch, f) is not None]
    fields += [k for k in _ARRAY_INPUTS if k in inputs]
    if _writes_read_only(spec, batch, cfg, inputs, None):
        return []
    return [
        f if f in _ARRAY_INPUTS else f"batch.{f}"
        for f in fields
        if _writes_read_only(spec, batch, cfg, inputs, f)
    ]


def _writes_read_only(
    spec: EstimatorSpec, batch: StepBatch, cfg: EstimatorConfig, inputs: dict, locked: str | None
) -> bool:
    """Whether the estimator hits a read-only array when only field ``locked`` (None: no
    field) is a read-only view and every other array a writable copy."""
    args = {k: _read_only(v) if k == locked else v.copy() if k in _ARRAY_INPUTS else list(v)
            for k, v in inputs.items()}  # fmt: skip
    positional = args.pop("values", None)
    view = batch.read_only(writable_copies_except=locked or "")
    try:
        with np.errstate(all="ignore"):
            spec.fn(view, cfg, positional, **args)
    except ValueError as exc:
        return _is_read_only_error(exc)
    except Exception:
        return False
    return False


def _field(batch: StepBatch, name: str) -> Any:
    if name.startswith("branches."):
        return None if batch.branches is None else getattr(batch.branches, name[9:])
    return getattr(batch, name)


def _register_builtins() -> None:
    builtins: list[tuple[str, Estimator, tuple[str, ...]]] = [
        ("grpo", grpo, ()),
        ("rloo", rloo, ()),
        ("stepwise", stepwise, ()),
        ("gigpo", gigpo, ()),
        ("oracle", oracle, ()),
        ("hgpo", hgpo, ()),
        ("hgpo-nohog2", hgpo_nohog2, ()),
        ("hgpo-uniform", hgpo_uniform, ()),
        ("gae", gae, ("values",)),
        ("graphgpo", graphgpo, ()),
        ("empg", empg, ("entropy",)),
        ("gigpo_dynamic", gigpo_dynamic, ()),
        ("gigpo_similarity", gigpo_similarity, ("observations",)),
        ("3spo", threespo, ()),
        ("ecpo", ecpo, ()),
    ]
    for name, fn, reads in builtins:
        _REGISTRY._specs[name] = _make_spec(name, fn, reads, "hgpo")


_register_builtins()
