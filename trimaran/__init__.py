"""Trimaran: a multi-protocol messaging server."""

__version__ = "0.1.0"
