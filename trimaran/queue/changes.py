"""One unit of a queue's state changes: the rows that commit together and what runs after them.

Below the groups and the journal: the groups put their changes into it, the journal fills it with
rows (``journal.py``) and hands it to the writer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trimaran.storage.rows import WriteBatch


@dataclass(slots=True, init=False)
class Changes(WriteBatch):
    """One unit of state changes: the rows that commit together, and what runs once they have
    (``after``: dead letters becoming deliverable). It is the writer's batch itself, so a change
    allocates nothing more than a bare batch did (``after`` only when there is something to run)."""

    after: list[Callable[[], None]] | None

    def __init__(self) -> None:  # compiled, as WriteBatch's
        # Not super(): slots=True makes a new class, which the zero-argument form does not know.
        WriteBatch.__init__(self)
        self.after = None

    def then(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once these changes are committed (at once if they write nothing)."""
        if self.after is None:
            self.after = [callback]
        else:
            self.after.append(callback)
