"""Who is connected, whatever the protocol, kept in one place.

A client that connects is in the registry the admin API lists and kicks, in the ``$SYS`` client
counters, and in a ``client.connected`` event; when it goes, all three say so once. The hulls call
:meth:`Presence.arrived` when a login is accepted and :meth:`Presence.left` when the connection is
gone: the counters are the registry's, so they cannot drift apart however a connection ends (a
takeover, a kick, a reset, a node handing a session over).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trimaran.broker.clients import Client, ClientRegistry
from trimaran.broker.events import CLIENT_CONNECTED, CLIENT_DISCONNECTED, EventBus

if TYPE_CHECKING:
    from trimaran.broker.stats import Stats


class Presence:
    __slots__ = ("_clients", "_events", "_stats")

    def __init__(self, clients: ClientRegistry, stats: Stats, events: EventBus) -> None:
        self._clients = clients
        self._stats = stats
        self._events = events

    def arrived(self, client: Client, **details: Any) -> None:
        """``client`` logged in: registered, counted, and ``client.connected`` with ``details``."""
        self._clients.add(client)
        self._stats.client_connected()
        if self._events.wants(CLIENT_CONNECTED):
            self._events.client_info(CLIENT_CONNECTED, client, **details)

    def left(self, client: Client | None, **details: Any) -> None:
        """``client``'s connection is gone (nothing if it never arrived, or already left)."""
        if client is None or not self._clients.remove(client):
            return
        self._stats.client_disconnected()
        if self._events.wants(CLIENT_DISCONNECTED):
            self._events.client_info(CLIENT_DISCONNECTED, client, **details)
