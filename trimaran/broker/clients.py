"""Every open client connection, whatever its protocol: what the admin API lists and kicks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trimaran.vhosts import DEFAULT_VHOST


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True, eq=False)
class ClientInfo:
    """One connected client. ``kick()`` closes it (protocol-correctly) from outside its tasks."""

    client_id: str  # MQTT client id, AMQP 1.0 container id, AMQP 0.9.1 connection name
    protocol: str  # a trimaran.broker.message.PROTOCOL_* value
    user: str | None
    # What kick() calls with ``conn``: one function serves every client of a protocol, where a
    # closure or partial per client would cost an idle connection ~250 bytes (issue #47).
    closer: Callable[[Any], None]
    conn: Any  # the protocol's connection object: its ``peer`` is the client's address
    vhost: str = DEFAULT_VHOST  # the vhost it logged in to (trimaran/vhosts.py)
    since_ms: int = field(default_factory=_now_ms)
    serial: int = 0  # the registry's number of it (an int: compiled, a field rather than an object)

    @property
    def peer(self) -> str:
        """``host:port``, asked of the connection (not kept: 64 bytes of every client, issue #47)."""
        peer: str = self.conn.peer
        return peer

    @property
    def key(self) -> str:
        """Unique among connected clients: what the admin API names it by."""
        return f"{self.protocol}-{self.serial}"

    def kick(self) -> None:
        self.closer(self.conn)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.key,
            "client_id": self.client_id,
            "protocol": self.protocol,
            "address": self.peer,
            "user": self.user,
            "connected_at_ms": self.since_ms,
            "vhost": self.vhost,
        }


class ClientRegistry:
    def __init__(self) -> None:
        self._clients: dict[int, ClientInfo] = {}  # by serial
        self._serial = 0
        self._by_protocol: dict[str, int] = {}  # kept as clients come and go: read every few seconds

    def add(self, client: ClientInfo) -> ClientInfo:
        self._serial += 1
        client.serial = self._serial
        self._clients[client.serial] = client
        self._by_protocol[client.protocol] = self._by_protocol.get(client.protocol, 0) + 1
        return client

    def remove(self, client: ClientInfo) -> bool:
        """False if ``client`` was not registered (never, or removed already)."""
        if self._clients.get(client.serial) is client:
            del self._clients[client.serial]
            self._by_protocol[client.protocol] -= 1
            return True
        return False

    def get(self, key: str) -> ClientInfo | None:
        """The client named ``key`` (``ClientInfo.key``: its protocol and serial)."""
        protocol, _, serial = key.rpartition("-")
        if not serial.isdigit():
            return None
        client = self._clients.get(int(serial))
        return client if client is not None and client.protocol == protocol else None

    def __iter__(self) -> Iterator[ClientInfo]:
        return iter(list(self._clients.values()))

    def __len__(self) -> int:
        return len(self._clients)

    def count_by_protocol(self) -> dict[str, int]:
        return {protocol: n for protocol, n in self._by_protocol.items() if n}
