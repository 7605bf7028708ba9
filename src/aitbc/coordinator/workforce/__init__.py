"""Who trains a run: hiring from the market, jobs on shards, leases, replacements, joiners and
releases. Imports ``money`` and everything below it."""
