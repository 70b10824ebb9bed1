"""JSON log lines carry fields (logger, level, time, message and the call's ``extra``), and a
failed login is a WARNING with the peer, protocol, client id, user and reason."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tests.support.paho import V5, Endpoints, connect
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer
from trimaran.logs import JsonFormatter


def record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("trimaran.test")
    return logger.makeRecord(
        "trimaran.test", logging.WARNING, __file__, 1, "refused %s", ("x",), None, extra=extra
    )


def test_json_line_has_the_standard_fields_and_the_extra_ones() -> None:
    line = json.loads(JsonFormatter().format(record(peer="10.0.0.1:5000", client_id="dev-1", port=1883)))
    assert line["logger"] == "trimaran.test" and line["level"] == "warning"
    assert line["message"] == "refused x"
    assert line["time"].endswith("Z") and "T" in line["time"]
    assert (line["peer"], line["client_id"], line["port"]) == ("10.0.0.1:5000", "dev-1", 1883)
    assert "args" not in line and "msg" not in line and "levelno" not in line


def test_json_line_survives_values_json_cannot_say() -> None:
    line = json.loads(JsonFormatter().format(record(path=Path("/x"), reason=ValueError("bad"))))
    assert line["path"] == "/x" and line["reason"] == "bad"


def test_failed_mqtt_login_is_a_warning_with_fields(tmp_path: Path) -> None:
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    env = {
        "TRIMARAN_AUTH__USERS": ALICE,
        "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
        "TRIMARAN_AUTH__ALLOW_ANONYMOUS": "false",
    }
    server = RunningServer([*args, "--log-format", "json"], cwd=tmp_path, env=env).start()
    try:
        port = next(p for name, p in server.ports.items() if name.strip('"') == "mqtt")
        client = connect(
            Endpoints("127.0.0.1", port),
            "intruder",
            version=V5,
            username="alice",
            password="guess",
            expect_success=False,
        )
        client.client.loop_stop()
    finally:
        assert server.stop() == 0
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    refused = [
        line
        for line in lines
        if line["message"].startswith("mqtt: client 'intruder'") and "refused" in line["message"]
    ]
    assert len(refused) == 1, lines
    (line,) = refused
    assert line["level"] == "warning"
    assert line["client_id"] == "intruder" and line["user"] == "alice" and line["protocol"] == "mqtt"
    assert line["peer"].startswith("127.0.0.1") and line["reason"]
