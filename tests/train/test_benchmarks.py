"""One adapter per benchmark (agentenvs.registry): nothing outside the adapters compares a
benchmark's name, and a new benchmark is one adapter plus one ``register`` call: the fake one
below runs through the trainer's own env, prompt and parser path, and through a whole tiny
training iteration."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentenvs import EpisodeMemory, parse_action
from agentenvs.adapters import Benchmark
from agentenvs.registry import BENCHMARKS, benchmark, register
from tests.train.conftest import ROOT, run_env

NAMES = ("alfworld", "webshop", "toy")
SCANNED = ("hgpo/*.py", "hgpo/train/**/*.py", "studies/**/*.py", "benchmarks/**/*.py")
"""Where no code may branch on a benchmark's name (the adapters live in agentenvs/adapters):
the core, the trainer, the studies and the benchmark scripts."""
NOT_SCANNED = {"hgpo/extras.py": "its EXTRAS table is keyed by pip extras, two named after envs"}

REFERENCE_TABLES = {
    ("benchmarks/make_verl_agent_golden.py", "MODES"),
    ("hgpo/config.py", "REFERENCE_PROFILES"),
    ("hgpo/config.py", "REFERENCE_ESTIMATOR_PROFILES"),
}
"""Tables keyed by benchmark name that are not the trainer's: the verl-agent reference's own
normalisation per recipe (hgpo.config.REFERENCE_PROFILES, which each adapter names its entry
of; the golden cases are made with it) and an estimator's per-recipe options
(REFERENCE_ESTIMATOR_PROFILES: GraphGPO's gamma per recipe)."""


def _names_a_benchmark(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in NAMES or node.value.startswith("toy:")
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_benchmark(e) for e in node.elts)
    return False


def _table_name(tree: ast.Module, table: ast.Dict) -> str:
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if isinstance(value, ast.Call) and value.args:  # NAME = MappingProxyType({...})
            value = value.args[0]
        if isinstance(node, ast.Assign | ast.AnnAssign) and value is table:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            return getattr(target, "id", "")
    return ""


def name_branches(path: Path, rel: str) -> list[str]:
    """Every comparison or membership test against a benchmark name, ``.startswith("toy...")``,
    ``is_toy(...)`` call, ``x in EXTRAS``/``ENV_DEFAULTS`` test and dict keyed by benchmark
    names in ``path``, as "file:line kind"."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        kind = ""
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_a_benchmark(s) for s in sides):
                kind = "compares a benchmark name"
            elif any(getattr(s, "id", "") in ("EXTRAS", "ENV_DEFAULTS") for s in sides):
                kind = "tests membership of a per-benchmark table"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            fn = node.func
            if getattr(fn, "id", "") == "is_toy":
                kind = "calls is_toy"
            elif getattr(fn, "attr", "") == "startswith" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("toy"):
                    kind = "startswith('toy')"
        elif isinstance(node, ast.Dict) and any(
            k is not None and _names_a_benchmark(k) for k in node.keys
        ):
            exempt = (rel, _table_name(tree, node)) in REFERENCE_TABLES
            kind = "" if exempt else "a dict keyed by benchmark names"
        if kind:
            out.append(f"{rel}:{node.lineno} {kind}")
    return out


def scan(root: Path) -> list[str]:
    """:func:`name_branches` of every module under :data:`SCANNED` of the tree at ``root``."""
    hits = []
    for pattern in SCANNED:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if rel not in NOT_SCANNED:
                hits += name_branches(path, rel)
    return hits


def test_no_code_outside_the_adapters_branches_on_a_benchmark_name():
    hits = scan(ROOT)
    assert not hits, "ask agentenvs.registry.benchmark(env) instead:\n" + "\n".join(hits)


def test_the_scan_finds_a_name_branch(tmp_path):
    """The scan is not blind: it finds each kind of branch it looks for."""
    src = (
        "E = {'webshop': 1}\n"
        "def f(env, cfg):\n"
        "    if env == 'alfworld' or env in ('toy', 'x'):\n"
        "        return env.startswith('toy:') or is_toy(env) or cfg.env in EXTRAS\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(src)
    hits = name_branches(path, "probe.py")
    kinds = sorted(h.split(" ", 1)[1] for h in hits)
    assert kinds == [
        "a dict keyed by benchmark names",
        "calls is_toy",
        "compares a benchmark name",
        "compares a benchmark name",
        "startswith('toy')",
        "tests membership of a per-benchmark table",
    ], hits


# -- a benchmark added in this file: a corridor whose goal is to the right ----------------------
class CorridorEnv:
    """Cell 0..2; "right" moves on, the goal (cell 2) pays 1 and ends the episode."""

    supports_snapshot = True

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        self.cell, self.task = 0, task
        return self._obs()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.cell = min(2, self.cell + 1) if action == "go right" else max(0, self.cell - 1)
        obs, info = self._obs()
        return obs, float(self.cell == 2), self.cell == 2, info

    def snapshot(self) -> Any:
        return (self.cell, self.task)

    def restore(self, snap: Any) -> tuple[str, dict[str, Any]]:
        self.cell, self.task = snap
        return self._obs()

    def _obs(self) -> tuple[str, dict[str, Any]]:
        info = {
            "admissible_actions": ["go left", "go right"],
            "task": f"reach cell 2 ({self.task})",
            "won": self.cell == 2,
        }
        return f"corridor cell {self.cell}", info


def _corridor(settings: Any, split: str) -> Any:
    return CorridorEnv


def _prompt(
    env: str, task: str, obs: str, admissible: Sequence[str], memory: EpisodeMemory, k: int
) -> str:
    history, n = memory.fetch(k) if len(memory) and k > 0 else ("", 0)
    return (
        f"Corridor. Task: {task}. Last {n}: {history} Now: {obs}. Choose one of {list(admissible)}."
    )


def _parse(text: str, info: dict[str, Any]) -> Any:
    """Anything the model says is "go right" (so every episode succeeds: the test can see
    that this parser, not another, chose the actions)."""
    parse_action(text, "alfworld", info.get("admissible_actions"))  # never raises
    return parse_action("<think>x</think><action>go right</action>", "alfworld")


CORRIDOR = Benchmark(
    name="corridor",
    defaults={"max_steps": 4, "history_length": 1},
    val_splits=("dev",),
    split_size=lambda settings, split: 3 if split == "train" else 2,
    factory=_corridor,
    task_text=lambda first_obs, info: info["task"],
    shown=lambda obs, task: obs.upper(),
    key=lambda obs, task: f"{task}|{obs}",
    prompt=_prompt,
    parse=_parse,
    candidates=lambda admissible, task: list(reversed(admissible)),
    templates=("Corridor. Task: {task}. Choose one of {actions}.",),
    sample_text=("corridor cell 0 go left go right",),
    corpus=lambda env: ["reach cell 2"],
)


@pytest.fixture
def corridor(monkeypatch):
    monkeypatch.setitem(BENCHMARKS, "corridor", CORRIDOR)
    return CORRIDOR


def test_register_adds_a_benchmark_once_and_the_lookup_names_the_choices(monkeypatch):
    monkeypatch.setattr("agentenvs.registry.BENCHMARKS", dict(BENCHMARKS))
    with pytest.raises(
        ValueError, match=r"^--env: must be one of 'alfworld', 'webshop', 'toy:FAMILY"
    ):
        benchmark("corridor")
    from agentenvs import registry

    assert register(CORRIDOR) is CORRIDOR and registry.benchmark("corridor") is CORRIDOR
    with pytest.raises(ValueError, match=r"^register: bench\.name: must be a new name"):
        register(CORRIDOR)
    assert registry.benchmark("toy:keydoor:size=4").name == "toy"
    for bad_env in ("toy", "alfworld:x", "corridor:1", 3):
        with pytest.raises(ValueError, match=r"^TrainConfig\.env: must be one of"):
            registry.benchmark(bad_env, "TrainConfig.env")


def test_a_registered_benchmark_runs_through_the_trainers_env_path(corridor):
    from hgpo.train.envs import TRAIN_SPLIT, EnvSet, split_size, val_splits
    from hgpo.train.episodes import candidate_actions
    from hgpo.train.train_config import resolve
    from hgpo.train.trainer import tiny_corpus

    cfg = resolve("corridor", "tiny", {"out_dir": "unused"})
    assert cfg.history_length == 1  # the adapter's defaults, under the preset
    assert val_splits(cfg.env) == ("dev",) and split_size(cfg, "dev") == 2
    corpus = tiny_corpus(cfg.env)
    assert corpus[0] == "reach cell 2" and corpus.index(CORRIDOR.templates[0]) < corpus.index(
        CORRIDOR.sample_text[0]
    )
    assert candidate_actions("corridor", ["a", "b"], "") == ["b", "a"]
    envs = EnvSet(cfg, TRAIN_SPLIT, 2)
    try:
        assert envs.num_tasks == 3
        obs, infos = envs.reset([1], 2)
        assert (
            envs.task(0) == "reach cell 2 (1)"
            and envs.key(0, obs[0]) == "reach cell 2 (1)|corridor cell 0"
        )
        assert envs.candidates(0, infos[0]) == ["go right", "go left"]
        parsed = envs.parse("no tags at all", infos[0])
        assert parsed.action == "go right" and parsed.valid
        envs.remember(0, obs[0], parsed.action)
        obs, _, _, infos = envs.step([parsed.action, "go left"])
        prompt = envs.prompt(0, obs[0], infos[0])
        assert prompt.startswith("Corridor. Task: reach cell 2 (1). Last 1: ")
        assert "CORRIDOR CELL 0" in prompt and "Now: CORRIDOR CELL 1" in prompt  # shown()
        envs.require_snapshot("here")  # the corridor's envs snapshot
    finally:
        envs.close()


def test_a_registered_benchmark_trains_one_tiny_iteration(tmp_path):
    """``python -m hgpo.train --env corridor`` after one ``register`` call: the adapter's
    defaults, splits, prompts and parser (every episode reaches the goal) carry the run."""
    out = tmp_path / "run"
    code = (
        "import sys; from agentenvs.registry import register; "
        "from tests.train.test_benchmarks import CORRIDOR; register(CORRIDOR); "
        "from hgpo.train.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    args = ["--preset", "tiny", "--env", "corridor", "--iterations", "1", "--val-every", "1"]
    r = subprocess.run(
        [sys.executable, "-c", code, *args, "--out-dir", str(out)],
        cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    assert row["success_rate"] == 1.0 and row["invalid_rate"] == 0.0
    assert row["val/dev/success"] == 1.0
    saved = json.loads((out / "config.json").read_text())
    assert saved["env"] == "corridor" and saved["history_length"] == 1 and saved["max_steps"] == 3
