"""Trimaran: a multi-protocol messaging server."""

from trimaran import compiled as _compiled

__version__ = "0.1.0"

_compiled.honour_environment()  # before any hot module is imported (trimaran/compiled.py)
