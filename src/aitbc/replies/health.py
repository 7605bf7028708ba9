"""Whether a coordinator is up, its version and clock."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aitbc.replies.base import Reply


class Health(Reply):
    status: Literal["ok"]
    version: str
    time: float = Field(description="the coordinator's clock (clients sign with timestamps)")
    replica: str = Field(description="this coordinator process's id among those sharing its database")
    driving: bool = Field(description="whether this process holds the driver lease (moves the rounds)")
    coordinator_id: str = Field(
        description="which coordinator this is: its database's id, the same for every replica and across restarts "
        "(a client that remembered a run's coordinator finds it again by this id when its URL changes)"
    )
