"""Signed requests' nonces, shared by the replicas on one PostgreSQL database.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

- ``seen_nonces``: each signed request's nonce until its timestamp plus the replay window
  (``coordinator/store/nonces.py``): a captured request replayed to another replica is refused.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "seen_nonces",
        sa.Column("nonce", sa.String(32), primary_key=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_seen_nonces_expires_at", "seen_nonces", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_seen_nonces_expires_at", table_name="seen_nonces")
    op.drop_table("seen_nonces")
