"""Gossip runs: the roster and mixing rules a worker is given, the model records workers
publish and witness, and the record's progress in a run's detail."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aitbc.replies.base import JsonObject, Reply


class GossipView(Reply):
    topology: str | None
    recorded_round: int = Field(description="the last round whose record closed (consensus evaluated)")
    spread: float | None = Field(description="that round's mean L2 distance of the kept models to their mean")
    newest_round: int = Field(description="the newest round any worker has published")
    records: int = Field(description="model records published so far")
    outliers: int = Field(description="published models flagged as outliers or corrupt")


class RosterEntry(Reply):
    worker: str
    job_id: str
    public_key: str = Field(description="checks the worker's signed model records")
    url: str | None = Field(
        description="its peer server; None: it cannot be reached, its models go through the coordinator"
    )
    samples: int


class GossipOrder(Reply):
    topology: str | None
    seed: int = Field(description="the run's seed: random:K neighbours are drawn from it (seed + 3), as the simulator")
    aggregator: str = Field(description="the rule each worker mixes with")
    f: int = Field(description="attackers the rule tolerates when its spec names none")
    next_round: int = Field(description="the round this worker trains next (one past its last published record)")
    roster: list[RosterEntry] = Field(description="the run's workers in topology order")
    norm_clip: float
    norm_reject: float
    max_staleness: int = Field(description="a neighbour's model at most this many rounds old is still mixed")
    staleness: str = Field(description="the rule weighting a neighbour's model of an older round (its samples x it)")
    wait: float | None = Field(description="seconds to wait for a neighbour's model of the round (None: the default)")


class SignedRecord(Reply):
    record: JsonObject
    signature: str


Verdict = Literal["consistent", "kept", "unmatched", "equivocation"]


class Witnessed(Reply):
    worker: str = Field(description="who signed the record")
    job_id: str
    round: int
    cid: str
    verdict: Verdict = Field(
        description="consistent: the coordinator holds this record's CID for its job and round; kept: it holds "
        "none yet, and a different one published later is caught; unmatched: the round closed without the "
        "job's record, so there is nothing to compare (not stored); equivocation: it holds another CID the "
        "same worker signed for that round (flagged)"
    )


class RecordAccepted(Reply):
    status: Literal["recorded"]
    round: int
    cid: str
    duplicate: bool
