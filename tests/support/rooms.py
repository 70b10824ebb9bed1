"""Which rooms (modules of ``trimaran/``) a piece of work passes through, and in which order.

A room is entered when a Python function of one module of ``trimaran/`` is called from anywhere
but that module: from another room, or from outside the package (the event loop running a
callback, the test itself). Building a value is not entering its room: an ``__init__``, generated
by a dataclass or written out (so that mypyc compiles it), counts as its caller's.
Calls inside a room, and calls into the standard library or third parties, are not entries. An
entry from outside the package starts a new *leg*: one publish has a leg for the call itself, one
for the end of the loop's turn, one for the commit's callback.

``RoomTrace`` records the entries of the thread it is started on (``sys.setprofile``), so it sees
the event loop's work and none of the storage writer's thread.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trimaran

PACKAGE = Path(trimaran.__file__).resolve().parent


def room_of(filename: str) -> str | None:
    """``queue/manager`` for ``.../trimaran/queue/manager.py``; None outside the package."""
    try:
        relative = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return relative.with_suffix("").as_posix()


@dataclass
class Entry:
    room: str
    function: str
    came_from: str | None  # the caller's room; None: from outside the package (a leg begins)

    @property
    def from_outside(self) -> bool:
        return self.came_from is None

    def __str__(self) -> str:
        return f"{self.room}({self.function})"


@dataclass
class RoomTrace:
    entries: list[Entry] = field(default_factory=list)
    _rooms: dict[str, str | None] = field(default_factory=dict)

    def _room(self, code: types.CodeType) -> str | None:
        filename = code.co_filename
        room = self._rooms.get(filename, "")
        if room == "":
            room = self._rooms[filename] = room_of(filename)
        return room

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        room = self._room(code)
        if room is None or code.co_name == "__init__":
            return
        caller = frame.f_back
        while caller is not None and (
            caller.f_code.co_filename.startswith("<") or caller.f_code.co_name == "__init__"
        ):
            caller = caller.f_back  # an __init__ (a dataclass's is ``<string>``) is its caller's
        came_from = None if caller is None else self._room(caller.f_code)
        if came_from != room:
            self.entries.append(Entry(room, frame.f_code.co_name, came_from))

    @contextmanager
    def running(self) -> Iterator[RoomTrace]:
        """Record this thread's entries inside the ``with`` block."""
        previous = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            yield self
        finally:
            sys.setprofile(previous)

    def legs(self) -> list[list[Entry]]:
        """The entries cut where the work came back from outside the package."""
        legs: list[list[Entry]] = []
        for entry in self.entries:
            if entry.from_outside or not legs:
                legs.append([])
            legs[-1].append(entry)
        return legs

    def rooms_entered_twice(self, leg: list[Entry]) -> list[str]:
        seen: set[str] = set()
        twice: list[str] = []
        for entry in leg:
            if entry.room in seen and entry.room not in twice:
                twice.append(entry.room)
            seen.add(entry.room)
        return twice

    def describe(self) -> str:
        return "\n".join(" -> ".join(map(str, leg)) for leg in self.legs())
