"""Owner-driven runs and measured job progress.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

- ``runs.manual_since``, ``runs.manual_from_round``: an automatic run its owner took over
  (its first phase move), and the first round the owner drives;
- ``runs.result_metrics``: the metrics the owner saved with the run's result;
- ``jobs.progress_round``, ``jobs.step``, ``jobs.progress_at``, ``jobs.speed``: the round and
  step of a worker's last progress report, when it came, and the speed measured from them.

Every new column is nullable (None: not yet known), so existing rows need no value.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

RUNS: tuple[sa.Column[Any], ...] = (
    sa.Column("result_metrics", sa.JSON(), nullable=True),
    sa.Column("manual_since", sa.Float(), nullable=True),
    sa.Column("manual_from_round", sa.Integer(), nullable=True),
)
JOBS: tuple[sa.Column[Any], ...] = (
    sa.Column("progress_round", sa.Integer(), nullable=True),
    sa.Column("step", sa.Integer(), nullable=True),
    sa.Column("progress_at", sa.Float(), nullable=True),
    sa.Column("speed", sa.Float(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        for c in RUNS:
            b.add_column(c)
    with op.batch_alter_table("jobs") as b:
        for c in JOBS:
            b.add_column(c)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        for c in reversed(JOBS):
            b.drop_column(c.name)
    with op.batch_alter_table("runs") as b:
        for c in reversed(RUNS):
            b.drop_column(c.name)
