"""The provider's worker daemon (see :mod:`aitbc.worker.daemon`)."""
