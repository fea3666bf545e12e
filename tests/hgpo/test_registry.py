"""Users' own estimators: register_estimator, the hgpo.estimators entry points, and the checks
on what a registered function takes and returns."""

from __future__ import annotations

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
from hgpo.estimator_registry import EstimatorRegistrationError

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
    ("entry", "match"),
    [
        ("broken = toyest:missing", r"entry point 'broken' \(hgpo.estimators: toyest:missing\) "
         r"failed to load: AttributeError"),
        ("hgpo = toyest:halved", r"the name 'hgpo' is taken by hgpo; give the entry point"),
        ("bad = toyest:np", r"entry point 'bad' .*must be a function"),
    ],
)  # fmt: skip
def test_a_bad_entry_point_is_a_named_error(tmp_path, entry, match):
    path = _package(tmp_path, TOY, entry)
    r = _run("from hgpo import ESTIMATORS\nprint(list(ESTIMATORS))", path)
    assert r.returncode == 1
    assert "EstimatorRegistrationError" in r.stderr
    assert __import__("re").search(match, r.stderr), r.stderr
