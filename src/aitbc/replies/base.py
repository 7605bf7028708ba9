"""What every reply shares: the strict base model, the error body, lists and plain acks."""

from __future__ import annotations

import functools
from collections.abc import KeysView
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from aitbc.units import AIT

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

# The validation context of a reply read by a client (:func:`parse`).
_FROM_COORDINATOR = {"from_coordinator": True}

JsonObject = dict[str, Any]
"""A JSON object whose keys the reply does not fix, passed through as its author wrote it: a
model's options, a run's training config and data spec, an owner's saved metrics, a worker's
device description, a ledger entry's memo and authorization, a gossip record as its worker
signed it. Its readers look keys up; nothing here checks them."""


def _money(value: object) -> AIT:
    """An amount of AIT as a reply carries it: a decimal string on the wire ("32.8"); an
    int, a Decimal, or a float a coordinator of an earlier release sent a price as (read by
    its shortest repr, so 1.2 is 1.2, not 1.1999999999999999555910790149937)."""
    if isinstance(value, bool) or not isinstance(value, (Decimal, int, str, float)):
        raise ValueError(f'an amount of AIT must be a decimal string such as "32.8", got {value!r}')
    try:
        d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))
    except InvalidOperation:
        raise ValueError(f'an amount of AIT must be a decimal string such as "32.8", got {value!r}') from None
    if not d.is_finite():
        raise ValueError(f"an amount of AIT must be finite, got {value!r}")
    return AIT(money_text(d))  # one spelling per amount: "32.800000" reads as 32.8, "1E+2" as 100


def money_text(d: Decimal) -> str:
    """An amount as the wire and ``--json`` write it: plain decimal AIT, no exponent and no
    trailing zeros (``Decimal("32.800000")`` -> ``"32.8"``, ``Decimal("1E+2")`` -> ``"100"``)."""
    return format(d.normalize(), "f") if d else "0"


Money = Annotated[
    AIT,
    PlainValidator(_money),
    PlainSerializer(money_text, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^-?\d+(\.\d{1,6})?$", "examples": ["32.8"]}),
]
"""Every amount of AIT a reply carries: an :class:`~aitbc.units.AIT`, a
:class:`~decimal.Decimal`, in Python (exact: ``paid + due`` is to the micro-AIT), a decimal
string of AIT in JSON (``"32.8"``), on the wire and in the CLI's ``--json``. The one type of money; the ``*_micro`` integers beside some amounts are
the same amount in micro-AIT, kept for clients of earlier releases and for the ledger's
audit, which adds its entries up in integers."""

MicroAIT = Annotated[int, WithJsonSchema({"type": "integer", "description": "micro-AIT (1 AIT = 1000000)"})]
"""An amount in integer micro-AIT: a ledger entry's ``amount`` and the ``*_micro`` companions of
:data:`Money` amounts (the same amount, exact, for integer arithmetic)."""


class Reply(BaseModel):
    """A reply that forbids extra keys: a view that builds a field its model lacks fails
    loudly (a validation error) instead of the key being dropped without anyone noticing.

    A reply also reads as the JSON object it is sent as, by the names on the wire
    (``run["training_id"]``, ``run.get("error")``, ``run.keys()``, ``sent["from"]``), for
    code written against the API's JSON (the SDK's documented examples, the CLI's views);
    typed code reads the attributes, which a type checker knows."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _ignore_newer_keys(cls, data: Any, info: ValidationInfo) -> Any:
        """A client (:func:`parse`) drops the keys this model does not know: a coordinator newer
        than the worker or SDK reading it may answer with more fields, and they must keep
        working; the coordinator's own views still build exactly the declared keys."""
        if info.context is _FROM_COORDINATOR and isinstance(data, dict):
            known = wire_names(cls)
            return {k: v for k, v in data.items() if k in known or k in cls.model_fields}
        return data

    def __getitem__(self, key: str) -> Any:
        name = wire_names(type(self)).get(key)
        if name is None:
            raise KeyError(key)
        return getattr(self, name)

    def get(self, key: str, default: Any = None) -> Any:
        name = wire_names(type(self)).get(key)
        return default if name is None else getattr(self, name)

    def keys(self) -> KeysView[str]:
        return wire_names(type(self)).keys()

    def __contains__(self, key: object) -> bool:
        return key in wire_names(type(self))


@functools.cache
def wire_names(model: type[Reply]) -> dict[str, str]:
    """A reply model's field names by their names on the wire (its alias, where it has one)."""
    return {(f.alias or name): name for name, f in model.model_fields.items()}


class ErrorBody(Reply):
    """Every 4xx (and the rare 500): a stable machine-readable code and one line for people."""

    error: str = Field(description="stable code, e.g. unknown_run, bad_signature, invalid_request")
    detail: str = Field(description="one line: what was wrong and what is allowed")


class Page(Reply, Generic[T]):
    """A list: the items and how many there are."""

    data: list[T]
    count: int


class Ok(Reply):
    ok: bool


def parse(model: type[R], data: object) -> R:
    """``data``, a reply as a client received it, read as ``model``: every field checked as the
    model says, and keys a newer coordinator added (at any depth) left out, not refused."""
    return model.model_validate(data, context=_FROM_COORDINATOR)
