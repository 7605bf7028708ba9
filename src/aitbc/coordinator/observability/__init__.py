"""The coordinator's Prometheus metrics. Imports only ``store``."""
