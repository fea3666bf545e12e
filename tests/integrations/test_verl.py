"""Every estimator of ours inside verl: registration, the metadata contract, exact parity.

The DataProto is built the way verl-agent builds one (one row per agent step: several rollout
groups, trajectories of different lengths, padded responses, repeated observations, the env
reward and the action validity per row), then verl's own ``ray_trainer.compute_advantage``
(ours once hgpo.integrations.verl is imported) runs on it; its token advantages must equal,
bit for bit, our ``compute_advantages`` on a StepBatch built independently from the
per-trajectory lists (``StepBatch.from_trajectories``; the builders are
benchmarks/verl_parity.py's), broadcast as ``A[row] * response_mask[row]``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
# verl's engine registry warns at import about every optional engine it lacks (megatron, ...)
pytestmark = pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning")

from benchmarks.verl_parity import (  # noqa: E402
    CASES,
    GAMMA,
    LAM,
    OUTCOME,
    algo_config,
    make_dataproto,
    make_episodes,
    outcome_case,
    outcome_dataproto,
    reference_tokens,
    rows_of,
)
from hgpo import EstimatorConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hv():
    """hgpo.integrations.verl, imported once (verl's imports take seconds)."""
    from hgpo.integrations import verl as module

    return module


@pytest.fixture(scope="module")
def ray_trainer(hv):
    from verl.trainer.ppo import ray_trainer

    return ray_trainer


@pytest.mark.parametrize("layout", ["emitted", "steps", "shuffled"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=lambda c: str(c))
def test_verl_compute_advantage_equals_ours_exactly(hv, ray_trainer, name, options, layout):
    seed = 7 + len(name) + 3 * len(options)
    ep = make_episodes(seed)
    rows = rows_of(ep, layout, seed)
    data = make_dataproto(ep, rows, step_index=layout == "shuffled")
    out = ray_trainer.compute_advantage(
        data, adv_estimator=hv.verl_name(name), gamma=GAMMA, lam=LAM, config=algo_config(options)
    )
    mask = data.batch["response_mask"].float()
    want_a, want_r, ref_advantages = reference_tokens(ep, rows, name, options, mask)
    assert out.batch["advantages"].dtype == torch.float32
    assert torch.equal(out.batch["advantages"], want_a)
    assert torch.equal(out.batch["returns"], want_r)
    assert (out.batch["advantages"][mask == 0] == 0).all()
    assert ref_advantages.std() > 0  # the case is not degenerate: a wrong order would show


def test_every_estimator_of_ours_is_registered_and_verls_are_untouched(hv):
    from verl.trainer.ppo import core_algos

    from hgpo import ESTIMATORS

    assert set(hv.NAMES) == set(ESTIMATORS)
    verls = {e.value for e in core_algos.AdvantageEstimator}
    for ours, name in hv.NAMES.items():
        assert core_algos.get_adv_estimator_fn(name).hgpo_estimator == ours
        assert core_algos.get_adv_estimator_fn(hv.NAMESPACE + ours).hgpo_estimator == ours
        assert name not in verls
    for name in verls:  # verl's own: never ours
        assert getattr(core_algos.ADV_ESTIMATOR_REGISTRY[name], "hgpo_estimator", None) is None
    assert hv.verl_name("grpo") == "hgpo.grpo" and hv.verl_name("rloo") == "hgpo.rloo"
    assert hv.verl_name("gae") == "hgpo.gae"
    assert hv.verl_name("hgpo") == "hgpo" and hv.verl_name("hgpo-nohog2") == "hgpo_nohog2"
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        hv.verl_name("nope")


def test_a_name_verl_takes_later_is_never_shadowed(hv):
    """A fake verl registry that already has 'stepwise' and 'hgpo.oracle': ours gets
    'hgpo.stepwise' only, and no 'hgpo.oracle' at all; verl's functions stay."""
    from enum import Enum
    from types import SimpleNamespace

    def theirs(**kwargs):
        return None

    registry = {"stepwise": theirs, "hgpo.oracle": theirs}

    def register_adv_est(name):
        def put(fn):
            assert name not in registry or registry[name] is fn, name
            registry[name] = fn
            return fn

        return put

    fake = SimpleNamespace(
        AdvantageEstimator=Enum("AdvantageEstimator", {"GRPO": "grpo", "GAE": "gae"}),
        ADV_ESTIMATOR_REGISTRY=registry,
        register_adv_est=register_adv_est,
    )
    names, ours = hv._register(fake)
    assert registry["stepwise"] is theirs and registry["hgpo.oracle"] is theirs
    assert names["stepwise"] == "hgpo.stepwise" and "stepwise" not in ours
    assert names["oracle"] == "oracle" and "hgpo.oracle" not in ours
    assert names["grpo"] == "hgpo.grpo" and "grpo" not in ours
    assert hv._register(fake) == (names, ours)  # idempotent


def test_verls_own_estimators_pass_through_unchanged(hv, ray_trainer):
    from verl.trainer.ppo import core_algos

    ep = make_episodes(3)
    data = make_dataproto(ep, rows_of(ep, "emitted", 3))
    want, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    out = ray_trainer.compute_advantage(data, adv_estimator="grpo", config=algo_config({}))
    assert torch.equal(out.batch["advantages"], want)
    want, _ = core_algos.compute_rloo_outcome_advantage(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.non_tensor_batch["uid"],
        config=algo_config({}),
    )
    out = ray_trainer.compute_advantage(data, adv_estimator="rloo", config=algo_config({}))
    assert torch.equal(out.batch["advantages"], want)


@pytest.mark.parametrize("key", ["uid", "traj_uid", "anchor_obs"])
def test_a_missing_key_is_a_named_error_listing_the_keys_before_any_work(hv, ray_trainer, key):
    ep = make_episodes(5)
    data = make_dataproto(ep, rows_of(ep, "emitted", 5))
    del data.non_tensor_batch[key]
    with pytest.raises(hv.MissingMetadataError) as e:
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))
    msg = str(e.value)
    assert f"lacks non_tensor_batch {key!r}" in msg and "estimator 'hgpo'" in msg
    for needed in ("uid", "traj_uid", "anchor_obs", "response_mask", "token_level_rewards"):
        assert repr(needed) in msg
    assert "advantages" not in set(data.batch.keys())  # nothing written
    assert "only 'uid' came" not in msg


def test_a_batch_with_only_uid_says_what_verls_v1_trainer_hands_over(hv, ray_trainer):
    """verl 0.9's v1 trainer (the default) builds compute_advantage's DataProto from 'uid'
    and fixed tensors only (trainer_base._compute_advantage): the error says what brings the
    rest."""
    ep = make_episodes(5)
    data = make_dataproto(ep, rows_of(ep, "emitted", 5))
    for key in set(data.non_tensor_batch) - {"uid"}:
        del data.non_tensor_batch[key]
    with pytest.raises(hv.MissingMetadataError, match="only 'uid' came: verl's v1 trainer"):
        ray_trainer.compute_advantage(data, adv_estimator="gigpo", config=algo_config({}))


def test_a_missing_tensor_and_gaes_values_are_named(hv, ray_trainer):
    ep = make_episodes(5)
    data = make_dataproto(ep, rows_of(ep, "emitted", 5))
    data.batch.pop("values")
    with pytest.raises(hv.MissingMetadataError, match=r"lacks batch 'values'"):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo.gae", config=algo_config({}))
    data.batch.pop("responses")
    with pytest.raises(hv.MissingMetadataError, match=r"'responses'"):
        ray_trainer.compute_advantage(
            data, adv_estimator="hgpo", config=algo_config({"include_actions": True})
        )


def test_the_registered_function_called_the_plain_verl_way_is_a_named_error(hv):
    from verl.trainer.ppo import core_algos

    ep = make_episodes(5)
    data = make_dataproto(ep, rows_of(ep, "emitted", 5))
    fn = core_algos.get_adv_estimator_fn("hgpo")
    with pytest.raises(hv.MissingMetadataError, match="'traj_uid', 'anchor_obs'"):
        fn(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            config=None,
            index=data.non_tensor_batch["uid"],
        )


def test_bad_metadata_values_are_named(hv, ray_trainer):
    ep = make_episodes(5)
    rows = rows_of(ep, "emitted", 5)
    data = make_dataproto(ep, rows)
    data.non_tensor_batch["is_action_valid"][2] = "yes"
    with pytest.raises(ValueError, match=r"is_action_valid'\]\[2\]: must be a bool, got 'yes'"):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))
    data = make_dataproto(ep, rows)
    long = next(i for i, r in enumerate(ep.rewards) if len(r) > 1)
    row = rows.index((long, 0))
    data.non_tensor_batch["uid"][row] = "another group"  # the trajectory spans two groups
    with pytest.raises(ValueError, match=r"DataProto -> StepBatch: StepBatch\.group"):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))
    data = make_dataproto(ep, rows, step_index=True)
    data.non_tensor_batch["step_index"][0] = 1.5
    with pytest.raises(ValueError, match=r"step_index'\]\[0\]: must be an integer >= 0, got 1.5"):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))


def test_options_verl_sets_are_not_taken_twice(hv):
    with pytest.raises(ValueError, match=r"algorithm.hgpo.gamma: set by verl's algorithm.gamma"):
        hv.estimator_config(algo_config({"gamma": 0.5}), gamma=0.9)
    with pytest.raises(ValueError, match=r"norm_adv_by_std_in_grpo"):
        hv.estimator_config(algo_config({"norm": "mean"}))
    with pytest.raises(ValueError, match="unknown estimator option 'KK'"):
        hv.estimator_config(algo_config({"KK": 2}))
    cfg = hv.estimator_config(algo_config({"K": 4}), gamma=0.9, lam=0.5, norm_by_std=False)
    assert (cfg.K, cfg.gamma, cfg.gae_lambda, cfg.norm) == (4, 0.9, 0.5, "mean")
    assert hv.estimator_config(None).K == EstimatorConfig().K


def test_version_outside_the_tested_range_is_one_line(hv, monkeypatch):
    hv.check_verl_version("0.9.1")
    hv.check_verl_version("0.9.7.dev0")
    monkeypatch.delenv("HGPO_VERL_ANY_VERSION", raising=False)
    for version in ("0.10.0", "0.8.5", "1.0", "0.90"):
        with pytest.raises(hv.UnsupportedVerlVersion) as e:
            hv.check_verl_version(version)
        assert "\n" not in str(e.value) and f"verl {version} is outside" in str(e.value)
    monkeypatch.setenv("HGPO_VERL_ANY_VERSION", "1")
    with pytest.warns(UserWarning, match="outside the tested range"):
        hv.check_verl_version("0.10.0")


def test_import_verl_with_the_env_var_registers_and_installs():
    """What `VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl python -m verl.trainer.main_ppo`
    does first: `import verl` loads us, and verl's compute_advantage is ours."""
    code = (
        "import verl\n"
        "from verl.trainer.ppo import core_algos, ray_trainer\n"
        "import hgpo.integrations.verl as hv\n"
        "assert ray_trainer.compute_advantage is hv.compute_advantage\n"
        "print(sorted(n for n in core_algos.ADV_ESTIMATOR_REGISTRY if n in hv.REGISTERED))\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="hgpo.integrations.verl")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "'hgpo'" in r.stdout and "'hgpo.grpo'" in r.stdout and "'gigpo'" in r.stdout


def test_without_rewards_the_step_reward_is_the_rows_token_rewards(hv, ray_trainer):
    """No non_tensor_batch['rewards']: each row's reward is token_level_rewards[row].sum()."""
    ep = make_episodes(11)
    rows = rows_of(ep, "steps", 11)
    with_key = make_dataproto(ep, rows)
    without = make_dataproto(ep, rows)
    del without.non_tensor_batch["rewards"]
    tlr = torch.zeros_like(without.batch["token_level_rewards"])
    for r, (i, t) in enumerate(rows):
        tlr[r, 0] = ep.rewards[i][t] / 2  # the step reward spread over two tokens
        tlr[r, ep.lengths[i][t] - 1] += ep.rewards[i][t] / 2
    without.batch["token_level_rewards"] = tlr
    for data in (with_key, without):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", gamma=GAMMA, config=None)
    assert torch.equal(with_key.batch["advantages"], without.batch["advantages"])
    assert with_key.batch["advantages"].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(OUTCOME))
def test_ours_equals_verls_own_outcome_estimator_to_float32_rounding(hv, name):
    """hgpo.grpo / hgpo.rloo against verl's grpo / rloo on one-step episodes: the same
    definition, verl's in float32, ours in float64 (then float32): equal to 1e-6 relative."""
    for seed in range(20):
        assert outcome_case(name, seed) <= 1e-6
    data = outcome_dataproto(0)
    assert data.batch["token_level_rewards"].abs().sum() > 0


def test_the_command_lines_overrides_reach_the_estimator(hv):
    """verl's own ppo_trainer config, composed by hydra with the overrides a user types."""
    from hydra import compose, initialize_config_module

    overrides = [
        "algorithm.adv_estimator=hgpo.hgpo-nohog2",
        "algorithm.gamma=0.9",
        "+algorithm.hgpo.K=4",
        "+algorithm.hgpo.alpha=2.0",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    algo = cfg.algorithm
    assert hv.our_name(algo.adv_estimator) == "hgpo-nohog2"
    est = hv.estimator_config(algo, algo.gamma, algo.lam, algo.norm_adv_by_std_in_grpo)
    assert (est.K, est.alpha, est.gamma, est.norm) == (4, 2.0, 0.9, "mean_std")
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        plain = compose(config_name="ppo_trainer", overrides=["algorithm.adv_estimator=hgpo"])
    assert hv.estimator_config(plain.algorithm).K == EstimatorConfig().K  # struct, no hgpo key
    from verl.trainer.config import AlgoConfig

    assert hv.estimator_config(AlgoConfig(gamma=0.9), 0.9).gamma == 0.9  # verl's dataclass


def test_importing_under_an_untested_verl_stops_with_one_line(hv, monkeypatch):
    """The module's import (a fresh copy, so nothing is registered twice) reads verl's
    version first: 0.10 stops it with the one-line UnsupportedVerlVersion."""
    import importlib.util

    import verl

    monkeypatch.setattr(verl, "__version__", "0.10.0")
    monkeypatch.delenv("HGPO_VERL_ANY_VERSION", raising=False)
    spec = importlib.util.spec_from_file_location("hgpo_verl_copy", hv.__file__)
    copy = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match=r"verl 0\.10\.0 is outside the tested range 0\.9\.x"):
        spec.loader.exec_module(copy)


def test_a_copied_row_with_step_index_is_a_named_error(hv, ray_trainer):
    """verl-agent's adjust_batch (mode "copy") appends copies of random rows to make the batch
    divisible; with step_index a copy is a repeated step, a named error (without step_index
    it cannot be told from a real step)."""
    from verl import DataProto

    ep = make_episodes(5)
    rows = rows_of(ep, "emitted", 5)
    data = make_dataproto(ep, rows, step_index=True)
    data = DataProto.concat([data, data.select_idxs(np.array([3]))])
    with pytest.raises(ValueError, match=r"DataProto -> StepBatch: StepBatch\.step\["):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))


def _with_next_obs(ep, rows, data, seed: int) -> list[str]:
    """Give ``data`` verl-agent's GraphGPO key ``next_obs`` (the next step's observation; after
    a trajectory's last step its terminal observation: a room of its group, which may rejoin
    the graph, or a place seen nowhere else); returns each trajectory's terminal."""
    rng = np.random.default_rng(seed)
    end = [
        f"task {g}: room {int(rng.integers(0, 4))}" if rng.random() < 0.7 else f"end {i}"
        for i, g in enumerate(ep.groups)
    ]
    nxt = [ep.obs[i][t + 1] if t + 1 < len(ep.obs[i]) else end[i] for i, t in rows]
    data.non_tensor_batch["next_obs"] = np.array(nxt, dtype=object)
    return end


@pytest.mark.parametrize("layout", ["emitted", "shuffled"])
def test_graphgpo_reads_next_obs_as_the_terminal_states(hv, ray_trainer, layout):
    """non_tensor_batch['next_obs'] (verl-agent's GraphGPO key) becomes StepBatch.next_state,
    keyed as anchor_obs: verl's compute_advantage with graphgpo equals ours on the episodes'
    own batch with those terminal states; without the key, ours without them (the dead-end
    reading); and the two differ here (a failed trajectory's end rejoins the graph)."""
    from hgpo import StateIndexer, StepBatch, compute_advantages

    seed = 31
    ep = make_episodes(seed, n_per_group=6)
    rows = rows_of(ep, layout, seed)
    order = list(dict.fromkeys(i for i, _ in rows))
    keys = StateIndexer()
    states = [keys(ep.obs[i]).tolist() for i in order]
    cfg = EstimatorConfig(gamma=GAMMA)
    got = {}
    for given in (True, False):
        data = make_dataproto(ep, rows, step_index=layout == "shuffled")
        end = _with_next_obs(ep, rows, data, seed) if given else None
        out = ray_trainer.compute_advantage(
            data, adv_estimator=hv.verl_name("graphgpo"), gamma=GAMMA, config=algo_config({})
        )
        batch = StepBatch.from_trajectories(
            [ep.groups[i] for i in order], [ep.rewards[i] for i in order], states,
            invalid=[[not v for v in ep.valid[i]] for i in order],
            terminal_states=keys([end[i] for i in order]) if given else None,
        )  # fmt: skip
        ref = compute_advantages("graphgpo", batch, cfg)
        assert ref.diagnostics["graph"]["terminal"] == ("next_state" if given else "dead_end")
        start = dict(zip(order, batch.traj_start.tolist(), strict=True))
        at = [start[i] + t for i, t in rows]
        mask = data.batch["response_mask"].float()
        want = torch.tensor(ref.advantages[at], dtype=torch.float32)[:, None] * mask
        assert torch.equal(out.batch["advantages"], want)
        got[given] = out.batch["advantages"]
    assert not torch.equal(got[True], got[False])


def test_a_next_obs_that_is_not_the_next_step_is_a_named_error(hv, ray_trainer):
    ep = make_episodes(31)
    rows = rows_of(ep, "emitted", 31)
    data = make_dataproto(ep, rows)
    _with_next_obs(ep, rows, data, 31)
    data.non_tensor_batch["next_obs"][0] = "somewhere else"  # row 0 is not a last step
    assert len(ep.obs[rows[0][0]]) > 1
    with pytest.raises(ValueError, match=r"non_tensor_batch\['next_obs'\].*next_state\[0\]"):
        ray_trainer.compute_advantage(data, adv_estimator=hv.verl_name("graphgpo"),
                                      config=algo_config({}))  # fmt: skip


def _balance_batch(data, dp_size: int = 2) -> None:
    """verl's own ``RayPPOTrainer._balance_batch`` (trainer.balance_batch=True, the default)
    on ``data``, in place: the rows reordered so that each of ``dp_size`` ranks gets similar
    token counts (the attention mask here is the response mask)."""
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    data.batch["attention_mask"] = data.batch["response_mask"].clone()
    trainer = SimpleNamespace(
        _get_dp_size=lambda worker_group, role: dp_size,
        actor_rollout_wg=None,
        use_prefix_grouper=False,
    )
    RayPPOTrainer._balance_batch(trainer, data, metrics={})


@pytest.mark.parametrize("name", ["hgpo", "gigpo"])
def test_a_batch_balance_batch_reordered_needs_step_index(hv, ray_trainer, name):
    """A batch as verl-agent emits it (trajectory by trajectory), reordered by verl's own
    balance_batch: without step_index its step order cannot be read (StepOrderError naming
    step_index, where main computed on the scrambled order); with step_index it gives the
    advantages of the batch before the reordering, row for row."""
    ep = make_episodes(11)
    rows = rows_of(ep, "emitted", 11)
    assert len(rows) % 2 == 0  # (balance_batch splits the rows equally over the 2 ranks)
    args = dict(adv_estimator=hv.verl_name(name), gamma=GAMMA, config=algo_config({"K": 2}))
    plain = make_dataproto(ep, rows, step_index=True)
    want = ray_trainer.compute_advantage(plain, **args).batch["advantages"]
    for step_index in (False, True):
        data = make_dataproto(ep, rows, step_index=step_index)
        data.non_tensor_batch["row"] = np.arange(len(rows), dtype=object)
        _balance_batch(data)
        moved = data.non_tensor_batch["row"].astype(np.int64)
        assert not np.array_equal(moved, np.arange(len(rows)))
        if not step_index:
            with pytest.raises(hv.StepOrderError, match=r"no 'step_index'.*set non_tensor_batch"):
                ray_trainer.compute_advantage(data, **args)
            continue
        got = ray_trainer.compute_advantage(data, **args).batch["advantages"]
        assert torch.equal(got, want[torch.as_tensor(moved)])


def test_rows_appended_after_their_trajectory_need_step_index(hv, ray_trainer):
    """verl-agent's adjust_batch copies rows to the end of the batch: without step_index a
    copy would be read as a later step of its trajectory; it is a StepOrderError."""
    from verl import DataProto

    ep = make_episodes(5)
    data = make_dataproto(ep, rows_of(ep, "emitted", 5))
    data = DataProto.concat([data, data.select_idxs(np.array([0]))])
    with pytest.raises(hv.StepOrderError, match=r"trajectory '[^']+' is in rows 0, .*step_index"):
        ray_trainer.compute_advantage(data, adv_estimator="hgpo", config=algo_config({}))


def test_the_docs_names_table_is_the_live_registry(hv):
    """docs/integrations.md's "Names" table has a row for every built-in estimator of the
    registry (hgpo.estimator_registry), with the name verl takes (NAMES)."""
    from hgpo import ESTIMATORS
    from hgpo.estimator_registry import get_spec

    text = (ROOT / "docs" / "integrations.md").read_text()
    table = text.split("### Names", 1)[1].split("\n\n| ours", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", table, flags=re.M))
    builtins = [n for n in ESTIMATORS if get_spec(n).builtin]
    assert len(builtins) >= 14
    assert {n: rows.get(n) for n in builtins} == {n: hv.NAMES[n] for n in builtins}


def test_bf16_tensors_give_the_float32_advantages(hv, ray_trainer):
    """verl's tensors in bf16 (token rewards, response mask, values), with the action keys
    read from the response tokens (include_actions): the advantages of the float32 batch, in
    bf16 (token_level_rewards' dtype), where main's numpy conversion raised a raw TypeError."""
    ep = make_episodes(9)
    rows = rows_of(ep, "emitted", 9)
    args = dict(adv_estimator="hgpo", gamma=GAMMA, config=algo_config({"include_actions": True}))
    want = ray_trainer.compute_advantage(make_dataproto(ep, rows), **args).batch["advantages"]
    data = make_dataproto(ep, rows)
    for key in ("token_level_rewards", "response_mask", "values"):
        data.batch[key] = data.batch[key].to(torch.bfloat16)
    got = ray_trainer.compute_advantage(data, **args).batch["advantages"]
    assert got.dtype == torch.bfloat16 and want.abs().max() > 0
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-6)
