"""Gossip runs: the workers' signed model records and the consensus spread.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

- ``updates.record``: a gossip record as the worker signed it (``{"record": ..., "signature": ...}``);
  a gossip run's ``updates`` rows are its workers' published models, one per worker and round.
- ``updates.val_loss``: the coordinator's validation loss of that published model.
- ``rounds.spread``: mean L2 distance of the round's kept models to their mean.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("updates") as b:
        b.add_column(sa.Column("record", sa.JSON(), nullable=True))
        b.add_column(sa.Column("val_loss", sa.Float(), nullable=True))
    with op.batch_alter_table("rounds") as b:
        b.add_column(sa.Column("spread", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as b:
        b.drop_column("spread")
    with op.batch_alter_table("updates") as b:
        b.drop_column("val_loss")
        b.drop_column("record")
