"""aitbc: train one PyTorch model across many GPU providers that do not trust each other."""

__version__ = "0.1.0"
