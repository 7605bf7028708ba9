"""The provider's worker daemon (:class:`aitbc.worker.daemon.Worker`), in parts. Lowest
first, each importing only modules above it in this list: ``config``, ``peers`` (peer
transport), ``metrics``, ``progress``, ``threads``, ``records`` (what the parts hand each
other), ``attack``, ``calls`` (every request to the coordinator, and where replies are
read), ``fetcher`` (models and shards by CID), ``spot_checks``, ``gossip_peers``,
``cheats``, ``round_training`` (one round's update), ``sending`` (updates sent, overlap),
``gossip_publish``, ``gossip`` (a gossip job's rounds), ``job_loop``, ``daemon``."""
