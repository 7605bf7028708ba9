"""Money and sizes as people type them, and money as people read it.

Money is integers of micro-AIT everywhere below this module: ``parse_price("1.20")`` is
1_200_000, exactly (decimal arithmetic, never binary floating point), and
``format_price`` turns micro-AIT back into text without a float on the way. The CLI, the
SDK and the coordinator all use these functions, so a rule lives here once. A refusal is
a :class:`UnitError` (a usage error with a stable ``code``); the coordinator answers it
with a 422, the CLI with one ``error:`` line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, overload

from aitbc.errors import UsageError


class UnitError(UsageError):
    """A size or an amount that is not one: ``code`` names the kind (``bad_size``,
    ``bad_price``, ``bad_amount``), the message what was wrong and what is allowed."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


MICRO = 1_000_000  # micro-AIT per AIT: money is integers
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?I?B?)\s*$", re.IGNORECASE | re.ASCII)
MAX_SIZE = 10**18  # 1000 PB; also keeps the byte count inside a 64-bit database integer
# A plain decimal number (ASCII digits, optional fraction and exponent): not Decimal's
# wider syntax ("1_000", non-ASCII digits, "NaN", "Infinity").
_PRICE_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$", re.ASCII)
_UNITS = {
    "": 10**9,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}


def parse_size(text: str) -> int:
    """``100GB`` -> 100_000_000_000 bytes. A bare number means GB (as the SDK's
    ``dataset_size=100``). Units: B, KB, MB, GB, TB, PB (powers of 1000) or KiB..PiB."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise UnitError(
            "bad_size", f"dataset size {text!r} is not a size; use a number and a unit, e.g. 100GB, 500MB, 1.5TB"
        )
    n = int(Decimal(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise UnitError("bad_size", f"dataset size {text!r} must be more than 0 bytes")
    if n > MAX_SIZE:
        raise UnitError("bad_size", f"dataset size {text!r} is over the largest this coordinator records (1000PB)")
    return n


def parse_price(value: str | int | float, *, field: str = "price") -> int:
    """A price in AIT (``1.20``) -> integer micro-AIT (1_200_000), exactly: parsed as a
    decimal, never through binary floating point; more than 6 decimals is refused."""
    text = str(value).strip()
    try:
        if isinstance(value, bool) or not _PRICE_RE.match(text):
            raise InvalidOperation
        d = Decimal(text)
    except InvalidOperation:
        raise UnitError(
            "bad_price", f"{field} {value!r} is not a number; give AIT with up to 6 decimals, e.g. 1.20"
        ) from None
    if d < 0 or d > 10**6:
        raise UnitError("bad_price", f"{field} {value!r} must be between 0 and 1000000 AIT")
    # Decimal places actually used, from the exact digits: ``d * MICRO`` would be rounded
    # to the context's 28 digits and let "1.0000000000000000000000000001" through.
    _, digits, exp = d.as_tuple()
    assert isinstance(exp, int), exp  # _PRICE_RE admits only finite numbers (no 'n', 'N', 'F')
    trailing_zeros = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    if -(exp + trailing_zeros) > 6 and any(digits):
        raise UnitError("bad_price", f"{field} {value!r} has more than 6 decimals (1 micro-AIT is the smallest unit)")
    return int(d * MICRO)  # exact: at most 13 significant digits remain


def parse_amount(value: str | int | float, *, field: str = "amount") -> int:
    """A price that must be more than 0 (a transfer, a faucet request, a payment)."""
    text = str(value).strip()
    # before parse_price, whose range (from 0) is a price's, not an amount's
    if not isinstance(value, bool) and _PRICE_RE.match(text) and not 0 < Decimal(text) <= 10**6:
        above = Decimal(text) > 0
        raise UnitError(
            "bad_amount", f"{field} must be more than 0{' and at most 1000000' if above else ''} AIT; got {text}"
        )
    amount = parse_price(value, field=field)
    if amount <= 0:
        raise UnitError("bad_amount", f"{field} must be more than 0 AIT; got {value!r}")
    return amount


def format_price(micro: int) -> str:
    """1_200_000 -> "1.2", -1 -> "-0.000001" (no float on the way)."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(int(micro)), MICRO)
    return sign + (f"{whole}.{frac:06d}".rstrip("0") if frac else str(whole))


class AIT(Decimal):
    """An amount of AIT as the SDK and the replies carry it: a :class:`~decimal.Decimal`, exact
    with ints and Decimals (``paid + due`` to the micro-AIT), that mixes with a float as an int
    does, giving a float, where a plain Decimal raises TypeError: code written against prices
    as numbers (the users' documentation scores an offer ``1 / (price + 1) * 0.3``) keeps
    working. Comparisons stay Decimal's (exact)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the loop below installs, as a type checker should see it

        @overload  # type: ignore[override]  # wider than Decimal's: a float gives a float
        def __add__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __add__(self, value: float, /) -> float: ...
        def __add__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload
        def __radd__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __radd__(self, value: float, /) -> float: ...
        def __radd__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload  # type: ignore[override]  # wider than Decimal's: a float gives a float
        def __sub__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __sub__(self, value: float, /) -> float: ...
        def __sub__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload
        def __rsub__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __rsub__(self, value: float, /) -> float: ...
        def __rsub__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload  # type: ignore[override]  # wider than Decimal's: a float gives a float
        def __mul__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __mul__(self, value: float, /) -> float: ...
        def __mul__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload
        def __rmul__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __rmul__(self, value: float, /) -> float: ...
        def __rmul__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload  # type: ignore[override]  # wider than Decimal's: a float gives a float
        def __truediv__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __truediv__(self, value: float, /) -> float: ...
        def __truediv__(self, value: Decimal | float, /) -> AIT | float: ...
        @overload
        def __rtruediv__(self, value: Decimal | int, /) -> AIT: ...
        @overload
        def __rtruediv__(self, value: float, /) -> float: ...
        def __rtruediv__(self, value: Decimal | float, /) -> AIT | float: ...
        def __neg__(self) -> AIT: ...
        def __pos__(self) -> AIT: ...
        def __abs__(self) -> AIT: ...


def _mixing(name: str) -> Callable[..., Any]:
    exact = getattr(Decimal, name)

    def op(self: AIT, *other: object) -> object:
        if other and isinstance(other[0], float):
            return getattr(float(self), name)(*other)
        out = exact(self, *other)
        return AIT(out) if isinstance(out, Decimal) else out

    op.__name__ = name
    return op


for _name in (
    *(f"__{n}__" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
    *(f"__r{n}__" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
    "__neg__",
    "__pos__",
    "__abs__",
):
    setattr(AIT, _name, _mixing(_name))


def ait(micro: int) -> AIT:
    """1_200_000 -> AIT("1.2"): micro-AIT as the exact amount of AIT a reply carries."""
    return AIT(format_price(micro))
