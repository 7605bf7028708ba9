"""parse_kv and build_config: option strings -> typed component configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from aitbc.core.options import build_config, parse_kv
from aitbc.errors import UsageError


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    steps: int = 1
    lr: float = 0.1
    flag: bool = False
    name: str = "x"
    hidden: tuple[int, ...] = (4,)
    limit: int | None = 7
    cap: Optional[float] = None  # noqa: UP045 -- the typing.Optional spelling on purpose

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")


def build(**options):
    return build_config(DemoConfig, options, what="demo")


# --- parse_kv ------------------------------------------------------------------------------


def test_parse_kv_separate_items():
    assert parse_kv(["a=1", "b=x"], what="demo") == {"a": "1", "b": "x"}


def test_parse_kv_comma_separated_items_and_whitespace():
    assert parse_kv([" a = 1 , b=x,", "c=2"], what="demo") == {"a": "1", "b": "x", "c": "2"}


def test_parse_kv_dashes_in_keys_become_underscores():
    assert parse_kv(["weight-decay=0.1"], what="demo") == {"weight_decay": "0.1"}


def test_parse_kv_value_may_hold_equals_sign_and_be_empty():
    assert parse_kv(["a=b=c", "d="], what="demo") == {"a": "b=c", "d": ""}


def test_parse_kv_later_item_wins():
    assert parse_kv(["a=1", "a=2"], what="demo") == {"a": "2"}


def test_parse_kv_empty_input():
    assert parse_kv([], what="demo") == {}
    assert parse_kv(["", " , "], what="demo") == {}


@pytest.mark.parametrize("item", ["lr", "=3", " =3", "a=1,oops"])
def test_parse_kv_rejects_items_without_key_or_equals(item):
    with pytest.raises(UsageError) as exc:
        parse_kv([item], what="model")

    assert "bad model option" in str(exc.value)
    assert "KEY=VALUE" in str(exc.value)


# --- build_config: conversions ----------------------------------------------------------------


def test_defaults_when_no_options():
    assert build_config(DemoConfig, None, what="demo") == DemoConfig()
    assert build_config(DemoConfig, {}, what="demo") == DemoConfig()


def test_strings_convert_to_field_types():
    cfg = build(steps="3", lr="1e-3", name="adamw")

    assert cfg.steps == 3 and type(cfg.steps) is int
    assert cfg.lr == 1e-3 and type(cfg.lr) is float
    assert cfg.name == "adamw"


def test_plain_values_pass_through_and_int_widens_to_float():
    cfg = build(steps=5, lr=2, flag=True)

    assert cfg.steps == 5
    assert cfg.lr == 2.0 and type(cfg.lr) is float
    assert cfg.flag is True


@pytest.mark.parametrize("text", ["128x64", "128 64", "128:64", " 128  x 64 "])
def test_tuple_from_string(text):
    assert build(hidden=text).hidden == (128, 64)


def test_tuple_from_list_and_single_value_string():
    assert build(hidden=[128, "64"]).hidden == (128, 64)
    assert build(hidden="32").hidden == (32,)


def test_tuple_with_bad_item():
    with pytest.raises(UsageError, match="hidden='a'"):
        build(hidden="128xa")


def test_tuple_field_given_a_single_number():
    # e.g. {"hidden": 128} from JSON (this used to escape as TypeError)
    assert build(hidden=128).hidden == (128,)


def test_tuple_field_given_a_wrong_plain_value():
    with pytest.raises(UsageError, match="hidden=1.5 must be int"):
        build(hidden=1.5)


@pytest.mark.parametrize("text", ["1", "true", "True", "YES", "on"])
def test_bool_true_spellings(text):
    assert build(flag=text).flag is True


@pytest.mark.parametrize("text", ["0", "false", "FALSE", "no", "off"])
def test_bool_false_spellings(text):
    assert build(flag=text).flag is False


def test_bool_rejects_other_words():
    with pytest.raises(UsageError) as exc:
        build(flag="maybe")

    assert "demo option flag='maybe' must be bool" in str(exc.value)


@pytest.mark.parametrize("text", ["none", "None", "null", ""])
def test_optional_none_spellings(text):
    cfg = build(limit=text, cap=text)

    assert cfg.limit is None and cfg.cap is None


def test_optional_value_converts_to_inner_type():
    cfg = build(limit="5", cap="0.5")

    assert cfg.limit == 5 and cfg.cap == 0.5


def test_optional_accepts_real_none():
    assert build(limit=None).limit is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("steps", "1.5", "demo option steps='1.5' must be int"),
        ("steps", "ten", "demo option steps='ten' must be int"),
        ("lr", "fast", "demo option lr='fast' must be float"),
        ("steps", 1.5, "demo option steps=1.5 must be int"),
        ("name", 3, "demo option name=3 must be str"),
        ("limit", "many", "demo option limit='many' must be int"),
    ],
)
def test_bad_values_name_option_value_and_type(key, value, message):
    with pytest.raises(UsageError) as exc:
        build(**{key: value})

    assert str(exc.value) == message


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(UsageError) as exc:
        build(stepz="3")

    assert str(exc.value) == ("unknown demo option 'stepz'; allowed: steps, lr, flag, name, hidden, limit, cap")


def test_post_init_value_error_becomes_usage_error():
    with pytest.raises(UsageError) as exc:
        build(steps="-1")

    assert str(exc.value) == "demo: steps must be >= 0, got -1"
    assert exc.value.exit_code == 2


def test_bool_is_not_an_int():
    with pytest.raises(UsageError, match="steps=True must be int"):
        build(steps=True)


@dataclass(kw_only=True, slots=True)
class RadiusConfig:
    tau: float | Literal["auto"] = "auto"


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("2.5", 2.5), (3, 3.0), ("1e-3", 1e-3)])
def test_a_union_takes_the_first_type_that_accepts_the_value(value, expected):
    assert build_config(RadiusConfig, {"tau": value}, what="demo").tau == expected


@pytest.mark.parametrize("value", ["big", "", "Auto"])
def test_a_union_names_every_allowed_kind_when_none_accepts_the_value(value):
    with pytest.raises(UsageError, match=rf"^demo option tau={value!r} must be float or auto$"):
        build_config(RadiusConfig, {"tau": value}, what="demo")
