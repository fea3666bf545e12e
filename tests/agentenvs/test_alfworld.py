"""ALFWorld through the real engine on the shipped generated games."""

import re
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the alfworld package (extra [alfworld])")
pytest.importorskip("textworld", reason="ALFWorld needs textworld (installed with alfworld)")

from agentenvs.alfworld.env import AlfWorldEnv, find_games, run_expert
from agentenvs.alfworld.generator import (
    OOD_FLOORPLANS,
    TASK_TYPES,
    floorplans,
    generate_game,
    pddl_problem,
)

DATA = Path(__file__).parent / "data" / "alfworld_games"
GOALS = {
    "pick_and_place_simple": (r"put a \w+ in \w+", r"put some \w+ on \w+"),
    "look_at_obj_in_light": (r"look at \w+ under the \w+", r"examine the \w+ with the \w+"),
    "pick_clean_then_place_in_recep": (
        r"put a clean \w+ in \w+",
        r"clean some \w+ and put it in \w+",
    ),
    "pick_heat_then_place_in_recep": (r"put a hot \w+ in \w+", r"heat some \w+ and put it in \w+"),
    "pick_cool_then_place_in_recep": (r"put a cool \w+ in \w+", r"cool some \w+ and put it in \w+"),
    "pick_two_obj_and_place": (r"put two \w+ in \w+", r"find two \w+ and put them in \w+"),
}


@pytest.fixture(scope="module")
def games():
    return {s: find_games(DATA / s) for s in ("train", "valid_seen", "valid_unseen")}


def test_shipped_games_cover_splits_and_types(games):
    assert len(games["train"]) == 6 and games["valid_seen"] and games["valid_unseen"]
    assert {Path(g).parent.parent.name.split("-")[0] for g in games["train"]} == set(TASK_TYPES)


def test_ood_floorplans_never_used_in_training():
    assert set(floorplans("train")).isdisjoint(OOD_FLOORPLANS)
    assert set(floorplans("valid_unseen")) <= set(OOD_FLOORPLANS)
    for seed in range(30):
        assert generate_game(seed, "train").floorplan not in OOD_FLOORPLANS
        assert generate_game(seed, "valid_unseen").floorplan in OOD_FLOORPLANS
    with pytest.raises(ValueError, match="split"):
        floorplans("test")


def test_generation_is_deterministic():
    a, b = generate_game(11, "train"), generate_game(11, "train")
    assert pddl_problem(a) == pddl_problem(b)
    assert pddl_problem(a) != pddl_problem(generate_game(11, "valid_seen"))


def test_first_observation_and_protocol(games):
    env = AlfWorldEnv(games["train"])
    for t in range(env.num_tasks):
        obs, info = env.reset(t)
        m = re.fullmatch(
            r"-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a "
            r"room\. Looking quickly around you, you see (.+)\.\n\nYour task is "
            r"to: (.+)\.",
            obs,
            flags=re.DOTALL,
        )
        assert m, obs
        assert re.fullmatch(r"(a [a-z]+ \d+, )*(and )?a [a-z]+ \d+", m.group(1))
        assert any(re.fullmatch(p, m.group(2)) for p in GOALS[info["task_type"]])
        adm = info["admissible_actions"]
        assert adm == sorted(set(adm)) and "look" in adm and "inventory" in adm
    obs, r, d, info = env.step("fly to the moon")
    assert (obs, r, d) == ("Nothing happens.", 0.0, False)
    assert env.step("inventory")[0] == "You are not carrying anything."
    go = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs = env.step(go)[0]
    r_name = go[len("go to ") :]
    assert obs.startswith(f"You arrive at {r_name}. ")
    assert re.fullmatch(
        rf"You arrive at {r_name}\. (The {r_name} is closed\.|On the {r_name}, you see "
        r"(nothing|.+)\.)",
        obs,
    )
    env.close()


def test_expert_solves_every_shipped_game_within_50_steps(games):
    for split, files in games.items():
        env = AlfWorldEnv(files)
        for t in range(len(files)):
            won, plan = run_expert(env, t)
            assert won and 1 <= len(plan) <= 50, (split, files[t], plan)
            assert env.step("look")[2]  # finished episodes stay done
        env.close()


def test_step_limit_counts_invalid_steps(games):
    env = AlfWorldEnv(games["train"][:1], max_steps=3)
    env.reset(0)
    dones = [env.step("nonsense")[2] for _ in range(3)]
    assert dones == [False, False, True]
    env.close()


def test_batched_alfworld_groups_start_identical(games):
    from agentenvs.batched import BatchedEnv
    from agentenvs.factories import alfworld_factory, observation_key

    with BatchedEnv(alfworld_factory(games["valid_seen"]), num_envs=4, num_workers=2) as env:
        obs, infos = env.reset([0, 1], group_n=2)
        assert obs[0] == obs[1] and obs[2] == obs[3] and obs[0] != obs[2]
        assert infos[0]["admissible_actions"] == infos[1]["admissible_actions"]
        assert observation_key("alfworld", obs[0]) == obs[0]
        obs, _r, _d, infos = env.step(["look", "look", "inventory", "inventory"])
        assert obs[0] == obs[1] and obs[2] == "You are not carrying anything."


def test_planner_solves_every_shipped_game_no_longer_than_the_expert(games):
    """The PDDL planner (used for official games, where no generator record exists) finds a
    winning plan, and an optimal one cannot be longer than the scripted expert's."""
    from agentenvs.alfworld.env import planner_plan, play

    files = games["train"] + games["valid_unseen"]
    env = AlfWorldEnv(files)
    for t in range(len(files)):
        plan = planner_plan(env, t)
        assert play(env, t, plan), (files[t], plan)
        assert len(plan) <= len(run_expert(env, t)[1]), files[t]
    env.close()


def test_official_plan_lengths_from_alfworld_data(games, tmp_path, monkeypatch):
    """--official reads $ALFWORLD_DATA/json_2.1.1/<split> as the official layout: stand the
    shipped train games there and the planner's report covers them."""
    import shutil

    from agentenvs.alfworld.solvability import solvability_report

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ValueError, match="set ALFWORLD_DATA"):
        solvability_report(3, "train", official=True, workers=1)
    root = tmp_path / "json_2.1.1" / "train"
    for f in games["train"]:
        trial = Path(f).parent
        shutil.copytree(trial, root / trial.parent.name / trial.name)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    rep = solvability_report(4, "train", seed=0, official=True, workers=1)
    assert (rep["games"], rep["plans"], rep["n_games"], rep["solved"]) == (
        "official", "planner", 4, 4,
    )  # fmt: skip
    assert sum(v["n"] for v in rep["plan_length"].values()) == 4
