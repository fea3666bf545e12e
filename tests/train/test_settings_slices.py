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

from hgpo.train import (
    branched_play,
    engines,
    episodes,
    loss,
    preflight,
    run_checkpoint,
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
}
BY_NAME = {name.rsplit(".", 1)[-1]: proto for (_, name), proto in SLICES.items()}


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


@pytest.mark.parametrize("key", list(SLICES), ids=[name for _, name in SLICES])
def test_function_reads_only_its_protocol(key):
    module, qualname = key
    proto = SLICES[key]
    fn = function_node(module, qualname)
    arg = next(a for a in fn.args.args if a.arg == "cfg")
    assert ast.unparse(arg.annotation) == proto.__name__
    assert stray_uses(fn, set(members(proto))) == []


@pytest.mark.parametrize("proto", sorted(set(SLICES.values()), key=lambda p: p.__name__))
def test_train_config_satisfies_protocol(proto):
    own = typing.get_type_hints(TrainConfig)
    for name, want in members(proto).items():
        if inspect.isfunction(want):  # a method: TrainConfig's, with the same return annotation
            have = getattr(TrainConfig, name, None)
            assert inspect.isfunction(have), f"TrainConfig.{name} is not a method"
            assert have.__annotations__.get("return") == want.__annotations__.get("return")
            assert list(inspect.signature(have).parameters) == ["self"]
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
