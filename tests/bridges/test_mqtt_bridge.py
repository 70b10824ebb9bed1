"""Bridges to a real Mosquitto (trimaran/bridges/mqtt.py): topics out, in and both ways, gaps."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme

from tests.support.bridges import write_bridges
from tests.support.mosquitto import running_mosquitto
from tests.support.paho import V5, V311, Client, Endpoints, connect
from tests.support.server import RunningServer, serving, unused_port

VERSIONS = {"mqttv311": V311, "mqttv50": V5}


@contextmanager
def bridged(
    directory: Path, remote_port: int, topics: list[str], *, connected: bool = True, **settings: object
) -> Iterator[RunningServer]:
    """Trimaran with one bridge, ``cloud``, to the broker on ``remote_port``; yields it connected
    (``connected`` False: as soon as it is up). The same ``directory`` again: its data again."""
    directory.mkdir(exist_ok=True)
    config = directory / "trimaran.toml"
    write_bridges(
        config, {"name": "cloud", "address": f"127.0.0.1:{remote_port}", "topic": topics, **settings}
    )
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    server = RunningServer([*args, "--config", str(config)], cwd=directory).start()
    with serving(server):
        if connected:
            assert server.wait_for_log("bridge cloud: connected"), server.output()
        yield server


def local_client(server: RunningServer, client_id: str, version: object = V311, **kwargs: object) -> Client:
    return connect(Endpoints("127.0.0.1", server.ports["mqtt"]), client_id, version=version, **kwargs)  # type: ignore[arg-type]


def remote_client(port: int, client_id: str, version: object = V311, **kwargs: object) -> Client:
    return connect(Endpoints("127.0.0.1", port), client_id, version=version, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", list(VERSIONS))
def test_topics_go_out_and_come_in_with_their_prefixes(tmp_path: Path, protocol: str) -> None:
    topics = ["sensors/# out 1 edge/ cloud/", "cmd/# in 1 edge/ cloud/"]
    with (
        running_mosquitto(tmp_path) as port,
        bridged(tmp_path / "t", port, topics, bridge_protocol_version=protocol) as server,
    ):
        version = VERSIONS[protocol]
        local = local_client(server, "device-app", version)
        remote = remote_client(port, "cloud-app", version)
        local.subscribe("edge/cmd/#", 1)
        remote.subscribe("cloud/sensors/#", 1)
        local.publish("edge/sensors/t1", b"21.5", qos=1)
        got = remote.expect()
        assert (got.topic, got.payload, got.qos) == ("cloud/sensors/t1", b"21.5", 1)
        remote.publish("cloud/cmd/reboot", b"now", qos=1)
        got = local.expect()
        assert (got.topic, got.payload, got.qos) == ("edge/cmd/reboot", b"now", 1)
        # Only what the lines name crosses, and each way only.
        local.publish("edge/other", b"x", qos=1)
        local.publish("edge/cmd/local", b"x", qos=1)
        remote.publish("cloud/sensors/from-cloud", b"x", qos=1)
        assert local.expect().topic == "edge/cmd/local"
        assert remote.expect().topic == "cloud/sensors/from-cloud"
        local.expect_none(0.5)
        remote.expect_none(0.1)
        local.disconnect()
        remote.disconnect()


@pytest.mark.parametrize("protocol", list(VERSIONS))
def test_both_ways_no_message_comes_back(tmp_path: Path, protocol: str) -> None:
    with (
        running_mosquitto(tmp_path) as port,
        bridged(tmp_path / "t", port, ["chat/# both 1"], bridge_protocol_version=protocol) as server,
    ):
        local = local_client(server, "local")
        remote = remote_client(port, "remote")
        local.subscribe("chat/#", 1)
        remote.subscribe("chat/#", 1)
        local.publish("chat/a", b"from here", qos=1)
        remote.publish("chat/b", b"from there", qos=1)
        seen_here = sorted((m.topic, m.payload) for m in local.drain(2))
        seen_there = sorted((m.topic, m.payload) for m in remote.drain(2))
        expected = [("chat/a", b"from here"), ("chat/b", b"from there")]
        assert seen_here == expected and seen_there == expected
        local.expect_none(1.0)  # a loop would bring each back, again and again
        remote.expect_none(0.1)
        local.disconnect()
        remote.disconnect()


def test_retained_flags_cross_and_the_state_is_published_here(tmp_path: Path) -> None:
    with running_mosquitto(tmp_path) as port, bridged(tmp_path / "t", port, ["status/# out 1"]) as server:
        local = local_client(server, "local")
        local.publish("status/pump", b"on", qos=1, retain=True)
        time.sleep(0.3)
        late = remote_client(port, "late")
        late.subscribe("status/#", 1)
        got = late.expect()
        assert (got.topic, got.payload, got.retain) == ("status/pump", b"on", True)
        # Mosquitto's notifications: 1 retained while connected.
        local.subscribe("$SYS/broker/connection/#", 0)
        got = local.expect()
        assert (got.topic, got.payload, got.retain) == (
            "$SYS/broker/connection/trimaran.cloud/state",
            b"1",
            True,
        )
        local.disconnect()
        late.disconnect()


def test_qos1_messages_published_in_a_gap_arrive_once_the_remote_is_back(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    with running_mosquitto(remote_dir, persistence=True) as port:
        # A subscriber with a session Mosquitto keeps (on disk) across its restart.
        keeper = remote_client(port, "keeper", clean=False)
        keeper.subscribe("cloud/#", 1)
        keeper.disconnect()
        server_cm = bridged(tmp_path / "t", port, ["# out 1 edge/ cloud/"])
        server = server_cm.__enter__()
    try:
        assert server.wait_for_log("bridge cloud: the remote closed", 10) or server.wait_for_log(
            "bridge cloud: cannot connect", 10
        ), server.output()
        local = local_client(server, "device")
        for i in range(20):
            local.publish(f"edge/r/{i}", str(i).encode(), qos=1)  # acknowledged here, held for there
        local.disconnect()
        with running_mosquitto(remote_dir, port=port, persistence=True):
            assert server.wait_for_log_count("bridge cloud: connected", 2, 10), server.output()
            keeper = remote_client(port, "keeper", clean=False)
            got = keeper.drain(20)
            assert [(m.topic, m.payload) for m in got] == [
                (f"cloud/r/{i}", str(i).encode()) for i in range(20)
            ]
            keeper.expect_none(0.5)
            keeper.disconnect()
    finally:
        server_cm.__exit__(None, None, None)


def test_messages_from_the_remote_go_into_a_queue_and_are_acknowledged_once_stored(tmp_path: Path) -> None:
    with (
        running_mosquitto(tmp_path) as port,
        bridged(tmp_path / "t", port, ['jobs/# in 1 $queue/ ""']) as server,
    ):
        remote = remote_client(port, "producer")
        for i in range(5):
            remote.publish(f"jobs/{i}", f"job {i}".encode(), qos=1)
        worker = local_client(server, "worker", V5)
        worker.subscribe("$queue/jobs", 1)
        got = worker.drain(5)
        assert sorted(m.payload for m in got) == [f"job {i}".encode() for i in range(5)]
        worker.disconnect()
        remote.disconnect()


@pytest.mark.parametrize("client_certificate", [pytest.param(False, marks=pytest.mark.slow), True])
def test_over_tls_with_the_remote_verified(tmp_path: Path, client_certificate: bool) -> None:
    ca = trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "client", "client-key")}
    ca.cert_pem.write_to_path(files["ca"])
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    server_cert.private_key_pem.write_to_path(files["key"])
    client_cert = ca.issue_cert("trimaran-bridge")
    client_cert.cert_chain_pems[0].write_to_path(files["client"])
    client_cert.private_key_pem.write_to_path(files["client-key"])
    tls_port = unused_port()
    tls = (
        f"listener {tls_port} 127.0.0.1\ncafile {files['ca']}\ncertfile {files['cert']}\n"
        f"keyfile {files['key']}\nrequire_certificate {'true' if client_certificate else 'false'}\n"
    )
    settings: dict[str, object] = {"bridge_cafile": str(files["ca"])}
    if client_certificate:
        settings |= {"bridge_certfile": str(files["client"]), "bridge_keyfile": str(files["client-key"])}
    with (
        running_mosquitto(tmp_path, tls) as port,
        bridged(tmp_path / "t", tls_port, ["t/# both 1"], **settings) as server,
    ):
        assert f"connected to 127.0.0.1:{tls_port}" in server.output()
        local = local_client(server, "local")
        remote = remote_client(port, "remote")  # on Mosquitto's plain listener
        remote.subscribe("t/#", 1)
        local.publish("t/secret", b"over TLS", qos=1)
        assert remote.expect().payload == b"over TLS"
        local.disconnect()
        remote.disconnect()


def test_a_remote_whose_certificate_does_not_verify_is_refused(tmp_path: Path) -> None:
    ca, other = trustme.CA(), trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "other")}
    ca.cert_pem.write_to_path(files["ca"])
    other.cert_pem.write_to_path(files["other"])
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    server_cert.private_key_pem.write_to_path(files["key"])
    tls_port = unused_port()
    tls = f"listener {tls_port} 127.0.0.1\ncertfile {files['cert']}\nkeyfile {files['key']}\n"
    with (
        running_mosquitto(tmp_path, tls),
        bridged(
            tmp_path / "t", tls_port, ["t/# out 1"], connected=False, bridge_cafile=str(files["other"])
        ) as server,
    ):
        assert server.wait_for_log("CERTIFICATE_VERIFY_FAILED"), server.output()
        assert "bridge cloud: connected" not in server.output()


def test_a_reload_adds_changes_and_removes_bridges_and_leaves_the_others(tmp_path: Path) -> None:
    with running_mosquitto(tmp_path) as port, bridged(tmp_path / "t", port, ["a/# out 1"]) as server:
        config = tmp_path / "t" / "trimaran.toml"
        remote = remote_client(port, "remote")
        remote.subscribe("#", 1)
        local = local_client(server, "local")
        address = f"127.0.0.1:{port}"
        write_bridges(
            config,
            {"name": "cloud", "address": address, "topic": ['a/# out 1 "" moved/']},
            {"name": "second", "address": address, "topic": ["b/# out 1"]},
        )
        assert server.process is not None
        server.process.send_signal(signal.SIGHUP)
        assert server.wait_for_log("bridges reloaded: added second; changed cloud"), server.output()
        assert server.wait_for_log("bridge second: connected"), server.output()
        assert server.wait_for_log_count("bridge cloud: connected", 2), server.output()
        local.publish("a/1", b"x", qos=1)
        local.publish("b/1", b"y", qos=1)
        assert sorted((m.topic, m.payload) for m in remote.drain(2)) == [("b/1", b"y"), ("moved/a/1", b"x")]
        write_bridges(config, {"name": "second", "address": address, "topic": ["b/# out 1"]})
        server.process.send_signal(signal.SIGHUP)
        assert server.wait_for_log("bridges reloaded: removed cloud"), server.output()
        local.publish("a/2", b"x", qos=1)  # nobody takes it out now
        local.publish("b/2", b"y", qos=1)
        assert remote.expect().topic == "b/2"
        remote.expect_none(0.5)
        config.write_text("[[bridges]]\nname = 1\n")  # broken: the running bridges go on
        server.process.send_signal(signal.SIGHUP)
        assert server.wait_for_log("bridges not reloaded, the settings cannot be read"), server.output()
        local.publish("b/3", b"y", qos=1)
        assert remote.expect().topic == "b/3"
        local.disconnect()
        remote.disconnect()


def test_a_queue_is_read_out_to_the_remote_beside_its_own_consumers(tmp_path: Path) -> None:
    """An out line from $queue/: the bridge reads the queue in a group of its own, and settles each
    message once the remote has it; the queue's workers get every message as before."""
    with (
        running_mosquitto(tmp_path) as port,
        bridged(tmp_path / "t", port, ["alerts/# out 1 $queue/ site-7/"]) as server,
    ):
        remote = remote_client(port, "control-room")
        remote.subscribe("site-7/#", 1)
        worker = local_client(server, "worker", V5)
        worker.subscribe("$queue/alerts", 1)
        producer = local_client(server, "plc")
        for i in range(5):
            producer.publish(f"$queue/alerts/pump-{i}", f"alarm {i}".encode(), qos=1)
        got = remote.drain(5)
        assert sorted((m.topic, m.payload) for m in got) == [
            (f"site-7/alerts/pump-{i}", f"alarm {i}".encode()) for i in range(5)
        ]
        assert sorted(m.payload for m in worker.drain(5)) == [f"alarm {i}".encode() for i in range(5)]
        remote.expect_none(0.5)
        for client in (remote, worker, producer):
            client.disconnect()


def test_two_brokers_bridged_to_each_other_stop_a_message_after_one_turn(tmp_path: Path) -> None:
    """Each of two servers bridges ``ring/#`` out to the other at MQTT 5: a message goes round
    once, and the header of the links it went out through stops it there."""
    ports = {"first": unused_port(), "second": unused_port()}
    servers = {}
    for name, other, bridge in (("first", "second", "over"), ("second", "first", "back")):
        directory = tmp_path / name
        directory.mkdir()
        address = f"127.0.0.1:{ports[other]}"
        table = {
            "name": bridge,
            "address": address,
            "topic": ["ring/# out 1"],
            "bridge_protocol_version": "mqttv50",
        }
        write_bridges(directory / "trimaran.toml", table)
        args = ["--mqtt", f"127.0.0.1:{ports[name]}", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
        servers[name] = RunningServer([*args, "--config", str(directory / "trimaran.toml")], cwd=directory)
    with serving(servers["first"].start()) as one, serving(servers["second"].start()) as two:
        assert one.wait_for_log("bridge over: connected", 15), one.output()
        assert two.wait_for_log("bridge back: connected", 15), two.output()
        watcher = local_client(one, "watcher", V5)
        watcher.subscribe("ring/#", 1)
        watcher.publish("ring/start", b"once", qos=1)
        assert watcher.expect().payload == b"once"  # its own publish
        assert watcher.expect(10).payload == b"once"  # back from the other server, once
        watcher.expect_none(1.5)  # and no more
        watcher.disconnect()
        dropped = "for $bridge/over in vhost '/' dropped: a bridge or shovel sent it out before"
        assert one.wait_for_log(dropped), one.output()
