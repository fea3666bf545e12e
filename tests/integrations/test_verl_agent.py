"""hgpo.integrations.verl_agent: verl-agent's advantage signatures on the registry.

Parity: the golden cases of ``tests/hgpo/data/verl_agent_golden.json`` (the authors' public
code run on random batches, as published in float32 and with float32 replaced by float64) are
fed through the same trainer glue the authors' functions get (``benchmarks/verl_agent_glue.py``)
into OUR functions with the authors' signatures:
- float64 glue: every row equals the authors' float64 run to 1e-7 x max(1, |A|), except hgpo
  rows whose "A_k == 0" test is decided by rounding (as in tests/hgpo/test_verl_agent_golden.py);
- float32 glue (as published): every row that our exact path (compute_advantages on the case's
  StepBatch) puts within 1e-6 of both authors' runs is within 2e-6 x max(1, |A|) of the float32
  run: both are within 1e-6 of exact arithmetic, ours on the float32 inputs, theirs in float32.
"""

from __future__ import annotations

import inspect
import json
import types
from enum import Enum
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.golden_common import classify  # noqa: E402
from benchmarks.make_verl_agent_golden import case_batch, ours, rounding_decided  # noqa: E402
from benchmarks.verl_agent_glue import MODES, authors_inputs, call_ours  # noqa: E402
from hgpo import EstimatorConfig, compute_advantages, estimator_reads, reference_config  # noqa: E402
from hgpo.integrations import verl_agent as va  # noqa: E402
from tests.integrations import verl_agent_live as live  # noqa: E402

GOLDEN = json.loads(
    (Path(__file__).parents[1] / "hgpo" / "data" / "verl_agent_golden.json").read_text()
)
CASES = GOLDEN["cases"]
F32_TOL, F64_TOL, SIG32_TOL = 1e-6, 1e-7, 2e-6


def _first_token(adv: torch.Tensor) -> np.ndarray:
    return adv[:, 0].double().numpy()  # every golden row has >= 1 response token


@pytest.mark.parametrize("estimator", ["hgpo", "gigpo", "grpo", "rloo"])
def test_float64_glue_equals_the_authors_float64_run(estimator):
    cases = [c for c in CASES if c["estimator"] == estimator]
    assert cases
    for n, case in enumerate(cases):
        x = authors_inputs(case, float64=True)
        adv, ret = call_ours(va, case, x)
        assert adv is ret and adv.dtype == torch.float64 and adv.shape == x.response_mask.shape
        a, f64 = _first_token(adv), np.asarray(case["reference_f64"])
        ok = np.abs(a - f64) <= F64_TOL * np.maximum(1.0, np.abs(a))
        bad = ~ok & ~rounding_decided(case)
        assert not bad.any(), (
            f"{estimator} case {n}: rows {np.flatnonzero(bad)}: {a[bad]} {f64[bad]}"
        )


@pytest.mark.parametrize("estimator", ["hgpo", "gigpo", "grpo", "rloo"])
def test_float32_glue_equals_the_authors_float32_run(estimator):
    cases = [c for c in CASES if c["estimator"] == estimator]
    for n, case in enumerate(cases):
        x = authors_inputs(case, float64=False)
        adv, _ = call_ours(va, case, x)
        assert adv.dtype == torch.float32
        a, f32 = _first_token(adv), np.asarray(case["reference_f32"])
        f64 = np.asarray(case["reference_f64"])
        exact_agrees = (classify(ours(case), f32, f64) == 0) & ~rounding_decided(case)
        ok = np.abs(a - f32) <= SIG32_TOL * np.maximum(1.0, np.abs(a))
        bad = exact_agrees & ~ok
        assert not bad.any(), (
            f"{estimator} case {n}: rows {np.flatnonzero(bad)}: {a[bad]} {f32[bad]}"
        )


SIGNATURES = {
    "compute_gigpo_outcome_advantage": [
        ("token_level_rewards", None), ("step_rewards", None), ("response_mask", None),
        ("anchor_obs", None), ("index", None), ("traj_index", None), ("epsilon", 1e-6),
        ("step_advantage_w", 1.0), ("mode", "mean_norm"), ("enable_similarity", False),
        ("similarity_thresh", 0.95)],
    "compute_hgpo_outcome_advantage": [
        ("token_level_rewards", None), ("step_rewards", None), ("response_mask", None),
        ("anchor_obs", None), ("index", None), ("traj_index", None), ("history_length", None),
        ("epsilon", 1e-6), ("mode", "mean_std_norm"), ("length_weight_alpha", 1.0),
        ("base_group", False)],
    "compute_grpo_outcome_advantage": [
        ("token_level_rewards", None), ("response_mask", None), ("index", None),
        ("traj_index", None), ("epsilon", 1e-6), ("norm_adv_by_std_in_grpo", True),
        ("compute_mean_std_cross_steps", True)],
    "compute_rloo_outcome_advantage": [
        ("token_level_rewards", None), ("response_mask", None), ("index", None),
        ("traj_index", None), ("epsilon", 1e-6), ("compute_mean_std_cross_steps", True)],
}  # fmt: skip
"""verl-agent's signatures at 796ed31: (parameter, default or None for a required one)."""


def _signature(fn) -> list[tuple]:
    empty = inspect.Parameter.empty
    return [(p.name, None if p.default is empty else p.default)
            for p in inspect.signature(fn).parameters.values()]  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_verl_agents(name):
    assert _signature(getattr(va, name)) == SIGNATURES[name]


def test_padding_is_zero_and_rows_follow_the_mask():
    case = next(c for c in CASES if c["estimator"] == "hgpo" and c["base_group"])
    x = authors_inputs(case)
    adv, _ = call_ours(va, case, x)
    assert torch.all(adv[x.response_mask == 0] == 0)
    row = adv[:, :1].expand_as(adv) * x.response_mask
    assert torch.equal(adv, row)


def _interleaved(case: dict) -> np.ndarray:
    """A row order that interleaves the trajectories, each keeping its own step order."""
    traj = np.asarray(case["traj"])
    pos = np.zeros(len(traj), dtype=np.int64)
    for t in np.unique(traj):
        rows = np.flatnonzero(traj == t)
        pos[rows] = np.arange(rows.size)
    return np.lexsort((traj, pos))


@pytest.mark.parametrize("estimator", ["hgpo", "gigpo"])
def test_trajectories_need_not_be_contiguous(estimator):
    case = next(c for c in CASES if c["estimator"] == estimator and len(set(c["traj"])) > 2)
    x = authors_inputs(case, float64=True)
    adv, _ = call_ours(va, case, x)
    p = _interleaved(case)
    assert not np.array_equal(p, np.arange(p.size))

    shuffled = type(x)(x.token_level_rewards[p], x.step_rewards[p], x.response_mask[p],
                       x.anchor_obs[p], x.index[p], x.traj_index[p])  # fmt: skip
    adv_p, _ = call_ours(va, case, shuffled)
    torch.testing.assert_close(adv_p, adv[p], rtol=0, atol=1e-12)


SIMILARITY = [
    c
    for c in json.loads(
        (Path(__file__).parents[1] / "hgpo" / "data" / "gigpo_variants_golden.json").read_text()
    )["cases"]
    if c["estimator"] == "gigpo_similarity"
]
"""verl-agent's GiGPO with enable_similarity=True on random batches (the golden file of
tests/hgpo/test_gigpo_variants_golden.py), inputs from the trainer glue of authors_inputs."""


def _similarity_call(case: dict, float64: bool) -> torch.Tensor:
    x = authors_inputs(case, float64=float64)
    adv, ret = va.compute_gigpo_outcome_advantage(
        token_level_rewards=x.token_level_rewards, step_rewards=x.step_rewards,
        response_mask=x.response_mask, anchor_obs=np.array(case["observations"], dtype=object),
        index=x.index, traj_index=x.traj_index, step_advantage_w=1.0, mode=MODES[case["env"]],
        enable_similarity=True, similarity_thresh=case["thresh"],
    )  # fmt: skip
    assert adv is ret and adv.dtype == (torch.float64 if float64 else torch.float32)
    return adv


def test_enable_similarity_equals_the_authors_runs():
    """Our gigpo_similarity through verl-agent's signature: every row equals the authors'
    float64 run to 1e-7 x max(1, |A|) on float64 glue; on the float32 glue (as published),
    the float32 run to 2e-6 x max(1, |A|) wherever our exact path agrees with both runs."""
    from benchmarks.make_gigpo_variants_golden import ours as ours_variant

    assert len(SIMILARITY) >= 8
    assert any(c["thresh"] <= 0.8 and len(set(c["observations"])) > 2 for c in SIMILARITY)
    for n, case in enumerate(SIMILARITY):
        a = _first_token(_similarity_call(case, float64=True))
        f32, f64 = np.asarray(case["reference_f32"]), np.asarray(case["reference_f64"])
        ok = np.abs(a - f64) <= F64_TOL * np.maximum(1.0, np.abs(a))
        assert ok.all(), f"case {n}: rows {np.flatnonzero(~ok)}: {a[~ok]} {f64[~ok]}"
        a32 = _first_token(_similarity_call(case, float64=False))
        exact_agrees = classify(ours_variant(case), f32, f64) == 0
        ok = np.abs(a32 - f32) <= SIG32_TOL * np.maximum(1.0, np.abs(a32))
        bad = exact_agrees & ~ok
        assert not bad.any(), f"case {n}: rows {np.flatnonzero(bad)}: {a32[bad]} {f32[bad]}"


def test_enable_similarity_clusters_in_the_rows_order_hand_worked():
    """One rollout group of three one-step trajectories with texts A = "aaaa", B = "aaab",
    C = "aabb" at threshold 0.7: difflib's ratio is 0.75 for (A, B) and (B, C), 0.5 for (A, C).
    Episode scores all 0 (A^E = 0), step returns R = 1, 2, 4 for A, B, C, mode mean_norm.
    Rows A, B, C: B joins A's cluster: {A, B} mean 1.5, {C}: A^S = -0.5, 0.5, 0.
    Rows C, B, A: B joins C's cluster: {C, B} mean 3, {A}: A^S = 0 for A, -1 for B, 1 for C
    (as the authors' build_step_group, which takes the rows in the order given)."""

    def run(texts, R):
        n = len(texts)
        adv, _ = va.compute_gigpo_outcome_advantage(
            token_level_rewards=torch.zeros((n, 2), dtype=torch.float64),
            step_rewards=torch.tensor(R, dtype=torch.float64),
            response_mask=torch.ones((n, 2), dtype=torch.float64),
            anchor_obs=np.array(texts, dtype=object), index=np.array(["g"] * n, dtype=object),
            traj_index=np.array([f"t{i}" for i in range(n)], dtype=object),
            mode="mean_norm", enable_similarity=True, similarity_thresh=0.7,
        )  # fmt: skip
        return _first_token(adv).tolist()

    assert run(["aaaa", "aaab", "aabb"], [1.0, 2.0, 4.0]) == [-0.5, 0.5, 0.0]
    assert run(["aabb", "aaab", "aaaa"], [4.0, 2.0, 1.0]) == [1.0, -1.0, 0.0]
    # enable_similarity=False groups equal texts only: three singletons
    adv, _ = va.compute_gigpo_outcome_advantage(
        token_level_rewards=torch.zeros((3, 2), dtype=torch.float64),
        step_rewards=torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64),
        response_mask=torch.ones((3, 2), dtype=torch.float64),
        anchor_obs=np.array(["aaaa", "aaab", "aabb"], dtype=object),
        index=np.array(["g"] * 3, dtype=object), traj_index=np.array(["a", "b", "c"], dtype=object),
        mode="mean_norm",
    )  # fmt: skip
    assert _first_token(adv).tolist() == [0.0, 0.0, 0.0]


def test_enable_similarity_needs_text_observations(args):
    args["anchor_obs"] = np.array([7] * len(args["anchor_obs"]), dtype=object)
    with pytest.raises(
        ValueError, match=r"^anchor_obs\[0\]: must be a str \(enable_similarity=True"
    ):
        va.compute_gigpo_outcome_advantage(**args, enable_similarity=True)
    va.compute_gigpo_outcome_advantage(**args)  # equal numbers group without similarity


def _coincident(case: dict, gamma: float = 1.0):
    """Inputs on which the registry's own one-batch encoding applies: gamma = 1 and no invalid
    actions, so step_rewards = R_t and every row's score = R_0 of its trajectory."""
    batch = case_batch(case)
    batch = type(batch)(group=batch.group, traj=batch.traj, step=batch.step,
                        reward=batch.reward, state=batch.state)  # fmt: skip
    from hgpo import discounted_returns, episode_returns

    R = discounted_returns(batch, gamma)
    E = episode_returns(batch)[batch.traj_index]
    n = batch.n_steps
    mask = torch.ones((n, 3), dtype=torch.float64)
    tlr = torch.zeros((n, 3), dtype=torch.float64)
    tlr[:, 2] = torch.as_tensor(E)
    obj = lambda v: np.array([str(s) for s in v], dtype=object)  # noqa: E731
    args = dict(token_level_rewards=tlr, step_rewards=torch.as_tensor(R), response_mask=mask,
                anchor_obs=obj(batch.state), index=obj(batch.group), traj_index=obj(batch.traj))  # fmt: skip
    return batch, args


@pytest.mark.parametrize("base_group", [False, True])
def test_hgpo_equals_the_registry_on_one_batch(base_group):
    """with_base_level (Eq. 7 with the base level over two batches) = hgpo(base_group=True)."""
    for case in [c for c in CASES if c["estimator"] == "hgpo"][:6]:
        batch, args = _coincident(case)
        mode = MODES[case["env"]]
        adv, _ = va.compute_hgpo_outcome_advantage(**args, history_length=case["K"], mode=mode,
                                                   length_weight_alpha=case["alpha"],
                                                   base_group=base_group)  # fmt: skip
        cfg = reference_config("hgpo", env=case["env"], K=case["K"], gamma=1.0,
                               alpha=case["alpha"], base_group=base_group)  # fmt: skip
        want = compute_advantages("hgpo", batch, config=cfg).advantages
        np.testing.assert_allclose(_first_token(adv), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["stepwise", "oracle", "hgpo-nohog2", "hgpo-uniform"])
def test_step_estimators_equal_the_registry_on_one_batch(name):
    for case in [c for c in CASES if c["estimator"] == "hgpo"][:4]:
        batch, args = _coincident(case)
        base = case["base_group"] and name == "hgpo-uniform"
        adv, _ = va.compute_step_advantage(name, **args, history_length=case["K"],
                                           mode=MODES[case["env"]], base_group=base)  # fmt: skip
        cfg = reference_config(name, env=case["env"], K=case["K"], gamma=1.0, base_group=base)
        want = compute_advantages(name, batch, config=cfg).advantages
        np.testing.assert_allclose(_first_token(adv), want, rtol=0, atol=1e-12)


def test_gigpo_equals_the_registry_on_one_batch():
    for case in [c for c in CASES if c["estimator"] == "gigpo"][:6]:
        batch, args = _coincident(case)
        adv, _ = va.compute_gigpo_outcome_advantage(**args, mode=MODES[case["env"]],
                                                    step_advantage_w=0.5)  # fmt: skip
        cfg = reference_config("gigpo", env=case["env"], gamma=1.0, omega=0.5)
        want = compute_advantages("gigpo", batch, config=cfg).advantages
        np.testing.assert_allclose(_first_token(adv), want, rtol=0, atol=1e-12)


def test_output_dtype_follows_the_authors_promotion():
    _, args = _coincident(CASES[0])
    args32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    args32["response_mask"] = args["response_mask"].long()  # verl's mask is the attention mask
    adv, _ = va.compute_hgpo_outcome_advantage(**args32, history_length=2)
    assert adv.dtype == torch.float32
    adv, _ = va.compute_gigpo_outcome_advantage(**args32)
    assert adv.dtype == torch.float32
    args32["step_rewards"] = args["step_rewards"]  # float64: GiGPO's sum promotes
    adv, _ = va.compute_gigpo_outcome_advantage(**args32)
    assert adv.dtype == torch.float64


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def args():
    return _coincident(CASES[0])[1]


@pytest.mark.parametrize(
    ("fn", "opts", "names"),
    [
        ("gigpo", dict(enable_similarity="yes"), "enable_similarity"),
        ("gigpo", dict(enable_similarity=True, similarity_thresh=1.0), "similarity_thresh"),
        ("gigpo", dict(enable_similarity=True, similarity_thresh=True), "similarity_thresh"),
        ("gigpo", dict(mode="mean"), "mode"),
        ("gigpo", dict(step_advantage_w=float("nan")), "step_advantage_w"),
        ("hgpo", dict(history_length=-1), "history_length"),
        ("hgpo", dict(history_length=1.5), "history_length"),
        ("hgpo", dict(mode="std"), "mode"),
        ("hgpo", dict(length_weight_alpha=-1.0), "length_weight_alpha"),
        ("hgpo", dict(base_group="yes"), "base_group"),
        ("hgpo", dict(epsilon=-1.0), "epsilon"),
    ],
)
def test_unsupported_options_are_named(args, fn, opts, names):
    f = getattr(va, f"compute_{fn}_outcome_advantage")
    if fn == "hgpo":
        opts = {"history_length": 2, **opts}
    with pytest.raises(ValueError, match=names):
        f(**args, **opts)


def test_cross_trajectory_statistics_are_refused(args):
    with pytest.raises(ValueError, match="compute_mean_std_cross_steps"):
        va.compute_grpo_outcome_advantage(
            args["token_level_rewards"], args["response_mask"], args["index"],
            args["traj_index"], compute_mean_std_cross_steps=False,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (lambda a: a.update(step_rewards=a["step_rewards"][:-1]), "step_rewards"),
        (lambda a: a.update(response_mask=a["response_mask"][:, :1]), "response_mask"),
        (
            lambda a: a.update(token_level_rewards=a["token_level_rewards"].numpy()),
            "token_level_rewards",
        ),
        (lambda a: a.update(anchor_obs=a["anchor_obs"][:-1]), "anchor_obs"),
        (lambda a: a.update(traj_index=a["traj_index"][:-1]), "traj_index"),
        (lambda a: a["step_rewards"].__setitem__(1, float("nan")), r"step_rewards\[1\]"),
        (lambda a: a["anchor_obs"].__setitem__(0, object()), r"anchor_obs\[0\]"),
    ],
)
def test_bad_inputs_are_named(args, change, names):
    change(args)
    with pytest.raises(ValueError, match=names):
        va.compute_hgpo_outcome_advantage(**args, history_length=2)


_ID_CALLS = {
    "hgpo": lambda a: va.compute_hgpo_outcome_advantage(**a, history_length=2),
    "gigpo": lambda a: va.compute_gigpo_outcome_advantage(**a),
    "grpo": lambda a: va.compute_grpo_outcome_advantage(
        a["token_level_rewards"], a["response_mask"], a["index"], a["traj_index"]),
    "rloo": lambda a: va.compute_rloo_outcome_advantage(
        a["token_level_rewards"], a["response_mask"], a["index"], a["traj_index"]),
    "stepwise": lambda a: va.compute_step_advantage("stepwise", **a),
}  # fmt: skip


def _ids(column: np.ndarray) -> np.ndarray:
    """int64 ids of the values of an object column (equal values, equal ids)."""
    return np.unique(column.astype(str), return_inverse=True)[1].astype(np.int64)


@pytest.mark.parametrize("fn", sorted(_ID_CALLS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16])
def test_index_as_a_torch_tensor_groups_as_the_same_ids(args, fn, dtype):
    """index and traj_index given as torch tensors (int64, or bf16 as verl runs) group the
    rows as a numpy array of the same ids does (main hashed each element tensor by identity:
    every row its own group, all advantages 0, or a named error that blamed the length)."""
    want, _ = _ID_CALLS[fn](args)
    assert want[:, 0].abs().max() > 0
    for key in ("index", "traj_index"):
        ids = _ids(args[key])
        a = dict(args)
        a[key] = ids
        np.testing.assert_array_equal(_ID_CALLS[fn](a)[0].numpy(), want.numpy())
        a[key] = torch.as_tensor(ids).to(dtype)
        np.testing.assert_array_equal(_ID_CALLS[fn](a)[0].numpy(), want.numpy())
    a = dict(args, index=torch.as_tensor(_ids(args["index"]))[:, None])
    with pytest.raises(ValueError, match=r"index: must be one-dimensional.*shape \(\d+, 1\)"):
        _ID_CALLS[fn](a)


@pytest.mark.parametrize("fn", sorted(_ID_CALLS))
def test_bf16_inputs_give_the_float32_results(args, fn):
    """Every tensor in bf16 (verl's training dtype), the ids a bf16 tensor too: the advantages
    of the same values in float32, to bf16's precision, in the dtype the authors' code gives
    (hgpo and stepwise: float32; the others: the inputs' bf16)."""
    bf = {k: (v.to(torch.bfloat16) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    bf["index"] = torch.as_tensor(_ids(args["index"])).to(torch.bfloat16)
    f32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in bf.items()}
    got, want = _ID_CALLS[fn](bf)[0], _ID_CALLS[fn](f32)[0]
    assert got.dtype == (torch.float32 if fn in ("hgpo", "stepwise") else torch.bfloat16)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-6)


# --------------------------------------------------------------------------- install()


def _verl_agent_stand_in() -> types.ModuleType:
    """A stand-in for verl-agent's trainer module: ``compute_advantage`` with the signature of
    recipe/hgpo/hgpo_ray_trainer.py at 796ed31 (it records the calls it still gets)."""
    mod = types.ModuleType("stand_in_ray_trainer")
    mod.calls = []

    def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
                          multi_turn=False, norm_adv_by_std_in_grpo=True, step_advantage_w=1.0,
                          gigpo_mode="mean_std_norm", **kwargs):  # fmt: skip
        mod.calls.append(adv_estimator)
        data.batch["advantages"] = "verl-agent's own"
        return data

    def compute_response_mask(data):
        return data.batch["attention_mask"][:, -data.batch["responses"].size(1) :]

    mod.compute_advantage = compute_advantage
    mod.compute_response_mask = compute_response_mask
    mod.AdvantageEstimator = AdvantageEstimator
    return mod


class AdvantageEstimator(str, Enum):
    """recipe/hgpo/hgpo_ray_trainer.py's enum at 796ed31."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    GRPO_PASSK = "grpo_passk"
    GiGPO = "gigpo"
    HGPO = "hgpo"


def _admitted(AE) -> list:
    """RayPPOTrainer.__init__'s list of the estimators that run without a critic."""
    return [AE.GRPO, AE.GRPO_PASSK, AE.REINFORCE_PLUS_PLUS, AE.REMAX, AE.RLOO,
            AE.REINFORCE_PLUS_PLUS_BASELINE, AE.GiGPO, getattr(AE, "HGPO", AE.GiGPO)]  # fmt: skip


def _check_admits(AE, step_member: str) -> None:
    """After install(): the trainer's comparisons admit our names on the right path."""
    for shown, name in va.routed_names().items():
        assert shown in _admitted(AE), shown
        assert shown != AE.GAE and not (shown == AE.GAE)  # noqa: SIM201 (both operators)
        path = name if name in ("grpo", "rloo", "gigpo") else step_member
        assert shown == getattr(AE, {"grpo": "GRPO", "rloo": "RLOO", "gigpo": "GiGPO",
                                     "hgpo": "HGPO"}[path]), shown  # fmt: skip
    assert "hgpo_v2" not in _admitted(AE) and "gae" not in _admitted(AE)
    assert AE.HGPO == "hgpo" if hasattr(AE, "HGPO") else AE.GiGPO == "gigpo"
    assert "stepwise" != AE.GRPO and AE.GAE == "gae" and AE.REMAX != "stepwise"  # noqa: SIM300


def _data(args, with_entropy: bool = False, rewards=None) -> types.SimpleNamespace:
    """verl-agent's batch of ``args`` (with ``step_entropy`` for the estimators that read it;
    ``rewards``: each step's env reward, default that of ``_coincident(CASES[0])``, whose
    ``args`` the tests use)."""
    n, L = args["response_mask"].shape
    if rewards is None:
        rewards = _coincident(CASES[0])[0].reward
    data = types.SimpleNamespace(
        batch={"token_level_rewards": args["token_level_rewards"],
               "step_rewards": args["step_rewards"], "responses": torch.zeros((n, L)),
               "attention_mask": torch.cat([torch.ones((n, 2)), args["response_mask"]], 1)},
        non_tensor_batch={"uid": args["index"], "traj_uid": args["traj_index"],
                          "anchor_obs": args["anchor_obs"],
                          "rewards": np.array(list(rewards), dtype=object),
                          "is_action_valid": np.array([True] * n, dtype=object),
                          "active_masks": np.array([True] * n, dtype=object)},
    )  # fmt: skip
    if with_entropy:
        data.non_tensor_batch["step_entropy"] = _entropy(n).astype(object)
    return data


def _entropy(n: int) -> np.ndarray:
    """A step entropy per row (for the estimators that read it)."""
    return (np.arange(n) % 3) * 0.5


def _expected_config(name: str, norm: str, omega: float, **common) -> EstimatorConfig:
    """contract_config's rules written out for the tests: the reference preset where one
    exists, the step weight as omega (GiGPO's variants) or graph_step_weight (GraphGPO, whose
    graph gamma is the call's gamma) or rewardflow_step_weight (RewardFlow, whose propagation
    gamma is the call's gamma), EstimatorConfig() for 3spo, gagpo and users' estimators."""
    if name == "graphgpo":
        return reference_config(name, norm=norm, graph_gamma=common["gamma"],
                                graph_step_weight=omega, graph_episode_weight=1.0, **common)  # fmt: skip
    if name == "gigpo_similarity":
        return reference_config(name, norm=norm, omega=omega, gigpo_similarity_thresh=0.95,
                                **common)  # fmt: skip
    if name in ("empg", "g2po"):  # g2po: its preset; step_advantage_w is not mapped
        return reference_config(name, norm=norm, **common)
    if name == "rewardflow":
        return reference_config(name, norm=norm, rewardflow_gamma=common["gamma"],
                                rewardflow_step_weight=omega, **common)  # fmt: skip
    return EstimatorConfig(norm=norm, **common)


def _direct(name: str, args, opts) -> torch.Tensor:
    if name in ("grpo", "rloo"):
        f = getattr(va, f"compute_{name}_outcome_advantage")
        return f(args["token_level_rewards"], args["response_mask"], args["index"],
                 args["traj_index"])[0]  # fmt: skip
    if name == "gigpo":
        return va.compute_gigpo_outcome_advantage(**args, mode="mean_std_norm")[0]
    hgpo_opts = dict(history_length=opts["history_length"], mode=opts["hgpo_mode"],
                     length_weight_alpha=1.0, base_group=opts["hgpo_base_group"])  # fmt: skip
    if name == "hgpo":
        return va.compute_hgpo_outcome_advantage(**args, **hgpo_opts)[0]
    if name in ("stepwise", "oracle", "hgpo-nohog2", "hgpo-uniform"):
        return va.compute_step_advantage(name, **args, **hgpo_opts)[0]
    # Every other one: the registry on the StepBatch of the same episodes (env rewards), with
    # the options of contract_config written out, as the test calls the router (gamma 0.95,
    # gigpo_mode mean_std_norm, hgpo_mode mean_norm, step_advantage_w 1), broadcast to tokens.
    batch = _coincident(CASES[0])[0]
    common = dict(gamma=0.95, K=opts["history_length"], eps=1e-6, invalid_penalty=0.1,
                  penalty_mode="after_discount")  # fmt: skip
    gigpo_norm = ("graphgpo", "gigpo_similarity", "empg", "3spo", "rewardflow")
    norm = "mean_std" if name in gigpo_norm else "mean"
    cfg = _expected_config(name, norm, omega=1.0, **common)
    inputs = {}
    if "entropy" in estimator_reads(name):
        inputs["entropy"] = _entropy(batch.n_steps)
    if "observations" in estimator_reads(name):
        inputs["observations"] = list(args["anchor_obs"])
    A = compute_advantages(name, batch, cfg, **inputs).advantages  # (batch in row order)
    return torch.as_tensor(A, dtype=torch.float64)[:, None] * args["response_mask"]


def test_install_routes_every_name_to_the_registry(args):
    mod = _verl_agent_stand_in()
    assert va.install(mod) == [mod]
    va.install(mod)  # twice: no double wrapping
    assert mod.compute_advantage.__wrapped__.__name__ == "compute_advantage"
    routed = va.routed_names()
    assert {"hgpo", "gigpo", "grpo", "rloo", "stepwise", "oracle", "hgpo_nohog2",
            "hgpo_uniform", "hgpo.hgpo-nohog2", "hgpo.grpo"} <= set(routed)  # fmt: skip
    assert "gae" not in routed and "hgpo.gae" not in routed
    for shown, name in routed.items():
        base = name in ("hgpo", "hgpo-uniform")
        opts = dict(history_length=3, hgpo_mode="mean_norm", hgpo_base_group=base)
        data = mod.compute_advantage(_data(args, with_entropy=True), shown, gamma=0.95,
                                     norm_adv_by_std_in_grpo=True, step_advantage_w=1.0,
                                     gigpo_mode="mean_std_norm", epsilon=1e-6, **opts)  # fmt: skip
        want = _direct(name, args, opts)
        assert torch.equal(data.batch["advantages"], want), shown
        assert data.batch["returns"] is data.batch["advantages"]
    # verl-agent's own gigpo with its similarity options (algorithm.gigpo.enable_similarity)
    args["anchor_obs"] = np.array([f"you see a mug {s}" for s in args["anchor_obs"]], dtype=object)
    data = mod.compute_advantage(_data(args), "gigpo", gigpo_mode="mean_norm",
                                 gigpo_enable_similarity=True, gigpo_similarity_thresh=0.9)  # fmt: skip
    want = va.compute_gigpo_outcome_advantage(**args, mode="mean_norm", enable_similarity=True,
                                              similarity_thresh=0.9)[0]  # fmt: skip
    assert torch.equal(data.batch["advantages"], want)
    assert not torch.equal(want, va.compute_gigpo_outcome_advantage(**args, mode="mean_norm")[0])
    assert mod.calls == []
    mod.compute_advantage(_data(args), "remax")
    assert mod.calls == ["remax"]  # verl-agent's own token-level estimators stay its own


def test_install_lets_the_trainer_admit_our_names():
    mod = _verl_agent_stand_in()
    assert "stepwise" not in _admitted(mod.AdvantageEstimator)
    va.install(mod)
    _check_admits(mod.AdvantageEstimator, "hgpo")
    va.install(mod)  # twice: the same class
    assert mod.AdvantageEstimator.hgpo_admits


def test_install_on_the_main_trainer_uses_the_gigpo_path():
    """verl-agent's verl/trainer/ppo/ray_trainer.py has no HGPO member: step estimators take
    GiGPO's path (which fills step_rewards the same way)."""
    mod = _verl_agent_stand_in()
    mod.AdvantageEstimator = Enum("AdvantageEstimator", {m.name: m.value for m in
                                  AdvantageEstimator if m.name != "HGPO"}, type=str)  # fmt: skip
    va.install(mod)
    _check_admits(mod.AdvantageEstimator, "gigpo")


def test_install_errors_are_named(args):
    mod = _verl_agent_stand_in()
    va.install(mod)
    with pytest.raises(ValueError, match=r"unknown estimator 'hgpo_v2'.*hgpo_nohog2"):
        mod.compute_advantage(_data(args), "hgpo_v2")
    data = _data(args)
    del data.batch["step_rewards"]
    with pytest.raises(ValueError, match=r"stepwise.*batch\['step_rewards'\]"):
        mod.compute_advantage(data, "stepwise")
    del data.non_tensor_batch["traj_uid"]
    with pytest.raises(ValueError, match=r"traj_uid"):
        mod.compute_advantage(data, "grpo")
    with pytest.raises(ValueError, match="no verl-agent compute_advantage"):
        va.install(types.ModuleType("upstream_verl_trainer"))


# --------------------------------------------------------------------------- the contract route
#
# Every routed estimator without verl-agent glue (the newer built-ins, users') runs on the
# StepBatch of verl-agent's batch itself: each step's env reward (non_tensor_batch['rewards']),
# its invalid flag, the penalty as verl-agent's trainer applies it (0.1 after discounting).

NEW_ROUTES = ("graphgpo", "gigpo_similarity", "empg", "3spo", "rewardflow")
"""The built-ins this route made correct (UNROUTED_BUILTINS before it)."""


def _agent_data(case: dict, anchor=None, next_obs=None, entropy=None) -> types.SimpleNamespace:
    """verl-agent's batch at the advantage step for a case's episodes (rollout_loop.py's
    non_tensor_batch at 796ed31; float64 rewards so that the comparisons are exact): the
    episode reward less 0.1 x invalid at each step's last response token, no step_rewards."""
    n, L = len(case["group"]), max(case["resp_len"])
    traj, invalid = np.asarray(case["traj"]), np.asarray(case["invalid"], dtype=bool)
    episode = np.bincount(traj, weights=np.asarray(case["reward"], dtype=np.float64))
    mask = torch.zeros((n, L), dtype=torch.float64)
    tlr = torch.zeros((n, L), dtype=torch.float64)
    for i, m in enumerate(case["resp_len"]):
        mask[i, :m] = 1.0
        tlr[i, m - 1] = episode[traj[i]] - 0.1 * invalid[i]
    obj = lambda v: np.array(list(v), dtype=object)  # noqa: E731
    nt = {"uid": obj(f"g{g}" for g in case["group"]), "traj_uid": obj(f"t{t:04d}" for t in traj),
          "anchor_obs": obj(anchor if anchor is not None else (f"obs {s}" for s in case["state"])),
          "rewards": obj(float(r) for r in case["reward"]),
          "is_action_valid": obj(~invalid), "active_masks": obj([True] * n)}  # fmt: skip
    if next_obs is not None:
        nt["next_obs"] = obj(next_obs)
    if entropy is not None:
        nt["step_entropy"] = obj(entropy)
    return types.SimpleNamespace(batch={"token_level_rewards": tlr, "response_mask": mask},
                                 non_tensor_batch=nt)  # fmt: skip


def _rows(data: types.SimpleNamespace, p: np.ndarray) -> types.SimpleNamespace:
    """The batch with its rows in order ``p``."""
    return types.SimpleNamespace(
        batch={k: v[torch.as_tensor(p)] for k, v in data.batch.items()},
        non_tensor_batch={k: v[p] for k, v in data.non_tensor_batch.items()},
    )


def _routed(data, name: str, **call) -> np.ndarray:
    """The advantage of each row after verl-agent's compute_advantage (a stand-in with
    install()), checked to be broadcast over the response tokens."""
    mod = _verl_agent_stand_in()
    va.install(mod)
    out = mod.compute_advantage(data, name, **call)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    assert out.batch["returns"] is adv and adv.dtype == data.batch["token_level_rewards"].dtype
    row = adv[:, :1].expand_as(adv) * mask
    assert torch.equal(adv, row) and mod.calls == []
    return adv[:, 0].double().numpy()


def test_the_new_routes_are_routed_and_gigpo_dynamic_is_not():
    routed = va.routed_names()
    for name in NEW_ROUTES:
        assert routed[name] == name and routed[f"hgpo.{name}"] == name
    assert set(va.UNROUTED_BUILTINS) == {"gigpo_dynamic", "ecpo"}
    for name in va.UNROUTED_BUILTINS:
        assert name not in routed and f"hgpo.{name}" not in routed
    mod = _verl_agent_stand_in()
    va.install(mod)
    data = _agent_data(CASES[0])
    with pytest.raises(ValueError, match=r"'gigpo_dynamic' is not routed.*filter_groups"):
        mod.compute_advantage(data, "gigpo_dynamic")
    with pytest.raises(ValueError, match=r"'hgpo.gae' is not routed.*critic"):
        mod.compute_advantage(data, "hgpo.gae")
    with pytest.raises(ValueError, match=r"'ecpo' is not routed.*canonical action"):
        mod.compute_advantage(data, "ecpo")


@pytest.mark.parametrize("name", NEW_ROUTES)
def test_a_new_route_equals_the_registry_on_the_same_episodes(name):
    """verl-agent's routed call = compute_advantages(name, StepBatch of the same episodes, cfg,
    **inputs) broadcast to the tokens, cfg written out from contract_config's rules; the rows
    interleaved (each trajectory in step order), invalid actions, gamma < 1, both modes."""
    for case in CASES[:8]:
        mode = MODES[case["env"]]
        norm = "mean_std" if mode == "mean_std_norm" else "mean"
        n = len(case["group"])
        ent = (np.arange(n) % 5) * 0.3
        data = _agent_data(case, entropy=ent)
        p = _interleaved(case)
        call = dict(gamma=case["gamma"], norm_adv_by_std_in_grpo=mode == "mean_std_norm",
                    step_advantage_w=0.5, gigpo_mode=mode, hgpo_mode="mean_norm",
                    history_length=case["K"], epsilon=1e-6)  # fmt: skip
        got = _routed(_rows(data, p), name, **call)
        common = dict(gamma=case["gamma"], K=case["K"], eps=1e-6, invalid_penalty=0.1,
                      penalty_mode="after_discount")  # fmt: skip
        cfg = _expected_config(name, norm, omega=0.5, **common)
        inputs = {"empg": {"entropy": ent},
                  "gigpo_similarity": {"observations": [f"obs {s}" for s in case["state"]]}}  # fmt: skip
        want = compute_advantages(name, case_batch(case), cfg, **inputs.get(name, {})).advantages
        np.testing.assert_allclose(got, want[p], rtol=0, atol=1e-12, err_msg=name)


def _graphgpo_next_obs(case: dict) -> list:
    """recipe/GraphGPO/rollout_loop.py's next_obs: the next step's anchor, after the last step
    'success' when the episode reward is > 0, else the terminal observation (one of the
    group's or, without next_state in the case, one seen nowhere else)."""
    traj, state = case["traj"], case["state"]
    episode = np.bincount(traj, weights=np.asarray(case["reward"]))
    out = []
    for i, t in enumerate(traj):
        if i + 1 < len(traj) and traj[i + 1] == t:
            out.append(f"obs {state[i + 1]}")
        elif episode[t] > 0:
            out.append("success")
        else:
            out.append(f"obs {case['terminal'][t]}" if case["with_next_state"] else f"end {t}")
    return out


def test_graphgpo_on_verl_agents_batch_reproduces_the_authors_code():
    """The GraphGPO golden cases (recipe/GraphGPO, verl-agent@234a913) as the GraphGPO
    recipe's trainer hands them over (next_obs, algorithm.gamma = the graph's gamma, its step
    and episode weights, gigpo_mode): the routed call equals our verified graphgpo and the
    authors' float64 run. (normalize_distance is an option of the
    recipe's return computation, not of compute_advantage: those cases are left out.)"""
    from benchmarks.make_graphgpo_golden import GOLDEN as GRAPH_GOLDEN
    from benchmarks.make_graphgpo_golden import ours as graph_ours

    cases = json.loads(GRAPH_GOLDEN.read_text())["cases"]
    checked = 0
    for case in (c for c in cases if not c["normalize_distance"]):
        data = _agent_data(case, next_obs=_graphgpo_next_obs(case))
        got = _routed(data, "graphgpo", gamma=reference_config("graphgpo", env=case["env"])
                      .graph_gamma, step_advantage_w=case["step_weight"],
                      episode_advantage_w=case["episode_weight"], gigpo_mode=case["mode"],
                      epsilon=1e-6)  # fmt: skip
        want = graph_ours(case)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        f64 = np.asarray(case["reference_f64"])  # (every golden row agrees with it)
        assert np.all(np.abs(got - f64) <= F64_TOL * np.maximum(1.0, np.abs(got)))
        checked += 1
    assert checked >= 16


def test_gigpo_similarity_and_empg_on_verl_agents_batch_reproduce_the_public_code():
    """The gigpo_variants golden cases (verl-agent's GiGPO with enable_similarity at
    vanzll/verl-agent@d0b9724; ARLArena's EMPG): the routed call equals our verified estimator
    with the case's options (EMPG's k, k', zeta are not compute_advantage arguments: the
    defaults 1, 1, 0.1), and the public float64 run on the cases with those defaults."""
    from benchmarks.make_gigpo_variants_golden import GOLDEN as VARIANTS
    from benchmarks.make_gigpo_variants_golden import ours as variant_ours
    from benchmarks.make_gigpo_variants_golden import step_entropy

    cases = json.loads(VARIANTS.read_text())["cases"]
    checked = {"gigpo_similarity": 0, "empg": 0}
    for case in (c for c in cases if c["estimator"] in checked):
        name, mode = case["estimator"], MODES[case["env"]]
        data = _agent_data(case, anchor=case["observations"], entropy=step_entropy(case))
        got = _routed(data, name, gamma=case["gamma"], step_advantage_w=1.0, gigpo_mode=mode,
                      norm_adv_by_std_in_grpo=mode == "mean_std_norm",
                      gigpo_similarity_thresh=case["thresh"])  # fmt: skip
        default = {**case, "k": 1.0, "k_f": 1.0, "zeta": 0.1}
        np.testing.assert_allclose(got, variant_ours(default), rtol=0, atol=1e-12, err_msg=name)
        if name == "gigpo_similarity" or (case["k"], case["k_f"], case["zeta"]) == (1, 1, 0.1):
            f64 = np.asarray(case["reference_f64"])
            np.testing.assert_allclose(got, f64, rtol=0, atol=F64_TOL * max(1.0, np.abs(f64).max()))
            checked[name] += 1
    assert checked["gigpo_similarity"] == 8 and checked["empg"] >= 1


def _episode_sum_is_advantage(batch, cfg, values=None):
    """A user's estimator: each step's advantage is its episode's return, the sum of the
    batch's rewards over the trajectory."""
    return np.bincount(batch.traj_index, weights=batch.reward)[batch.traj_index]


def test_a_users_estimator_sums_the_true_env_rewards():
    """Before this route a user's estimator got verl-agent's discounted step returns (less the
    penalty) as its reward column: a sum over a trajectory was not the episode return."""
    from hgpo import register_estimator, unregister_estimator

    case = next(c for c in CASES if c["gamma"] < 1 and any(c["invalid"])
                and len(set(c["traj"])) < len(c["traj"]))  # fmt: skip
    x = authors_inputs(case, float64=True)  # verl-agent's step_rewards, as the trainer has them
    data = _agent_data(case)
    data.batch["step_rewards"] = x.step_rewards
    register_estimator("test_episode_sum", _episode_sum_is_advantage)
    try:
        got = _routed(data, "test_episode_sum", gamma=case["gamma"])
    finally:
        unregister_estimator("test_episode_sum")
    traj = np.asarray(case["traj"])
    want = np.array([sum(r for r, u in zip(case["reward"], traj, strict=True) if u == t)
                     for t in traj])  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_a_batch_without_rewards_is_named_before_any_work():
    mod = _verl_agent_stand_in()
    va.install(mod)
    data = _agent_data(CASES[0])
    del data.non_tensor_batch["rewards"]
    with pytest.raises(va.MissingMetadataError, match=r"lacks non_tensor_batch 'rewards'.*"
                       r"verl-agent's rollout loop sets non_tensor_batch\['rewards'\]"):  # fmt: skip
        mod.compute_advantage(data, "graphgpo")
    assert "advantages" not in data.batch and "response_mask" in data.batch
    with pytest.raises(KeyError, match="'rewards'"):
        va.compute_contract_advantage("3spo", data, EstimatorConfig())


def test_contract_route_bad_rows_are_named():
    mod = _verl_agent_stand_in()
    va.install(mod)
    data = _agent_data(CASES[0])
    data.non_tensor_batch["active_masks"][3] = False
    with pytest.raises(ValueError, match=r"active_masks'\]\[3\] is False"):
        mod.compute_advantage(data, "graphgpo")
    data = _agent_data(CASES[0], next_obs=["elsewhere"] * len(CASES[0]["group"]))
    with pytest.raises(
        ValueError,
        match=r"DataProto -> StepBatch: non_tensor_batch\['next_obs'\].*StepBatch.next_state",
    ):
        mod.compute_advantage(data, "graphgpo")
    data = _agent_data(CASES[0])
    with pytest.raises(KeyError, match=r"'step_entropy'.*'entropys'"):
        mod.compute_advantage(data, "empg")
    with pytest.raises(ValueError, match="gigpo_mode"):
        mod.compute_advantage(_agent_data(CASES[0]), "graphgpo", gigpo_mode="std")


# --------------------------------------------------------------------------- live check


def _golden_data(case: dict, x) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        batch={"token_level_rewards": x.token_level_rewards.clone(),
               "step_rewards": x.step_rewards.clone(), "response_mask": x.response_mask},
        non_tensor_batch={"uid": x.index, "traj_uid": x.traj_index, "anchor_obs": x.anchor_obs},
    )  # fmt: skip


def _recipe_kwargs(case: dict) -> dict:
    """What the HGPO recipe's fit() passes to compute_advantage (hgpo_ray_trainer.py)."""
    mode = MODES[case["env"]]
    return dict(gamma=case["gamma"], norm_adv_by_std_in_grpo=(mode == "mean_std_norm"),
                step_advantage_w=1.0, gigpo_mode=mode, hgpo_mode=mode,
                hgpo_length_weight_alpha=case["alpha"], hgpo_base_group=case["base_group"],
                history_length=case["K"], epsilon=1e-6)  # fmt: skip


@pytest.mark.skipif(live.ref_dir() is None, reason=f"set {live.ENV}=DIR (see verl_agent_live.py)")
def test_install_against_the_authors_compute_advantage():
    """The recipe's own compute_advantage (authors' code) and the same function after
    install(), on the golden cases' float32 inputs: the float32 criterion of
    test_float32_glue_equals_the_authors_float32_run, row by row."""
    theirs_mod = live.trainer_module(live.ref_dir())
    ours_mod = live.trainer_module(live.ref_dir())
    va.install(ours_mod)
    _check_admits(ours_mod.AdvantageEstimator, "hgpo")
    authors = {"compute_hgpo_outcome_advantage": theirs_mod.core_hgpo,
               "compute_gigpo_outcome_advantage": theirs_mod.core_gigpo,
               "compute_grpo_outcome_advantage": theirs_mod.core_algos,
               "compute_rloo_outcome_advantage": theirs_mod.core_algos}  # fmt: skip
    for name, mod in authors.items():
        assert _signature(getattr(mod, name)) == SIGNATURES[name], name
    checked = 0
    for case in CASES:
        x = authors_inputs(case)
        name = case["estimator"]
        theirs = live.quiet(theirs_mod.compute_advantage, _golden_data(case, x), name,
                            **_recipe_kwargs(case)).batch["advantages"]  # fmt: skip
        mine = ours_mod.compute_advantage(_golden_data(case, x), name, **_recipe_kwargs(case))
        mine = mine.batch["advantages"]
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        a, f = _first_token(mine), _first_token(theirs)
        np.testing.assert_array_equal(f, np.float32(case["reference_f32"]))  # the same glue
        f64 = np.asarray(case["reference_f64"])
        exact_agrees = (classify(ours(case), f, f64) == 0) & ~rounding_decided(case)
        bad = exact_agrees & ~(np.abs(a - f) <= SIG32_TOL * np.maximum(1.0, np.abs(a)))
        assert not bad.any(), f"{name}: rows {np.flatnonzero(bad)}"
        checked += 1
    assert checked == len(CASES)
