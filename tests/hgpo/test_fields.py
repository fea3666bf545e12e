"""The declarative field mechanism (hgpo.fields): setting, check_fields, add_flags."""

import argparse
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest

from hgpo.fields import (
    FIELD_DEFAULT,
    add_flags,
    check_fields,
    field_bounds,
    in_section,
    sections,
    setting,
)
from hgpo.options import ArgumentParser, OptionError

_run = in_section("run")


@dataclass(frozen=True)
class _Toy:
    """A toy config for the declarative mechanism."""

    steps: int = _run(100, lo=1, hi=10_000)
    """Steps of the run."""
    lr: float = setting(1e-3, lo=0, lo_open=True, section="optimizer")
    """Learning rate."""
    device: str = _run("cpu", choices=("cpu", "cuda"))
    """Where to run."""
    share: float = setting(0.5, lo=0, hi=1, hi_open=True, section="optimizer", help="A share.")
    verbose: bool = setting(False)
    """Say more (no section: the parser's own options)."""
    name: str = setting("toy", section="run")
    """Any string."""

    def __post_init__(self) -> None:
        check_fields(self, "Toy")


def _parser() -> argparse.ArgumentParser:
    # (not spelled as a call of the class: tests/test_cli_errors.py takes such a file for a CLI)
    make = ArgumentParser
    return make(prog="toy")


def test_setting_metadata_gives_sections_and_bounds_in_declaration_order():
    assert dict(sections(_Toy)) == {
        "run": ("steps", "device", "name"),
        "optimizer": ("lr", "share"),
    }
    bounds = {k: dict(v) for k, v in field_bounds(_Toy).items()}
    assert bounds == {
        "steps": {"lo": 1, "hi": 10_000},
        "lr": {"lo": 0, "lo_open": True},
        "share": {"lo": 0, "hi": 1, "hi_open": True},
    }
    with pytest.raises(TypeError):
        sections(_Toy)["run"] = ()  # a read-only view


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"steps": 0}, "Toy.steps: must be an integer in 1..10000, got 0"),
        ({"steps": 2.0}, "Toy.steps: must be an integer in 1..10000, got 2.0"),
        ({"lr": 0}, "Toy.lr: must be a finite number > 0, got 0"),
        ({"lr": math.inf}, "Toy.lr: must be a finite number > 0, got inf"),
        ({"share": 1.0}, "Toy.share: must be a finite number in [0, 1), got 1.0"),
        ({"device": "tpu"}, "Toy.device: must be one of 'cpu', 'cuda', got 'tpu'"),
        ({"verbose": 1}, "Toy.verbose: must be true or false, got 1"),
        ({"name": 3}, "Toy.name: must be a string, got 3"),
    ],
)
def test_check_fields_messages_are_the_helpers_own(kw, message):
    with pytest.raises(OptionError) as e:
        _Toy(**kw)
    assert str(e.value) == message


def test_check_fields_converts_and_stores():
    toy = _Toy(steps=np.int64(5), lr=1, share=np.float32(0.25), device=np.str_("cuda"))
    assert (toy.steps, toy.lr, toy.share, toy.device) == (5, 1.0, 0.25, "cuda")
    assert type(toy.steps) is int and type(toy.lr) is float and type(toy.device) is str


def test_check_fields_refuses_a_type_it_cannot_check():
    @dataclass
    class Odd:
        items: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"Odd\.items"):
        check_fields(Odd(), "Odd")


def test_add_flags_one_group_per_section_in_declaration_order():
    parser = _parser()
    add_flags(parser, _Toy, help_format="{doc} (default {default!r})")
    titles = [g.title for g in parser._action_groups]
    assert titles[-2:] == ["run", "optimizer"]  # after argparse's own two groups
    by_group = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert by_group["run"] == ["steps", "device", "name"]
    assert by_group["optimizer"] == ["lr", "share"]
    grouped = {a.dest for g in parser._action_groups[2:] for a in g._group_actions}
    assert "verbose" not in grouped and "verbose" in {a.dest for a in parser._actions}
    help_text = parser.format_help()
    assert help_text.count("run:") == 1 and help_text.count("optimizer:") == 1
    assert "--steps INT" in help_text and "--lr FLOAT" in help_text
    assert "Steps of the run. (default 100)" in help_text
    assert "A share. (default 0.5)" in help_text  # setting(help=...) wins over a docstring


def test_add_flags_parses_types_and_leaves_flags_not_given_unset():
    parser = _parser()
    add_flags(parser, _Toy)
    ns = parser.parse_args(["--steps", "7", "--lr", "0.5", "--verbose", "--device", "cuda"])
    assert vars(ns) == {"steps": 7, "lr": 0.5, "verbose": True, "device": "cuda"}
    assert vars(parser.parse_args(["--verbose", "off"])) == {"verbose": False}
    assert _Toy(**vars(ns)).steps == 7
    parser = _parser()
    add_flags(parser, _Toy, default=None)
    assert vars(parser.parse_args([]))["steps"] is None


def test_add_flags_bad_bool_is_argparse_error(capsys):
    parser = _parser()
    add_flags(parser, _Toy)
    with pytest.raises(SystemExit):
        parser.parse_args(["--verbose", "maybe"])
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_add_flags_skip_field_defaults_and_argparse_metavar():
    parser = _parser()
    groups = add_flags(parser, _Toy, default=FIELD_DEFAULT, skip=("name",), type_metavar=False)
    assert list(groups) == ["run", "optimizer"]
    groups["run"].add_argument("--names", dest="name", nargs="+")  # a hand-written flag
    ns = vars(parser.parse_args([]))
    assert ns == {"steps": 100, "lr": 1e-3, "device": "cpu", "share": 0.5, "verbose": False,
                  "name": None}  # fmt: skip
    help_text = parser.format_help()
    assert "--steps STEPS" in help_text and "--steps INT" not in help_text
    assert "--name " not in help_text and "--names NAME" in help_text
