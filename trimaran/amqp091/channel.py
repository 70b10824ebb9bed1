"""Per-channel state for the server side: open/closing and the content assembler.

A content-carrying method (basic.publish from a client) must be followed on the same channel by
exactly one content header of the same class and then body frames until the header's body size
is reached, with no other frame of that channel in between (other channels may interleave).
Anything else is a connection exception: 505 UNEXPECTED_FRAME for a frame out of order, 501
FRAME_ERROR for a body longer than announced. A body larger than ``max_body_size`` is a channel
exception, 406 PRECONDITION_FAILED, as in RabbitMQ.
"""

import enum

from trimaran.amqp091.frames import BodyFrame, HeaderFrame
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.spec import (
    FRAME_ERROR,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    Method,
    ProtocolError,
)

#: RabbitMQ's default max_message_size.
DEFAULT_MAX_BODY_SIZE = 128 * 1024 * 1024


class ChannelState(enum.Enum):
    OPEN = "open"
    #: We sent channel.close; everything but channel.close/close-ok is discarded until close-ok.
    CLOSING = "closing"


class ContentState(enum.Enum):
    AWAIT_METHOD = 0
    AWAIT_HEADER = 1
    AWAIT_BODY = 2


Content = tuple[Method, BasicProperties, bytes]


class Channel:
    __slots__ = (
        "_body_size",
        "_chunks",
        "_method",
        "_properties",
        "_received",
        "close_reason",
        "content_state",
        "flow_active",
        "max_body_size",
        "number",
        "state",
    )

    def __init__(self, number: int, max_body_size: int = DEFAULT_MAX_BODY_SIZE) -> None:
        self.number = number
        self.state = ChannelState.OPEN
        #: False after the client sent channel.flow(active=False): hold back content until True.
        self.flow_active = True
        #: (reply_code, reply_text, class_id, method_id) of the channel.close we sent, if any.
        self.close_reason: tuple[int, str, int, int] | None = None
        self.max_body_size = max_body_size
        self.content_state = ContentState.AWAIT_METHOD
        self._method: Method | None = None
        self._properties: BasicProperties | None = None
        self._body_size = 0
        self._received = 0
        self._chunks: list[bytes] = []

    def __repr__(self) -> str:
        return f"<Channel {self.number} {self.state.value} {self.content_state.name}>"

    # -- content assembly -------------------------------------------------------------------

    def begin_content(self, method: Method) -> None:
        """``method`` carries content: a header must come next."""
        self._method = method
        self.content_state = ContentState.AWAIT_HEADER

    def on_header(self, frame: HeaderFrame) -> Content | None:
        method = self._method
        if self.content_state is not ContentState.AWAIT_HEADER or method is None:
            raise self._unexpected("content header")
        if frame.class_id != method.CLASS_ID:
            raise self._unexpected(f"content header for class {frame.class_id}", method)
        if frame.body_size > self.max_body_size:
            self.reset_content()
            raise ProtocolError(
                PRECONDITION_FAILED,
                f"message size {frame.body_size} is larger than max size {self.max_body_size}",
                channel=self.number,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if frame.body_size == 0:
            self.reset_content()
            return method, frame.properties, b""
        self._properties = frame.properties
        self._body_size = frame.body_size
        self._received = 0
        self.content_state = ContentState.AWAIT_BODY
        return None

    def on_body(self, frame: BodyFrame) -> Content | None:
        if self.content_state is not ContentState.AWAIT_BODY:
            raise self._unexpected("content body", self._method)
        payload = frame.payload
        received = self._received + len(payload)
        if received > self._body_size:
            method = self._method
            raise ProtocolError(
                FRAME_ERROR,
                f"content body of {received} bytes exceeds the announced {self._body_size}",
                channel=self.number,
                class_id=method.CLASS_ID if method else 0,
                method_id=method.METHOD_ID if method else 0,
            )
        if received < self._body_size:
            self._chunks.append(payload)
            self._received = received
            return None
        chunks = self._chunks
        if chunks:
            chunks.append(payload)
            body = b"".join(chunks)
        else:
            body = payload
        method, props = self._method, self._properties
        assert method is not None and props is not None
        self.reset_content()
        return method, props, body

    def reset_content(self) -> None:
        self.content_state = ContentState.AWAIT_METHOD
        self._method = None
        self._properties = None
        self._body_size = self._received = 0
        if self._chunks:
            self._chunks = []

    def unexpected_method(self, what: str) -> ProtocolError:
        """The error for a method frame arriving while content is still expected."""
        return self._unexpected(what, self._method)

    def _unexpected(self, what: str, method: Method | None = None) -> ProtocolError:
        if self.content_state is ContentState.AWAIT_HEADER:
            expected = "content header"
        elif self.content_state is ContentState.AWAIT_BODY:
            expected = "content body"
        else:
            expected = "method frame"
        return ProtocolError(
            UNEXPECTED_FRAME,
            f"expected {expected}, got {what} on channel {self.number}",
            channel=self.number,
            class_id=method.CLASS_ID if method else 0,
            method_id=method.METHOD_ID if method else 0,
        )
