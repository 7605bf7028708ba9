"""The round lifecycle: the round driver's threads, a round's opening, aggregation and commit
(``lifecycle``), gossip rounds, and the provider's use-cases (offers, heartbeats, jobs,
updates). Imports ``verification`` and everything below it."""
