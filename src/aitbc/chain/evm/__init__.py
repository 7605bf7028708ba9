"""The EVM backend: contracts compiled from ``contracts/``, a local development node
(Foundry's anvil), and a JSON-RPC client that deploys, calls, sends and reads events."""
