"""A package's own estimator, by its ``hgpo.estimators`` entry point, everywhere an estimator is
chosen by name (issue 31, part 2): the bias/variance study, the LLM trainer and its exact-truth
monitor, verl's registry and verl-agent's routes.

The package ``toyplug`` lives in a temporary folder with a ``.dist-info`` (all that
importlib.metadata needs to find its entry points) and reaches each command through PYTHONPATH
only: nothing is installed. Its estimators: ``toy_centred`` (reads nothing: half the step
return less the batch mean) and ``toy_inputs`` (reads the policy's entropy and the observations,
and writes what it was given to ``$TOYPLUG_DUMP``, one JSON line per call).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGE = """
    import json
    import os

    from hgpo import step_returns


    def centred(batch, cfg, values=None):
        R = step_returns(batch, cfg)
        return 0.5 * (R - R.mean())


    def with_inputs(batch, cfg, values=None, entropy=None, observations=None):
        dump = os.environ.get("TOYPLUG_DUMP")
        if dump:
            with open(dump, "a") as f:
                f.write(json.dumps({"entropy": entropy.tolist(),
                                    "observations": list(observations)}) + "\\n")
        R = step_returns(batch, cfg)
        return R - R.mean()


    with_inputs.reads = ("entropy", "observations")
"""
ENTRY_POINTS = "toy_centred = toyplug:centred\ntoy_inputs = toyplug:with_inputs\n"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """The folder holding the package ``toyplug`` and its .dist-info."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "toyplug").mkdir()
    (root / "toyplug" / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    info = root / "toyplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hgpo.estimators]\n{ENTRY_POINTS}")
    return root


def _run(args: list[str], plugin: Path, **env: str) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root, with the plugin's folder on PYTHONPATH."""
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    full.update(PYTHONPATH=f"{plugin}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **env)  # fmt: skip
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def test_the_bias_variance_study_measures_it(plugin, tmp_path):
    out = tmp_path / "bv"
    r = _run(["-m", "studies.bias_variance", "--quick", "--envs", "tmaze:length=0",
              "--groups", "4", "--rollouts", "4", "--stages", "untrained", "--batches", "10",
              "--estimators", "toy_centred", "--norms", "mean", "--workers", "1",
              "--no-progress", "--out", str(out)], plugin)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "results.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["estimator"] == "toy_centred"]
    assert len(rows) == 1 and np.isfinite(float(rows[0]["mse"]))


def test_the_trainer_trains_it_and_the_truth_measures_every_estimator(plugin, tmp_path):
    """One iteration of the tiny model in score mode on the T-maze with --truth-every 1 and
    --estimator toy_inputs: the trainer hands it each step's candidate entropy and observation,
    the truth hands it the exact entropy of the same steps (the same weights: equal to scoring
    rounding) and logs truth/<est>/* of both plugin estimators."""
    pytest.importorskip("deepspeed")
    out, dump = tmp_path / "run", tmp_path / "dump.jsonl"
    r = _run(["-m", "hgpo.train", "--preset", "tiny", "--env", "toy:tmaze:length=0",
              "--action-mode", "score", "--max-steps", "6", "--iterations", "1",
              "--truth-every", "1", "--estimator", "toy_inputs", "--val-every", "0",
              "--save-every", "0", "--out-dir", str(out)], plugin, TOYPLUG_DUMP=str(dump))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    trained, truth = [json.loads(line) for line in dump.read_text().splitlines()]
    np.testing.assert_allclose(trained["entropy"], truth["entropy"], atol=1e-5)
    assert trained["observations"] == truth["observations"]
    assert all(o.startswith("You are") for o in trained["observations"])  # the env's own text
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for est in ("toy_centred", "toy_inputs"):
        assert f"truth/{est}/grad_cos" in row and f"truth/{est}/failed" not in row
    config = json.loads((out / "config.json").read_text())
    assert config["estimator"] == "toy_inputs"


def test_verl_registers_it_and_verl_agent_routes_it(plugin):
    pytest.importorskip("verl")
    code = (
        "from hgpo.integrations import verl as hv, verl_agent as va\n"
        "from verl.trainer.ppo import core_algos\n"
        "print(hv.verl_name('toy_centred'), hv.verl_name('toy_inputs'))\n"
        "print(core_algos.get_adv_estimator_fn('hgpo.toy_inputs').hgpo_estimator)\n"
        "print(va.routed_names()['toy_inputs'], va.routed_names()['hgpo.toy_centred'])\n"
    )
    r = _run(["-c", code], plugin)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-3:] == [
        "toy_centred toy_inputs", "toy_inputs", "toy_inputs toy_centred",
    ]  # fmt: skip


def test_a_broken_entry_point_stops_neither_verl_nor_the_others(plugin, tmp_path):
    """Issue 38 item 11: an entry point whose module is missing, or whose object is not a
    function, is skipped with one warning each: verl's registry still gets the package's good
    estimators, and choosing a broken one is a one-line error saying why it did not load."""
    pytest.importorskip("verl")
    broken = tmp_path / "broken"
    info = broken / "toybroken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toybroken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[hgpo.estimators]\ntoy_gone = nomodule:fn\ntoy_notfn = toyplug:os\n"
    )
    code = (
        "from hgpo.integrations import verl as hv\n"
        "from hgpo.estimator_registry import get_spec\n"
        "print(hv.verl_name('toy_centred'), 'toy_gone' in hv.NAMES)\n"
        "try:\n    get_spec('toy_gone')\nexcept ValueError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=os.pathsep.join(map(str, (plugin, broken, ROOT))), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()[-2:]
    assert out[0] == "toy_centred False"
    assert out[1] == (
        "estimator 'toy_gone': entry point 'toy_gone' (hgpo.estimators: nomodule:fn) failed to "
        "load: ModuleNotFoundError: No module named 'nomodule'"
    )
    warned = [ln for ln in r.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(warned) == 2 and "toy_gone" in warned[0] and "toy_notfn" in warned[1], warned
