"""A missing optional extra is one line naming the modules and the ``pip install -e ".[...]"``
that installs them (exit status 2), never a ModuleNotFoundError traceback.

A missing package is simulated in a subprocess by a ``sys.meta_path`` finder that refuses its
top-level name (nothing is uninstalled).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hgpo.extras import EXTRAS, MissingExtraError, installed, require_extras

ROOT = Path(__file__).resolve().parents[1]

BLOCK = """
import importlib.abc, runpy, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in blocked:
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
sys.meta_path.insert(0, Block())
if sys.argv[2] == "-c":
    exec(sys.argv[3])
else:
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _without(modules: str, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` (or ``python -c CODE`` for ``module="-c"``) with the top-level
    ``modules`` (comma-separated) missing."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", BLOCK, modules, module, *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return lines[0]


def test_require_extras_names_every_missing_module_and_one_pip_command(monkeypatch):
    require_extras("x", *EXTRAS.keys() & {"llm"})  # installed here: no error
    monkeypatch.setitem(EXTRAS, "a", ("no_such_module_a", "os"))
    monkeypatch.setitem(EXTRAS, "b", ("no_such_module_b",))
    with pytest.raises(MissingExtraError) as e:
        require_extras("thing", "a", "llm", "b")
    assert str(e.value) == (
        "thing needs no_such_module_a (the [a] extra) and no_such_module_b (the [b] extra); "
        'install them with pip install -e ".[a,b]"'
    )
    assert isinstance(e.value, ImportError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="require_extras: extra: must be one of"):
        require_extras("thing", "nope")
    assert installed("os") and not installed("no_such_module_a")


@pytest.mark.parametrize(
    "env, blocked, message",
    [
        ("toy:keydoor:size=4", "torch", 'needs torch (the [llm] extra); install it with '
         'pip install -e ".[llm]"'),
        ("webshop", "torch,transformers", 'needs torch, transformers (the [llm] extra); '
         'install it with pip install -e ".[llm]"'),
        ("webshop", "torch,bm25s", 'needs torch (the [llm] extra) and bm25s (the [webshop] '
         'extra); install them with pip install -e ".[llm,webshop]"'),
        ("alfworld", "textworld", 'needs textworld (the [alfworld] extra); install it with '
         'pip install -e ".[alfworld]"'),
    ],
)  # fmt: skip
def test_the_trainer_names_the_missing_extras(tmp_path, env, blocked, message):
    r = _without(
        blocked, "hgpo.train", "--preset", "tiny", "--env", env, "--out-dir", str(tmp_path)
    )
    assert _one_line(r) == f"error: python -m hgpo.train --env {env} {message}"
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_alfworld_generator_names_the_extra(tmp_path):
    r = _without("alfworld", "agentenvs.alfworld.generator", "--out", str(tmp_path), "--train", "1")
    assert _one_line(r) == (
        "error: python -m agentenvs.alfworld.generator needs alfworld (the [alfworld] extra); "
        'install it with pip install -e ".[alfworld]"'
    )
    r = _without("textworld", "agentenvs.alfworld.solvability", "--n", "1")
    assert (
        'needs textworld (the [alfworld] extra); install it with pip install -e ".[alfworld]"'
        in (_one_line(r))
    )


def test_importing_the_alfworld_engine_without_the_extra_names_it():
    r = _without("fast_downward", "-c", "import agentenvs.alfworld.engine")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last == (
        "hgpo.extras.MissingExtraError: the ALFWorld engine (agentenvs.alfworld.engine) needs "
        'fast_downward (the [alfworld] extra); install it with pip install -e ".[alfworld]"'
    )


def test_the_warm_start_names_the_missing_extras(tmp_path):
    r = _without("torch,bm25s", "hgpo.train.warmstart", "--env", "webshop", "--tasks", "1",
                 "--out", str(tmp_path / "warm"))  # fmt: skip
    assert _one_line(r) == (
        "error: python -m hgpo.train.warmstart --env webshop needs torch (the [llm] extra) and "
        'bm25s (the [webshop] extra); install them with pip install -e ".[llm,webshop]"'
    )


def test_ray_missing_has_the_one_missing_extra_message(monkeypatch):
    from agentenvs.ray_cluster import import_ray, require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # importing ray fails, find_spec says so
    with pytest.raises(MissingExtraError) as want:
        require_extras("--backend ray", "ray")
    for check in (import_ray, require_ray):
        with pytest.raises(MissingExtraError) as got:
            check("--backend ray")
        assert str(got.value) == str(want.value)
    assert str(want.value) == (
        '--backend ray needs ray (the [ray] extra); install it with pip install -e ".[ray]"'
    )


def test_the_study_names_the_missing_ray():
    r = _without("ray", "studies.train_toy", "--backend", "ray", "--out", "unused")
    assert _one_line(r) == (
        "python -m studies.train_toy: error: --backend ray needs ray (the [ray] extra); install "
        'it with pip install -e ".[ray]" (see --help)'
    )
