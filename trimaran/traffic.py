"""The byte and message counters every connection adds to: the runtime counts bytes, the hulls
count publishes, $SYS and the metrics read them.

A class on the ground floor rather than a protocol of the runtime's: the broker's ``Stats`` is one,
and the runtime adds to it on every read and write. Compiled, an addition is to a field of the
object; through a protocol it was two lookups by name.
"""

from __future__ import annotations


class Traffic:
    __slots__ = ("bytes_received", "bytes_sent", "messages_received")

    def __init__(self) -> None:
        self.bytes_received = 0
        self.bytes_sent = 0
        self.messages_received = 0  # the hulls count each publish (a user's rate is charged from it)
