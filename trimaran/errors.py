"""Reasons the server or a command cannot go on, each said in one line a person can act on.

The ground floor: every room may raise these (storage when its database cannot be reached, the app
when a listener cannot bind); the CLI prints ``trimaran: <message>`` and exits 2, no traceback.
"""

from __future__ import annotations

import errno


class StartupError(Exception):
    """The server cannot start; the message names what (a port, a file, a database) and why."""


class StorageUnavailable(StartupError):
    """The database cannot be reached or opened."""


_BIND_REASONS = {
    errno.EADDRINUSE: "address already in use (another process listens there)",
    errno.EACCES: "permission denied (ports below 1024 need CAP_NET_BIND_SERVICE)",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address",
}


def bind_failure(listener: str, address: str, error: OSError) -> StartupError:
    """A listener that cannot bind its address, e.g. ``mqtt listener cannot bind 0.0.0.0:1883: ...``."""
    reason = _BIND_REASONS.get(error.errno or 0) or error.strerror or str(error)
    return StartupError(f"{listener} listener cannot bind {address}: {reason}")


def first_line(error: BaseException) -> str:
    """An exception's message without the driver's continuation lines (SQL, hints, backgrounds)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def startup_problem(error: BaseException) -> str | None:
    """The one line to print for a failure at start, looking inside exception groups; ``None``
    when it is a bug (the traceback is then the useful thing)."""
    from trimaran.config import ConfigError

    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = startup_problem(inner)
            if found is not None:
                return found
        return None
    if isinstance(error, (StartupError, ConfigError)):
        return str(error)
    if isinstance(error, OSError):
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror or error}{where}"
    return None
