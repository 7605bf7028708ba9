"""The worker's peer server answers gossip record reads (``GET /v1/records/{job}``) with the
signed record it keeps, and refuses anything else with a JSON error; the reader side
(:func:`aitbc.ledger.records.record_problem`) refuses a record that is not the signer's."""

from __future__ import annotations

import httpx

from aitbc.ledger.records import make_record, record_problem
from aitbc.ledger.wallet import Wallet
from aitbc.worker.peers import BlobServer

CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


def test_records_are_served_and_bad_paths_refused():
    w = Wallet.generate("w")
    kept = {
        r: make_record(w, training_id="training_a", job_id="job_a", round=r, cid=CID, samples=3, train_loss=None)
        for r in (1, 2)
    }

    def records(job_id: str, r: int | None):
        if job_id != "job_a":
            return None
        return kept.get(r) if r in kept else kept[max(kept)]

    server = BlobServer("127.0.0.1", 0, lambda cid: None, records=records)
    try:
        base = f"http://127.0.0.1:{server.port}/v1/records/"
        assert httpx.get(base + "job_a", params={"round": 1}).json() == kept[1]
        assert httpx.get(base + "job_a", params={"round": 9}).json() == kept[2]  # not kept: the newest
        assert httpx.get(base + "job_a").json() == kept[2]
        for path, status in [
            ("job_b", 404),
            ("job_a?round=x", 400),
            ("..%2f..%2fetc", 400),
            ("", 400),
            ("a" * 65, 400),
        ]:
            r = httpx.get(base + path)
            assert r.status_code == status and r.json()["error"], (path, r.status_code)
    finally:
        server.close()


def test_a_record_is_checked_against_the_signer():
    w, other = Wallet.generate("w"), Wallet.generate("other")
    signed = make_record(w, training_id="t", job_id="j", round=1, cid=CID, samples=3, train_loss=0.5)
    assert record_problem(signed, w.public_key) is None
    assert "not its signer" in (record_problem(signed, other.public_key) or "")
    tampered = {**signed, "record": {**signed["record"], "cid": "bafkreiother"}}
    assert "does not verify" in (record_problem(tampered, w.public_key) or "")
    assert "exactly the fields" in (
        record_problem({**signed, "record": {**signed["record"], "x": 1}}, w.public_key) or ""
    )
    assert record_problem({"record": signed["record"]}, w.public_key) == "a signed record is {record, signature}"
