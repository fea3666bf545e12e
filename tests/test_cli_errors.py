"""Every command line of the repository: a bad flag is one line on stderr, exit status 2.

The CLIs are found in the sources (every ``ArgumentParser(`` construction), so a new one is
covered without editing this file; each must build its parser from
:class:`hgpo.options.ArgumentParser`, whose error is ``<prog>: error: <message> (see --help)``
instead of the 19-41 lines of usage argparse prints first. The error comes before torch,
transformers, deepspeed, ray or vllm is imported (so it is quick).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hgpo", "toyenvs", "agentenvs", "studies", "benchmarks", "tests")
RUN_AS = {
    "hgpo.train.train_config": "hgpo.train",
    "studies.compare_study": "studies.compare",
    "benchmarks.golden_common": "benchmarks.make_hiper_golden",  # (and the six other makers)
}
"""A module that builds the parser of another module's command line."""


def _parser_files() -> list[Path]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "options.py" and "ArgumentParser(" in path.read_text():
                out.append(path)
    return out


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return RUN_AS.get(name, name)


FILES = [p for p in _parser_files() if p != Path(__file__)]
CLIS = sorted({_module(p) for p in FILES})


HEAVY = ("torch", "transformers", "deepspeed", "ray", "vllm")
"""Packages a bad flag must not wait for (seconds each to import)."""

RUN_MODULE = """
import atexit, runpy, sys
atexit.register(lambda: print("imported:", *sorted(m for m in HEAVY if m in sys.modules)))
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    """``python -m ARGS``; its stdout ends with the line ``imported: ...`` of the heavy
    packages it imported."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = f"HEAVY = {HEAVY!r}\n{RUN_MODULE}"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_clis_are_found():
    assert {"hgpo.train", "hgpo.train.plot", "studies.bias_variance"} <= set(CLIS), CLIS
    assert len(CLIS) >= 15, CLIS


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_parser_is_the_one_line_error_parser(path):
    text = path.read_text()
    assert not re.search(r"argparse\.ArgumentParser\(", text), (
        f"{path.relative_to(ROOT)}: build the parser with hgpo.options.ArgumentParser"
    )


@pytest.mark.parametrize("module", CLIS)
def test_a_bad_flag_is_one_line_and_exit_2(module):
    """... and no flag is abbreviated: ``--hel`` (``--help`` cut short) does not print the
    help (where it did, the exit status was 0)."""
    r = _run(module, "--no-such-flag", "--hel")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert 1 <= len(lines) <= 2, r.stderr[-2000:]
    assert lines[-1].startswith(f"python -m {module}: error: "), lines[-1]
    assert lines[-1].endswith(" (see --help)"), lines[-1]
    assert "usage:" not in r.stderr and "usage:" not in r.stdout  # not --help's
    if module != "tests.train.tiny_golden":  # (imports the trainer tests' conftest)
        assert r.stdout.strip().splitlines()[-1] == "imported:", r.stdout[-500:]


def test_a_bad_value_names_the_flag_and_points_to_help():
    r = _run("hgpo.train", "--lr", "abc")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "python -m hgpo.train: error: argument --lr: invalid float value: 'abc' (see --help)"
    ]
    assert _run("hgpo.train.plot", "--help").stdout.startswith("usage: python -m hgpo.train.plot")
