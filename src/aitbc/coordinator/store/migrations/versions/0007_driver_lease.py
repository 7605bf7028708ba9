"""The round driver's lease: several coordinator processes on one database.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

- ``driver_lease``: one row per lease (``rounds``): the replica that drives the rounds,
  until ``expires_at``; taken and renewed by compare-and-set (``coordinator/store/lease.py``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "driver_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("driver_lease")
