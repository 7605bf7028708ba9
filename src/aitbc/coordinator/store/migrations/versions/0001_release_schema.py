"""The schema of the last release before migrations (what ``create_all`` made at c056fd2).

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Written out table by table, so a later change of the models never changes this revision.
A database is brought here three ways:

- empty: every table is created;
- made by a release before migrations (its tables are there, ``alembic_version`` is not):
  adopted as it is when it already matches; an older one gets the columns added since
  (existing rows filled with the value the model gave new rows, so no non-optional column
  is left NULL), the missing tables and indexes, and NOT NULL where an earlier in-place
  upgrade (``add_new_columns``) left a column nullable. A required column that has no
  such value cannot be filled: the upgrade stops with one line saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

from aitbc.errors import AitbcError

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# What rows written before a NOT NULL column existed hold in it: the default this release's
# models gave new rows.
BACKFILL: dict[str, dict[str, Any]] = {
    "runs": {
        "control": "automatic",
        "model_options": {},
        "seed": 0,
        "round": 0,
        "bytes_up": 0,
        "bytes_down": 0,
        "network": "local",
        "bond": 0,
        "escrowed": 0,
        "settled_round": 0,
        "finalized": False,
        "bonds_returned": False,
    },
    "offers": {"device": {}, "flags": 0, "max_bond": 0},
    "contracts": {"bond": 0, "slashed": 0, "paid_manual": 0},
    "jobs": {
        "config": {},
        "progress": 0.0,
        "epoch": 0.0,
        "worker_status": "assigned",
        "rounds_done": 0,
        "compute_seconds": 0.0,
    },
    "updates": {"compute_seconds": 0.0},
    "rounds": {"accepted": 0, "rejected": 0, "stragglers": [], "skipped": False},
    "scores": {"flags": [], "provable": False},
    "ledger_accounts": {"balance": 0},
    "ledger_head": {"seq": 0, "hash": "0" * 64},
}


def _release(create_table: Callable[..., Any], create_index: Callable[..., Any]) -> None:
    """Every table and index of the release, in foreign-key order."""
    create_table(
        "flags",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("round", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    create_index("ix_flags_run_id", "flags", ["run_id"])
    create_index("ix_flags_worker_id", "flags", ["worker_id"])
    create_table(
        "offers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.String(length=64), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("device", sa.JSON(), nullable=False),
        sa.Column("price", sa.BigInteger(), nullable=False),
        sa.Column("availability", sa.Float(), nullable=False),
        sa.Column("reputation", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("flags", sa.Integer(), nullable=False),
        sa.Column("failed_at", sa.Float(), nullable=True),
        sa.Column("max_bond", sa.BigInteger(), nullable=False),
        sa.Column("registration", sa.JSON(), nullable=True),
        sa.Column("last_heartbeat", sa.Float(), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    create_index("ix_offers_status", "offers", ["status"])
    create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("owner_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("control", sa.String(length=16), nullable=False),
        sa.Column("result_cid", sa.String(length=100), nullable=True),
        sa.Column("paused_from", sa.String(length=16), nullable=True),
        sa.Column("model_type", sa.String(length=200), nullable=False),
        sa.Column("model_options", sa.JSON(), nullable=False),
        sa.Column("dataset_size", sa.String(length=32), nullable=False),
        sa.Column("dataset_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("target_workers", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("data_source", sa.String(length=500), nullable=True),
        sa.Column("manifest_cid", sa.String(length=100), nullable=True),
        sa.Column("manifest", sa.JSON(), nullable=True),
        sa.Column("data_bytes", sa.BigInteger(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("round_started_at", sa.Float(), nullable=True),
        sa.Column("global_cid", sa.String(length=100), nullable=True),
        sa.Column("outer_state_cid", sa.String(length=100), nullable=True),
        sa.Column("initial_val_loss", sa.Float(), nullable=True),
        sa.Column("val_loss", sa.Float(), nullable=True),
        sa.Column("val_accuracy", sa.Float(), nullable=True),
        sa.Column("bytes_up", sa.BigInteger(), nullable=False),
        sa.Column("bytes_down", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("network", sa.String(length=16), nullable=False),
        sa.Column("budget", sa.BigInteger(), nullable=True),
        sa.Column("bond", sa.BigInteger(), nullable=False),
        sa.Column("escrowed", sa.BigInteger(), nullable=False),
        sa.Column("settled_round", sa.Integer(), nullable=False),
        sa.Column("finalized", sa.Boolean(), nullable=False),
        sa.Column("bonds_returned", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    create_index("ix_runs_owner", "runs", ["owner"])
    create_index("ix_runs_status", "runs", ["status"])
    create_table(
        "contracts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("price", sa.BigInteger(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("bond", sa.BigInteger(), nullable=False),
        sa.Column("slashed", sa.BigInteger(), nullable=False),
        sa.Column("paid_manual", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["worker_id"], ["offers.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "worker_id"),
    )
    create_index("ix_contracts_run_id", "contracts", ["run_id"])
    create_index("ix_contracts_worker_id", "contracts", ["worker_id"])
    create_table(
        "rounds",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("checkpoint_cid", sa.String(length=100), nullable=False),
        sa.Column("outer_state_cid", sa.String(length=100), nullable=True),
        sa.Column("val_loss", sa.Float(), nullable=True),
        sa.Column("val_accuracy", sa.Float(), nullable=True),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("stragglers", sa.JSON(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("closed_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("run_id", "round"),
    )
    create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("contract_id", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("shard_cid", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("joined_round", sa.Integer(), nullable=False),
        sa.Column("replaces", sa.String(length=64), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("moved_from", sa.Integer(), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("epoch", sa.Float(), nullable=False),
        sa.Column("worker_status", sa.String(length=32), nullable=False),
        sa.Column("rounds_done", sa.Integer(), nullable=False),
        sa.Column("compute_seconds", sa.Float(), nullable=False),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["contract_id"], ["contracts.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["worker_id"], ["offers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    create_index("ix_jobs_run_id", "jobs", ["run_id"])
    create_index("ix_jobs_status", "jobs", ["status"])
    create_index("ix_jobs_worker_id", "jobs", ["worker_id"])
    create_table(
        "scores",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("contract_id", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("gain", sa.Float(), nullable=True),
        sa.Column("own_gain", sa.Float(), nullable=True),
        sa.Column("other_gain", sa.Float(), nullable=True),
        sa.Column("kept", sa.Float(), nullable=True),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.Column("provable", sa.Boolean(), nullable=False),
        sa.Column("quality", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["contract_id"], ["contracts.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "round", "contract_id"),
    )
    create_index("ix_scores_run_id", "scores", ["run_id"])
    create_index("ix_scores_worker_id", "scores", ["worker_id"])
    create_table(
        "settlements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("contract_id", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("quality", sa.Float(), nullable=False),
        sa.Column("due", sa.BigInteger(), nullable=False),
        sa.Column("paid", sa.BigInteger(), nullable=False),
        sa.Column("entry_seq", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["contract_id"], ["contracts.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("contract_id", "round"),
    )
    create_index("ix_settlements_run_id", "settlements", ["run_id"])
    create_table(
        "updates",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("cid", sa.String(length=100), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=True),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("compute_seconds", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "round"),
    )
    create_index("ix_updates_run_id", "updates", ["run_id"])
    create_index("ix_updates_worker_id", "updates", ["worker_id"])
    create_table(
        "ledger_accounts",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("balance", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    create_table(
        "ledger_entries",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("network", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("debit", sa.String(length=100), nullable=False),
        sa.Column("credit", sa.String(length=100), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("memo", sa.JSON(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=True),
        sa.Column("signer", sa.String(length=64), nullable=False),
        sa.Column("auth", sa.JSON(), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("hash"),
        sa.UniqueConstraint("key"),
    )
    create_index("ix_ledger_entries_credit", "ledger_entries", ["credit"])
    create_index("ix_ledger_entries_debit", "ledger_entries", ["debit"])
    create_index("ix_ledger_entries_kind", "ledger_entries", ["kind"])
    create_index("ix_ledger_entries_signature", "ledger_entries", ["signature"])
    create_table(
        "ledger_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def upgrade() -> None:
    if op.get_context().as_sql:  # offline (--sql): nothing to look at, so the empty case
        _release(op.create_table, op.create_index)
        return
    bind = op.get_bind()
    schema = _frozen()
    existing = set(sa.inspect(bind).get_table_names())
    if not existing & set(schema.tables):
        _release(op.create_table, op.create_index)
    else:
        _adopt(bind, schema, existing)


def downgrade() -> None:
    for table in reversed(_frozen().sorted_tables):
        op.drop_table(table.name)


def _frozen() -> sa.MetaData:
    """The release's tables as a MetaData (not created): what an existing database is compared with."""
    meta = sa.MetaData()

    def table(name: str, *items: Any) -> sa.Table:
        return sa.Table(name, meta, *items)

    def index(name: str, table: str, columns: list[str], unique: bool = False) -> sa.Index:
        return sa.Index(name, *(meta.tables[table].c[c] for c in columns), unique=unique)

    _release(table, index)
    return meta


def _adopt(bind: sa.Connection, schema: sa.MetaData, existing: set[str]) -> None:
    """Bring a database made before migrations to this revision, keeping its rows."""
    insp = sa.inspect(bind)
    for table in schema.sorted_tables:
        if table.name not in existing:
            table.create(bind)  # a table added after the release that made this database
            continue
        have = {c["name"]: c for c in insp.get_columns(table.name)}
        fill = BACKFILL.get(table.name, {})
        for col in table.columns:
            if col.name not in have and not col.nullable and col.name not in fill:
                raise AitbcError(
                    f"table {table.name} has no column {col.name} and there is no value to fill its rows with; "
                    "this database is older than any release that can be upgraded: start a new one "
                    "(another --home or --db)"
                )
        for col in table.columns:
            if col.name not in have:  # nullable first; filled and tightened below
                op.add_column(table.name, sa.Column(col.name, col.type, nullable=True))
        for name, value in fill.items():
            bind.execute(sa.update(table).where(table.c[name].is_(None)).values({name: value}))
        loose = [c for c in table.columns if not c.nullable and (c.name not in have or have[c.name]["nullable"])]
        for col in loose:
            if bind.scalar(sa.select(sa.func.count()).select_from(table).where(col.is_(None))):
                raise AitbcError(
                    f"table {table.name} has rows without {col.name}, which is required and has no value to "
                    "fill them with: start a new database (another --home or --db)"
                )
        if loose:
            with op.batch_alter_table(table.name) as batch:
                for col in loose:
                    batch.alter_column(col.name, existing_type=col.type, nullable=False)
        indexes = {ix["name"] for ix in sa.inspect(bind).get_indexes(table.name)}
        for ix in table.indexes:
            if ix.name not in indexes:
                op.create_index(ix.name, table.name, [c.name for c in ix.columns], unique=ix.unique)
