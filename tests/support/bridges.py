"""Trimaran with a bridge to a real Mosquitto and its admin API on: what the admin tests (the API,
``trimaran bridges``, the management page) read and restart. tests/bridges/test_mqtt_bridge.py's
``bridged`` runs without the admin API; the table written here is the same."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.mosquitto import running_mosquitto
from tests.support.server import RunningServer, serving

ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "127.0.0.1:0"]


def write_bridges(
    config: Path, *tables: Mapping[str, object], shovels: tuple[Mapping[str, object], ...] = ()
) -> None:
    """``config``: a trimaran.toml of these ``[[bridges]]`` tables and ``[[shovels]]`` tables, each
    retrying quickly unless it says otherwise (JSON's strings and arrays are TOML's)."""
    text = ""
    for table in tables:
        table = {"restart_timeout": "0.2 0.5", **table}
        text += "[[bridges]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items())
    for shovel in shovels:
        shovel = {"reconnect_delay": 0.2, **shovel}
        text += "[[shovels]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in shovel.items())
    config.write_text(text)


@contextmanager
def bridged_with_admin(
    directory: Path, token: str, topics: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[RunningServer, int]]:
    """Mosquitto (the test is skipped without it) and Trimaran with one bridge, ``cloud``, to it,
    yielded once connected, with the admin API on a free port taking ``token``; and Mosquitto's port."""
    remote, local = directory / "remote", directory / "server"
    remote.mkdir()
    local.mkdir()
    with running_mosquitto(remote) as port:
        config = local / "trimaran.toml"
        write_bridges(config, {"name": "cloud", "address": f"127.0.0.1:{port}", "topic": topics})
        server_env = {"TRIMARAN_HTTP__TOKENS": json.dumps([token]), **(env or {})}
        server = RunningServer([*ARGS, "--config", str(config)], cwd=local, env=server_env).start()
        with serving(server):
            assert server.wait_for_log("bridge cloud: connected"), server.output()
            yield server, port
