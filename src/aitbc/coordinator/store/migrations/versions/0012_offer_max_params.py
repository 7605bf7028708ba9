"""The largest model an offer trains.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

- ``offers.max_params``: the parameters the provider's device can train (derived from its
  memory, or its operator's ``--max-params``; aitbc.market.capacity). Hiring passes over an
  offer that is too small for a run. None (every offer registered before this column, and a
  device whose memory is unknown): no stated limit, so the offer takes any run; the worker
  itself refuses a job it cannot build, and an offer states its limit when it registers again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("offers") as b:
        b.add_column(sa.Column("max_params", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("offers") as b:
        b.drop_column("max_params")
