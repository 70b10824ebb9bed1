"""The login throttle: wrong passwords slow the next refusals of the same user from the same address,
and nobody else.

- Keyed by the user name and the source address together: one client guessing a user's password
  behind a NAT or a proxy slows its own guesses, never another user's login from that address, nor
  the same user's logins from elsewhere.
- Only refusals wait. The guard verifies a password first: a correct one is answered at once and
  forgets its key's failures (:meth:`Throttle.succeeded`); a wrong one is answered after
  :meth:`Throttle.failed`'s delay: ``initial_s`` after the first failure, twice as long after each
  further one, up to ``max_s``.
- What it does not do: since a correct password is answered at once, a guesser who gives up on an
  answer that does not come at once learns the same as from the refusal; nor does it slow guesses
  spread over many connections at once or over many user names. It spaces out a client that waits
  for its answers (most clients, and every library's retry loop); password strength and
  ``limits.accept_rate_per_address`` / ``max_connections_per_address`` do the rest.
- Every refusal is the protocol's refusal: ``max_s`` is at most :data:`HANDSHAKE_SHARE` of the
  shortest handshake deadline (:func:`ceiling`), so the answer leaves long before the connection's
  handshake timer could drop the socket unanswered.
- Bounded memory: a key with no failure for :data:`FORGET_S` is forgotten (the oldest are dropped as
  new failures arrive, so an idle table empties itself), and at most :data:`MAX_KEYS` keys are kept
  (the oldest go first).

Standard library only; the clock is the caller's (``time.monotonic`` unless a test hands another).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["FORGET_S", "HANDSHAKE_SHARE", "MAX_KEYS", "Throttle", "ceiling"]

FORGET_S: Final = 60.0  # a key with no failure for this long starts afresh
MAX_KEYS: Final = 10_000
#: the longest wait, as a share of the shortest handshake deadline: the refusal always makes it
HANDSHAKE_SHARE: Final = 0.25


def ceiling(max_s: float, handshake_s: float | None) -> float:
    """The longest wait before a refusal: ``max_s``, or less when the shortest handshake deadline
    (``handshake_s``, None: not known) would not leave room for the answer after it."""
    if handshake_s is None:
        return max_s
    return min(max_s, handshake_s * HANDSHAKE_SHARE)


class Throttle:
    """Failed logins per (user name, address): the wait before each refusal doubles per failure."""

    __slots__ = ("_failures", "clock", "initial_s", "max_s")

    def __init__(self, initial_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.clock = clock
        # (user, host) -> (failures in a row, when the last one was); oldest failure first
        self._failures: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def failed(self, user: str, host: str) -> float:
        """A wrong password for ``user`` from ``host``: counted, and the seconds its refusal waits."""
        now = self.clock()
        self._forget(now)
        key = (user, host)
        count = self._failures.pop(key, (0, 0.0))[0] + 1
        self._failures[key] = (count, now)
        while len(self._failures) > MAX_KEYS:
            self._failures.popitem(last=False)
        if not self.initial_s:
            return 0.0
        return float(min(self.initial_s * 2 ** min(count - 1, 32), self.max_s))

    def succeeded(self, user: str, host: str) -> None:
        """A correct password: ``user``'s next failure from ``host`` waits ``initial_s`` again."""
        if self._failures:
            self._failures.pop((user, host), None)

    def failures(self, user: str, host: str) -> int:
        """How many failures in a row ``user`` has from ``host`` (0 once forgotten)."""
        entry = self._failures.get((user, host))
        if entry is None or self.clock() - entry[1] > FORGET_S:
            return 0
        return entry[0]

    def _forget(self, now: float) -> None:
        failures = self._failures
        while failures:
            key, (_, last) = next(iter(failures.items()))
            if now - last <= FORGET_S:
                return
            del failures[key]
