"""``python -m agentenvs.alfworld.generator``: a games folder of one task type for the trainer."""

import json
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the alfworld package (extra [alfworld])")

from agentenvs.alfworld.env import find_games
from agentenvs.alfworld.generator import generate_split, main


def test_cli_writes_the_official_layout_of_one_task_type(tmp_path, capsys):
    out = tmp_path / "games"
    args = ["--out", str(out), "--task-type", "look_at_obj_in_light", "--seed", "3"]
    assert main([*args, "--train", "3", "--valid-seen", "2", "--valid-unseen", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["games"] == {"train": 3, "valid_seen": 2, "valid_unseen": 2}
    assert set(summary["goal_and_floorplan_also_in_train"]) == {"valid_seen", "valid_unseen"}
    for split, n in summary["games"].items():
        games = find_games(out / split)
        assert len(games) == n
        for g in games:
            traj = json.loads((Path(g).parent / "traj_data.json").read_text())
            assert traj["task_type"] == "look_at_obj_in_light"
    with pytest.raises(SystemExit, match="already holds games"):
        main([*args, "--train", "1"])


def test_split_of_one_task_type_and_bad_values(tmp_path):
    paths = generate_split(tmp_path, "train", 2, seed=1, task_type="pick_and_place_simple")
    assert all("pick_and_place_simple-" in str(p) for p in paths)
    with pytest.raises(ValueError, match=r"^task_type: must be one of .*, got 'juggle'$"):
        generate_split(tmp_path, "train", 1, task_type="juggle")
    with pytest.raises(
        ValueError,
        match=r"^split: must be one of 'train', 'valid_seen', 'valid_unseen', got 'test'$",
    ):
        generate_split(tmp_path, "test", 1)


def test_cli_rejects_a_negative_count_and_an_unwritable_out(tmp_path):
    with pytest.raises(SystemExit, match=r"^--valid-unseen: must be an integer >= 0, got -1$"):
        main(["--out", str(tmp_path / "g"), "--valid-unseen", "-1"])
    with pytest.raises(SystemExit, match=r"^--out: cannot write to '/proc/hgpo/g'"):
        main(["--out", "/proc/hgpo/g", "--train", "1"])


def test_a_split_of_no_games_is_an_empty_folder_the_trainer_accepts(tmp_path, capsys):
    """--valid-unseen 0 (the default) still makes valid_unseen/: the trainer's games-folder
    check wants every split's folder, and refused the generator's own output before."""
    from agentenvs.registry import benchmark
    from hgpo.train.train_config import resolve

    out = tmp_path / "g"
    assert main(["--out", str(out), "--train", "1", "--task-type", "pick_and_place_simple"]) == 0
    assert json.loads(capsys.readouterr().out)["games"]["valid_unseen"] == 0
    assert (out / "valid_seen").is_dir() and (out / "valid_unseen").is_dir()
    check = benchmark("alfworld").preflight
    assert check(resolve("alfworld", "tiny", {"alfworld_games_dir": str(out)})) is None
    (out / "valid_unseen").rmdir()  # the check does look
    assert "has no valid_unseen/ folder" in check(
        resolve("alfworld", "tiny", {"alfworld_games_dir": str(out)})
    )
