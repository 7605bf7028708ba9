"""Pins: a wallet keeps a blob DAG (a file or a folder) from blob retention.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- ``pins``: one row per (owner, root CID), with the bytes and blob count of the DAG it
  keeps (counted against the owner's ``max_pinned_bytes``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pins",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("cid", sa.String(100), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("blobs", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("owner", "cid"),
    )
    op.create_index("ix_pins_owner", "pins", ["owner"])
    op.create_index("ix_pins_cid", "pins", ["cid"])


def downgrade() -> None:
    op.drop_index("ix_pins_cid", "pins")
    op.drop_index("ix_pins_owner", "pins")
    op.drop_table("pins")
