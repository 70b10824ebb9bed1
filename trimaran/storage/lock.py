"""The data directory's lock: one server per SQLite data directory.

Two servers on one SQLite file would both run their queues from memory and each deliver every job.
The first takes an exclusive ``flock`` on ``<dir>/trimaran.lock`` and writes its pid there; a second
is refused with one line naming that pid. The kernel drops the lock when the process ends, however
it ends (``kill -9`` included), so a stale file never blocks a start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from trimaran.errors import StorageUnavailable

LOCK_NAME = "trimaran.lock"


class DataDirLock:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StorageUnavailable` naming the holder's pid."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StorageUnavailable(
                f"data directory {self.directory} is in use by another trimaran ({who}, {self.path}); "
                "stop it or choose another storage.data_dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no pid left behind for the next reader to name
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
