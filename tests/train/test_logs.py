"""The trainer's output is what a user reads: no library DEBUG lines, no progress bars, no
warning printed twice; and a default model that cannot be loaded names the fixes."""

from __future__ import annotations

from collections import Counter

from tests.train.conftest import ROOT, run_env

NOISE = (
    "bm25s DEBUG",  # bm25s sets its logger to DEBUG on import
    "Loading weights",  # transformers' progress bars
    "Writing model shards",
    "it/s]",
    "Setting accelerator to CPU",  # DeepSpeed's accelerator detection where no CUDA is seen
)


def _run(args, **env_changes):
    import subprocess
    import sys

    env = run_env()
    env.pop("DS_ACCELERATOR", None)  # (tests/conftest.py names it; a user's shell does not)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run(
        [sys.executable, "-m", "hgpo.train", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def test_a_tiny_run_prints_no_library_noise(tmp_path):
    r = _run(["--preset", "tiny", "--env", "webshop", "--iterations", "1", "--val-every", "0",
              "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for noise in NOISE:
        assert noise not in out, f"{noise!r} in the output:\n{out[-3000:]}"
    assert r.stdout.splitlines()[0].startswith("done: 1 iterations")
    assert len(out.strip().splitlines()) <= 4, out


def test_an_unloadable_default_model_names_the_fixes_and_warns_once(tmp_path):
    # the hub unreachable (not offline mode): huggingface_hub retries 5 times (about 23 s)
    r = _run(["--env", "webshop", "--iterations", "1", "--val-every", "0",
              "--out-dir", str(tmp_path / "run")],
             HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None,
             HF_ENDPOINT="http://127.0.0.1:9")  # fmt: skip
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: TrainConfig.model: cannot load 'Qwen/Qwen2.5-1.5B-Instruct'"
    )
    assert "--model PATH" in lines[-1] and "--preset tiny" in lines[-1]
    retries = [x for x in lines if "Retrying in" in x]
    assert retries, r.stderr[-3000:]
    assert all(n == 1 for n in Counter(retries).values()), retries
    assert len(retries) == len({x.split("Retrying in", 1)[1] for x in retries}), retries
