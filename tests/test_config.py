from __future__ import annotations

from pathlib import Path

import pytest

from trimaran.config import (
    BridgeTopic,
    ConfigError,
    Endpoint,
    ShovelSettings,
    load_settings,
    parse_bridge_topic,
    parse_endpoint,
    parse_shovel_uri,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No stray TRIMARAN_* variables or ./trimaran.toml from the caller's environment.
    import os

    for name in list(os.environ):
        if name.startswith("TRIMARAN_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = load_settings()
    assert settings.listeners.mqtt == Endpoint("0.0.0.0", 1883)
    assert settings.listeners.mqtt_ws == Endpoint("0.0.0.0", 8083)
    assert settings.listeners.amqp == Endpoint("0.0.0.0", 5672)
    assert settings.http.bind == Endpoint("127.0.0.1", 8080)
    assert settings.storage.effective_url() == "sqlite:///data/trimaran.db"


def test_precedence_file_then_env_then_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path / "c.toml", "[limits]\nmax_inflight = 10\nreceive_maximum = 11\noutbox_bytes = 12000\n"
    )
    assert load_settings(config).limits.max_inflight == 10

    monkeypatch.setenv("TRIMARAN_LIMITS__RECEIVE_MAXIMUM", "21")
    monkeypatch.setenv("TRIMARAN_LIMITS__OUTBOX_BYTES", "22000")
    settings = load_settings(config, {"limits": {"outbox_bytes": 32768}})
    assert settings.limits.max_inflight == 10  # file only
    assert settings.limits.receive_maximum == 21  # env beats file
    assert settings.limits.outbox_bytes == 32768  # flag beats env


def test_trimaran_toml_in_working_directory_is_read(tmp_path: Path) -> None:
    write(tmp_path / "trimaran.toml", 'node_name = "from-cwd"\n')
    assert load_settings().node_name == "from-cwd"


def test_nested_flags_merge_with_file(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", '[listeners]\nmqtt = "127.0.0.1:1999"\n')
    settings = load_settings(config, {"listeners": {"amqp": "off"}})
    assert settings.listeners.mqtt == Endpoint("127.0.0.1", 1999)
    assert settings.listeners.amqp is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1884", Endpoint("0.0.0.0", 1884)),
        ("0", Endpoint("0.0.0.0", 0)),
        ("127.0.0.1:0", Endpoint("127.0.0.1", 0)),
        ("[::1]:1883", Endpoint("::1", 1883)),
        (":7", Endpoint("0.0.0.0", 7)),
        ("off", None),
        ("OFF", None),
    ],
)
def test_endpoint_forms(text: str, expected: Endpoint | None) -> None:
    assert parse_endpoint(text) == expected


def test_bad_setting_names_key_and_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMARAN_LIMITS__MAXIMUM_QOS", "3")
    with pytest.raises(ConfigError, match=r"invalid setting limits\.maximum_qos: .*less than or equal to 2"):
        load_settings()


def test_bad_port_and_unknown_key(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", '[listeners]\nmqtt = "70000"\nmqqt = 1\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    message = str(info.value)
    assert "invalid setting listeners.mqtt: Value error, port 70000 is out of range" in message
    assert "invalid setting listeners.mqqt: unknown setting" in message


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    broken = write(tmp_path / "broken.toml", "[limits\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(broken)


def test_secrets_are_masked(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", '[[auth.users]]\nname = "alice"\npassword = "s3cret"\n')
    settings = load_settings(config)
    assert settings.auth.users[0].password.get_secret_value() == "s3cret"
    dumped = settings.model_dump(mode="json")
    assert "s3cret" not in str(dumped)
    assert dumped["listeners"]["mqtt"] == "0.0.0.0:1883"


def test_shared_queues_need_postgresql(tmp_path: Path) -> None:
    assert load_settings().queues.shared is False
    config = write(tmp_path / "c.toml", "[queues]\nshared = true\n")
    with pytest.raises(ConfigError, match=r"queues\.shared: .*PostgreSQL.*sqlite:///data/trimaran\.db"):
        load_settings(config)
    settings = load_settings(config, {"storage": {"url": "postgresql://trimaran@db/trimaran"}})
    assert settings.queues.shared is True


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("sensors/#", BridgeTopic("sensors/#", "out", 0, "", "")),
        ("cmd/+ in 1", BridgeTopic("cmd/+", "in", 1, "", "")),
        ("# both 2 edge/ cloud/site-1/", BridgeTopic("#", "both", 2, "edge/", "cloud/site-1/")),
        ('"" out 1 local/alarm remote/alarm', BridgeTopic("", "out", 1, "local/alarm", "remote/alarm")),
        ('jobs/# in 1 $queue/ ""', BridgeTopic("jobs/#", "in", 1, "$queue/", "")),
        ("alerts/# out 1 $queue/ site-7/", BridgeTopic("alerts/#", "out", 1, "$queue/", "site-7/")),
    ],
)
def test_bridge_topic_lines_read_as_mosquitto_reads_them(line: str, expected: BridgeTopic) -> None:
    assert parse_bridge_topic(line) == expected


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("a/# sideways", "in, out or both"),
        ("a/# out 3", "0, 1 or 2"),
        ("a/# out 1 local/", "expected PATTERN"),
        ("a/# out 1 lo+cal/ remote/", "wildcard"),
        ('"" out 1 "" remote/', "both prefixes"),
        ("a/#/b", "not a topic filter"),
        ("# out 1 $queue/ jobs/", "names no queue"),
        ("jobs/# both 1 $queue/ jobs/", "in or out, not both"),
    ],
)
def test_bad_bridge_topic_lines_say_what_is_wrong(line: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_bridge_topic(line)


def test_bridges_are_checked_at_load(tmp_path: Path) -> None:
    config = tmp_path / "trimaran.toml"
    table = '[[bridges]]\nname = "{name}"\naddress = "{address}"\ntopic = ["#"]\n{extra}'
    config.write_text(table.format(name="a", address="broker.example:1883", extra='restart_timeout = "2"'))
    (bridge,) = load_settings(config).bridges
    assert bridge.addresses() == [("broker.example", 1883)]
    assert bridge.restart_times(bridge.restart_timeout) == (2.0, 2.0)
    config.write_text(
        table.format(name="a", address="h", extra="") + table.format(name="a", address="h", extra="")
    )
    with pytest.raises(ConfigError, match="two bridges are named a"):
        load_settings(config)
    config.write_text(table.format(name="a", address="h:port", extra=""))
    with pytest.raises(ConfigError, match="not HOST"):
        load_settings(config)
    config.write_text(table.format(name="a", address="h", extra='restart_timeout = "30 5"'))
    with pytest.raises(ConfigError, match="BASE <= CAP"):
        load_settings(config)
    config.write_text(table.format(name="a", address="h", extra='vhost = "prod"'))
    with pytest.raises(ConfigError, match="'prod' is not declared"):
        load_settings(config)


def test_shovel_uris_read_as_rabbitmq_writes_them() -> None:
    remote = parse_shovel_uri(
        "amqps://user:p%40ss@rabbit.example/prod%2Fa?cacertfile=/ca.pem&verify=verify_none"
    )
    assert (remote.local, remote.tls, remote.host, remote.port) == (False, True, "rabbit.example", 5671)
    assert (remote.username, remote.password, remote.vhost) == ("user", "p@ss", "prod/a")
    assert remote.query == {"cacertfile": "/ca.pem", "verify": "verify_none"}
    assert remote.shown == "amqps://user@rabbit.example:5671"  # never the password
    assert parse_shovel_uri("amqp://").local and parse_shovel_uri("amqp://").vhost == "/"
    assert parse_shovel_uri("amqp:///edge").vhost == "edge"
    assert parse_shovel_uri("amqp://h").port == 5672


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("http://h", "the scheme is amqp or amqps"),
        ("amqp://h:x", "the port is not a number"),
        ("amqp://h?channel_max=1", "unknown query keys channel_max"),
        ("amqp://h?verify=maybe", "verify_peer or verify_none"),
        ("amqps://", "this broker's URI is amqp://"),
    ],
)
def test_bad_shovel_uris_say_what_is_wrong(uri: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_shovel_uri(uri)


SHOVEL = {"name": "s", "src_uri": "amqp://", "src_queue": "q", "dest_uri": "amqp://h", "dest_queue": "q"}


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"dest_uri": "amqp://"}, "one of src_uri and dest_uri is this broker"),
        ({"src_uri": "amqp://a", "dest_uri": "amqp://b"}, "one of src_uri and dest_uri is this broker"),
        ({"src_queue": None, "src_exchange": "amq.direct"}, "bind a queue to 'amq.direct'"),
        ({"src_queue": None}, "the source names src_queue or src_exchange"),
        ({"src_exchange": "amq.topic"}, "src_queue or src_exchange, not both"),
        ({"dest_protocol": "amqp10"}, "an AMQP 1.0 dest names dest_address"),
        ({"dest_queue": None, "dest_address": "x"}, "dest_address is AMQP 1.0's"),
        ({"src_protocol": "amqp10", "src_queue": None, "src_address": "x"}, "named in AMQP 0.9.1 terms"),
        ({"src_queue": None, "src_exchange": "amq.topic", "src_exchange_key": "a.#b"}, "src_exchange_key"),
        ({"src_uri": "amqp:// amqp://h"}, "amqp:// is one URI alone"),
        (
            {"src_protocol": "amqp10", "src_uri": "amqp://h", "src_queue": None, "src_address": "a"}
            | {"dest_uri": "amqp://", "dest_queue": None, "dest_exchange": "amq.topic"},
            "name dest_exchange_key",
        ),
    ],
)
def test_bad_shovels_say_what_is_wrong(changes: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        ShovelSettings(**{**SHOVEL, **changes})


def test_shovels_are_checked_at_load(tmp_path: Path) -> None:
    config = tmp_path / "trimaran.toml"
    shovel = '[[shovels]]\nname = "{name}"\nsrc_uri = "{src}"\nsrc_queue = "q"\ndest_uri = "amqp://h amqp://g:5673"\n'
    config.write_text(shovel.format(name="s", src="amqp://"))
    (loaded,) = load_settings(config).shovels
    assert [(uri.host, uri.port) for uri in loaded.remotes()] == [("h", 5672), ("g", 5673)]
    assert loaded.source.local and loaded.local.vhost == "/"
    config.write_text(shovel.format(name="s", src="amqp:///prod"))
    with pytest.raises(ConfigError, match="the vhost 'prod' of amqp:// is not declared"):
        load_settings(config)
    bridge = '[[bridges]]\nname = "s"\naddress = "h"\ntopic = ["#"]\n'
    config.write_text(bridge + shovel.format(name="s", src="amqp://"))
    with pytest.raises(ConfigError, match="two bridges or shovels are named s"):
        load_settings(config)
