"""What a shovel (``shovel.py``) and its remote ends (``amqp091.py``, ``amqp1.py``) know of each
other: the end drives a client machine for the shovel and calls it back."""

from __future__ import annotations

from typing import Protocol

from trimaran.bridges.link import Machine
from trimaran.broker.message import Message
from trimaran.config import ShovelSettings


class Shoveller(Protocol):
    """The shovel, as its remote end sees it."""

    settings: ShovelSettings
    outward: bool  # this broker is the source: the end sends
    confirming: bool  # ack_mode on-confirm
    client_id: str  # the connection's name (AMQP 1.0: its container id)
    name: str
    vhost_prefix: str

    @property
    def id(self) -> str: ...

    def local_topic(self, routing_key: str) -> str:
        """Where a message from the remote goes here."""
        ...

    def loop_time(self) -> float: ...

    def end_ready(self) -> None:
        """Set up: connected, declared, consuming or confirming."""
        ...

    def end_took(self, message: Message, tag: int) -> None:
        """A message from the remote, its topic here set; acknowledged once it is here."""
        ...

    def end_settled(self, tag: int, outcome: str | None) -> None:
        """The remote settled a message sent to it: None accepted, "released" to send again,
        else why it refused it."""
        ...

    def end_closed(self, reason: str) -> None:
        """The connection closed (``reason`` says why)."""
        ...


class ClientMachine(Machine, Protocol):
    """What the ends ask of their client machine (``amqp091/client.py``, ``amqp1/client.py``)."""

    @property
    def closed(self) -> bool: ...

    def receive_data(self, data: bytes, now: float) -> None: ...

    def receive_eof(self, why: str | None = None) -> None: ...


class MachineEnd:
    """A remote end's feeding of its machine: each input, then the events it made (``_events``)."""

    machine: ClientMachine

    def receive(self, data: bytes, now: float) -> None:
        self.machine.receive_data(data, now)
        self._events()

    def eof(self, why: str | None) -> None:
        if not self.machine.closed:
            self.machine.receive_eof(why)
            self._events()

    def tick(self, now: float) -> None:
        self.machine.tick(now)
        self._events()

    def data_to_send(self) -> bytes:
        return self.machine.data_to_send()

    def next_deadline(self) -> float | None:
        return self.machine.next_deadline()

    def _events(self) -> None:
        raise NotImplementedError


class RemoteEnd(Protocol):
    """The remote half of a shovel over one connection: a client machine and the shovel's use of it."""

    ready: bool  # set up: messages may flow

    def receive(self, data: bytes, now: float) -> None: ...

    def eof(self, why: str | None) -> None: ...

    def tick(self, now: float) -> None: ...

    def data_to_send(self) -> bytes: ...

    def next_deadline(self) -> float | None: ...

    def window(self) -> int:
        """How many more messages the remote takes now (its credit, or no bound but the shovel's)."""
        ...

    def send(self, message: Message, mark: str, now: float) -> int:
        """Send ``message`` with its new shovel mark; the tag its outcome will name."""
        ...

    def accept(self, tags: list[int], now: float) -> None:
        """Acknowledge these received messages (in order) to the remote."""
        ...

    def close(self, now: float) -> None: ...
