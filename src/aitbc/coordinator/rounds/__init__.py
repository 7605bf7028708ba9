"""The rounds of live runs: the round driver's threads (``driver``), a round's opening and
evaluation (``lifecycle``), its aggregation (``aggregation``) and record (``commit``), the run
modes that decide when a round is due, how it closes and what an update must be
(``modes``: sync, async, gossip), gossip's records and close (``gossip``, ``gossip_close``),
and the provider's use-cases (``workers``: offers, heartbeats, job views, progress;
``submission``, ``admission``, ``jobs``: updates). Imports ``verification`` and everything below it."""
