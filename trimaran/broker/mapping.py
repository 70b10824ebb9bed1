"""Pieces of the protocol mappings (``amqp091/mapping.py``, ``amqp1/mapping.py``) that every front end
turns the same way into the broker's :class:`~trimaran.broker.message.Message`."""

from __future__ import annotations

__all__ = ["property_text"]


def property_text(value: object) -> str:
    """A typed header / application-property value as the text of an MQTT user property.

    Booleans are ``true``/``false``, bytes UTF-8 (undecodable bytes replaced). Subclasses of ``str``,
    ``int`` and ``float`` (the codecs' tagged wrapper types, which may have a repr of their own) print
    as their plain type; anything else as ``str(value)``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
