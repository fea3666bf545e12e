"""The shared name=value parser and validators (hgpo.options)."""

import math

import numpy as np
import pytest

from hgpo.options import (
    OptionError,
    check_bool,
    check_choice,
    check_int,
    check_number,
    parse_name_values,
    parse_value,
)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("1", 1), ("-2", -2), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True), ("False", False),
     ("mean", "mean"), (" x ", "x")],
)  # fmt: skip
def test_parse_value(raw, want):
    got = parse_value(raw)
    assert got == want and type(got) is type(want)


def test_parse_value_nonfinite_is_a_float_for_the_config_to_refuse():
    assert math.isnan(parse_value("nan")) and parse_value("inf") == math.inf


def test_parse_name_values():
    assert parse_name_values("a=1, b=mean,,c=0.5") == {"a": 1, "b": "mean", "c": 0.5}
    assert parse_name_values("") == {}


@pytest.mark.parametrize("text", ["a", "=1", "a=1,a=2"])
def test_parse_name_values_errors_name_where(text):
    with pytest.raises(OptionError, match=r"^--settings: "):
        parse_name_values(text, where="--settings")


def test_check_int_accepts_numpy_and_refuses_bool_and_float():
    assert check_int("K", np.int64(2), lo=0) == 2 and type(check_int("K", np.int64(2))) is int
    for bad in (True, 2.0, "2", None):
        with pytest.raises(OptionError, match=r"^K: must be an integer"):
            check_int("K", bad)
    with pytest.raises(OptionError, match=r"K: must be an integer in 0\.\.8, got 9"):
        check_int("K", 9, lo=0, hi=8)


def test_check_number():
    assert check_number("alpha", np.float32(1.0), lo=0) == 1.0
    for bad in (math.nan, math.inf, -math.inf, True, "1", None):
        with pytest.raises(OptionError, match=r"^alpha: must be a finite number"):
            check_number("alpha", bad)
    with pytest.raises(OptionError, match=r"must be a finite number in \(0, 1\), got 1"):
        check_number("clip", 1, lo=0, hi=1, lo_open=True, hi_open=True)
    assert check_number("cap", math.inf, lo=0, finite=False) == math.inf
    with pytest.raises(OptionError):
        check_number("cap", math.nan, finite=False)


def test_check_choice_and_bool():
    assert check_choice("norm", "mean", ("mean", "mean_std")) == "mean"
    with pytest.raises(OptionError, match=r"norm: must be one of 'mean', 'mean_std', got 'x'"):
        check_choice("norm", "x", ("mean", "mean_std"))
    assert check_bool("flag", np.bool_(True)) is True
    with pytest.raises(OptionError):
        check_bool("flag", 1)
