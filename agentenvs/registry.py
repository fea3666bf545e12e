"""The benchmarks by name, and the lookup of an ``--env`` string (see :mod:`agentenvs.adapters`).

``BENCHMARKS`` maps each name to its :class:`~agentenvs.adapters.Benchmark`, the way
``hgpo.ESTIMATORS`` maps estimators; :func:`benchmark` resolves "alfworld",
"webshop" and a spec such as "toy:keydoor:size=4" (to the toy adapter).
"""

from __future__ import annotations

from typing import Any

from agentenvs.adapters import Benchmark
from agentenvs.adapters.alfworld_bench import ALFWORLD
from agentenvs.adapters.toy_bench import TOY
from agentenvs.adapters.webshop_bench import WEBSHOP
from hgpo.options import bad

__all__ = ["BENCHMARKS", "Benchmark", "benchmark", "register", "usages"]

BENCHMARKS: dict[str, Benchmark] = {
    "alfworld": ALFWORLD,
    "webshop": WEBSHOP,
    "toy": TOY,
}
"""Every benchmark the trainer can run, by name (in the order --help and errors list them)."""


def usages() -> tuple[str, ...]:
    """How ``--env`` may name each benchmark ("alfworld", ..., "toy:FAMILY:param=value,...")."""
    return tuple(b.usage or b.name for b in BENCHMARKS.values())


def benchmark(env: Any, where: str = "--env") -> Benchmark:
    """The benchmark of ``--env`` value ``env``: a name, or "NAME:..." for a benchmark that
    takes a spec (its parameters are checked by ``Benchmark.check``). Anything else raises
    :class:`hgpo.options.OptionError` naming ``where`` and the choices."""
    if isinstance(env, str):
        name, sep, _ = env.partition(":")
        found = BENCHMARKS.get(name)
        if found is not None and bool(sep) == found.spec:
            return found
    raise bad(where, "one of " + ", ".join(repr(u) for u in usages()), env)


def register(bench: Benchmark) -> Benchmark:
    """Add ``bench`` to :data:`BENCHMARKS` (a new name only); returns it."""
    if not isinstance(bench, Benchmark):
        raise bad("register: bench", "a Benchmark", bench)
    if bench.name in BENCHMARKS or not bench.name or ":" in bench.name:
        raise bad("register: bench.name", "a new name without ':'", bench.name)
    BENCHMARKS[bench.name] = bench
    return bench
