"""What one ``GET /metrics`` scrape costs as the record grows (issue 16, part 2).

The record's metrics are counted in the database at each scrape (one aggregate query per
family, :class:`aitbc.coordinator.observability.metrics.RecordCollector`), so their cost grows with the
tables they count. This fills a coordinator database (SQLite, WAL, migrated as ``serve`` does;
or ``--db URL``) with runs of ``rounds`` rounds and ``workers`` workers each: one update per
worker and round (1 in 20 rejected, with the reasons the coordinator writes), a round record
per round, a flag per rejection, a ledger entry per worker and round, then times the whole
collector (median of ``--repeat`` scrapes, after one warm-up) at each size.

    .venv/bin/python bench/metrics_scrape.py [--sizes 10000,100000,1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json
from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.observability.metrics import RecordCollector
from aitbc.coordinator.store.models import Contract, Flag, Job, Offer, RoundRecord, Run, Update
from aitbc.ledger.book import Entry

ROUNDS, WORKERS = 100, 10  # per run: one run holds ROUNDS x WORKERS updates
REASONS = (
    "update contains NaN or Inf",
    "update norm 1e+09 is 1e+09 x the round's median 1 (more than 1000 x is refused)",
)


def fill(ctx, updates: int) -> None:
    """Add runs until the database holds ``updates`` updates (it holds fewer to start with)."""
    now = time.time()
    with ctx.session() as s:
        have = s.scalar(select(func.count()).select_from(Update)) or 0
        seq = s.scalar(select(func.max(Entry.seq))) or 0
        n_runs = s.scalar(select(func.count()).select_from(Run)) or 0
        offers = [f"ait1worker{w:030d}" for w in range(WORKERS)]
        if not have:
            s.execute(
                insert(Offer),
                [
                    dict(
                        id=o,
                        public_key="00" * 32,
                        gpu="RTX4090",
                        price=1_000_000,
                        availability=0.99,
                        reputation=1.0,
                        status="online",
                        last_heartbeat=now,
                        registered_at=now,
                    )
                    for o in offers
                ],
            )
        while have < updates:
            rid = f"training_{n_runs:032x}"
            n_runs += 1
            s.execute(
                insert(Run),
                [
                    dict(
                        id=rid,
                        owner="ait1owner",
                        owner_key="00" * 32,
                        status="complete",
                        model_type="mlp",
                        dataset_size="1GB",
                        dataset_size_bytes=1 << 30,
                        target_workers=WORKERS,
                        bytes_up=123,
                        bytes_down=456,
                        created_at=now,
                        updated_at=now,
                    )
                ],
            )
            s.execute(
                insert(Contract),
                [
                    dict(
                        id=f"contract_{rid}_{w}",
                        run_id=rid,
                        worker_id=o,
                        price=1,
                        score=1.0,
                        status="released",
                        created_at=now,
                    )
                    for w, o in enumerate(offers)
                ],
            )
            s.execute(
                insert(Job),
                [
                    dict(
                        id=f"job_{rid}_{w}",
                        run_id=rid,
                        contract_id=f"contract_{rid}_{w}",
                        worker_id=o,
                        shard_index=w,
                        shard_cid="bafy",
                        status="released",
                        joined_round=1,
                        config={},
                        created_at=now,
                        updated_at=now,
                    )
                    for w, o in enumerate(offers)
                ],
            )
            rows, flags, entries = [], [], []
            for r in range(1, ROUNDS + 1):
                for w, o in enumerate(offers):
                    bad = (r * WORKERS + w) % 20 == 0
                    reason = REASONS[r % 2] if bad else None
                    rows.append(
                        dict(
                            run_id=rid,
                            job_id=f"job_{rid}_{w}",
                            worker_id=o,
                            round=r,
                            cid="bafy",
                            size=1000,
                            samples=100,
                            status="rejected" if bad else "accepted",
                            reason=reason,
                            created_at=now,
                        )
                    )
                    if bad:
                        flags.append(
                            dict(
                                worker_id=o, run_id=rid, round=r, kind="rejected_update", reason=reason, created_at=now
                            )
                        )
                    seq += 1
                    entries.append(
                        dict(
                            seq=seq,
                            hash=f"{seq:064x}",
                            prev_hash=f"{seq - 1:064x}",
                            network="local",
                            kind="settle",
                            debit=f"escrow:{rid}",
                            credit=f"wallet:{o}",
                            amount=1,
                            memo={},
                            key=f"settle:{rid}:{w}:{r}",
                            signer="coordinator",
                            auth={},
                            signature=f"{seq:0128x}",
                            created_at=now,
                        )
                    )
            s.execute(insert(Update), rows)
            s.execute(insert(Flag), flags)
            s.execute(insert(Entry), entries)
            s.execute(
                insert(RoundRecord),
                [
                    dict(run_id=rid, round=r, checkpoint_cid="bafy", started_at=now, closed_at=now)
                    for r in range(ROUNDS + 1)
                ],
            )
            have += len(rows)
        s.commit()


def scrape_seconds(collector: RecordCollector, repeat: int) -> tuple[float, int]:
    families = list(collector.collect())  # warm-up (and the number of families)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        list(collector.collect())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(families)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="updates on record at each measurement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--db", default=None, help="a SQLAlchemy URL of an empty database (default: SQLite in a temp dir)")
    args = ap.parse_args()
    sizes = sorted(int(x) for x in args.sizes.split(","))
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ctx = build_context(Settings(home=Path(tmp), db_url=args.db))
        collector = RecordCollector(ctx, min_interval=0)  # every scrape reads the record
        try:
            for n in sizes:
                t0 = time.perf_counter()
                fill(ctx, n)
                filled = time.perf_counter() - t0
                seconds, families = scrape_seconds(collector, args.repeat)
                with ctx.session() as s:
                    counts = {
                        "updates": s.scalar(select(func.count()).select_from(Update)),
                        "rounds": s.scalar(select(func.count()).select_from(RoundRecord)),
                        "ledger_entries": s.scalar(select(func.count()).select_from(Entry)),
                        "flags": s.scalar(select(func.count()).select_from(Flag)),
                    }
                rows.append(
                    (
                        f"{counts['updates']:,}",
                        f"{counts['rounds']:,}",
                        f"{counts['ledger_entries']:,}",
                        f"{seconds * 1000:.1f}",
                    )
                )
                results.append({**counts, "scrape_seconds": seconds, "families": families, "fill_seconds": filled})
        finally:
            ctx.engine.dispose()
    backend = "SQLite" if args.db is None else args.db.split(":", 1)[0]
    print_table(
        f"One /metrics scrape's database queries ({backend}, median of {args.repeat})",
        ["updates", "rounds", "ledger entries", "scrape ms"],
        rows,
    )
    write_json("metrics_scrape", {"backend": backend, "repeat": args.repeat, "results": results})


if __name__ == "__main__":
    main()
