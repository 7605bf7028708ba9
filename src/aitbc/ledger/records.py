"""Gossip model records: a worker's signed statement "my model after round r is blob CID".

A record is a JSON object (:func:`make_record`); the worker signs its canonical JSON
(:func:`~aitbc.ledger.signing.canonical_json`) with its wallet key. The same signed record
goes to the coordinator (``POST /v1/jobs/{job}/records``) and to the worker's neighbours
(served by its peer server), so a neighbour can check who vouched for the CID it fetches,
and a worker that serves bytes not matching a CID it signed has no excuse.
"""

from __future__ import annotations

from typing import Any

from aitbc.ledger.signing import canonical_json
from aitbc.ledger.wallet import Wallet, address_of, verify_signature

RECORD_FORMAT = "aitbc.gossip/1"
FIELDS = ("format", "training_id", "job_id", "worker", "round", "cid", "samples", "train_loss")


def make_record(
    wallet: Wallet,
    *,
    training_id: str,
    job_id: str,
    round: int,
    cid: str,
    samples: int,
    train_loss: float | None,
) -> dict[str, Any]:
    """``{"record": {...}, "signature": hex}``, signed by ``wallet``."""
    record = {
        "format": RECORD_FORMAT,
        "training_id": training_id,
        "job_id": job_id,
        "worker": wallet.address,
        "round": round,
        "cid": cid,
        "samples": samples,
        "train_loss": train_loss,
    }
    return {"record": record, "signature": wallet.sign(canonical_json(record))}


def record_problem(signed: Any, public_key: str) -> str | None:
    """Why ``signed`` is not a well-formed record signed by ``public_key`` (None: it is)."""
    if not isinstance(signed, dict) or set(signed) != {"record", "signature"}:
        return "a signed record is {record, signature}"
    record = signed["record"]
    if not isinstance(record, dict) or set(record) != set(FIELDS):
        return f"a record has exactly the fields {', '.join(FIELDS)}"
    if record["format"] != RECORD_FORMAT:
        return f"record format {record['format']!r}; this build reads {RECORD_FORMAT}"
    try:
        signer = address_of(public_key)
    except Exception:  # noqa: BLE001 - a malformed key is a refusal, not a crash
        return "the signer's public key is malformed"
    if record["worker"] != signer:
        return f"the record names worker {record['worker']!r}, not its signer {signer}"
    try:
        message = canonical_json(record)
    except (TypeError, ValueError) as e:
        return f"the record is not canonical JSON: {e}"
    if not verify_signature(public_key, message, signed["signature"]):
        return "the record's signature does not verify against the worker's key"
    return None
