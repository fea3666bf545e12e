"""Users' own estimators: register_estimator, the hgpo.estimators entry points, and the checks
on what a registered function takes and returns."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hgpo
from hgpo import (
    ESTIMATORS,
    Advantages,
    StepBatch,
    compute_advantages,
    estimator_reads,
    register_estimator,
    step_returns,
    unregister_estimator,
)
from hgpo.estimator_registry import EstimatorRegistrationError, get_spec

ROOT = Path(__file__).resolve().parents[2]


def _batch() -> StepBatch:
    return StepBatch.from_trajectories(
        groups=[0, 0], rewards=[[0.0, 1.0], [0.0, 0.0]], states=[[1, 2], [1, 3]]
    )


@pytest.fixture
def registered():
    """Names registered by a test, removed afterwards."""
    names: list[str] = []
    yield names
    for n in names:
        if n in ESTIMATORS:
            unregister_estimator(n)


def centred(batch, cfg, values=None):
    """The step return less the batch mean (a toy estimator)."""
    R = step_returns(batch, cfg)
    return R - R.mean()


def test_a_registered_estimator_runs_by_name(registered):
    register_estimator("centred", centred)
    registered.append("centred")
    assert "centred" in ESTIMATORS and "centred" in list(ESTIMATORS)
    out = compute_advantages("centred", _batch(), gamma=1.0)
    assert isinstance(out, Advantages)
    # returns 1, 1, 0, 0: mean 0.5
    np.testing.assert_allclose(out.advantages, [0.5, 0.5, -0.5, -0.5])
    np.testing.assert_allclose(out.returns, [1.0, 1.0, 0.0, 0.0])
    assert estimator_reads("centred") == ()


def test_register_as_a_decorator_with_inputs(registered):
    @register_estimator("scaled", reads=("entropy",))
    def scaled(batch, cfg, values=None, *, entropy):
        return Advantages(entropy * 2.0, step_returns(batch, cfg))

    registered.append("scaled")
    out = compute_advantages("scaled", _batch(), entropy=np.array([0.0, 1.0, 0.5, 0.25]))
    np.testing.assert_allclose(out.advantages, [0.0, 2.0, 1.0, 0.5])
    with pytest.raises(ValueError, match=r"estimator 'scaled' needs entropy: float64\[n\]"):
        compute_advantages("scaled", _batch())
    with pytest.raises(ValueError, match=r"values: estimator 'scaled' does not read state values"):
        compute_advantages("scaled", _batch(), values=np.zeros(4), entropy=np.zeros(4))
    with pytest.raises(ValueError, match=r"scaled: entropy\[1\] is -1.0; an entropy is >= 0"):
        compute_advantages("scaled", _batch(), entropy=np.array([0.0, -1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"scaled: entropy: must be one value per step"):
        compute_advantages("scaled", _batch(), entropy=np.zeros(3))


def test_registering_a_name_twice_needs_replace(registered):
    register_estimator("twice", centred)
    registered.append("twice")
    with pytest.raises(
        EstimatorRegistrationError, match=r"'twice'.*already registered.*replace=True"
    ):
        register_estimator("twice", centred)
    with pytest.raises(EstimatorRegistrationError, match=r"'hgpo'.*already registered \(hgpo\)"):
        register_estimator("hgpo", centred)
    register_estimator("twice", lambda b, c, values=None: np.zeros(b.n_steps), replace=True)
    assert (compute_advantages("twice", _batch()).advantages == 0).all()


@pytest.mark.parametrize(
    ("fn", "reads", "match"),
    [
        (
            lambda batch: None,
            (),
            r"the estimator must accept \(batch, config, values=None\), but '<lambda>'\(batch\)",
        ),
        (
            lambda b, c, values=None: None,
            ("entropy",),
            r"the estimator must accept \(batch, config, values=None, entropy=None\)",
        ),
        (
            "not a function",
            (),
            r"the estimator must be a function fn\(batch, config, values=None\), got str",
        ),
        (centred, ("critic",), r"reads: unknown input 'critic'; an estimator may read values"),
        (centred, "values", r"reads must be a tuple of input names"),
    ],
)
def test_a_wrong_signature_is_a_named_error(fn, reads, match):
    with pytest.raises(EstimatorRegistrationError, match=r"register_estimator\('bad'\): " + match):
        register_estimator("bad", fn, reads=reads)
    assert "bad" not in ESTIMATORS


@pytest.mark.parametrize("name", ["", "a b", "x,y", "k=v", "-x", ".x", 3])
def test_a_bad_name_is_refused(name):
    with pytest.raises(EstimatorRegistrationError, match=r"the name must be letters"):
        register_estimator(name, centred)


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (
            lambda b: np.zeros(b.n_steps + 1),
            r"returned advantages of shape \(5,\); it must be one ",
        ),
        (lambda b: np.zeros((b.n_steps, 1)), r"returned advantages of shape \(4, 1\)"),
        (lambda b: "zeros", r"returned str; it must return an hgpo.Advantages or float64\[4\]"),
        (
            lambda b: np.array([0.0, np.nan, 0.0, 0.0]),
            r"returned a non-finite advantage nan at row 1 \(step 1 of trajectory 0\)",
        ),
        (
            lambda b: Advantages(np.zeros(4), np.zeros(2)),
            r"returned returns of shape \(2,\)",
        ),
    ],
)
def test_a_wrong_result_names_the_estimator(registered, result, match):
    register_estimator("wrong", lambda b, c, values=None: result(b))
    registered.append("wrong")
    with pytest.raises(ValueError, match=r"estimator 'wrong' \(register_estimator\) " + match):
        compute_advantages("wrong", _batch())


def test_an_unknown_estimator_lists_the_registered_ones(registered):
    register_estimator("mine", centred)
    registered.append("mine")
    with pytest.raises(
        ValueError, match=r"unknown estimator 'ppo'; known estimators: grpo, .*mine"
    ):
        compute_advantages("ppo", _batch())
    with pytest.raises(ValueError, match=r"unknown estimator 'gone'"):
        unregister_estimator("gone")


def test_builtin_reads():
    assert estimator_reads("gae") == ("values",)
    assert estimator_reads("hiper") == ("values",)
    assert estimator_reads("hgpo") == ()
    for name in ESTIMATORS:
        assert set(estimator_reads(name)) <= set(hgpo.STEP_INPUTS)


def _package(tmp_path: Path, body: str, entry: str) -> Path:
    """A package ``toyest`` with an ``hgpo.estimators`` entry point, importable from tmp_path
    (a .dist-info folder is all importlib.metadata needs to find it)."""
    (tmp_path / "toyest").mkdir()
    (tmp_path / "toyest" / "__init__.py").write_text(textwrap.dedent(body))
    info = tmp_path / "toyest-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyest\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hgpo.estimators]\n{entry}\n")
    return tmp_path


def _run(code: str, path: Path) -> subprocess.CompletedProcess:
    env_path = f"{path}:{ROOT}"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


TOY = """
    import numpy as np
    from hgpo import step_returns

    def halved(batch, cfg, values=None):
        return 0.5 * (step_returns(batch, cfg) - step_returns(batch, cfg).mean())

    def needs_entropy(batch, cfg, values=None, entropy=None):
        return entropy - entropy.mean()
    needs_entropy.reads = ("entropy",)
"""


def test_an_entry_point_estimator_appears_by_name(tmp_path):
    path = _package(tmp_path, TOY, "halved = toyest:halved\nsharp = toyest:needs_entropy")
    r = _run(
        """
        import numpy as np
        from hgpo import ESTIMATORS, StepBatch, compute_advantages, estimator_reads
        from hgpo.estimator_registry import get_spec
        b = StepBatch.from_trajectories(groups=[0, 0], rewards=[[0.0, 1.0], [0.0, 0.0]],
                                        states=[[1, 2], [1, 3]])
        print(list(ESTIMATORS)[-2:], get_spec("halved").origin, estimator_reads("sharp"))
        print(compute_advantages("halved", b, gamma=1.0).advantages.tolist())
        print(compute_advantages("sharp", b, entropy=np.arange(4.0)).advantages.tolist())
        """,
        path,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "['halved', 'sharp'] entry point toyest:halved ('entropy',)"
    assert lines[1] == "[0.25, 0.25, -0.25, -0.25]"
    assert lines[2] == "[-1.5, -0.5, 0.5, 1.5]"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("broken = toyest:missing", r"AttributeError: module 'toyest' has no attribute"),
        ("broken = nomodule:fn", r"ModuleNotFoundError: No module named 'nomodule'"),
        ("broken = toyest:np", r"the estimator must be a function .*got module"),
    ],
)  # fmt: skip
def test_a_broken_entry_point_is_skipped_with_one_warning(tmp_path, entry, reason):
    """Issue 38 item 11: a broken entry point (module missing, import error, not callable)
    stops nothing: one warning names it and why, the others load, and choosing it by name is a
    one-line error saying it failed to load (before: importing the registry raised)."""
    path = _package(tmp_path, TOY, f"{entry}\nhalved = toyest:halved")
    r = _run(
        """
        from hgpo import ESTIMATORS, compute_advantages, StepBatch
        print(list(ESTIMATORS)[-1], len(ESTIMATORS) == len(list(ESTIMATORS)))
        b = StepBatch.from_trajectories(groups=[0], rewards=[[1.0]], states=[[0]])
        try:
            compute_advantages("broken", b)
        except ValueError as exc:
            print(exc)
        """,
        path,
    )
    assert r.returncode == 0, r.stderr
    where = r"entry point 'broken' \(hgpo.estimators: [\w:]+\)"
    warned = [line for line in r.stderr.splitlines() if "Warning" in line]
    assert len(warned) == 1 and re.search(rf"skipping estimator {where}: {reason}", warned[0])
    out = r.stdout.splitlines()
    assert out[0] == "halved True"
    assert len(out) == 2 and re.fullmatch(rf"estimator 'broken': {where} failed to load: {reason}.*",
                                          out[1]), out  # fmt: skip


def test_an_entry_point_taking_a_builtin_name_is_skipped(tmp_path):
    path = _package(tmp_path, TOY, "hgpo = toyest:halved")
    r = _run("from hgpo.estimator_registry import get_spec\nprint(get_spec('hgpo').origin)", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hgpo"]
    assert "the name 'hgpo' is taken by hgpo; give the entry point another name" in r.stderr


# --------------------------------------------------------------------------- issue 38


def _writes_reward(batch, cfg, values=None):
    r = batch.reward
    r -= r.mean()
    return r


def _writes_values(batch, cfg, values=None):
    values *= 2.0
    return values


def _writes_layout(batch, cfg, values=None):
    np.add(batch.traj_index, 1, out=batch.traj_index)
    return np.zeros(batch.n_steps)


@pytest.mark.parametrize(
    ("fn", "reads", "field"),
    [
        (_writes_reward, (), "batch.reward"),
        (_writes_values, ("values",), "values"),
        (_writes_layout, (), "batch.traj_index"),
    ],
)
def test_an_estimator_that_writes_into_its_inputs_is_named(registered, fn, reads, field):
    """Issue 38 item 2: ``r = batch.reward; r -= r.mean()`` changed every estimator run after
    it on the same batch, silently; now the write raises, naming the estimator and the field,
    and the batch and the caller's arrays are as they were."""
    b = _batch()
    reward, values = b.reward.copy(), np.arange(4.0)
    before = compute_advantages("grpo", b).advantages
    register_estimator("writer", fn, reads=reads)
    registered.append("writer")
    kw = {"values": values} if reads else {}
    with pytest.raises(
        hgpo.estimator_registry.EstimatorWriteError,
        match=rf"estimator 'writer' \(register_estimator\) wrote into its input {field}: "
        r"estimators get read-only views",
    ) as info:
        compute_advantages("writer", b, **kw)
    assert "read-only" in str(info.value.__cause__)
    np.testing.assert_array_equal(b.reward, reward)
    np.testing.assert_array_equal(values, np.arange(4.0))
    np.testing.assert_array_equal(compute_advantages("grpo", b).advantages, before)
    assert b.reward.flags.writeable  # the batch's own arrays stay the caller's


def test_a_returned_input_comes_back_writable(registered):
    register_estimator("echo", lambda b, c, values=None: values, reads=("values",))
    registered.append("echo")
    values = np.arange(4.0)
    out = compute_advantages("echo", _batch(), values=values)
    out.advantages[0] = 7.0  # the caller's to change: its own copy
    assert values[0] == 0.0


def test_non_finite_returns_name_the_estimator(registered):
    """Issue 38 item 5: an Advantages whose returns hold inf passed (only the advantages were
    checked)."""
    register_estimator(
        "badret", lambda b, c, values=None: Advantages(np.zeros(4), np.array([0, 0, np.inf, 0]))
    )
    registered.append("badret")
    with pytest.raises(
        ValueError,
        match=r"estimator 'badret' \(register_estimator\) returned a non-finite return inf at "
        r"row 2 \(step 0 of trajectory 1\) of returns; an estimator must return finite values",
    ):
        compute_advantages("badret", _batch())


def test_an_estimator_that_raises_is_named(registered):
    """Issue 38 item 11: a user's estimator's own error names the estimator (every caller
    goes through compute_advantages), the original chained."""

    def boom(batch, cfg, values=None):
        raise KeyError("gamma2")

    register_estimator("boom", boom)
    registered.append("boom")
    with pytest.raises(
        hgpo.estimator_registry.EstimatorError,
        match=r"^estimator 'boom' \(register_estimator\) raised KeyError: 'gamma2'$",
    ) as info:
        compute_advantages("boom", _batch())
    assert isinstance(info.value.__cause__, KeyError)


def _full_batches() -> list[StepBatch]:
    """A batch with every column (actions, invalid flags, next states) and a branched one."""
    plain = StepBatch.from_trajectories(
        groups=[0, 0, 1, 1],
        rewards=[[0.0, 1.0], [0.5, 0.0, 2.0], [1.0], [0.0, 3.0]],
        states=[[1, 2], [1, 3, 2], [4], [4, 5]],
        actions=[[0, 1], [0, 0, 1], [1], [1, 0]],
        invalid=[[False, True], [False, False, True], [False], [True, False]],
        terminal_states=[6, 6, 7, 7],
    )
    branched = StepBatch(
        group=[0] * 7, traj=[0, 0, 0, 0, 1, 1, 2], step=[0, 1, 2, 3, 2, 3, 3],
        reward=[0.0, 0.0, 1.0, 2.0, 0.0, 4.0, 10.0], state=[5, 6, 7, 8, 7, 9, 9],
        action=[0, 1, 0, 1, 1, 0, 0], invalid=[False, True, False, False, False, True, False],
        parent=[-1, -1, -1, -1, 0, 0, 1],
    )  # fmt: skip
    return [plain, branched]


@pytest.mark.parametrize("name", [n for n in ESTIMATORS if get_spec(n).builtin])
def test_no_builtin_estimator_writes_into_its_inputs(name):
    """Every built-in runs on read-only views of every batch array and per-step input (a
    write would be an EstimatorWriteError), with the invalid-action penalty on."""
    from tests.hgpo.strategies import default_inputs

    for batch in _full_batches():
        if name in ("graphgpo", "3spo") and batch.next_state is None:
            continue
        inputs = default_inputs(name, batch)
        if "values" in inputs:
            inputs["values"] = np.linspace(-1.0, 1.0, batch.n_steps)
        saved = {k: np.copy(v) for k, v in vars(batch).items() if isinstance(v, np.ndarray)}
        for cfg in ({}, {"invalid_penalty": 0.1, "penalty_mode": "return", "gamma": 0.0}):
            out = compute_advantages(name, batch, **cfg, **inputs)
            assert np.isfinite(out.advantages).all() and out.advantages.flags.writeable
            assert out.returns.flags.writeable
        for k, v in saved.items():
            np.testing.assert_array_equal(getattr(batch, k), v, err_msg=k)


def test_a_read_only_array_of_the_estimators_own_is_its_own_error(registered):
    def own(batch, cfg, values=None):
        a = np.broadcast_to(0.0, batch.n_steps)
        a[0] = 1.0

    register_estimator("own", own)
    registered.append("own")
    with pytest.raises(
        hgpo.estimator_registry.EstimatorError,
        match=r"estimator 'own' \(register_estimator\) raised ValueError: assignment "
        r"destination is read-only",
    ) as info:
        compute_advantages("own", _batch())
    assert type(info.value) is hgpo.estimator_registry.EstimatorError
