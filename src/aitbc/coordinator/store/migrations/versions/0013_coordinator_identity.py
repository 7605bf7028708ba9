"""The coordinator's identity.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

- ``coordinator_identity``: one row, the id of the coordinator this database is (every
  replica serving it answers with it in ``/v1/health``). Drawn once, here, so a database
  upgraded in place keeps its runs under one id from now on. A client that remembered a
  run's coordinator by URL finds it again by this id when the URL changes (a local stack
  restarted on another port), and never takes another coordinator's run for it.
"""

from __future__ import annotations

import secrets
import time

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "coordinator_identity",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(table, [{"id": f"coordinator_{secrets.token_hex(8)}", "created_at": time.time()}])


def downgrade() -> None:
    op.drop_table("coordinator_identity")
