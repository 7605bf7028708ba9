"""The worker's own previous update an overlapping update's start adds to its base.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

- ``updates.prior_cid``: with ``overlap`` 1 a worker trains round r ahead from the model
  before the round's (``base_cid``) plus its own round r-1 update (eager start, as in
  "eager updates" for overlapped DiLoCo): it starts where its own last round ended, moved by
  what the global model gained since. Such an update counts in full; its spot check
  replays it from ``base - decode(prior)``. None: the start is ``base_cid`` alone.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("updates") as b:
        b.add_column(sa.Column("prior_cid", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("updates") as b:
        b.drop_column("prior_cid")
