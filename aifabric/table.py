"""Plain-text tables for the terminal (the implementation is `analysis.table`, which the
analysis's text rendering uses too)."""

from analysis.table import render

__all__ = ["render"]
