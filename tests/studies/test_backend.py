"""studies.backend: the same sweep through local processes and through Ray gives the same
files; resume, failures with their keys, the progress bar, and the bad-input paths."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from studies import backend as B
from studies import bias_variance as bv
from studies import train_toy as tt

pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")


def _toy(out: Path, **kw: object) -> tt.TrainToyConfig:
    base: dict[str, object] = dict(
        envs=("tmaze:length=2",), settings=("grpo", "hgpo"), seeds=2, iterations=4,
        eval_every=2, eval_rollouts=4, workers=1, out=str(out),
    )  # fmt: skip
    base.update(kw)
    return tt.TrainToyConfig(**base)  # type: ignore[arg-type]


def _final(out: Path) -> list[dict[str, str]]:
    """final.csv without its wall-clock column."""
    with (out / "final.csv").open() as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def test_train_toy_on_ray_equals_local_and_resumes(ray_cluster, tmp_path, capsys):
    # 2 runs (2 settings x 1 seed), one per node: each run on Ray starts a worker process,
    # seconds apiece on 2 loaded cores; 4 runs checked nothing more
    tt.run_study(_toy(tmp_path / "local", seeds=1), progress=False)
    ray_cfg = _toy(tmp_path / "ray", backend="ray", workers=2, seeds=1)
    tt.run_study(ray_cfg, progress=True)
    err = capsys.readouterr().err
    assert "runs: 100%" in err and "2/2" in err  # the progress bar counts tasks
    rows = _final(tmp_path / "ray")
    assert len(rows) == 2 and rows == _final(tmp_path / "local")
    names = sorted(p.name for p in (tmp_path / "ray" / "runs").glob("*.json"))
    assert names == sorted(p.name for p in (tmp_path / "local" / "runs").glob("*.json"))
    # re-submitted with one run missing: only that run is recomputed, the others are kept
    runs = sorted((tmp_path / "ray" / "runs").glob("*.json"))
    stamps = {p: p.stat().st_mtime_ns for p in runs[1:]}
    runs[0].unlink()
    tt.run_study(ray_cfg, progress=True)
    assert "resuming: 1 of 2 runs" in capsys.readouterr().err
    assert runs[0].is_file() and all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    assert _final(tmp_path / "ray") == rows


def test_bias_variance_on_ray_equals_local(ray_cluster, tmp_path):
    kw = dict(envs=("keydoor:size=4",), Ks=(1,), stages=("untrained", "0.5"), n_batches=10,
              groups=4, estimators=("grpo", "hgpo", "gae"), workers=1)  # fmt: skip
    local = bv.run_study(bv.StudyConfig(**kw, out=str(tmp_path / "a")), progress=False)
    ray = bv.run_study(bv.StudyConfig(**kw, out=str(tmp_path / "b"), backend="ray"), progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "gt_seconds"} for r in rows]  # noqa: E731
    assert json.dumps(strip(ray["rows"])) == json.dumps(strip(local["rows"]))
    assert json.dumps(strip(ray["levels"])) == json.dumps(strip(local["levels"]))


def _maybe_fail(x: int) -> int:
    if x == 2:
        raise ValueError(f"bad input {x}")
    return 10 * x


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_failed_task_is_reported_with_its_key_and_the_rest_go_on(ray_cluster, backend, capsys):
    tasks = [B.Task(f"t{i}", (i,)) for i in range(4)]
    got: dict[str, int] = {}
    sweep = B.run_tasks(_maybe_fail, tasks, got.__setitem__, backend=backend, workers=2)
    assert got == {"t0": 0, "t1": 10, "t3": 30}
    assert sweep.failures == [B.Failure("t2", "ValueError: bad input 2")]
    assert "failed: t2: ValueError: bad input 2" in capsys.readouterr().err
    assert "t2: ValueError" in str(B.SweepError(sweep.failures, 4))


def test_cli_reports_failed_runs_and_exits_1(ray_cluster, tmp_path, monkeypatch, capsys):
    def broken(cfg, run):
        if run["seed"] == 1:
            raise RuntimeError("numerical trouble")
        return real(cfg, run)

    real = tt.run_one
    monkeypatch.setattr(tt, "run_one", broken)  # the local in-process backend sees it
    args = ["--envs", "tmaze:length=2", "--settings", "grpo", "--seeds", "2", "--iterations",
            "2", "--eval-every", "1", "--workers", "1", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    assert tt.main(args) == 1
    err = capsys.readouterr().err
    assert "1 of 2 tasks failed" in err and "_s1_" in err and "numerical trouble" in err
    assert len(list((tmp_path / "runs").glob("*.json"))) == 1  # the good run is kept


@pytest.mark.parametrize("main", [tt.main, bv.main])
def test_unreachable_ray_address_exits_2_naming_it(main, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--backend", "ray", "--ray-address", "127.0.0.1:1", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--ray-address" in err and "'127.0.0.1:1'" in err and "ray start --head" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--backend", "dask"], "--backend: must be one of 'local', 'ray', got 'dask'"),
        (["--ray-address", "h:1"], "--ray-address: only used with --backend ray"),
        (["--backend", "ray", "--ray-address", "nohostport"], "--ray-address: must be host:port"),
    ],
)
def test_bad_backend_options(args, match, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        tt.main([*args, "--out", str(tmp_path)])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_missing_ray_names_the_install_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SystemExit) as exc:
        bv.main(["--backend", "ray", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        '--backend ray needs ray (the [ray] extra); install it with pip install -e ".[ray]"' in err
    )
