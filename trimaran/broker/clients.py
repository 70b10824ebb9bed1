"""Every open client connection, whatever its protocol: what the admin API lists and kicks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from trimaran.vhosts import DEFAULT_VHOST


class Client(Protocol):
    """A connected client as the registry holds it: the MQTT hull itself (an object of its own
    would be about 100 bytes of every idle device, issue #47), or a :class:`ClientInfo`."""

    serial: int  # the registry's number of it, set when it is added: its key's, never reused
    since_ms: int  # when it was added, epoch ms
    slot: int  # its index in the registry's list; -1 when not in it

    @property
    def client_id(self) -> str: ...  # MQTT client id, AMQP 1.0 container id, AMQP 0.9.1 connection name

    @property
    def protocol(self) -> str: ...  # a trimaran.broker.message.PROTOCOL_* value

    @property
    def user(self) -> str | None: ...

    @property
    def vhost(self) -> str: ...  # the vhost it logged in to (trimaran/vhosts.py)

    @property
    def peer(self) -> str: ...  # ``host:port``

    def kick(self) -> None:
        """Close it, protocol-correctly, from outside its tasks."""


@dataclass(slots=True, eq=False)
class ClientInfo:
    """The registry's record of a client whose connection does not carry one itself (AMQP)."""

    client_id: str
    protocol: str
    user: str | None
    # What kick() calls with ``conn``: one function serves every client of a protocol, where a
    # closure or partial per client would cost an idle connection ~250 bytes (issue #47).
    closer: Callable[[Any], None]
    conn: Any  # the protocol's connection object: its ``peer`` is the client's address
    vhost: str = DEFAULT_VHOST
    since_ms: int = 0
    serial: int = 0  # (ints: compiled, fields rather than objects)
    slot: int = -1

    @property
    def peer(self) -> str:
        """Asked of the connection (not kept: 64 bytes of every client, issue #47)."""
        peer: str = self.conn.peer
        return peer

    def kick(self) -> None:
        self.closer(self.conn)


def client_key(client: Client) -> str:
    """Unique among connected clients: what the admin API names it by (``mqtt-12``)."""
    return f"{client.protocol}-{client.serial}"


def client_json(client: Client) -> dict[str, object]:
    return {
        "id": client_key(client),
        "client_id": client.client_id,
        "protocol": client.protocol,
        "address": client.peer,
        "user": client.user,
        "connected_at_ms": client.since_ms,
        "vhost": client.vhost,
    }


class ClientRegistry:
    """The connected clients: a list in which each holds its index (``Client.slot``), as a dict by
    serial would cost every client some 70 bytes (its entry and the serial's int) and this 16
    (issue #47). Found by key with a scan: only the admin API asks."""

    def __init__(self) -> None:
        self._clients: list[Client] = []
        self._serial = 0
        self._by_protocol: dict[str, int] = {}  # kept as clients come and go: read every few seconds

    def add(self, client: Client) -> None:
        self._serial += 1
        client.serial = self._serial
        client.since_ms = time.time_ns() // 1_000_000
        client.slot = len(self._clients)
        self._clients.append(client)
        self._by_protocol[client.protocol] = self._by_protocol.get(client.protocol, 0) + 1

    def remove(self, client: Client) -> bool:
        """False if ``client`` was not registered (never, or removed already)."""
        clients, at = self._clients, client.slot
        if at < 0 or at >= len(clients) or clients[at] is not client:
            return False
        last = clients.pop()  # the last one takes its place
        if last is not client:
            clients[at] = last
            last.slot = at
        client.slot = -1
        self._by_protocol[client.protocol] -= 1
        return True

    def get(self, key: str) -> Client | None:
        """The client named ``key`` (``client_key``: its protocol and serial)."""
        protocol, _, serial = key.rpartition("-")
        if not serial.isdigit():
            return None
        number = int(serial)
        for client in self._clients:
            if client.serial == number:
                return client if client.protocol == protocol else None
        return None

    def __iter__(self) -> Iterator[Client]:
        return iter(list(self._clients))  # a copy: kicking one changes the list

    def __len__(self) -> int:
        return len(self._clients)

    def count_by_protocol(self) -> dict[str, int]:
        return {protocol: n for protocol, n in self._by_protocol.items() if n}
