"""The model an update was trained from, when not its round's own (overlapping rounds).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

- ``updates.base_cid``: with ``overlap`` 1 a worker trains round r from round r-2's
  checkpoint while round r-1 closes; its update names that model, and the close counts it
  by the run's staleness rule. None: the round's own model (every update before this
  revision).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("updates") as b:
        b.add_column(sa.Column("base_cid", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("updates") as b:
        b.drop_column("base_cid")
