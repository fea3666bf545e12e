"""Issue 28: parts take the slice of config they read (a ``<Thing>Settings`` Protocol, as
``LossSettings``), not the whole TrainConfig. Each function below reads no ``cfg.<attr>`` outside
its Protocol, hands ``cfg`` on only to a function whose Protocol it covers, and TrainConfig has
every member of each Protocol with the same annotation (so callers keep passing a TrainConfig)."""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing

import pytest

from agentenvs.adapters import alfworld_bench, toy_bench, webshop_bench
from hgpo.train import (
    branched_play,
    engines,
    envs,
    episodes,
    loss,
    preflight,
    run_checkpoint,
    rundir,
    truth_monitor,
)
from hgpo.train.train_config import TrainConfig

SLICES = {
    # (module, qualified function name): its Protocol
    (loss, "ppo_loss"): loss.LossSettings,
    (engines, "ds_config"): engines.DeepSpeedSettings,
    (run_checkpoint, "load_run"): run_checkpoint.LoadRunSettings,
    (truth_monitor, "truth_chain"): truth_monitor.TruthChainSettings,
    (truth_monitor, "check_truth_size"): truth_monitor.TruthSizeSettings,
    (preflight, "check_model_shapes"): preflight.ModelShapeSettings,
    (preflight, "check_sizes"): preflight.SizeSettings,
    (branched_play, "BranchPlan.from_config"): branched_play.BranchPlanSettings,
    (episodes, "Play.training"): episodes.TrainingPlaySettings,
    (episodes, "Play.validation"): episodes.ValidationPlaySettings,
    (envs, "split_size"): envs.BenchmarkSettings,
    (envs, "env_actors"): envs.EnvActorSettings,
    (envs, "check_ray_capacity"): envs.EnvActorSettings,
    (envs, "EnvSet.__init__"): envs.EnvSetSettings,
    (rundir, "check_run_dir"): rundir.RunDirSettings,
    (rundir, "check_resume"): rundir.RunDirSettings,
    (rundir, "resume_reference"): rundir.RunDirSettings,
    (rundir, "resume_changes"): rundir.RunDirSettings,
    (run_checkpoint, "save_run"): run_checkpoint.SaveRunSettings,
    (run_checkpoint, "_write_files"): run_checkpoint.SaveRunSettings,
    (preflight, "check_snapshots"): preflight.SnapshotSettings,
    (preflight, "note_resume"): rundir.RunDirSettings,
}
BY_NAME = {
    name.removesuffix(".__init__").rsplit(".", 1)[-1]: proto for (_, name), proto in SLICES.items()
}
"""Each sliced function (a class by its ``__init__``) by the name it is called with."""
BY_NAME["config_changes"] = rundir.ConfigRecord  # (its arguments are old and new, not cfg)

ADAPTER_CALLABLES = {"split_size", "factory", "expert_plans", "preflight"}
"""``Benchmark`` fields that take the run's config: the adapter reads its own Protocol of it."""
ADAPTER_SETTINGS = (
    alfworld_bench.AlfWorldSettings, toy_bench.ToySettings, webshop_bench.WebShopSettings,
)  # fmt: skip


def members(proto: type) -> dict[str, object]:
    """A Protocol's fields (name: annotation string) and methods (name: the function)."""
    out: dict[str, object] = {}
    for klass in reversed(proto.__mro__):
        if klass in (object, typing.Protocol, typing.Generic):
            continue
        out.update(getattr(klass, "__annotations__", {}))
        out.update({k: v for k, v in vars(klass).items() if inspect.isfunction(v) and k[0] != "_"})
    return out


def function_node(module: object, qualname: str) -> ast.FunctionDef:
    node: ast.AST = ast.parse(inspect.getsource(module))
    for part in qualname.split("."):
        node = next(
            n
            for n in ast.iter_child_nodes(node)
            if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part
        )
    assert isinstance(node, ast.FunctionDef)
    return node


def stray_uses(fn: ast.FunctionDef, allowed: set[str]) -> list[str]:
    """Uses of ``cfg`` in ``fn`` its Protocol does not cover: ``cfg.<attr>`` with attr not in
    ``allowed``, and ``cfg`` itself handed on other than to a sliced function whose Protocol's
    members lie in ``allowed``."""
    name = "cfg"
    covered: set[int] = set()  # ids of Name nodes accounted for
    bad: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == name:
                covered.add(id(node.value))
                if node.attr not in allowed:
                    bad.append(f"line {node.lineno}: {name}.{node.attr}")
        elif isinstance(node, ast.Call) and _adapter_call(node):
            covered.update(id(a) for a in node.args if isinstance(a, ast.Name) and a.id == name)
        elif isinstance(node, ast.Call):
            callee = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else (node.func.id if isinstance(node.func, ast.Name) else None)
            )
            for arg in node.args:
                if (
                    isinstance(arg, ast.Name)
                    and arg.id == name
                    and callee in BY_NAME
                    and set(members(BY_NAME[callee])) <= allowed
                ):
                    covered.add(id(arg))
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and id(node) not in covered:
            bad.append(f"line {node.lineno}: {name} handed on whole")
    return bad


def _adapter_call(node: ast.Call) -> bool:
    """``benchmark(...).split_size(cfg, ...)`` or ``self.bench.factory(cfg, ...)``: the config
    handed to its benchmark's adapter (checked against :data:`ADAPTER_SETTINGS`)."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in ADAPTER_CALLABLES:
        return False
    owner = func.value
    if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name):
        return owner.func.id == "benchmark"
    return isinstance(owner, ast.Attribute) and owner.attr == "bench"


def self_cfg_reads(cls: ast.ClassDef) -> set[str]:
    """The attributes read of ``self.cfg`` in every method of ``cls``."""
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "cfg"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }


@pytest.mark.parametrize("key", list(SLICES), ids=[name for _, name in SLICES])
def test_function_reads_only_its_protocol(key):
    module, qualname = key
    proto = SLICES[key]
    fn = function_node(module, qualname)
    arg = next(a for a in fn.args.args if a.arg == "cfg")
    assert ast.unparse(arg.annotation) == proto.__name__
    allowed = set(members(proto))
    if fn.name == "__init__":  # a class keeps its slice as ``self.cfg: Proto = cfg``
        keep = [n for n in fn.body if not _stores_slice(n, proto)]
        assert len(keep) == len(fn.body) - 1, f"{qualname}: no self.cfg: {proto.__name__} = cfg"
        fn.body = keep
        klass = _class_node(module, qualname.rpartition(".")[0])
        assert self_cfg_reads(klass) <= allowed, self_cfg_reads(klass) - allowed
    assert stray_uses(fn, allowed) == []


def _stores_slice(node: ast.stmt, proto: type) -> bool:
    return (
        isinstance(node, ast.AnnAssign)
        and ast.unparse(node.target) == "self.cfg"
        and node.value is not None
        and ast.unparse(node.value) == "cfg"
        and ast.unparse(node.annotation) == proto.__name__
    )


def _class_node(module: object, name: str) -> ast.ClassDef:
    tree = ast.parse(inspect.getsource(module))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


@pytest.mark.parametrize(
    "proto",
    sorted({*SLICES.values(), rundir.ConfigRecord, *ADAPTER_SETTINGS}, key=lambda p: p.__name__),
)
def test_train_config_satisfies_protocol(proto):
    own = typing.get_type_hints(TrainConfig)
    for name, want in members(proto).items():
        if inspect.isfunction(want):  # a method: TrainConfig's, with the same return annotation
            have = getattr(TrainConfig, name, None)
            assert inspect.isfunction(have), f"TrainConfig.{name} is not a method"
            assert have.__annotations__.get("return") == want.__annotations__.get("return")
            params = list(inspect.signature(want).parameters)
            assert list(inspect.signature(have).parameters) == params
        else:
            assert name in own, f"TrainConfig has no field {name} ({proto.__name__})"
            hint = typing.get_type_hints(proto)[name]
            assert hint == own[name], f"{proto.__name__}.{name}: {hint} vs {own[name]}"


def test_a_stray_read_is_caught():
    """The checker itself: a read outside the Protocol, and cfg handed on whole, are reported."""
    fn = function_node(engines, "ds_config")
    allowed = set(members(engines.DeepSpeedSettings))
    src = textwrap.dedent(ast.unparse(fn)).replace(
        "return {", "x = cfg.lr\n    other(cfg)\n    return {", 1
    )
    mutated = ast.parse(src).body[0]
    assert isinstance(mutated, ast.FunctionDef)
    found = stray_uses(mutated, allowed)
    assert any("cfg.lr" in f for f in found) and any("handed on whole" in f for f in found)
