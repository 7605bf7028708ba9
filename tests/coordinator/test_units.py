"""Sizes and prices as people type them (aitbc/units.py): exact, integer, and every
refusal a 422 with a stable code."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aitbc.units import MAX_SIZE, MICRO, UnitError, format_price, parse_price, parse_size


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("100GB", 100 * 10**9),
        ("100", 100 * 10**9),  # a bare number is GB, as the SDK's dataset_size=100
        (100, 100 * 10**9),
        ("1.5TB", 1_500_000_000_000),
        ("500MB", 500_000_000),
        ("500 mb", 500_000_000),
        ("  2tb ", 2 * 10**12),
        ("1B", 1),
        ("1KB", 1000),
        ("1K", 1000),
        ("1KiB", 1024),
        ("1.5 GiB", 3 * 2**29),
        ("1PiB", 2**50),
        ("1000PB", MAX_SIZE),
        ("0.001KB", 1),
    ],
)
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize(
    "text",
    [
        "lots",
        "",
        " ",
        "GB",
        "0GB",
        "0",
        "0.0001B",
        "-5GB",
        "+5GB",
        "1e3GB",
        ".5GB",
        "1.GB",
        "1,000GB",
        "1XB",
        "1IB",
        "1KI",
        "1 G B",
        "100GBB",
        "\u0661\u0660\u0660GB",  # Arabic-Indic digits
        "1001PB",
        "99999999999PB",  # over MAX_SIZE: would overflow the database's 64-bit integer
    ],
)
def test_parse_size_refuses(text):
    with pytest.raises(UnitError) as e:
        parse_size(text)
    assert e.value.code == "bad_size"
    assert repr(text) in e.value.detail


def test_parse_size_says_what_is_wanted():
    with pytest.raises(UnitError) as e:
        parse_size("lots")
    assert "100GB" in e.value.detail
    with pytest.raises(UnitError) as e:
        parse_size("0GB")
    assert "more than 0 bytes" in e.value.detail


@pytest.mark.parametrize(
    ("value", "micro"),
    [
        ("1.20", 1_200_000),
        (1.2, 1_200_000),
        ("0", 0),
        (0, 0),
        ("-0", 0),
        ("0.000001", 1),
        (" 2 ", 2_000_000),
        ("1e3", 1_000_000_000),
        ("1000000", 10**12),
        ("1.000000000000000000000000000000", 1_000_000),  # trailing zeros are not decimals
        (0.3, 300_000),
        (7, 7_000_000),
    ],
)
def test_parse_price(value, micro):
    assert parse_price(value) == micro
    assert type(parse_price(value)) is int


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1", "between 0 and 1000000"),
        (-0.5, "between 0 and 1000000"),
        ("1000000.000001", "between 0 and 1000000"),
        (1e300, "between 0 and 1000000"),
        ("1.0000001", "more than 6 decimals"),
        ("0.0000001", "more than 6 decimals"),
        ("1e-7", "more than 6 decimals"),
        (0.1 + 0.2, "more than 6 decimals"),  # 0.30000000000000004: binary float noise is refused
        ("1.0000000000000000000000000000001", "more than 6 decimals"),  # past Decimal's 28 digits
        ("abc", "not a number"),
        ("", "not a number"),
        ("nan", "not a number"),
        ("NaN", "not a number"),
        ("inf", "not a number"),
        ("-Infinity", "not a number"),
        (float("nan"), "not a number"),
        (float("inf"), "not a number"),
        ("1_000", "not a number"),
        ("1,20", "not a number"),
        ("\u0661", "not a number"),  # an Arabic-Indic one: Decimal would take it
        (True, "not a number"),
        ("0x10", "not a number"),
    ],
)
def test_parse_price_refuses(value, why):
    with pytest.raises(UnitError) as e:
        parse_price(value)
    assert e.value.code == "bad_price"
    assert why in e.value.detail and e.value.detail.startswith("price ")


def test_parse_price_names_its_field():
    with pytest.raises(UnitError) as e:
        parse_price("abc", field="max price")
    assert e.value.detail.startswith("max price 'abc'")


@pytest.mark.parametrize(
    ("micro", "text"),
    [
        (0, "0"),
        (1, "0.000001"),
        (10, "0.00001"),
        (1_000_000, "1"),
        (1_200_000, "1.2"),
        (1_234_567, "1.234567"),
        (10**12, "1000000"),
        (-1, "-0.000001"),
        (-1_500_000, "-1.5"),
        (-2_000_000, "-2"),
    ],
)
def test_format_price(micro, text):
    assert format_price(micro) == text


@given(st.integers(min_value=0, max_value=10**6 * MICRO))
def test_price_round_trip_from_micro(micro):
    text = format_price(micro)
    assert parse_price(text) == micro
    assert "e" not in text.lower() and not (("." in text) and text.endswith("0"))


@given(st.decimals(min_value=0, max_value=10**6, places=6, allow_nan=False, allow_infinity=False))
def test_price_round_trip_from_text(d):
    micro = parse_price(str(d))
    assert Decimal(micro) / MICRO == d
    assert Decimal(format_price(micro)) == d


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_format_price_is_exact(micro):
    assert Decimal(format_price(micro)) * MICRO == micro
