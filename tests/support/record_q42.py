"""Record issue 42's case as the real server lived it: the audit's fixture in ``tests/analytics/q42/``.

Against ``trimaran serve`` from this tree (a child process, AMQP 1.0 on port 0, SQLite), with
python-qpid-proton:

1. publish ``grasshopper`` (application property colour=green), ``panda`` and ``squirrel``
   (colour=red) to the durable queue ``$queue/zoo``;
2. a receiver with the selector ``colour = 'red'`` takes panda and squirrel and accepts both;
3. a plain receiver takes grasshopper and accepts it;

then a clean stop (SIGTERM, exit status 0), and the database is kept as ``before-restart.db``; the
server starts again on the same file, a plain receiver takes what it is given and accepts it, a
clean stop, and the database is kept as ``after-restart.db``. Each file is one consistent SQLite
database (the backup API, then VACUUM), as the audit reads it over JDBC; ``trimaran export`` makes
the Parquet form from it.

With issue 42's bug (bb9c970) a browser still sees panda and squirrel after step 3 and both are
delivered again after the restart; with the fix neither happens. The script says which it saw and
refuses to write a fixture of a tree without the bug (``--any`` writes it anyway)::

    python -m tests.support.record_q42 [DIR] [--any]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from proton import Message, Timeout
from proton.reactor import Copy, Selector
from proton.utils import BlockingConnection, BlockingReceiver

from tests.support.amqp1 import body_str, close_link
from tests.support.server import RunningServer

QUEUE = "zoo"
ADDRESS = f"$queue/{QUEUE}"
ANIMALS = (("grasshopper", "green"), ("panda", "red"), ("squirrel", "red"))
ARGS = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]
FIXTURE = Path(__file__).resolve().parents[1] / "analytics" / "q42"


def _receive(receiver: BlockingReceiver, wait: float = 1.0) -> list[tuple[str, int]]:
    """(body, delivery-count) of each message until none comes for ``wait`` s, each accepted."""
    got: list[tuple[str, int]] = []
    while True:
        try:
            message = receiver.receive(timeout=wait)
        except Timeout:
            return got
        got.append((body_str(message), int(message.delivery_count)))
        receiver.accept()


def _browse(conn: BlockingConnection) -> list[str]:
    browser = conn.create_receiver(ADDRESS, credit=10, options=Copy())
    try:
        return [body for body, _count in _receive(browser, 0.5)]
    finally:
        close_link(browser)


def _keep(database: Path, target: Path) -> None:
    """One self-contained copy of the live database (WAL included), compacted."""
    target.unlink(missing_ok=True)
    source = sqlite3.connect(database)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
        copy.execute("PRAGMA journal_mode=DELETE")  # a single file, whatever the server used
        copy.execute("PRAGMA page_size=1024")  # a few dozen near-empty tables: small pages
        copy.execute("VACUUM")
    finally:
        copy.close()
        source.close()


def _serve(workdir: Path, database: Path) -> RunningServer:
    env = {"TRIMARAN_STORAGE__URL": f"sqlite:///{database}", "TRIMARAN_LIMITS__SYS_INTERVAL": "0"}
    return RunningServer(ARGS, cwd=workdir, env=env).start()


def _stop(server: RunningServer) -> None:
    code = server.stop()
    if code != 0:
        raise SystemExit(f"the server did not stop cleanly ({code}):\n{server.output()}")


def first_run(url: str) -> list[str]:
    """The three steps; returns what a browser sees afterwards."""
    conn = BlockingConnection(url, timeout=10)
    try:
        sender = conn.create_sender(ADDRESS)
        for body, colour in ANIMALS:
            sender.send(Message(body=body, durable=True, properties={"colour": colour}))
        close_link(sender)
        red = conn.create_receiver(ADDRESS, credit=10, options=Selector("colour = 'red'"))
        taken = _receive(red)
        close_link(red)
        if taken != [("panda", 0), ("squirrel", 0)]:
            raise SystemExit(f"the selector receiver got {taken}")
        plain = conn.create_receiver(ADDRESS, credit=10)
        taken = _receive(plain)
        close_link(plain)
        if taken != [("grasshopper", 0)]:
            raise SystemExit(f"the plain receiver got {taken}")
        return _browse(conn)
    finally:
        conn.close()


def second_run(url: str) -> list[tuple[str, int]]:
    """After the restart: what a plain receiver is given (each accepted)."""
    conn = BlockingConnection(url, timeout=10)
    try:
        plain = conn.create_receiver(ADDRESS, credit=10)
        again = _receive(plain)
        close_link(plain)
        left = _browse(conn)
        if left:
            raise SystemExit(f"a browser still sees {left} after the restart")
        return again
    finally:
        conn.close()


def record(out: Path, *, any_tree: bool = False) -> tuple[list[str], list[tuple[str, int]]]:
    """Both runs on a fresh database; the two copies written to ``out``."""
    with tempfile.TemporaryDirectory(prefix="record-q42-") as tmp:
        workdir = Path(tmp)
        database = workdir / "trimaran.db"
        server = _serve(workdir, database)
        try:
            left = first_run(f"127.0.0.1:{server.ports['amqp']}")
            time.sleep(0.3)  # the accepts' commits, before the stop
        finally:
            _stop(server)
        print(f"after the three steps a browser sees {left or 'nothing'}")
        if left != ["panda", "squirrel"] and not any_tree:
            raise SystemExit("this tree does not have issue 42's bug: nothing recorded (--any records it)")
        out.mkdir(parents=True, exist_ok=True)
        _keep(database, out / "before-restart.db")
        server = _serve(workdir, database)
        try:
            again = second_run(f"127.0.0.1:{server.ports['amqp']}")
            time.sleep(0.3)
        finally:
            _stop(server)
        print(f"after the restart delivered again (body, delivery-count): {again or 'nothing'}")
        _keep(database, out / "after-restart.db")
    return left, again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("directory", nargs="?", default=str(FIXTURE), help=f"default {FIXTURE}")
    parser.add_argument("--any", action="store_true", help="record even a tree without the bug")
    args = parser.parse_args(argv)
    record(Path(args.directory), any_tree=args.any)
    print(f"written: {args.directory}/before-restart.db, {args.directory}/after-restart.db")
    return 0


if __name__ == "__main__":
    sys.exit(main())
