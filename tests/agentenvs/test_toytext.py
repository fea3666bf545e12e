"""The toy POMDPs as text environments: toyenvs' dynamics exactly, readable text, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import toyenvs
from agentenvs import BatchedEnv, EpisodeMemory
from agentenvs.toytext import (
    ToyTextEnv,
    parse_toy_spec,
    render,
    toy_factory,
    toy_prompt,
)

# every family, with slip where the family has it, so the outcome draws are compared too
SPECS = [
    "toy:keydoor:size=4,horizon=20,slip=0.3",
    "toy:tmaze:length=3,slip=0.3",
    "toy:household:n_rooms=2,receptacles_per_room=3,n_tasks=4,slip=0.2",
    "toy:shop:n_items=4,n_tasks=4",
    "toy:random:n_states=12,slip=0.3",
]


@pytest.mark.parametrize("spec", SPECS)
def test_dynamics_equal_toyenvs_for_the_same_seed_and_actions(spec):
    """Same episode seed, same action sequence: the same hidden trajectory, rewards and ends
    as toyenvs.POMDPEnv, whose reward is ours minus 0.1 per invalid action."""
    sp = parse_toy_spec(spec)
    rng = np.random.default_rng(1)
    text = ToyTextEnv(sp, "train", seed=3)
    env = text.env
    gym = toyenvs.POMDPEnv(env)
    n_moves = 0
    for episode in range(6):
        task = episode % env.train_tasks.size
        obs, info = text.reset(task)
        g_obs, g_info = gym.reset(
            seed=info["episode_seed"], options={"task": int(env.train_tasks[task])}
        )
        assert info["hidden_state"] == g_info["hidden_state"] == env.train_tasks[task]
        assert obs == text.text.obs_text[g_obs]
        done = False
        while not done:
            a = int(rng.integers(env.n_actions))
            obs, r, done, info = text.step(env.action_names[a])
            g_obs, g_r, term, trunc, g_info = gym.step(a)
            assert info["hidden_state"] == g_info["hidden_state"]
            assert info["invalid"] == g_info["invalid"] and info["action_id"] == a
            assert r - 0.1 * info["invalid"] == pytest.approx(g_r)
            assert done == (term or trunc) and info["won"] == (term and r > 0)
            assert obs == text.text.obs_text[g_obs]
            n_moves += 1
    assert n_moves > 20


@pytest.mark.parametrize("spec", SPECS)
def test_text_is_a_function_of_the_observation_id(spec):
    """Hidden states with one observation read the same; distinct texts tell observations
    apart wherever the task is shown (keydoor, tmaze, random: every observation)."""
    env = parse_toy_spec(spec).build()
    tt = render(env)
    assert len(tt.obs_text) == len(tt.task_of_obs) == env.n_obs
    assert all(a == a.lower().strip() for a in tt.actions)  # the parser lower-cases
    if env.name in ("keydoor", "tmaze", "random"):
        assert len(set(tt.obs_text)) == env.n_obs
    pairs = set(zip(tt.obs_text, tt.task_of_obs, strict=True))
    if env.name in ("keydoor", "tmaze", "random", "household"):
        assert len(pairs) == env.n_obs


def test_unknown_action_text_is_invalid_and_keeps_the_state():
    text = ToyTextEnv(parse_toy_spec("toy:tmaze:length=2"), "train")
    obs, info = text.reset(0)
    obs2, r, done, info2 = text.step("dance")
    assert (obs2, r, done) == (obs, 0.0, False)
    assert info2["invalid"] and info2["action_id"] == -1
    assert info2["hidden_state"] == info["hidden_state"]


def test_a_goal_pays_ten_and_ends():
    text = ToyTextEnv(parse_toy_spec("toy:tmaze:length=1"), "train")
    text.reset(0)  # cue up
    rewards = [text.step(a)[1] for a in ("forward", "forward")]
    obs, r, done, info = text.step("up")
    assert rewards == [0.0, 0.0] and (r, done, info["won"], info["task_score"]) == (
        10.0,
        True,
        True,
        10.0,
    )
    assert obs == "You found the treasure."


def test_batched_slots_of_a_group_draw_their_own_outcomes():
    """With slip, the members of one group (same task) do not replay the same draws."""
    factory = toy_factory(parse_toy_spec("toy:random:n_states=12,slip=0.5"), "train", seed=0)
    with BatchedEnv(factory, 8, num_workers=2) as envs:
        envs.reset([0], 8)
        hidden = []
        for _ in range(5):
            _, _, _, infos = envs.step(["a0"] * 8)
            hidden.append([i["hidden_state"] for i in infos])
    paths = {tuple(col) for col in np.array(hidden).T}
    assert len(paths) > 1


def test_splits_are_the_familys():
    sp = parse_toy_spec("toy:keydoor:size=4")
    env = sp.build()
    held = ToyTextEnv(sp, "heldout")
    for i, s in enumerate(env.heldout_tasks):
        assert held.reset(i)[1]["hidden_state"] == s
    with pytest.raises(ValueError, match=r"^task: must be an integer in 0\.\.\d+, got \d+$"):
        held.reset(env.heldout_tasks.size)
    with pytest.raises(ValueError, match="split: must be one of"):
        toy_factory(sp, "test")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("toy:maze", "unknown toy family 'maze'.*known families: keydoor, tmaze, household"),
        ("toy:keydoor:sz=4", "no parameter 'sz'; parameters: \\['size', 'slip'"),
        ("toy:keydoor:size=2", r"size: must be an integer in 4\.\.64, got 2"),
        ("keydoor:size=4", "must be 'toy:FAMILY:param=value,...'"),
        ("toy:tmaze:length", "name=value items"),
    ],
)
def test_bad_specs_name_the_known_ones(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_toy_spec(spec)


def test_prompt_shows_task_history_and_actions():
    mem = EpisodeMemory()
    p0 = toy_prompt("tmaze", "turn right", "obs A", ["forward", "up"], mem, 2)
    assert "turn right" in p0 and "'forward'\n 'up'" in p0 and "step(s)" not in p0
    for o, a in (("obs A", "forward"), ("obs B", "up"), ("obs C", "forward")):
        mem.store(o, a)
    p = toy_prompt("tmaze", "turn right", "obs D", ["forward", "up"], mem, 2)
    assert "already taken 3 step(s)" in p and "[Observation 2: 'obs B', Action 2: 'up']" in p
    assert "obs A" not in p and "now at step 4" in p
