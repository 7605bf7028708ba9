"""The coordinator's database: its tables (models), the run config stored with a run, every
recorded state and the run's state machine, sessions and the schema's migrations, the lookups
and row locks every use-case shares, the driver lease and replay nonces. It imports nothing of
the coordinator but ``errors``."""
