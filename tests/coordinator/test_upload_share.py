"""Upload slots are shared per party (issue 33 part 4): one signer holds at most
``max_uploads_per_signer`` of them, and a body slower than ``min_upload_rate`` over an
``upload_rate_window`` is cut off 408 with its slot freed, whether it trickles or sends
nothing at all. A real coordinator (uvicorn, the round driver, SQLite or PostgreSQL), real
sockets; the holder is one signed client doing what the issue's attacker did (1 byte every
few seconds on every upload it can open)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

import pytest
import torch

from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

Coordinator = Any  # tests/coordinator/conftest.py's (a test module cannot import the conftest by name)
SHARE = 2
SLOTS = 4
RATE = 4096  # bytes/s
WINDOW = 1.0  # s
BIG = 100_000  # a body the holder declares and never sends (under the tests' max_blob_bytes)


def settings(**kw: Any) -> dict[str, Any]:
    return dict(
        max_uploads=SLOTS, max_uploads_per_signer=SHARE, min_upload_rate=RATE, upload_rate_window_seconds=WINDOW, **kw
    )


@pytest.fixture(scope="module")
def coord(new_coordinator) -> Coordinator:
    return new_coordinator(**settings())


@pytest.fixture(scope="module")
def patient(new_coordinator) -> Coordinator:
    """Slots shared as ``coord``'s, but a floor judged over a minute: nothing is cut off in a test."""
    return new_coordinator(**{**settings(), "upload_rate_window_seconds": 60.0})


def open_upload(coord: Coordinator, wallet: Wallet, *, declared: int = BIG, first: bytes = b"x") -> socket.socket:
    """A signed PUT of a blob whose headers are sent with ``first`` of its body bytes."""
    path = f"/v1/blobs/{cid_of_bytes(b'never sent' + wallet.address.encode())}"
    h = sign_request(wallet, "PUT", path, unsigned_payload=True)
    port = int(coord.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = [f"PUT {path} HTTP/1.1", "Host: x", f"Content-Length: {declared}", *(f"{k}: {v}" for k, v in h.items())]
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + first)
    return s


def answer(s: socket.socket) -> tuple[int, dict]:
    """The status and JSON body the coordinator answered on ``s`` (waits for it)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        more = s.recv(65536)
        if not more:
            break
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def small_put(coord: Coordinator, wallet: Wallet) -> tuple[int, dict]:
    """A whole small upload by ``wallet`` (bytes that do not hash to the CID: 400 once taken)."""
    s = open_upload(coord, wallet, declared=3, first=b"abc")
    try:
        return answer(s)
    finally:
        s.close()


def test_a_signer_holds_at_most_its_share_and_others_still_upload(patient, api):
    holder, other = Wallet.generate("holder"), Wallet.generate("other")
    held = []
    try:
        for i in range(SHARE):  # one at a time, each taken before the next
            held.append(open_upload(patient, holder))
            api.wait_for(f"upload {i} taken", lambda: patient.ctx.uploads.by_signer.get(holder.address, 0), i.__lt__)
        # The holder's next upload is refused: its share is in flight ...
        status, body = small_put(patient, holder)
        assert status == 429, body
        assert body["error"] == "too_many_uploads" and "max_uploads_per_signer 2" in body["detail"], body
        # ... and refused before it takes a slot: other signers still have all the others
        for name in ("a", "b"):
            status, body = small_put(patient, Wallet.generate(name))
            assert (status, body["error"]) == (400, "cid_mismatch"), body
        status, body = small_put(patient, other)
        assert (status, body["error"]) == (400, "cid_mismatch"), body
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_body_under_the_floor_is_cut_off_and_its_slot_freed(coord, api, trickle):
    """Nothing more after the first byte, or a byte at a time under the floor: either way
    the coordinator answers 408 when the window's bytes are short, not when (or if) the
    next byte comes."""
    wallet = Wallet.generate("slow")
    held = [open_upload(coord, wallet) for _ in range(SHARE)]
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.2):
            for s in held:
                with contextlib.suppress(OSError):  # answered and closed already
                    s.sendall(b"x")

    dripper = threading.Thread(target=drip, daemon=True)
    if trickle:
        dripper.start()
    try:
        for s in held:
            status, body = answer(s)
            assert (status, body["error"]) == (408, "upload_too_slow"), body
            assert f"at least {RATE} bytes/s (min_upload_rate)" in body["detail"], body
    finally:
        stop.set()
        for s in held:
            s.close()
    # the signer's share is free again: its next upload is taken
    status, body = api.wait_for("the slots freed", lambda: small_put(coord, wallet), lambda a: a[0] != 429)
    assert (status, body["error"]) == (400, "cid_mismatch"), body
    assert not any(p.name.startswith(".") for p in (coord.home / "blobs").iterdir() if p.is_file()), (
        "a cut-off upload left its temporary file"
    )


class Holder:
    """The issue's attacker: one signed client keeping every upload slot it can open, each
    body a byte at a time, reopening whatever is cut off or refused."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord, self.wallet = coord, Wallet.generate("holder")
        self.answers: list[tuple[int, str, str]] = []  # (status, error, detail) of its uploads answered
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        socks: list[socket.socket] = []
        while not self.stop.is_set():
            while len(socks) < SLOTS:  # try for every slot there is, all at once
                socks.append(open_upload(self.coord, self.wallet))
            self.stop.wait(0.2)
            for s in list(socks):  # a byte more on each; an answered one (refused, cut off) is replaced
                s.settimeout(0.001)
                try:
                    data = s.recv(65536)
                except TimeoutError:
                    try:
                        s.sendall(b"x")
                        continue
                    except OSError:
                        data = b""
                except OSError:
                    data = b""
                socks.remove(s)
                s.close()
                if data.startswith(b"HTTP/1.1 "):
                    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
                    self.answers.append((int(data.split()[1]), body["error"], body["detail"]))
        for s in socks:
            s.close()

    def __enter__(self) -> Holder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_slot_holder_does_not_stall_another_runs_rounds(new_coordinator, api):
    """While one signer keeps trying to hold every upload slot with 1-byte trickles, a run
    whose workers upload their updates as blobs completes its rounds; the holder is refused
    past its share and cut off under the floor (it was there, holding, all along)."""
    t = api.start_training_run(new_coordinator(**settings()), 2, aggregator="mean")
    sign = torch.tensor([1.0, -1.0]).repeat((t.d + 1) // 2)[: t.d]  # (d,) +-1: the two updates differ

    def seen(status: int, words: str) -> Any:
        return lambda answers: any(a[0] == status and words in a[2] for a in answers)

    with Holder(t.coord) as holder:
        api.wait_for("the holder answered", lambda: list(holder.answers), bool)  # it is at it
        for r in (1, 2, 3):
            for w, side in zip(t.workers, (1.0, -1.0), strict=True):
                u = r * 1e-3 * (1 + 0.5 * side * sign)
                cid = api.put_update(w, u)  # a PUT refused 429 would raise here
                w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, cid))
            rounds = lambda: len(t.owner.get(f"/runs/{t.run_id}/rounds")["data"])
            api.wait_for(f"round {r} closed", rounds, r.__lt__, timeout=90)
        assert holder.thread.is_alive()  # it held to the end ...
        # ... refused past its share and cut off under the floor, over and over
        api.wait_for("the holder refused", lambda: list(holder.answers), seen(429, "max_uploads_per_signer"))
        api.wait_for("a trickle cut off", lambda: list(holder.answers), seen(408, "min_upload_rate"))
    assert api.wait_status(t.owner, t.run_id, "complete")["rounds_completed"] == 3


def test_the_upload_settings_refuse_nonsense(tmp_path):
    from pydantic import ValidationError

    from aitbc.coordinator.config import Settings

    for field, bad in (
        ("max_uploads_per_signer", 0),
        ("min_upload_rate", 0),
        ("upload_rate_window_seconds", 0),
    ):
        with pytest.raises(ValidationError, match=field):
            Settings(home=tmp_path, **{field: bad})
