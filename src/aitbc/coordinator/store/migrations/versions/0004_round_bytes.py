"""The bytes each round moved and its training accuracy (the dashboard's and the report's
bytes per round and training accuracy).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

- ``rounds.bytes_up``: the bytes of the updates the round received (accepted or not);
- ``rounds.bytes_down``: the global model's checkpoint once per answering worker (each
  answer began with a download of the model), as ``runs.bytes_down`` counts it;
- ``updates.train_accuracy``, ``rounds.train_accuracy``: the share of its round's training
  samples a worker's model predicted right, as the worker reports it, and the round's mean
  over its accepted updates (classifiers; None for language data).

All nullable: rounds recorded before this revision did not count them (None: unknown).

And ``ix_scores_contract_id``: the payment views read a contract's scores, which had no
index leading with ``contract_id`` (one scan of every run's scores per contract).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ROUNDS: tuple[sa.Column[Any], ...] = (
    sa.Column("bytes_up", sa.BigInteger(), nullable=True),
    sa.Column("bytes_down", sa.BigInteger(), nullable=True),
    sa.Column("train_accuracy", sa.Float(), nullable=True),
)
UPDATES: tuple[sa.Column[Any], ...] = (sa.Column("train_accuracy", sa.Float(), nullable=True),)


def upgrade() -> None:
    with op.batch_alter_table("rounds") as b:
        for c in ROUNDS:
            b.add_column(c)
    with op.batch_alter_table("updates") as b:
        for c in UPDATES:
            b.add_column(c)
    op.create_index("ix_scores_contract_id", "scores", ["contract_id"])


def downgrade() -> None:
    op.drop_index("ix_scores_contract_id", table_name="scores")
    with op.batch_alter_table("updates") as b:
        for c in reversed(UPDATES):
            b.drop_column(c.name)
    with op.batch_alter_table("rounds") as b:
        for c in reversed(ROUNDS):
            b.drop_column(c.name)
