"""Every status a record of aitbc carries, as a ``StrEnum``, each defined once: the
coordinator stores them and its replies (:mod:`aitbc.replies`) carry them, so the worker, the
SDK and the CLI read the same names.

The enums are ``str`` subclasses: they are stored as their plain values and compare equal
to them, so the database and the API carry the plain strings.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    INITIALIZING = "initializing"
    DISTRIBUTING = "distributing"
    TRAINING = "training"
    AGGREGATING = "aggregating"
    COMPLETE = "complete"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by its owner (``stop``): not a failure
    PAUSED = "paused"


class Control(StrEnum):
    """Who moves a run's phases: the round driver, or the owner's agent."""

    AUTOMATIC = "automatic"
    MANUAL = "manual"


class OfferStatus(StrEnum):
    ONLINE = "online"
    FAILED = "failed"  # its lease ran out or its owner marked it; back online at a newer heartbeat


class ContractStatus(StrEnum):
    HIRED = "hired"  # agreed (bond posted), no job yet: a spare
    WORKING = "working"  # has a job
    RELEASED = "released"
    FAILED = "failed"
    SLASHED = "slashed"


class JobStatus(StrEnum):
    ACTIVE = "active"
    FAILED = "failed"
    RELEASED = "released"


class UpdateStatus(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"  # malformed, wrong shape, NaN/Inf: provable from the blob itself
    EXCLUDED = "excluded"  # accepted, but left out of a manual aggregation by the owner


class ScoreStatus(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    MISSING = "missing"
