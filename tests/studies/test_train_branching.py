"""``python -m studies.train_branching``: named errors before any run, and a tiny CPU study
(two schemes, one seed, one iteration of the tiny model on the T-maze) that a second call
reads back without training again."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from studies.train_branching import main

RUN = [
    "--preset", "tiny", "--env", "toy:tmaze:length=1", "--history-length", "2",
    "--max-steps", "9", "--action-mode", "score", "--groups-per-iter", "2", "--group-size", "4",
    "--truth-every", "1", "--val-every", "0", "--save-every", "0", "--mini-batch-size", "16",
    "--micro-batch-size", "8",
]  # fmt: skip


@pytest.mark.parametrize(
    ("own", "run", "needle"),
    [
        (["--schemes", "independent", "branch:deep"], [], "--schemes: must be one of independent"),
        (["--schemes", "branch:uniform"], [], "--schemes: must be 'independent' first"),
        (["--schemes", "independent", "independent"], [], "--schemes: must be distinct schemes"),
        (["--seeds", "0", "0"], [], "--seeds: must be distinct seeds, got [0, 0]"),
        (["--seeds", "-1"], [], "--seeds: must be an integer >= 0, got -1"),
        (["--branch-budget", "nan"], [], "--branch-budget: must be a finite number in (0, 1]"),
        (["--iterations", "0"], [], "--iterations: must be an integer >= 1, got 0"),
        (["--K", "4"], RUN, "--K: must be the runs' --history-length 2 (or left out), got 4"),
        *(
            ([], [*RUN, flag, value], f"{flag} after --: the study sets it itself ({instead})")
            for flag, value, instead in (
                ("--rollout-scheme", "branch:uniform", "give --schemes"),
                ("--branch-budget", "0.25", "give --branch-budget before --"),
                ("--seed", "3", "give --seeds"),
                ("--out-dir", "elsewhere", "give --out"),
                ("--iterations", "5", "give --iterations before --"),
                ("--resume", "true", "every run resumes"),
            )
        ),
        # the trainer's own spellings: an abbreviation and --flag=value
        ([], [*RUN, "--rollout-sch=tree:2"], "--rollout-scheme after --: the study sets it"),
        (
            [],
            [*RUN, "--lr", "nan"],
            "the runs' arguments (after --) with --rollout-scheme independent: python -m "
            "hgpo.train: error: TrainConfig.lr: must be a finite number > 0, got nan",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_run(own, run, needle, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["--out", str(out), *own, "--", *run]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + needle), err
    assert err.count("\n") == 1
    assert not any(out.glob("*/seed*/metrics.jsonl"))


def test_an_unwritable_out_is_named(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert main(["--out", str(tmp_path / "a_file"), "--", *RUN]) == 2
    assert "error: --out: " in capsys.readouterr().err


def test_a_run_the_trainer_refuses_is_named_with_its_error(tmp_path, capsys):
    # --truth-every needs whole episodes: the trainer refuses at its start, not at parse time
    argv = ["--out", str(tmp_path), "--seeds", "0", "--", *RUN, "--max-steps", "8"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: run independent seed 0: TrainConfig.max_steps=8 is below"), err


SMALL = [
    "--preset", "tiny", "--env", "toy:tmaze:length=0", "--history-length", "2",
    "--max-steps", "6", *RUN[RUN.index("--action-mode") :],
]  # fmt: skip
"""RUN on the shortest T-maze (horizon 6): a truth chain of 155 prompts, not 389; the runs of
the two tests below, which share one study folder (:func:`tiny_study`)."""
TINY = ["--schemes", "independent", "branch:singleton", "--seeds", "0", "--iterations", "1"]


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> tuple[Path, str]:
    """A finished tiny study (independent and branch:singleton, one seed, one iteration, with
    the exact truth) and what it printed: two trainer runs, shared by the tests below."""
    out = tmp_path_factory.mktemp("study")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["--out", str(out), *TINY, "--", *SMALL]) == 0
    return out, printed.getvalue()


def test_tiny_study_prints_its_tables_and_reads_finished_runs_back(tiny_study, capsys):
    out, first = tiny_study
    assert first.count("+ -m hgpo.train") == 2
    assert "| scheme | level-2 util | paired diff |" in first
    assert "| branch:singleton |" in first and "truth/hgpo/mse_all" in first
    figs = json.loads(first.strip().splitlines()[-1])
    assert figs["independent"][0]["branches"] == 0
    assert figs["branch:singleton"][0]["branches"] > 0
    # every run holds its iteration: the second call trains nothing and prints the same
    assert main(["--out", str(out), *TINY, "--", *SMALL]) == 0
    second = capsys.readouterr().out
    assert "+ -m hgpo.train" not in second
    assert json.loads(second.strip().splitlines()[-1]) == figs


def _util_rows(out, capsys):
    text = capsys.readouterr().out
    return text.count("+ -m hgpo.train"), json.loads(text.strip().splitlines()[-1])


def test_a_run_is_reused_only_with_the_same_settings(tiny_study, capsys):
    """Item 1 of issue 27: a run folder is keyed by the run's whole configuration. (The
    1-iteration run is :func:`tiny_study`'s independent one, trained once.)"""
    tmp_path, printed = tiny_study
    own = ["--out", str(tmp_path), "--schemes", "independent", "--seeds", "0"]
    # the same settings: the tiny study's run, read back
    assert main([*own, "--iterations", "1", "--", *SMALL]) == 0
    trained, one = _util_rows(tmp_path, capsys)
    assert trained == 0
    assert one["independent"] == json.loads(printed.strip().splitlines()[-1])["independent"]
    # more iterations: a run of its own (not the 1-iteration run's row, nor that run extended)
    assert main([*own, "--iterations", "2", "--", *SMALL]) == 0
    trained, two = _util_rows(tmp_path, capsys)
    assert trained == 1 and one != two
    # another lr after --: a run of its own
    assert main([*own, "--iterations", "1", "--", *SMALL, "--lr", "0.05"]) == 0
    trained, lr = _util_rows(tmp_path, capsys)
    assert trained == 1
    runs = sorted(p.parent.name for p in tmp_path.glob("independent/*/metrics.jsonl"))
    assert len(runs) == 3 and all(r.startswith("seed0_") for r in runs), runs
    # each settings' run is read back, not trained again
    assert main([*own, "--iterations", "2", "--", *SMALL]) == 0
    assert _util_rows(tmp_path, capsys) == (0, two)
    assert main([*own, "--iterations", "1", "--", *SMALL]) == 0
    assert _util_rows(tmp_path, capsys) == (0, one)
    assert main([*own, "--iterations", "1", "--", *SMALL, "--lr=0.05"]) == 0  # same config
    assert _util_rows(tmp_path, capsys) == (0, lr)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_a_sigkilled_study_leaves_no_trainer_behind(tmp_path):
    """The runs die with the study (PR_SET_PDEATHSIG): a killed study's trainer does not go on
    writing its folder (the same command resumes it)."""
    argv = [sys.executable, "-m", "studies.train_branching", "--out", str(tmp_path),
            "--schemes", "independent", "--seeds", "0", "--iterations", "50", "--", *RUN]  # fmt: skip
    study = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert study.stdout.readline().startswith("+ -m hgpo.train")  # the run has started
        deadline = time.monotonic() + 60
        while not (trainers := _children(study.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert trainers
        study.kill()
        study.wait(10)
        deadline = time.monotonic() + 10
        while any(map(_alive, trainers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in trainers if _alive(p)], "the trainer outlived its study"
    finally:
        study.kill()
        for p in _children(study.pid):
            os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
