"""End to end: gossip pays only original work, and no gossip peer stalls anyone else.

Real coordinator and worker processes on loopback (issue 33, part 3):

- A worker that signs a neighbour's published model as its own (``--cheat copy``: the very
  CID; ``--cheat copy-noise``: the model with a little noise, another CID) earns nothing
  and is flagged ``gossip_copy`` every round; the workers it copied are paid in full.
- A worker whose peer server trickles its model a byte every 2 s (``--cheat trickle``)
  holds only its own run's rounds, up to the coordinator's fetch deadline: another owner's
  sync run, on the same coordinator, closes rounds while the trickle is held.
- A worker whose peer server streams bytes for ever for its CID (``--cheat endless``)
  costs each neighbour at most the model's size on disk; it is flagged ``bad_peer_blob``
  and no honest neighbour is flagged.
"""

from __future__ import annotations

import pytest
from tests.coordinator.conftest import wait_for
from tests.e2e.conftest import free_port
from tests.e2e.test_gossip_live import _gossip_run, _start_workers

from aitbc.core.gossip import model_bytes

pytestmark = [pytest.mark.slow, pytest.mark.long]

PRICE = 1_000_000  # 1.00 AIT a round, in micro-AIT


def _paid(stack, run_id: str) -> dict[str, int]:
    stack.finalized(run_id, timeout=180)
    paid: dict[str, int] = {}
    for w, amount in stack.rows("SELECT worker_id, paid FROM settlements WHERE run_id = :r", r=run_id):
        paid[w] = paid.get(w, 0) + amount
    return paid


@pytest.mark.parametrize("cheat", ["copy", "copy-noise"])
def test_a_copier_earns_nothing_and_is_flagged(stack, cheat):
    rounds = 4
    stack.start_coordinator()
    names = ["h0", "h1", "h2", "copier"]
    _start_workers(stack, names, copier={"cheat": cheat})
    run_id = _gossip_run(stack, rounds=rounds)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    copier = stack.worker_id("copier")
    honest = {stack.worker_id(n) for n in names[:3]}
    assert "cheating (copy" in (stack.root / "copier.log").read_text(errors="replace")  # it did copy

    ups = stack.rows("SELECT worker_id, round, cid, status FROM updates WHERE run_id = :r", r=run_id)
    mine = {r: (cid, st) for w, r, cid, st in ups if w == copier}
    assert sorted(mine) == list(range(1, rounds + 1)), ups  # it published every round...
    assert all(st == "rejected" for _, st in mine.values()), mine  # ...and none was kept
    theirs = {(r, cid) for w, r, cid, _ in ups if w in honest}
    if cheat == "copy":  # the very CIDs of its neighbours' models
        assert all(any(cid == c for _, c in theirs) for cid, _ in mine.values()), (mine, theirs)
    else:  # its own CIDs: caught by distance
        assert not any(cid == c for cid, _ in mine.values() for _, c in theirs)

    flags = stack.rows("SELECT worker_id, kind, round FROM flags WHERE run_id = :r", r=run_id)
    assert {r for w, kind, r in flags if w == copier and kind == "gossip_copy"} == set(range(1, rounds + 1)), flags
    assert not [f for f in flags if f[0] in honest], flags  # nobody it copied is blamed for it

    paid = _paid(stack, run_id)
    assert paid.get(copier, 0) == 0, paid
    assert all(paid[w] == rounds * PRICE for w in honest), paid


def test_a_trickling_peer_holds_only_its_own_rounds(stack):
    """The trickler's model comes a byte every 2 s: the coordinator gives up on it at its
    fetch deadline (on a thread of its own, not the round driver's), so its gossip run's
    record waits up to that deadline; meanwhile another owner's sync run on the same
    coordinator keeps closing rounds. Its honest neighbours give up on it at theirs
    (``--peer-timeout 1``: 4 s) and mix without it; none of them is flagged or unpaid."""
    gossip_rounds = 3
    stack.start_coordinator()
    for name in ("s0", "s1"):  # another owner's sync run: only they have the GPU it asks for
        stack.start_worker(name, gpu="H100", step_delay=0.05)
    names = ["h0", "h1", "h2", "slow"]
    for name in names:
        stack.start_worker(
            name,
            extra=("--listen", f"127.0.0.1:{free_port()}", "--peer-timeout", "1"),
            cheat="trickle" if name == "slow" else None,
        )
    keys = [stack.root / n / "wallets" / n / "key.json" for n in names]
    wait_for("the gossip workers' wallets", lambda: all(k.exists() for k in keys), bool, timeout=120)
    ids = {stack.worker_id(n) for n in names}
    stack.wait_offers(6)
    r = stack.cli(
        "distributed-training", "init", "--wallet", "other-owner", "--model-type", "mlp", "--dataset-size", "100GB",
        "--target-workers", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert stack.cli("wallet", "fund", "other-owner", "100000").returncode == 0
    sync = r.stdout.split("Training ID: ")[1].split()[0]
    # rounds enough that it is still training whenever the trickler's round is held (on a
    # loaded machine the gossip run's start took longer than 60 of its rounds)
    stack.start_run(sync, workers=2, rounds=5000, local_steps=10, min_gpu="H100")
    stack.wait_run(sync, lambda r: r["round"] >= 1 and r["status"] == "training", timeout=120, what="training")
    gossip = _gossip_run(stack, rounds=gossip_rounds)
    slow = stack.worker_id("slow")
    honest = {stack.worker_id(n) for n in names[:3]}
    hired = stack.rows("SELECT worker_id FROM jobs WHERE run_id = :r", r=gossip)
    assert {w for (w,) in hired} == ids, hired

    def held() -> tuple[int, int, int]:
        """(the gossip run's round, whether the trickler published it, the sync run's round)"""
        g = stack.api(f"/runs/{gossip}")
        n = stack.rows(
            "SELECT count(*) FROM updates WHERE run_id = :r AND worker_id = :w AND round = :n",
            r=gossip,
            w=slow,
            n=g["round"],
        )[0][0]
        return g["round"], n, stack.api(f"/runs/{sync}")["round"]

    # the coordinator is fetching the trickler's model of a round (published, not recorded yet)...
    at, _, before = wait_for("the trickler's round held", held, lambda v: v[1] == 1, timeout=180)
    # ...and the other run closes two rounds meanwhile, while that round is still held
    wait_for("the sync run's pace", lambda: stack.api(f"/runs/{sync}")["round"], lambda n: n >= before + 2, 120)
    g = stack.api(f"/runs/{gossip}")
    assert g["round"] == at and g["status"] in ("training", "aggregating"), (at, g["round"], g["status"])
    assert "misbehaving (trickle)" in (stack.root / "slow.log").read_text(errors="replace")

    run = stack.wait_run(gossip, lambda r: r["status"] in ("complete", "failed"), timeout=400, what="the end")
    assert run["status"] == "complete", run["error"]
    ups = stack.rows("SELECT worker_id, round, status FROM updates WHERE run_id = :r", r=gossip)
    assert all(st == "excluded" for w, _, st in ups if w == slow), ups  # never fetched: unpaid, not flagged
    assert all(st == "accepted" for w, _, st in ups if w in honest), ups
    flags = stack.rows("SELECT worker_id, kind FROM flags WHERE run_id = :r", r=gossip)
    assert not flags, flags
    paid = _paid(stack, gossip)
    assert paid.get(slow, 0) == 0 and all(paid[w] == gossip_rounds * PRICE for w in honest), paid


def test_an_endless_peer_costs_a_neighbour_at_most_the_model(stack):
    """The endless peer's server sends its model and then bytes for ever: each honest
    neighbour stops reading at the model's size (refused at the byte past it, nothing
    kept, reported), the coordinator's own check confirms it (``bad_peer_blob``), and the
    neighbours mix without it: none of them flagged, all paid."""
    rounds = 4
    stack.start_coordinator()
    names = ["h0", "h1", "h2", "endless"]
    _start_workers(stack, names, endless={"cheat": "endless"})
    run_id = _gossip_run(stack, rounds=rounds)
    endless = stack.worker_id("endless")
    honest = {stack.worker_id(n) for n in names[:3]}
    incoming = [stack.root / n / "worker-gossip-in" / n for n in names[:3]]
    peak = 0

    def disk() -> int:  # the honest workers' bytes of models being fetched, at their largest
        nonlocal peak
        for d in incoming:
            if d.exists():
                peak = max(peak, sum(p.stat().st_size for p in d.rglob("*") if p.is_file()))
        return peak

    def ended() -> bool:
        disk()
        return stack.api(f"/runs/{run_id}")["status"] in ("complete", "failed")

    wait_for("the run's end", ended, bool, timeout=300)
    run = stack.api(f"/runs/{run_id}")
    assert run["status"] == "complete", run["error"]
    size = model_bytes(run["config"]["compression"], run["config"]["d"])
    assert peak <= size, (peak, size)  # a neighbour fetches one model at a time
    said = f"is longer than its {size} bytes; refused at that byte"
    refused = [n for n in names[:3] if said in (stack.root / f"{n}.log").read_text(errors="replace")]
    assert len(refused) == 2, {n: stack.log(n) for n in names[:3]}  # its ring neighbours stopped at the model's size

    flags = stack.rows("SELECT worker_id, kind FROM flags")
    assert flags and all(w == endless for w, _ in flags), flags  # no honest neighbour flagged
    assert {k for _, k in flags} == {"bad_peer_blob"}, flags
    paid = _paid(stack, run_id)
    assert paid.get(endless, 0) == 0 and all(paid[w] == rounds * PRICE for w in honest), paid
