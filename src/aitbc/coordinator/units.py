"""Parsing of the human quantities the API takes: dataset sizes and prices."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from aitbc.coordinator.errors import unprocessable

MICRO = 1_000_000  # micro-AIT per AIT: money is integers
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?I?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 10**9, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
          "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def parse_size(text: str) -> int:
    """``100GB`` -> 100_000_000_000 bytes. A bare number means GB (as the SDK's
    ``dataset_size=100``). Units: B, KB, MB, GB, TB, PB (powers of 1000) or KiB..PiB."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise unprocessable("bad_size", f"dataset size {text!r} is not a size; use a number and a unit, e.g. 100GB, 500MB, 1.5TB")
    n = int(Decimal(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise unprocessable("bad_size", f"dataset size {text!r} must be more than 0 bytes")
    return n


def parse_price(value: str | int | float, *, field: str = "price") -> int:
    """A price in AIT (``1.20``) -> integer micro-AIT (1_200_000), exactly: parsed as a
    decimal, never through binary floating point; more than 6 decimals is refused."""
    try:
        d = Decimal(str(value).strip())
    except InvalidOperation:
        raise unprocessable("bad_price", f"{field} {value!r} is not a number; give AIT with up to 6 decimals, e.g. 1.20") from None
    if not d.is_finite() or d < 0 or d > 10**6:
        raise unprocessable("bad_price", f"{field} {value!r} must be between 0 and 1000000 AIT")
    micro = d * MICRO
    if micro != micro.to_integral_value():
        raise unprocessable("bad_price", f"{field} {value!r} has more than 6 decimals (1 micro-AIT is the smallest unit)")
    return int(micro)


def format_price(micro: int) -> str:
    """1_200_000 -> "1.2" (no float on the way)."""
    whole, frac = divmod(int(micro), MICRO)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)
