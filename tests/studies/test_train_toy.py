"""studies.train_toy and studies.tabular_ppo: the gradient, the update, the study's bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import toyenvs
from studies import train_toy as tt
from studies.tabular_ppo import Adam, PPOSettings, TabularPPO, ValueTable
from studies.train_toy_report import compare, ordering_tests, orderings


def _ppo(seed: int = 0, **settings: float) -> tuple[TabularPPO, np.ndarray, np.ndarray]:
    """A policy with 5 contexts x 4 actions, random logits, and its PPO state."""
    env = toyenvs.make("tmaze", length=2)
    pol = toyenvs.TabularPolicy(env, K=1)
    rng = np.random.default_rng(seed)
    codes = rng.choice(pol.n_codes, 5, replace=False)
    pol.index_of(codes)
    ppo = TabularPPO(pol, PPOSettings(**settings))
    # the reference = the zero logits at construction; move the policy away from it
    pol.logits[:] = rng.normal(size=pol.logits.shape)
    rows = rng.integers(0, 5, size=40)
    act = rng.integers(0, env.n_actions, size=40)
    return ppo, rows, act


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradient_matches_finite_differences(temperature: float) -> None:
    """The analytic gradient of clip + dual clip + k3 KL + entropy equals central differences,
    with old log-probs chosen so that every branch (unclipped, clipped, dual-clipped) occurs."""
    ppo, rows, act = _ppo(kl_coef=0.3, entropy_coef=0.2)
    ppo.pol.temperature = temperature
    rng = np.random.default_rng(1)
    adv = rng.normal(size=rows.size) * 2
    lp = ppo.old_log_probs(rows, act)
    old_lp = lp + rng.choice(
        [0.0, 0.5, -0.5, 2.0, -2.0], size=rows.size
    )  # ratios e^0, e^-+0.5, ...
    loss, grad, figs = ppo.loss_and_grad(rows, act, adv, old_lp)
    assert 0 < figs["clip_frac"] < 1
    L = ppo.pol.logits
    num = np.zeros_like(L)
    h = 1e-6
    for i in range(L.shape[0]):
        for j in range(L.shape[1]):
            L[i, j] += h
            up = ppo.loss_and_grad(rows, act, adv, old_lp)[0]
            L[i, j] -= 2 * h
            down = ppo.loss_and_grad(rows, act, adv, old_lp)[0]
            L[i, j] += h
            num[i, j] = (up - down) / (2 * h)
    np.testing.assert_allclose(grad, num, atol=1e-6)
    assert np.isfinite(loss)


def test_update_moves_probability_toward_positive_advantage() -> None:
    ppo, _, _ = _ppo(lr=0.1, entropy_coef=0.0, kl_coef=0.0)
    ppo.pol.logits[:] = 0.0
    rows = np.zeros(64, dtype=np.int64)
    act = np.tile([0, 1], 32)
    adv = np.where(act == 0, 1.0, -1.0)
    before = ppo.pol.probs(np.array([0]))[0]
    ppo.update(rows, act, adv, ppo.old_log_probs(rows, act), np.random.default_rng(0))
    after = ppo.pol.probs(np.array([0]))[0]
    assert after[0] > before[0] and after[1] < before[1]


def test_update_handles_a_growing_table() -> None:
    ppo, rows, act = _ppo()
    ppo.update(
        rows, act, np.ones(rows.size), ppo.old_log_probs(rows, act), np.random.default_rng(0)
    )
    ppo.pol.index_of(np.arange(50))  # new contexts appear, as in a new rollout
    rows2 = np.arange(ppo.pol.n_contexts)
    act2 = np.zeros(rows2.size, dtype=np.int64)
    st = ppo.update(rows2, act2, np.ones(rows2.size), ppo.old_log_probs(rows2, act2),
                    np.random.default_rng(1))  # fmt: skip
    assert np.isfinite(st.pg_loss) and ppo.adam.m.shape == ppo.pol.logits.shape


def test_non_uniform_init_is_refused() -> None:
    env = toyenvs.make("tmaze", length=2)
    with pytest.raises(ValueError, match="init"):
        TabularPPO(toyenvs.TabularPolicy(env, K=1, init="random"), PPOSettings())


def test_adam_first_step_is_lr_times_sign() -> None:
    x = np.array([1.0, 2.0, 3.0])
    Adam(0.1).step(x, np.array([5.0, -0.01, 0.0]))
    np.testing.assert_allclose(x, [0.9, 2.1, 3.0], atol=1e-6)


def test_value_table_converges_to_the_mean_target() -> None:
    env = toyenvs.make("tmaze", length=2)
    pol = toyenvs.TabularPolicy(env, K=1)
    pol.index_of(np.array([3, 7]))
    vt = ValueTable(pol, lr=0.1)
    ctx = np.array([0, 0, 1, 1])
    tgt = np.array([1.0, 3.0, -2.0, -2.0])
    rng = np.random.default_rng(0)
    for _ in range(400):
        vt.update(ctx, tgt, 1, 1, rng)
    np.testing.assert_allclose(vt.values(np.array([0, 1])), [2.0, -2.0], atol=1e-2)


# ---------------------------------------------------------------------------- runs and study


def _cfg(tmp_path: Path, **kw: object) -> tt.TrainToyConfig:
    base: dict[str, object] = dict(
        envs=("tmaze:length=2",), settings=("grpo", "hgpo"), seeds=2, iterations=6,
        eval_every=3, eval_rollouts=8, workers=1, out=str(tmp_path / "out"),
    )  # fmt: skip
    base.update(kw)
    return tt.TrainToyConfig(**base)  # type: ignore[arg-type]


def test_run_is_reproducible_and_logs_every_metric(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    run = {"env": "tmaze:length=2", "setting": "hgpo", "K": 2, "seed": 0}
    a, b = tt.run_one(cfg, run), tt.run_one(cfg, run)
    assert json.dumps(a["curve"]) == json.dumps(b["curve"])  # NaN != NaN, so compare text
    assert json.dumps(a["evals"]) == json.dumps(b["evals"])
    assert [e["iteration"] for e in a["evals"]] == [0, 3, 6]
    for key in ("success", "reward", "adv_mean", "pg_loss", "kl", "clip_frac", "entropy",
                "invalid_rate", "util_top"):  # fmt: skip
        assert np.isfinite(a["curve"][-1][key]), key


def test_gae_trains_its_value_table(tmp_path: Path) -> None:
    """The value table starts at 0 (explains nothing) and comes to explain part of the returns."""
    cfg = _cfg(tmp_path, iterations=30, eval_every=30)
    r = tt.run_one(cfg, {"env": "tmaze:length=2", "setting": "gae", "K": 2, "seed": 0})
    ev = np.array([c["critic_ev"] for c in r["curve"]])
    assert ev[0] == 0.0 and ev[-5:].mean() > 0.03
    assert all(np.isfinite(c["critic_loss"]) for c in r["curve"])


def test_training_learns_on_a_small_tmaze(tmp_path: Path) -> None:
    """From the uniform policy (about 10% success) to a clearly better one in 40 iterations."""
    cfg = _cfg(tmp_path, iterations=40, eval_every=40, eval_rollouts=64, lr=0.05)
    r = tt.run_one(cfg, {"env": "tmaze:length=2", "setting": "gigpo", "K": 2, "seed": 0})
    start, end = r["evals"][0]["train_success"], r["evals"][-1]["train_success"]
    assert end > start + 0.3, (start, end)


def test_warm_start_reaches_its_target_and_is_the_reference(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, iterations=1, eval_every=1, eval_rollouts=64, start="0.3",
               eval_temperature=1.0)  # fmt: skip
    r = tt.run_one(cfg, {"env": "keydoor:size=4", "setting": "grpo", "K": 2, "seed": 0})
    assert 0.15 < r["evals"][0]["train_success"] < 0.5
    assert r["curve"][0]["kl"] < 1e-3  # the first update starts at the reference


def test_study_writes_its_folder_and_resumes_without_redoing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tmp_path)
    s1 = tt.run_study(cfg, progress=False)
    out = Path(cfg.out)
    for name in ("curves.csv", "evals.csv", "final.csv", "tests.csv", "results.json",
                 "report.md", "learning_curves.png", "ablations.png", "training_metrics.png"):  # fmt: skip
        assert (out / name).is_file(), name
    runs = sorted((out / "runs").glob("*.json"))
    assert len(runs) == 4
    # a killed study: one run missing, one half-written temporary file
    runs[0].unlink()
    (out / "runs" / "partial.json.tmp").write_text("{")
    calls = []
    real = tt.run_one
    monkeypatch.setattr(tt, "run_one", lambda c, r: calls.append(r) or real(c, r))
    s2 = tt.run_study(cfg, progress=False)
    assert len(calls) == 1
    assert not list((out / "runs").glob("*.tmp"))
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in s["final"]] for s in (s1, s2)]
    assert json.dumps(strip[0]) == json.dumps(strip[1])
    assert "Table 1" in (out / "report.md").read_text()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings on the way
@pytest.mark.parametrize(
    ("setting", "kw", "needle"),
    [
        ("grpo", {"lr": 1e308}, "iteration 1: the PPO loss (nan) or its gradient norm (nan) is "
         "not finite: the run stops before the update (lower --lr)"),
        ("gae", {"critic_lr": 1e308}, "iteration 1: the critic's loss is not finite (inf)"),
    ],
)  # fmt: skip
def test_a_non_finite_loss_stops_the_run_and_saves_nothing(tmp_path, setting, kw, needle):
    from studies.backend import SweepError

    cfg = _cfg(tmp_path, seeds=1, settings=(setting,), **kw)
    with pytest.raises(FloatingPointError) as e:
        tt.run_one(cfg, {"env": "tmaze:length=2", "setting": setting, "K": 2, "seed": 0})
    assert needle in str(e.value)
    with pytest.raises(SweepError, match="1 of 1 tasks failed"):
        tt.run_study(cfg, progress=False)
    assert not list((Path(cfg.out) / "runs").glob("*.json"))
    assert not (Path(cfg.out) / "results.json").exists()


def test_changed_settings_do_not_reuse_old_runs(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, seeds=1, settings=("grpo",))
    tt.run_study(cfg, progress=False)
    tt.run_study(_cfg(tmp_path, seeds=1, settings=("grpo",), lr=0.02), progress=False)
    assert len(list((Path(cfg.out) / "runs").glob("*.json"))) == 2


def test_several_k_compare_within_each_k(tmp_path: Path) -> None:
    """With K = 2 and 4 the columns are (env, K): tests and orderings exist for each K."""
    cfg = _cfg(tmp_path, settings=("grpo", "gigpo", "hgpo"), Ks=(2, 4), iterations=2,
               eval_every=1)  # fmt: skip
    s = tt.run_study(cfg, progress=False)
    envs = {t["env"] for t in s["tests"]}
    assert envs == {"tmaze:length=2 K=2", "tmaze:length=2 K=4"}
    assert {o["env"] for o in s["orderings"]} == envs
    assert {r["label"] for r in s["final"]} == {"grpo", "gigpo", "hgpo"}


def test_settings_k_and_dedup(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, settings=("hgpo", "hgpo:K=4", "gigpo"), Ks=(2, 4), seeds=1)
    runs = tt._runs(cfg)
    keys = {(r["setting"], r["K"]) for r in runs}
    assert keys == {("hgpo", 2), ("hgpo", 4), ("hgpo:K=4", 4), ("gigpo", 2), ("gigpo", 4)}
    name, K, ec = tt.parse_setting("hgpo:K=4,alpha=2,base_group=true")
    assert (name, K, ec.alpha, ec.base_group) == ("hgpo", 4, 2.0, True)


# The bad-input tables of TrainToyConfig and of the command line: tests/studies/test_bad_input.py.


def test_cli_quick_run_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "q"
    assert tt.main(["--quick", "--iterations", "4", "--eval-every", "2", "--workers", "1",
                    "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "final train/held" in text and "HGPO > GiGPO > GRPO" in text
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["iterations"] == 4 and len(res["final"]) == 6


def test_run_keys_without_scheme_are_those_of_earlier_studies() -> None:
    """Folders written before --scheme existed must resume: the first default run's key, as
    main computed it before the change, is unchanged (no "scheme" entry, no branch share)."""
    cfg = tt.TrainToyConfig()
    assert tt._run_key(cfg, tt._runs(cfg)[0]) == "keydoor_size=4_horizon=40_grpo_K2_s0_e5d9210a72"
    assert tt._run_key(tt.TrainToyConfig(branch_budget=0.25), tt._runs(cfg)[0]).endswith(
        "e5d9210a72"
    )


def test_cli_quick_scheme_run_compares_per_env_step(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--quick --scheme: grpo, gigpo, hgpo under each scheme at the cost of independent
    rollouts; the independent scheme is today's run, the tests cover both families."""
    out = tmp_path / "s"
    argv = ["--quick", "--scheme", "independent", "branch:singleton", "--iterations", "6",
            "--eval-every", "3", "--workers", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert tt.main(argv) == 0
    assert "Learning speed per env step" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert {r["label"] for r in res["final"]} == {
        f"{s} [{sc}]"
        for s in ("grpo", "gigpo", "hgpo")
        for sc in ("independent", "branch:singleton")
    }
    steps = {(r["setting"], r["scheme"], r["seed"]): r["env_steps"] for r in res["final"]}
    for (s, sc, seed), n in steps.items():
        if sc == "branch:singleton":  # equal cost: the budget of independent, plus overshoot
            assert n >= 0.9 * steps[(s, "independent", seed)]
            assert n <= steps[(s, "independent", seed)] + 6 * 16 * 8  # iterations x groups x H
    assert all(0 <= r["auc_steps"] <= 1 for r in res["final"])
    pairs = {
        (t["env"], t["label"], t["baseline"]) for t in res["tests"] if t["metric"] == "auc_steps"
    }
    assert ("tmaze:length=3 / hgpo", "branch:singleton", "independent") in pairs
    assert ("tmaze:length=3 / branch:singleton", "grpo", "hgpo") in pairs
    # the independent scheme reproduces a run without --scheme bit for bit
    cfg = tt.TrainToyConfig(envs=("tmaze:length=3",), iterations=3, eval_every=3)
    run = {"env": "tmaze:length=3", "setting": "hgpo", "K": 2, "seed": 0}
    plain, ind = tt.run_one(cfg, run), tt.run_one(cfg, {**run, "scheme": "independent"})
    assert plain["curve"][-1]["pg_loss"] == ind["curve"][-1]["pg_loss"]
    assert plain["curve"][-1]["env_steps"] == ind["curve"][-1]["env_steps"]


def test_step_auc_on_known_numbers() -> None:
    """Two runs with success 0 -> 1 at steps 100 and 200: on the common span S = 100 the
    first averages 0.5 (a ramp), the second 0.25 (a ramp to 0.5 at s = 100)."""
    from studies.train_toy_report import add_step_auc

    def run(n: int) -> dict:
        return {"curve": [{"env_steps": n}],
                "evals": [{"iteration": 0, "train_success": 0.0},
                          {"iteration": 1, "train_success": 1.0}]}  # fmt: skip

    rows = [{"env": "e"}, {"env": "e"}]
    span = add_step_auc([run(100), run(200)], rows)
    assert span == {"e": 100.0}
    assert rows[0]["auc_steps"] == pytest.approx(0.5)
    assert rows[1]["auc_steps"] == pytest.approx(0.25)
    assert (rows[0]["env_steps"], rows[1]["env_steps"]) == (100.0, 200.0)


def test_compare_and_orderings_on_known_numbers() -> None:
    rows = []
    for seed in range(6):
        for label, v in (("hgpo", 0.9), ("gigpo", 0.6), ("grpo", 0.5), ("oracle", 0.89)):
            rows.append({"env": "e", "label": label, "auc_train": v + 0.01 * (seed % 3)})
    tests = compare(rows, "auc_train")
    by = {t["label"]: t for t in tests}
    assert by["gigpo"]["significant"] and by["grpo"]["significant"]
    assert not by["oracle"]["significant"] and by["oracle"]["diff"] == pytest.approx(-0.01)
    tests += ordering_tests(rows, "auc_train")  # gigpo > grpo: grpo against gigpo
    ords = {o["ordering"]: o["verdict"] for o in orderings(rows, tests, "auc_train")}
    # the oracle is below hgpo by 0.01 but not significantly: that ordering does not "hold"
    assert ords == {"HGPO > GiGPO > GRPO": "holds", "ablations below HGPO": "not significant"}


def test_compare_without_spread_on_either_side() -> None:
    # 100 in every seed against 0 in every seed: Welch's t is infinite (p = 0), and a NaN must
    # not reach Holm's adjustment of the other labels of the env
    rows = [{"env": "e", "label": lab, "auc_train": v}
            for _ in range(4) for lab, v in (("hgpo", 0.0), ("gae", 1.0), ("grpo", 0.0))]  # fmt: skip
    rows += [{"env": "e", "label": "gigpo", "auc_train": 0.1 * s} for s in range(4)]
    by = {t["label"]: t for t in compare(rows, "auc_train")}
    assert by["gae"]["p"] == 0.0 and by["gae"]["significant"] and by["gae"]["diff"] == 1.0
    assert by["grpo"]["p"] == 1.0 and not by["grpo"]["significant"]
    assert all(np.isfinite(t["p_holm"]) for t in by.values())


def test_train_toy_config_declares_its_checks_per_field():
    """Every TrainToyConfig field has a --help section; every number declares its bounds and
    the --K list its K bounds, in the field's metadata (hgpo.fields.setting)."""
    from hgpo.fields import field_bounds, field_choices, field_types, sections

    cls = tt.TrainToyConfig
    in_a_section = [name for names in sections(cls).values() for name in names]
    assert sorted(in_a_section) == sorted(field_types(cls))
    numbers = [n for n, kind in field_types(cls).items() if kind in (int, float)]
    assert set(numbers) | {"Ks"} == set(field_bounds(cls))
    assert dict(field_bounds(cls)["Ks"]) == {"lo": 0, "hi": tt.TABULAR_MAX_K}
    assert field_choices(cls)["norm"] == ("mean", "mean_std")
    help_text = tt._parser().format_help()
    for title in sections(cls):
        assert help_text.count(f"\n{title}:\n") == 1
