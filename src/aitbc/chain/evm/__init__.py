"""The EVM backend: the contracts (Vyper sources in ``vy/``, compiled by :mod:`.contracts`),
a local development node (Foundry's anvil), and a JSON-RPC client that deploys, calls,
sends and reads events."""
