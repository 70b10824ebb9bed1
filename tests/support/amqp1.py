"""Typed access to python-qpid-proton message bodies and links for AMQP 1.0 interop tests.

proton annotates ``Message.body`` as a wide union (and leaves out ``memoryview``, which is what it
actually returns for a binary body, valid only while the Message lives). These helpers check the
body's kind at run time, so a test that expects binary or text fails clearly on anything else.
proton is only imported for type checking: tests that use it still skip cleanly without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from proton import Message


def body_bytes(message: Message) -> bytes:
    """The binary body of ``message`` as bytes (a copy, so it outlives the message)."""
    body: object = message.body
    assert isinstance(body, bytes | memoryview), f"expected a binary body, got {body!r}"
    return bytes(body)


def body_str(message: Message) -> str:
    """The text body of ``message``."""
    body: object = message.body
    assert isinstance(body, str), f"expected a text body, got {body!r}"
    return body


def close_link(link: Any) -> None:
    """BlockingLink.close, which proton leaves unannotated."""
    cast(Callable[[], None], link.close)()
