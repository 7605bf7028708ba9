"""What every reply shares: the strict base model, the error body, lists and plain acks."""

from __future__ import annotations

import functools
from collections.abc import KeysView
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

# The validation context of a reply read by a client (:func:`parse`).
_FROM_COORDINATOR = {"from_coordinator": True}

JsonObject = dict[str, Any]
"""A JSON object whose keys the reply does not fix, passed through as its author wrote it: a
model's options, a run's training config and data spec, an owner's saved metrics, a worker's
device description, a ledger entry's memo and authorization, a gossip record as its worker
signed it. Its readers look keys up; nothing here checks them."""


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
