"""The coordinator database's versioned schema (alembic): ``env.py`` and ``versions/``.

:func:`aitbc.coordinator.store.db.upgrade_database` runs them at every start; nothing here is
imported as a module by the coordinator itself (alembic loads the files by path).
"""
