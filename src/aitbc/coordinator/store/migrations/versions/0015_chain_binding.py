"""The chain a database's money is on.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

- ``chain_binding``: one row, written by the coordinator's first start on this database
  (not here: only a start knows the chain it was given), naming the chain its money is on:
  ``local`` (the coordinator's own ledger) or ``evm`` with the deployment's chain id, escrow,
  token and the hash of its block. A later start on another chain is refused, so the books
  of one chain are never spent on another.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chain_binding",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chain", sa.String(length=8), nullable=False),
        sa.Column("chain_id", sa.BigInteger(), nullable=True),
        sa.Column("escrow", sa.String(length=42), nullable=True),
        sa.Column("token", sa.String(length=42), nullable=True),
        sa.Column("anchor", sa.String(length=66), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("chain_binding")
