"""Start-up checks of the data directory and the SQLite file: one line each, no long silent wait."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from trimaran.errors import StorageUnavailable
from trimaran.storage.lock import DataDirLock
from trimaran.storage.store import Storage


def test_second_lock_on_a_data_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path / "data")
    first.acquire()
    try:
        with pytest.raises(StorageUnavailable, match=rf"in use by another trimaran \(pid {os.getpid()},"):
            DataDirLock(tmp_path / "data").acquire()
    finally:
        first.release()
    again = DataDirLock(tmp_path / "data")
    again.acquire()  # released at exit: the next server starts
    assert again.held
    again.release()


def _storage(path: Path) -> Storage:
    return Storage.from_url(f"sqlite:///{path}")


def test_damaged_sqlite_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "trimaran.db"
    db.write_bytes(b"this is not a database, it only sits where one should be" * 100)
    storage = _storage(db)
    try:
        with pytest.raises(StorageUnavailable) as caught:
            storage.check()
    finally:
        storage.close()
    message = str(caught.value)
    assert "\n" not in message
    assert f"the database {db} is damaged" in message


def test_corrupted_page_is_found_by_quick_check(tmp_path: Path) -> None:
    db = tmp_path / "trimaran.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        connection.execute("CREATE INDEX t_v ON t (v)")
        connection.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"value {i}" * 20) for i in range(2000)])
    connection.close()
    data = bytearray(db.read_bytes())
    page = 4096
    for offset in range(3 * page, len(data) - page, 7 * page):  # scribble over some b-tree pages
        data[offset + 8 : offset + 200] = b"\xff" * 192
    db.write_bytes(bytes(data))
    storage = _storage(db)
    try:
        with pytest.raises(StorageUnavailable, match="is damaged"):
            storage.check()
    finally:
        storage.close()


def test_locked_sqlite_file_stops_the_start_quickly(tmp_path: Path) -> None:
    db = tmp_path / "trimaran.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (k INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    storage = _storage(db)
    started = time.monotonic()
    try:
        with pytest.raises(StorageUnavailable, match="is locked by another process"):
            storage.check(busy_timeout_s=0.3)
    finally:
        storage.close()
        holder.execute("ROLLBACK")
        holder.close()
    assert time.monotonic() - started < 5


def test_healthy_file_passes(tmp_path: Path) -> None:
    storage = _storage(tmp_path / "trimaran.db")
    try:
        storage.migrate()
        storage.check()
    finally:
        storage.close()
