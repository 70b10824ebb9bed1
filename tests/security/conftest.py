"""A real server with a password file written by Debian's ``mosquitto_passwd``, a rule file, and
anonymous access off; certificates made with trustme."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.paho import Endpoints
from tests.support.server import RunningServer, serving

PASSWORDS = {"alice": "wonderland", "bob": "builder", "carol": "singer"}

RULES = """\
# Nothing for anonymous clients.
user alice
topic readwrite alice/#
topic read public/#
topic all $queue/alice-work/#
topic read $SYS/#
topic write $SYS/#
user bob
topic readwrite bob/#
topic readwrite public/#
topic all $queue/invoices/#
topic all $queue/payroll/#
topic all $queue/bob-dl/#
topic all $queue/events/#
topic read $queue/$dlq/payroll/#
topic configure $exchange/bob-x
topic write $exchange/bob-x
user carol
topic all $queue/#
pattern readwrite clients/%c/#
pattern readwrite users/%u/#
"""


def write_passwords(path: Path, users: dict[str, str]) -> None:
    """With mosquitto_passwd itself: the file an operator brings from Mosquitto."""
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd (Debian's mosquitto package) is not installed")
    first = True
    for user, password in users.items():
        args = [tool, "-b", str(path), user, password]
        if first:
            args.insert(1, "-c")
            first = False
        subprocess.run(args, check=True, capture_output=True)


def secure_env(
    directory: Path, rules: str = RULES, grants: tuple[tuple[str, str], ...] = (), **extra: str
) -> dict[str, str]:
    """``grants``: (user, vhost) permissions (.* .* .*) besides each password user's on /."""
    passwords = directory / "passwords"
    acl = directory / "acl"
    write_passwords(passwords, PASSWORDS)
    acl.write_text(rules)
    return {
        "TRIMARAN_AUTH__ALLOW_ANONYMOUS": "false",
        "TRIMARAN_AUTH__PASSWORD_FILE": str(passwords),
        "TRIMARAN_AUTH__ACL_FILE": str(acl),
        # No permission, no entry: the users of the password file may enter / (the rules decide inside).
        "TRIMARAN_AUTH__PERMISSIONS": json.dumps(
            [{"user": user} for user in PASSWORDS] + [{"user": u, "vhost": v} for u, v in grants]
        ),
        "TRIMARAN_AUTH__LOGIN_DELAY_INITIAL_S": "0",
        "TRIMARAN_LIMITS__SYS_INTERVAL": "1",
        "TRIMARAN_QUEUES__DECLARE": '[{"name": "events", "mode": "stream"}]',
        **extra,
    }


SERVER_ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "127.0.0.1:0"]


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("secure")
    server = RunningServer(SERVER_ARGS, cwd=directory, env=secure_env(directory))
    with serving(server.start()) as running:
        yield running


@pytest.fixture(scope="module")
def smqtt(secure_server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", secure_server.ports["mqtt"])


@pytest.fixture(scope="session")
def client_ca() -> trustme.CA:
    return trustme.CA()
