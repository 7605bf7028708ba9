"""Gossip equivocation: the records workers received from their neighbours.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

- ``gossip_witnesses``: a worker's signed gossip record as another worker received it
  (``POST /v1/records/witnessed``), kept until the coordinator holds that job's record of
  the round with the same CID; two different signed records of one job and round flag the
  worker ``equivocation`` (``coordinator/rounds/gossip.py``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gossip_witnesses",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("cid", sa.String(100), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("reporter", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("job_id", "round", "cid"),
    )
    op.create_index("ix_gossip_witnesses_run_id", "gossip_witnesses", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_gossip_witnesses_run_id", table_name="gossip_witnesses")
    op.drop_table("gossip_witnesses")
