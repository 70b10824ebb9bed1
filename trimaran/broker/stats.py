"""The deck's counters: one ``Stats`` the broker owns and the hulls, the presence registry and
$SYS read and bump."""

from __future__ import annotations

from trimaran.broker.drops import Drops
from trimaran.traffic import Traffic


class Stats(Traffic):
    """Counters for $SYS and metrics; plain attributes because they change per message. The
    runtime adds every connection's bytes to the ``Traffic`` ones."""

    __slots__ = (
        "clients_connected",
        "clients_maximum",
        "clients_total",
        "drops",
        "messages_sent",
        "publish_routed",
    )

    def __init__(self) -> None:
        super().__init__()
        self.messages_sent = 0
        self.drops = Drops()  # messages dropped, by reason and vhost
        self.clients_connected = 0
        self.clients_maximum = 0
        self.clients_total = 0
        self.publish_routed = 0

    @property
    def messages_dropped(self) -> int:
        return self.drops.total

    def client_connected(self) -> None:
        self.clients_connected += 1
        self.clients_total += 1
        if self.clients_connected > self.clients_maximum:
            self.clients_maximum = self.clients_connected

    def client_disconnected(self) -> None:
        self.clients_connected -= 1
