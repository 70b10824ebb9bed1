"""SASL layer of AMQP 1.0 (part 5 "security", section 5.3) for the server side.

The server offers its mechanisms, reads ``sasl-init`` and hands the credentials to the
caller as an event; the caller's verdict becomes the ``sasl-outcome`` code. Supported
mechanisms: ``ANONYMOUS`` (RFC 4505, the initial response is an optional trace string) and
``PLAIN`` (RFC 4616, ``authzid NUL authcid NUL passwd``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "ANONYMOUS",
    "PLAIN",
    "SUPPORTED_MECHANISMS",
    "Credentials",
    "SaslCode",
    "parse_initial_response",
]

ANONYMOUS = "ANONYMOUS"
PLAIN = "PLAIN"
EXTERNAL = "EXTERNAL"  # RFC 4422: the identity the TLS client certificate proved
SUPPORTED_MECHANISMS = (PLAIN, ANONYMOUS, EXTERNAL)


class SaslCode(enum.IntEnum):
    """``sasl-outcome`` codes."""

    OK = 0
    AUTH = 1  # authentication failed: bad credentials
    SYS = 2  # system error, unspecified
    SYS_PERM = 3  # system error, permanent
    SYS_TEMP = 4  # system error, transient


@dataclass(frozen=True, slots=True)
class Credentials:
    mechanism: str
    username: str | None  # None for ANONYMOUS
    password: str | None
    authzid: str | None
    trace: str | None = None  # ANONYMOUS trace information


class SaslParseError(ValueError):
    pass


def parse_initial_response(mechanism: str, response: bytes | None) -> Credentials:
    """Credentials from a sasl-init; raises ``SaslParseError`` for a malformed response."""
    if mechanism == ANONYMOUS:
        trace = None
        if response:
            trace = response.decode("utf-8", "replace")
        return Credentials(ANONYMOUS, None, None, None, trace)
    if mechanism == PLAIN:
        if response is None:
            raise SaslParseError("PLAIN needs an initial response")
        parts = response.split(b"\x00")
        if len(parts) != 3 or not parts[1]:
            raise SaslParseError("PLAIN response is not authzid NUL authcid NUL passwd")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise SaslParseError("PLAIN response is not UTF-8") from None
        return Credentials(PLAIN, user, password, authzid or None)
    if mechanism == EXTERNAL:
        requested = response.decode("utf-8", "replace") if response else ""
        return Credentials(EXTERNAL, None, None, requested or None)
    raise SaslParseError(f"unsupported mechanism {mechanism}")
