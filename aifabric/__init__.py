"""aifabric: a lab for the RoCE backend networks that train large models."""

__version__ = "0.1.0"
