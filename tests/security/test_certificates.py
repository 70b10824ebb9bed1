"""Identity from verified client certificates (made here with trustme): MQTT's
``use_identity_as_username`` and SASL EXTERNAL for AMQP 0.9.1 and 1.0, under the same rules."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho_mqtt
import pytest
import trustme
from paho.mqtt.enums import CallbackAPIVersion

from tests.security.conftest import secure_env
from tests.security.test_guard import NOT_AUTHORIZED, puback
from tests.support.paho import V5, Client
from tests.support.server import RunningServer, serving
from trimaran.mqtt.codec import encode
from trimaran.mqtt.packets import Connect

ARGS = ["--mqtt", "off", "--mqtt-tls", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off"]
ARGS += ["--amqps", "127.0.0.1:0", "--http", "off"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    files = {
        name: directory / f"{name}.pem" for name in ("ca", "cert", "key", "client_ca", "alice", "nobody")
    }
    server_ca.cert_pem.write_to_path(files["ca"])
    server_cert = server_ca.issue_cert("localhost", "127.0.0.1")
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    server_cert.private_key_pem.write_to_path(files["key"])
    client_ca.cert_pem.write_to_path(files["client_ca"])
    alice = client_ca.issue_cert("alice.clients.example", common_name="alice")
    alice.private_key_and_cert_chain_pem.write_to_path(files["alice"])
    stranger = trustme.CA().issue_cert("alice.clients.example", common_name="alice")  # another CA
    stranger.private_key_and_cert_chain_pem.write_to_path(files["nobody"])
    return files


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("tls-server")
    env = secure_env(
        directory,
        TRIMARAN_LISTENERS__TLS__CERT_FILE=str(pki["cert"]),
        TRIMARAN_LISTENERS__TLS__KEY_FILE=str(pki["key"]),
        TRIMARAN_LISTENERS__TLS__CA_FILE=str(pki["client_ca"]),
        TRIMARAN_AUTH__USE_IDENTITY_AS_USERNAME="true",
    )
    with serving(RunningServer(ARGS, cwd=directory, env=env).start()) as running:
        yield running


def client_context(pki: dict[str, Path], identity: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if identity is not None:
        context.load_cert_chain(str(pki[identity]))
    return context


def mqtt_over_tls(server: RunningServer, pki: dict[str, Path], identity: str | None) -> tuple[Client, int]:
    paho = paho_mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="", protocol=V5, reconnect_on_failure=False
    )
    client = Client(paho, V5)
    paho.tls_set_context(client_context(pki, identity))
    paho.on_connect = lambda _c, _u, flags, reason, props: client.connack.put((flags, reason, props))
    paho.connect("127.0.0.1", server.ports["mqtt-tls"])
    paho.loop_start()
    _flags, reason, _props = client.connack.get(timeout=10)
    return client, int(reason.value)


def test_mqtt_certificate_identity_is_the_username(tls_server: RunningServer, pki: dict[str, Path]) -> None:
    alice, reason = mqtt_over_tls(tls_server, pki, "alice")  # no user name, no password
    try:
        assert reason == 0
        assert puback(alice, "alice/from-cert") == 0
        assert puback(alice, "bob/private/inbox") == NOT_AUTHORIZED  # alice's rules apply
    finally:
        alice.client.disconnect()
        alice.client.loop_stop()
    anonymous, reason = mqtt_over_tls(tls_server, pki, None)  # no certificate: anonymous, refused
    anonymous.client.loop_stop()
    assert reason == NOT_AUTHORIZED


def test_a_certificate_from_another_ca_is_not_accepted(
    tls_server: RunningServer, pki: dict[str, Path]
) -> None:
    """The same CN from a CA the server does not trust: the TLS handshake fails, no CONNACK."""
    raw = socket.create_connection(("127.0.0.1", tls_server.ports["mqtt-tls"]), timeout=10)
    context = client_context(pki, "nobody")
    with (
        pytest.raises((ssl.SSLError, ConnectionError)),
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(encode(Connect(protocol_level=5, client_id="x"), 5))
        if not tls.recv(4):
            raise ConnectionError("closed without a CONNACK")


def test_amqp091_sasl_external(tls_server: RunningServer, pki: dict[str, Path]) -> None:
    pika = pytest.importorskip("pika")
    params = pika.ConnectionParameters(
        "127.0.0.1",
        tls_server.ports["amqps"],
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(client_context(pki, "alice"), "localhost"),
        connection_attempts=1,
    )
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.queue_declare("alice-work", durable=True)  # alice's rules: all on $queue/alice-work
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("invoices", durable=True)
        assert caught.value.reply_code == 403
    finally:
        connection.close()


def test_amqp1_sasl_external(tls_server: RunningServer, pki: dict[str, Path]) -> None:
    pytest.importorskip("proton")
    from proton import SSLDomain
    from proton.utils import BlockingConnection, LinkDetached

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki["ca"]))
    domain.set_credentials(str(pki["alice"]), str(pki["alice"]), None)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    url = f"amqps://localhost:{tls_server.ports['amqps']}"
    connection = BlockingConnection(url, timeout=10, ssl_domain=domain, allowed_mechs="EXTERNAL")
    try:
        receiver = connection.create_receiver("topic://alice/#")
        receiver.close()
        with pytest.raises(LinkDetached) as caught:
            connection.create_receiver("topic://bob/#")
        assert str(caught.value.condition) == "amqp:unauthorized-access"
    finally:
        connection.close()
