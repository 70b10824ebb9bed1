"""Shovels (trimaran/bridges/shovel.py) between two Trimaran servers, over AMQP 0.9.1 and AMQP 1.0:
queues and amq.topic out, in, the marks that stop a loop. The same against RabbitMQ and the proton
broker: test_shovel_peers.py; under faults: test_shovel_faults.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest
import trustme

from tests.admin.test_api import SERVER_ENV, Api, wait_for
from tests.support.bridges import write_bridges
from tests.support.paho import V311, connect
from tests.support.paho import Endpoints as MqttEndpoints
from tests.support.permissions import store_permissions
from tests.support.server import RunningServer, serving

ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--http", "off"]


def start(
    directory: Path,
    *shovels: Mapping[str, object],
    amqp: str = "127.0.0.1:0",
    tls: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> RunningServer:
    """A Trimaran with AMQP 0.9.1 and 1.0 on ``amqp`` and these ``[[shovels]]``, started; ``tls``:
    a directory of ``cert.pem`` and ``key.pem``, and AMQPS on a free port."""
    directory.mkdir(exist_ok=True)
    config = directory / "trimaran.toml"
    write_bridges(config, shovels=shovels)
    args = [*ARGS, "--amqp", amqp, "--config", str(config)]
    environment = dict(env or {})
    if tls is not None:
        args += ["--amqps", "127.0.0.1:0"]
        environment["TRIMARAN_LISTENERS__TLS__CERT_FILE"] = str(tls / "cert.pem")
        environment["TRIMARAN_LISTENERS__TLS__KEY_FILE"] = str(tls / "key.pem")
    return RunningServer(args, cwd=directory, env=environment).start()


@contextmanager
def broker(
    directory: Path,
    *shovels: Mapping[str, object],
    connected: bool = True,
    amqp: str = "127.0.0.1:0",
    tls: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningServer]:
    """:func:`start`'s server, yielded once each shovel is connected (``connected`` False: as soon
    as it is up), and stopped cleanly after. The same ``directory`` again: its data again."""
    with serving(start(directory, *shovels, amqp=amqp, tls=tls, env=env)) as server:
        if connected:
            for shovel in shovels:
                assert server.wait_for_log(f"shovel {shovel['name']}: connected"), server.output()
        yield server


def uri(server: RunningServer) -> str:
    """The server's AMQP port, which speaks 0.9.1 and 1.0."""
    return f"amqp://guest:guest@127.0.0.1:{server.ports['amqp']}"


def channel(server: RunningServer, vhost: str = "/") -> pika.adapters.blocking_connection.BlockingChannel:
    params = pika.ConnectionParameters("127.0.0.1", server.ports["amqp"], vhost, connection_attempts=3)
    return pika.BlockingConnection(params).channel()


def publish(
    server: RunningServer, queue: str, bodies: list[bytes], exchange: str = "", vhost: str = "/"
) -> None:
    ch = channel(server, vhost)
    ch.confirm_delivery()
    if not exchange:
        ch.queue_declare(queue, durable=True)
    for body in bodies:
        ch.basic_publish(exchange, queue, body, pika.BasicProperties(delivery_mode=2))
    ch.connection.close()


def drain(
    server: RunningServer, queue: str, count: int, timeout: float = 20.0, vhost: str = "/"
) -> list[bytes]:
    """``count`` messages of ``queue`` (declared if absent), acknowledged, in the order they came."""
    ch = channel(server, vhost)
    ch.queue_declare(queue, durable=True)
    got: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=timeout):
        if body is None:
            break
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    ch.connection.close()
    return got


def depth(server: RunningServer, queue: str) -> int:
    ch = channel(server)
    count = ch.queue_declare(queue, durable=True).method.message_count
    ch.connection.close()
    return int(count)


BODIES = [f"order {i}".encode() for i in range(300)]
#: AMQP 1.0 both ways is in the default run by the Proton broker's test (test_shovel_peers.py).
AMQP10_SLOW = pytest.param("amqp10", marks=pytest.mark.slow)


@pytest.mark.parametrize("protocol", ["amqp091", AMQP10_SLOW])
def test_a_queue_here_is_shovelled_to_a_queue_there(tmp_path: Path, protocol: str) -> None:
    with broker(tmp_path / "cloud") as cloud:
        dest = (
            {"dest_protocol": "amqp091", "dest_uri": uri(cloud), "dest_queue": "orders-in"}
            if protocol == "amqp091"
            else {
                "dest_protocol": "amqp10",
                "dest_uri": uri(cloud),
                "dest_address": "$queue/orders-in",
            }
        )
        shovel = {"name": "up", "src_uri": "amqp://", "src_queue": "orders", **dest}
        with broker(tmp_path / "edge", shovel) as edge:
            publish(edge, "orders", BODIES)
            assert drain(cloud, "orders-in", len(BODIES)) == BODIES  # all, in order
            assert depth(edge, "orders") == 0  # moved, not copied


@pytest.mark.parametrize("protocol", ["amqp091", AMQP10_SLOW])
def test_a_queue_there_is_shovelled_to_topics_here(tmp_path: Path, protocol: str) -> None:
    with broker(tmp_path / "cloud") as cloud:
        src = (
            {"src_protocol": "amqp091", "src_uri": uri(cloud), "src_queue": "commands"}
            if protocol == "amqp091"
            else {"src_protocol": "amqp10", "src_uri": uri(cloud), "src_address": "$queue/commands"}
        )
        shovel = {
            "name": "down",
            **src,
            "dest_uri": "amqp://",
            "dest_exchange": "amq.topic",
            "dest_exchange_key": "plant.commands",
        }
        with broker(tmp_path / "edge", shovel) as edge:
            device = connect(MqttEndpoints("127.0.0.1", edge.ports["mqtt"]), "plc", version=V311)
            device.subscribe("plant/commands", 1)
            publish(cloud, "commands", BODIES[:50])
            got = [device.expect(10).payload for _ in range(50)]
            assert got == BODIES[:50]
            device.disconnect()
            assert depth(cloud, "commands") == 0  # acknowledged there once here


def test_topics_here_go_to_an_exchange_there_with_their_keys(tmp_path: Path) -> None:
    with broker(tmp_path / "cloud") as cloud:
        ch = channel(cloud)
        ch.queue_declare("telemetry", durable=True)
        ch.queue_bind("telemetry", "amq.topic", "site-1.#")
        ch.connection.close()
        shovel = {
            "name": "telemetry",
            "src_uri": "amqp://",
            "src_exchange": "amq.topic",
            "src_exchange_key": "sensors.#",
            "dest_uri": uri(cloud),
            "dest_exchange": "amq.topic",
            "dest_exchange_key": "site-1.sensors",
        }
        with broker(tmp_path / "edge", shovel) as edge:
            device = connect(MqttEndpoints("127.0.0.1", edge.ports["mqtt"]), "meter", version=V311)
            for i in range(20):
                device.publish(f"sensors/line-{i % 3}", f"{i}".encode(), qos=1)
            device.publish("other/topic", b"not shovelled", qos=1)
            device.disconnect()
            assert drain(cloud, "telemetry", 20) == [f"{i}".encode() for i in range(20)]
            assert drain(cloud, "telemetry", 1, timeout=0.5) == []


def test_a_message_that_went_round_is_not_shovelled_again(tmp_path: Path) -> None:
    # Out from the topics here to a queue there, and from that queue back to the same topics:
    # each message goes out once, comes back once, and stops.
    with broker(tmp_path / "cloud") as cloud:
        out = {
            "name": "out",
            "src_uri": "amqp://",
            "src_exchange": "amq.topic",
            "src_exchange_key": "loop.#",
            "dest_uri": uri(cloud),
            "dest_queue": "ring",
        }
        back = {
            "name": "back",
            "src_uri": uri(cloud),
            "src_queue": "ring",
            "dest_uri": "amqp://",
            "dest_exchange": "amq.topic",
            "dest_exchange_key": "loop.back",
        }
        with broker(tmp_path / "edge", out, back) as edge:
            watcher = connect(MqttEndpoints("127.0.0.1", edge.ports["mqtt"]), "watch", version=V311)
            watcher.subscribe("loop/#", 1)
            watcher.publish("loop/start", b"once", qos=1)
            topics = sorted(watcher.expect(10).topic for _ in range(2))
            assert topics == ["loop/back", "loop/start"]
            watcher.expect_none(1.5)  # it did not go round again
            watcher.disconnect()
            dropped = "for $shovel/out in vhost '/' dropped: a bridge or shovel sent it out before"
            assert edge.wait_for_log(dropped, 1), edge.output()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA's ``ca.pem``, and ``cert.pem`` / ``key.pem`` it issued for localhost."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(directory / "ca.pem")
    issued = ca.issue_cert("localhost")
    issued.cert_chain_pems[0].write_to_path(directory / "cert.pem")
    issued.private_key_pem.write_to_path(directory / "key.pem")
    trustme.CA().cert_pem.write_to_path(directory / "other-ca.pem")
    return directory


@pytest.mark.parametrize("protocol", ["amqp091", AMQP10_SLOW])
def test_a_shovel_speaks_tls_and_checks_the_remote(tmp_path: Path, pki: Path, protocol: str) -> None:
    with broker(tmp_path / "cloud", tls=pki) as cloud:
        remote = f"amqps://guest:guest@localhost:{cloud.ports['amqps']}?cacertfile={pki / 'ca.pem'}"
        dest = {"dest_queue": "orders-in"} if protocol == "amqp091" else {"dest_address": "$queue/orders-in"}
        shovel = {"name": "up", "src_uri": "amqp://", "src_queue": "orders", "dest_protocol": protocol}
        with broker(tmp_path / "edge", {**shovel, "dest_uri": remote, **dest}) as edge:
            publish(edge, "orders", BODIES[:20])
            assert drain(cloud, "orders-in", 20) == BODIES[:20]
        # A remote whose certificate another CA signed is refused, and the log says why.
        stranger = remote.replace("ca.pem", "other-ca.pem")
        with broker(tmp_path / "edge2", {**shovel, "dest_uri": stranger, **dest}, connected=False) as edge:
            assert edge.wait_for_log("certificate verify failed"), edge.output()
            assert "shovel up: connected" not in edge.output()


def test_the_settings_refuse_a_shovel_without_this_broker(tmp_path: Path) -> None:
    config = tmp_path / "trimaran.toml"
    write_bridges(
        config,
        shovels=(
            {"name": "x", "src_uri": "amqp://a", "src_queue": "q", "dest_uri": "amqp://b", "dest_queue": "q"},
        ),
    )
    server = RunningServer([*ARGS, "--amqp", "off", "--config", str(config)], cwd=tmp_path)
    with pytest.raises(RuntimeError, match="one of src_uri and dest_uri is this broker"):
        server.start()


def test_a_shovel_is_listed_restarted_and_reloaded_with_the_bridges(tmp_path: Path) -> None:
    with broker(tmp_path / "cloud") as cloud:
        shovel = {"name": "up", "src_uri": "amqp://", "src_queue": "orders", "dest_uri": uri(cloud)}
        shovel["dest_queue"] = "orders-in"
        edge_dir = tmp_path / "edge"
        edge_dir.mkdir()
        config = edge_dir / "trimaran.toml"
        write_bridges(config, shovels=(shovel,))
        args = [*ARGS[:-2], "--http", "127.0.0.1:0", "--amqp", "127.0.0.1:0", "--config", str(config)]
        edge = RunningServer(args, cwd=edge_dir, env=SERVER_ENV).start()
        with serving(edge):
            assert edge.wait_for_log("shovel up: connected"), edge.output()
            api = Api(edge.ports["http"])

            def shown() -> Any:
                return api.call("GET", "/api/v1/bridges/up")[1]

            publish(edge, "orders", BODIES[:5])
            wait_for(lambda: shown()["sent"] == 5)
            (listed,) = api.call("GET", "/api/v1/bridges")[1]["items"]
            remote = f"amqp://guest@127.0.0.1:{cloud.ports['amqp']}"  # never the password
            expected = {
                "kind": "shovel",
                "protocol_version": "amqp091",
                "client_id": "trimaran.up",
                "address": f"127.0.0.1:{cloud.ports['amqp']}",
                "state": "connected",
                "queue": "orders",
                "in_flight": 0,
                "topics": [f"amqp:// queue orders -> {remote} queue orders-in"],
            }
            assert {key: listed[key] for key in expected} == expected
            status, body, _ = api.call("POST", "/api/v1/bridges/up/restart")
            assert status == 202
            assert edge.wait_for_log_count("shovel up: connected", 2), edge.output()
            write_bridges(config)
            status, body, _ = api.call("POST", "/api/v1/bridges/reload")
            assert status == 200 and body == {"added": [], "removed": ["up"], "changed": []}
            assert api.call("GET", "/api/v1/bridges")[1]["items"] == []
        assert drain(cloud, "orders-in", 5) == BODIES[:5]


@pytest.mark.parametrize("ack_mode", ["on-publish", pytest.param("no-ack", marks=pytest.mark.slow)])
def test_the_other_ack_modes_move_messages_both_ways(tmp_path: Path, ack_mode: str) -> None:
    with broker(tmp_path / "cloud") as cloud:
        remote = uri(cloud)
        up = {"src_uri": "amqp://", "src_queue": "orders", "dest_uri": remote, "dest_queue": "orders-in"}
        down = {"src_uri": remote, "src_queue": "commands", "dest_uri": "amqp://", "dest_queue": "commands"}
        shovels = ({"name": "up", "ack_mode": ack_mode, **up}, {"name": "down", "ack_mode": ack_mode, **down})
        with broker(tmp_path / "edge", *shovels) as edge:
            publish(edge, "orders", BODIES[:100])
            publish(cloud, "commands", BODIES[100:200])
            assert drain(cloud, "orders-in", 100) == BODIES[:100]
            assert drain(edge, "commands", 100) == BODIES[100:200]
            assert depth(edge, "orders") == depth(cloud, "commands") == 0


def test_a_shovel_works_in_its_vhost_here_and_there(tmp_path: Path) -> None:
    servers = {}
    for name in ("cloud", "edge"):  # guest may enter / and plant on both
        (tmp_path / name).mkdir()
        url = f"sqlite:///{tmp_path / name / 'vhosts.db'}"
        store_permissions(url, [("guest", "/"), ("guest", "plant")])
        servers[name] = {"TRIMARAN_VHOSTS": '["/", "plant"]', "TRIMARAN_STORAGE__URL": url}
    with broker(tmp_path / "cloud", env=servers["cloud"]) as cloud:
        remote = f"amqp://guest:guest@127.0.0.1:{cloud.ports['amqp']}/plant"
        up = {"name": "up", "src_uri": "amqp:///plant", "src_queue": "orders", "dest_uri": remote}
        up["dest_queue"] = "orders"
        down = {"name": "down", "src_uri": remote, "src_queue": "commands", "dest_uri": "amqp:///plant"}
        down |= {"dest_exchange": "amq.topic", "dest_exchange_key": "cmd.all"}
        with broker(tmp_path / "edge", up, down, env=servers["edge"]) as edge:
            mqtt = MqttEndpoints("127.0.0.1", edge.ports["mqtt"])
            device = connect(mqtt, "plc", version=V311, username="plant:guest", password="guest")
            device.subscribe("cmd/all", 1)
            publish(edge, "orders", BODIES[:10], vhost="plant")
            assert drain(cloud, "orders", 10, vhost="plant") == BODIES[:10]
            assert drain(cloud, "orders", 1, timeout=0.3) == []  # not in the default vhost there
            publish(cloud, "commands", BODIES[10:20], vhost="plant")
            assert [device.expect(10).payload for _ in range(10)] == BODIES[10:20]
            device.disconnect()
