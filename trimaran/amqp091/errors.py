"""AMQP 0-9-1 reply codes and the errors of the codec and the machine: the ground floor of the
package, importing nothing of it, so that :mod:`~trimaran.amqp091.fields` and
:mod:`~trimaran.amqp091.spec` both raise them without importing each other.
:mod:`~trimaran.amqp091.spec` re-exports every name, and callers keep using ``spec.ProtocolError``.
"""

from dataclasses import dataclass

__all__ = [
    "ACCESS_REFUSED",
    "CHANNEL_ERROR",
    "COMMAND_INVALID",
    "CONNECTION_FORCED",
    "CONTENT_TOO_LARGE",
    "FRAME_ERROR",
    "INTERNAL_ERROR",
    "INVALID_PATH",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_IMPLEMENTED",
    "NO_CONSUMERS",
    "NO_ROUTE",
    "PRECONDITION_FAILED",
    "REPLY_CODES",
    "REPLY_SUCCESS",
    "RESOURCE_ERROR",
    "RESOURCE_LOCKED",
    "SYNTAX_ERROR",
    "UNEXPECTED_FRAME",
    "AMQPError",
    "EncodeError",
    "LocalProtocolError",
    "ProtocolError",
    "ReplyCode",
    "is_connection_exception",
    "truncate_shortstr",
]

# Reply codes. "Soft" codes are channel exceptions, "hard" codes connection exceptions.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541


@dataclass(frozen=True, slots=True)
class ReplyCode:
    code: int
    text: str
    #: True for a connection exception ("hard error"), False for a channel exception ("soft error").
    #: 200 and the 31x codes are used by channel.close / basic.return and are not errors as such.
    connection: bool


REPLY_CODES: dict[int, ReplyCode] = {
    rc.code: rc
    for rc in (
        ReplyCode(REPLY_SUCCESS, "REPLY_SUCCESS", False),
        ReplyCode(CONTENT_TOO_LARGE, "CONTENT_TOO_LARGE", False),
        ReplyCode(NO_ROUTE, "NO_ROUTE", False),
        ReplyCode(NO_CONSUMERS, "NO_CONSUMERS", False),
        ReplyCode(CONNECTION_FORCED, "CONNECTION_FORCED", True),
        ReplyCode(INVALID_PATH, "INVALID_PATH", True),
        ReplyCode(ACCESS_REFUSED, "ACCESS_REFUSED", False),
        ReplyCode(NOT_FOUND, "NOT_FOUND", False),
        ReplyCode(RESOURCE_LOCKED, "RESOURCE_LOCKED", False),
        ReplyCode(PRECONDITION_FAILED, "PRECONDITION_FAILED", False),
        ReplyCode(FRAME_ERROR, "FRAME_ERROR", True),
        ReplyCode(SYNTAX_ERROR, "SYNTAX_ERROR", True),
        ReplyCode(COMMAND_INVALID, "COMMAND_INVALID", True),
        ReplyCode(CHANNEL_ERROR, "CHANNEL_ERROR", True),
        ReplyCode(UNEXPECTED_FRAME, "UNEXPECTED_FRAME", True),
        ReplyCode(RESOURCE_ERROR, "RESOURCE_ERROR", False),
        ReplyCode(NOT_ALLOWED, "NOT_ALLOWED", True),
        ReplyCode(NOT_IMPLEMENTED, "NOT_IMPLEMENTED", True),
        ReplyCode(INTERNAL_ERROR, "INTERNAL_ERROR", True),
    )
}


def truncate_shortstr(text: str) -> str:
    """Cut ``text`` to what fits a shortstr (255 bytes of UTF-8), at a character boundary."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= 255:
        return text
    return raw[:255].decode("utf-8", "ignore")


def is_connection_exception(reply_code: int) -> bool:
    """True if ``reply_code`` must be raised with connection.close (unknown codes count as hard)."""
    rc = REPLY_CODES.get(reply_code)
    return True if rc is None else rc.connection


# --------------------------------------------------------------------------------------------
# Errors


class AMQPError(Exception):
    """Base of the errors raised by this package."""


class ProtocolError(AMQPError):
    """The peer broke the protocol. Carries what to answer with.

    ``reply_text`` is prefixed with the reply code's name RabbitMQ-style when sent
    (``"FRAME_ERROR - ..."``). ``class_id``/``method_id`` name the offending method, if any.
    ``channel`` is where it happened (0 for connection-level problems).
    """

    def __init__(
        self,
        reply_code: int,
        reply_text: str,
        *,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        super().__init__(reply_code, reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id

    @property
    def connection_exception(self) -> bool:
        return is_connection_exception(self.reply_code)

    @property
    def full_text(self) -> str:
        rc = REPLY_CODES.get(self.reply_code)
        name = rc.text if rc is not None else str(self.reply_code)
        return truncate_shortstr(f"{name} - {self.reply_text}")

    def __str__(self) -> str:
        return f"{self.reply_code} {self.full_text}"


class LocalProtocolError(AMQPError):
    """We (the caller of this package) tried something the protocol or the state forbids."""


class EncodeError(LocalProtocolError, ValueError):
    """A value cannot be encoded (string too long, integer out of range, unsupported type)."""
