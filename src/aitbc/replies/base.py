"""What every reply shares: the strict base model, the error body, lists and plain acks."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

JsonObject = dict[str, Any]
"""A JSON object whose keys the reply does not fix, passed through as its author wrote it: a
model's options, a run's training config and data spec, an owner's saved metrics, a worker's
device description, a ledger entry's memo and authorization, a gossip record as its worker
signed it. Its readers look keys up; nothing here checks them."""


class Reply(BaseModel):
    """A reply that forbids extra keys: a view that builds a field its model lacks fails
    loudly (a validation error) instead of the key being dropped without anyone noticing."""

    model_config = ConfigDict(extra="forbid")


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
