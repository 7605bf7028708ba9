"""Money on a public chain: the contracts, the node and the client that the coordinator and
the CLI use beside the coordinator's own ledger (:mod:`aitbc.ledger`)."""
