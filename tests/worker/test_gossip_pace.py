"""A gossip worker's pace (``X-Aitbc-Pace`` beside its records): its peer server sends it,
a reader parses it strictly, and a worker does not wait for a neighbour whose own pace says
it cannot publish the round within the wait -- while it still waits for one about to.

The neighbour is a real peer server (:class:`aitbc.worker.peers.BlobServer`) serving real
signed records and a real encoded model; the coordinator fallback is a real client of a
port nobody listens on (unreachable, as a coordinator that is down)."""

from __future__ import annotations

import math
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from aitbc.client import CoordinatorClient
from aitbc.core.compression import build_codec
from aitbc.core.gossip import model_bytes
from aitbc.ledger.records import make_record
from aitbc.ledger.wallet import Wallet
from aitbc.replies.gossip import RosterEntry
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.gossip_peers import NeighbourReader, eta_of, parse_pace
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.peers import PACE_HEADER, BlobServer, PeerFetcher

D = 8  # the model's parameters
ROUNDS = 5


def test_the_peer_server_sends_the_pace_beside_a_record_and_its_404():
    w = Wallet.generate("w")
    signed = make_record(w, training_id="t", job_id="job_a", round=1, cid="bafkreiaa", samples=3, train_loss=None)
    paces = {"job_a": "round=2; step=5; steps=40; seconds=0.250"}
    server = BlobServer(
        "127.0.0.1",
        0,
        lambda cid: None,
        records=lambda job, r: signed if job == "job_a" and r == 1 else None,
        pace=paces.get,
    )
    try:
        base = f"http://127.0.0.1:{server.port}/v1/records/"
        ok = httpx.get(base + "job_a", params={"round": 1})
        assert ok.status_code == 200 and ok.json() == signed  # the record is unchanged: the pace is a header
        assert ok.headers[PACE_HEADER] == paces["job_a"]
        paces["job_a"] = "round=2; step=6; steps=40; seconds=0.300"
        none = httpx.get(base + "job_a", params={"round": 2})
        assert none.status_code == 404 and none.headers[PACE_HEADER] == paces["job_a"]
        other = httpx.get(base + "job_b")  # a job it is not training: no pace
        assert other.status_code == 404 and PACE_HEADER not in other.headers
    finally:
        server.close()


def test_the_pace_is_parsed_strictly():
    assert parse_pace("round=2; step=5; steps=40; seconds=0.25", ROUNDS) == (2, 5, 40, 0.25)
    assert parse_pace("seconds=1;steps=4;step=0;round=1", ROUNDS) == (1, 0, 4, 1.0)  # any order
    for bad in [
        None,
        "",
        "round=2; step=5; steps=40",  # a field missing
        "round=2; step=5; steps=40; seconds=0.2; extra=1",  # one too many
        "round=2; round=2; step=5; steps=40; seconds=0.2",  # twice
        "round=two; step=5; steps=40; seconds=0.2",
        "round=2; step=5; steps=40; seconds=nan",
        "round=2; step=5; steps=40; seconds=inf",
        "round=2; step=5; steps=40; seconds=-1",
        "round=2; step=41; steps=40; seconds=0.2",  # past its steps
        "round=2; step=-1; steps=40; seconds=0.2",
        "round=2; step=0; steps=0; seconds=0.2",
        f"round={ROUNDS + 1}; step=5; steps=40; seconds=0.2",  # past the run's last round
        "round=0; step=5; steps=40; seconds=0.2",
        "round=2 step=5 steps=40 seconds=0.2",
        "round=2; step=5; steps=40; seconds=" + "1" * 200,  # too long
    ]:
        assert parse_pace(bad, ROUNDS) is None, bad


def test_the_time_a_neighbour_needs_is_from_its_own_pace():
    assert eta_of((1, 4, 40, 0.4), 1) == pytest.approx(3.6)  # 36 steps left at 0.1 s a step
    assert eta_of((1, 40, 40, 0.4), 2) == pytest.approx(0.4)  # trained round 1: all of round 2 left
    assert eta_of((1, 20, 40, 0.2), 3) == pytest.approx(1.0)  # 20 + 40 + 40 steps at 0.01 s
    assert eta_of((4, 1, 40, 0.1), 3) == math.inf  # past round 3 with no record of it: none will come
    assert eta_of((1, 3, 40, 0.3), 1) is None  # too early in its round to tell
    assert eta_of((1, 2, 2, 0.3), 1) == 0.0  # a round of 2 steps: judged at its end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Neighbour:
    """A neighbour's real peer server: its record of round 1 appears on the ``ready``-th ask
    (never, if None), beside ``pace``; its model is served by CID."""

    def __init__(self, tmp: Path, pace: str | None, ready: int | None) -> None:
        self.wallet = Wallet.generate("neighbour")
        self.blob = build_codec("none", {}).encode(torch.arange(D, dtype=torch.float32))
        self.cid = cid_of_bytes(self.blob)
        self.store = LocalBlobStore(tmp / "neighbour", durable=False)
        self.store.put_bytes(self.blob)
        self.record = make_record(
            self.wallet, training_id="t", job_id="job_n", round=1, cid=self.cid, samples=7, train_loss=None
        )
        self.asks, self.ready = 0, ready
        self.server = BlobServer(
            "127.0.0.1",
            0,
            lambda cid: self.store.dir / cid if self.store.has(cid) else None,
            records=self._records,
            pace=lambda job: pace,
        )
        self.entry = RosterEntry(
            worker=self.wallet.address,
            job_id="job_n",
            public_key=self.wallet.public_key,
            url=f"http://127.0.0.1:{self.server.port}",
            samples=7,
        )

    def _records(self, job: str, r: int | None) -> dict[str, Any] | None:
        self.asks += 1
        return self.record if self.ready is not None and self.asks >= self.ready else None


def _loop(tmp: Path, wait: float) -> NeighbourReader:
    """A worker's reader of its gossip neighbours at round 1."""
    stop = threading.Event()
    client = CoordinatorClient(f"http://127.0.0.1:{_free_port()}")  # nobody listens: unreachable
    return NeighbourReader(
        CoordinatorCalls(client, stop=stop, backoff=0.2, max_backoff=5.0),
        PeerFetcher(timeout=3.0),
        WorkerMetrics(),
        stop=stop,
        report=lambda cid, worker: None,
        incoming=LocalBlobStore(tmp / "incoming", durable=False),
        training_id="t",
        rounds=ROUNDS,
        d=D,
        model_size=model_bytes("none", D),
        wait=wait,
        max_staleness=4,
    )


def test_a_neighbour_too_slow_for_the_wait_is_not_waited_for(tmp_path):
    # 4 steps of 40 in 0.4 s: about 3.6 s from its record, past a wait of 2 s. Without its
    # pace the worker would ask every POLL (0.1 s) for the whole 2 s.
    slow = _Neighbour(tmp_path, "round=1; step=4; steps=40; seconds=0.4", ready=None)
    loop = _loop(tmp_path, wait=2.0)
    try:
        assert loop.model_of(slow.entry, 1) is None
        assert slow.asks == 1  # one look, then on: not polled until the wait ran out
        assert loop.lagging[slow.entry["worker"]] is True  # next round: its newest at once
    finally:
        slow.server.close()


def test_a_neighbour_about_to_publish_is_waited_for(tmp_path):
    # 38 steps of 40 in 0.38 s: about 0.02 s from its record: waited for (it comes on the 3rd ask)
    late = _Neighbour(tmp_path, "round=1; step=38; steps=40; seconds=0.38", ready=3)
    loop = _loop(tmp_path, wait=60.0)
    try:
        got = loop.model_of(late.entry, 1)
        assert got is not None and late.asks == 3
        model, samples, their_round, signed = got
        assert signed["record"]["round"] == 1  # the record it mixed, for its witness report
        assert torch.equal(model, torch.arange(D, dtype=torch.float32)) and (samples, their_round) == (7, 1)
        assert loop.lagging[late.entry["worker"]] is False
    finally:
        late.server.close()


def test_a_neighbour_with_no_pace_is_waited_for_as_before(tmp_path):
    # a peer server of a worker without the pace (or a lying one saying nothing): the wait bounds it
    late = _Neighbour(tmp_path, None, ready=4)
    loop = _loop(tmp_path, wait=60.0)
    try:
        got = loop.model_of(late.entry, 1)
        assert got is not None and late.asks == 4
    finally:
        late.server.close()


class _Ahead(_Neighbour):
    """A neighbour that keeps its records of rounds 1 and 4: a round's when asked for it,
    else its newest (as a worker's peer server)."""

    def __init__(self, tmp: Path, pace: str) -> None:
        super().__init__(tmp, pace, ready=1)
        self.newest = make_record(
            self.wallet, training_id="t", job_id="job_n", round=4, cid=self.cid, samples=7, train_loss=None
        )
        self.asked: list[int | None] = []

    def _records(self, job: str, r: int | None) -> dict[str, Any] | None:
        self.asked.append(r)
        return self.record if r == 1 else self.newest


@pytest.mark.parametrize(
    ("pace", "mixed"), [("round=5; step=2; steps=40; seconds=0.02", 4), ("round=2; step=2; steps=40; seconds=0.02", 1)]
)
def test_a_slow_worker_mixes_the_newest_model_of_a_neighbour_rounds_ahead(tmp_path, pace, mixed):
    # at round 1, its neighbour's server still keeps round 1; its pace says it trains round 5:
    # its newest (round 4) is mixed, not the old one. One round ahead (jitter between equal
    # workers): round 1's, as the simulator mixes
    ahead = _Ahead(tmp_path, pace)
    loop = _loop(tmp_path, wait=60.0)
    try:
        got = loop.model_of(ahead.entry, 1)
        assert got is not None
        _, _, their_round, signed = got
        assert their_round == mixed and signed["record"]["round"] == mixed
        assert ahead.asked == ([1, None] if mixed == 4 else [1])
    finally:
        ahead.server.close()
