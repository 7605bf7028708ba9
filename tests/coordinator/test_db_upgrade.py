"""A database made before columns were added keeps working: they are added in place."""

from __future__ import annotations

from sqlalchemy import text

from aitbc.coordinator.db import add_new_columns, make_engine


def test_missing_columns_are_added_with_their_defaults(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:  # the shape of an earlier version's database, with one run in it
        for table, column in [
            ("runs", "control"),
            ("runs", "bonds_returned"),
            ("runs", "result_cid"),
            ("jobs", "seed"),
            ("offers", "failed_at"),
        ]:
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(text("ALTER TABLE contracts DROP COLUMN paid_manual"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN config"))
        conn.execute(
            text(
                "INSERT INTO runs (id, owner, owner_key, status, model_type, model_options, dataset_size, dataset_size_bytes, "
                "target_workers, seed, round, bytes_up, bytes_down, network, bond, escrowed, settled_round, finalized, "
                "created_at, updated_at) VALUES ('training_old', 'ait1x', 'k', 'complete', 'mlp', '{}', '1GB', 1, 2, 0, 3, "
                "0, 0, 'local', 0, 0, 3, 1, 0, 0)"
            )
        )
    engine.dispose()
    engine = make_engine(url)  # what a coordinator does at start
    with engine.connect() as conn:
        row = conn.execute(text("SELECT control, bonds_returned, result_cid FROM runs WHERE id = 'training_old'")).one()
        assert tuple(row) == ("automatic", 0, None)
        conn.execute(text("SELECT paid_manual, config FROM contracts, jobs LIMIT 1")).all()
    assert add_new_columns(engine) == []  # nothing left to add
