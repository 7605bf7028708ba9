"""Verification of work: each update's commitment, spot check and verdict.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

On ``updates`` (all nullable or defaulted; updates before this revision were never
verified):

- ``proof``: the worker's commitment (digests of its training state every k steps);
- ``challenge``: the boundaries the coordinator asked it to reveal, drawn after the update
  arrived;
- ``revealed``: boundary -> the CID of the state blob the worker uploaded;
- ``verification``: unchecked | challenged | revealed | passed | failed | unanswered
  (None: the run does not verify);
- ``verify_detail``, ``verify_steps`` (local steps re-run), ``verify_seconds``.

On ``jobs``: ``previous_config`` and ``config_at``, the job's config before the owner's last
change and when it changed (a round under way then was trained with either, and the check
re-runs what the worker used).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPDATES: tuple[sa.Column[Any], ...] = (
    sa.Column("proof", sa.JSON(), nullable=True),
    sa.Column("challenge", sa.JSON(), nullable=True),
    sa.Column("revealed", sa.JSON(), nullable=True),
    sa.Column("verification", sa.String(16), nullable=True),
    sa.Column("verify_detail", sa.Text(), nullable=True),
    sa.Column("verify_steps", sa.Integer(), nullable=True),
    sa.Column("verify_seconds", sa.Float(), nullable=True),
)


JOBS: tuple[sa.Column[Any], ...] = (
    sa.Column("previous_config", sa.JSON(), nullable=True),
    sa.Column("config_at", sa.Float(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("updates") as b:
        for c in UPDATES:
            b.add_column(c)
    with op.batch_alter_table("jobs") as b:
        for c in JOBS:
            b.add_column(c)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        for c in reversed(JOBS):
            b.drop_column(c.name)
    with op.batch_alter_table("updates") as b:
        for c in reversed(UPDATES):
            b.drop_column(c.name)
