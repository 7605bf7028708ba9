"""Issue 18 part 1 on a real coordinator (uvicorn, SQLite, the round driver): with
``aggregation_memory_mb`` below one round's updates, every round streams from disk
(``round_updates``), and the norm bound, the trend and the rule give what memory gives."""

from __future__ import annotations

import torch

from aitbc.coordinator.live.updates import SPILL_DIR, streams
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.compression import build_codec, decode
from aitbc.core.norms import NormBound, apply_verdict, judge_norms, update_norms

from .conftest import round_params, wait_for

INT8 = build_codec("int8", {"chunk_size": 64})


def _submit(api, w, job: str, blob: bytes, r: int) -> None:
    w.post(f"/jobs/{job}/updates", api.update_body(r, api.put_update(w, blob)))


def test_rounds_stream_from_disk_with_the_norm_bound_and_the_trend_as_in_memory(api, new_coordinator):
    # Prepare: a coordinator whose memory setting is below any round (every round streams)
    coord = new_coordinator(aggregation_memory_mb=1e-6)
    t = api.start_training_run(coord, 4, aggregator="trend:f=1+median")
    assert streams(coord.ctx, 1, t.d)
    g = torch.Generator().manual_seed(4)
    (a, ja), (b, jb), (c, jc), (x, jx) = ((w, t.jobs[w.wallet.address]) for w in t.workers)
    base = 1e-3 * torch.randn(t.d, generator=g)  # (d,)
    one = [
        INT8.encode(base + 3e-4 * torch.randn(t.d, generator=g)),
        INT8.encode(base + 3e-4 * torch.randn(t.d, generator=g)),
        INT8.encode(5 * base),  # 5x the median: scaled down to 3x, not punished
        INT8.encode(torch.full((t.d,), 3e38)),  # finite, 1e40 x the median: rejected
    ]

    # Execute: round 1 (no trend yet), then round 2 with an IPM update against the trend
    for (w, j), blob in zip(((a, ja), (b, jb), (c, jc), (x, jx)), one, strict=True):
        _submit(api, w, j, blob, 1)
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda v: v == 2, timeout=60)
    honest = [base + 3e-4 * torch.randn(t.d, generator=g) for _ in range(2)]  # x was ejected
    two = [INT8.encode(u) for u in honest] + [INT8.encode(-0.5 * torch.stack(honest).mean(0))]
    for (w, j), blob in zip(((a, ja), (b, jb), (c, jc)), two, strict=True):
        _submit(api, w, j, blob, 2)
    wait_for(
        "round 2 recorded", lambda: len(t.owner.get(f"/runs/{t.run_id}/rounds")["data"]), lambda v: v >= 3, timeout=60
    )

    # Assert: round 1 is the in-memory pipeline on the bound's output (the rows the driver
    # ordered by shard: the workers' order here), round 2 leaves the IPM update out
    U = torch.stack([decode(b_).to(torch.float32) for b_ in one])  # (n, d)
    kept, _ = apply_verdict(U, judge_norms(update_norms(U), NormBound()))
    expected = parse_aggregator("trend:f=1+median", default_f=1)(kept)
    torch.testing.assert_close(round_params(t, 0) - round_params(t, 1), expected, rtol=0, atol=1e-6)
    rows = {
        r["worker_id"]: r["status"]
        for r in t.coord.rows("SELECT worker_id, status FROM updates WHERE run_id = :r AND round = 1", r=t.run_id)
    }
    assert rows[x.wallet.address] == "rejected" and rows[c.wallet.address] == "accepted"
    U2 = torch.stack([decode(b_).to(torch.float32) for b_ in two[:2]])  # c's IPM update left out by the trend
    torch.testing.assert_close(round_params(t, 1) - round_params(t, 2), U2.mean(0), rtol=0, atol=1e-6)
    # and the books thread scored round 2 from disk with the rule's verdict: the IPM update kept nothing
    settled = "SELECT settled_round FROM runs WHERE id = :r"
    wait_for(
        "round 2 settled", lambda: t.coord.rows(settled, r=t.run_id)[0]["settled_round"], lambda v: v >= 2, timeout=60
    )
    kept = {
        r["worker_id"]: r["kept"]
        for r in t.coord.rows("SELECT worker_id, kept FROM scores WHERE run_id = :r AND round = 2", r=t.run_id)
    }
    assert kept == {a.wallet.address: 1.0, b.wallet.address: 1.0, c.wallet.address: 0.0}
    assert list((coord.home / SPILL_DIR).iterdir()) == []  # nothing left on disk
