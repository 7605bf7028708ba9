"""How blobs move in and out of the coordinator: upload slots and pace per signer, and peer
transport (which workers hold which blobs). Imports only ``store`` and ``errors``."""
