"""Money on an EVM chain: who holds what on chain, and the settlement outbox.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

- ``offers.evm_address``: the provider's EVM account (named in its signed offer) that posts
  its bonds and is paid on chain, on a coordinator that settles on an EVM chain.
- ``runs.owner_evm``: the owner's EVM account (named in its signed ``init``); the run's
  escrow key on chain is derived from it and the run id, so nobody else can open it.
  ``runs.chain_deposited``: the on-chain deposit (total, micro-AIT) mirrored into the run's
  escrow in the coordinator's books so far.
- ``contracts.evm_address`` (the provider's account when hired) and
  ``contracts.chain_bonded`` (its bond seen on chain and mirrored into the books).
- ``chain_txs``: one row per transaction the settlement key owes the chain (a round's
  settlement, a run's finalization), written in the transaction that settles the round in
  the books, so a crash leaves either both or neither; its nonce and signed bytes are kept
  before the broadcast, so a restarted sender resends the same transaction and never a
  second one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("offers") as t:
        t.add_column(sa.Column("evm_address", sa.String(length=42), nullable=True))
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("owner_evm", sa.String(length=42), nullable=True))
        t.add_column(sa.Column("chain_deposited", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("contracts") as t:
        t.add_column(sa.Column("evm_address", sa.String(length=42), nullable=True))
        t.add_column(sa.Column("chain_bonded", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "chain_txs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=True),
        sa.Column("raw_tx", sa.Text(), nullable=True),
        sa.Column("tx_hash", sa.String(length=66), nullable=True),
        sa.Column("block", sa.BigInteger(), nullable=True),
        sa.Column("confirmations", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("gas_used", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sender", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.Column("final_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "kind", "round"),
    )
    op.create_index("ix_chain_txs_run_id", "chain_txs", ["run_id"])
    op.create_index("ix_chain_txs_status", "chain_txs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_chain_txs_status", table_name="chain_txs")
    op.drop_index("ix_chain_txs_run_id", table_name="chain_txs")
    op.drop_table("chain_txs")
    with op.batch_alter_table("contracts") as t:
        t.drop_column("chain_bonded")
        t.drop_column("evm_address")
    with op.batch_alter_table("runs") as t:
        t.drop_column("chain_deposited")
        t.drop_column("owner_evm")
    with op.batch_alter_table("offers") as t:
        t.drop_column("evm_address")
