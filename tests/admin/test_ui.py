"""The management page at /ui in a real headless Chromium (selenium): log in with a token, see a
queue appear after an MQTT publish, purge it, publish from the page, see the sessions, kick a client,
see a failing webhook endpoint, watch the charts move under load, see a bridge to a real Mosquitto, its
charts move, and restart it; and the files it is served from.
With TRIMARAN_SCREENSHOTS=DIR it takes the manual's screenshots of each page.

Needs Debian's ``chromium`` and ``chromium-driver`` (scripts/system-deps.sh installs them) and
selenium (the dev extra); the browser tests are skipped, saying which is missing, without them.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.bridges import bridged_with_admin
from tests.support.browser import needs_browser, snap, wait
from tests.support.paho import V5, Endpoints, connect
from tests.support.server import RunningServer, refused_port
from trimaran.admin.ui import FILES, asset

TOKEN = "page-token"
ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "127.0.0.1:0"]


# An endpoint nobody listens on: the first client.connected event makes it fail.
WEBHOOK_URL = f"http://127.0.0.1:{refused_port()}/hooks/secret-path"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN]),
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_WEBHOOKS__ENDPOINTS": json.dumps([{"url": WEBHOOK_URL, "events": ["client.*"]}]),
        "TRIMARAN_WEBHOOKS__FLUSH_TIMEOUT_S": "0.2",
        "TRIMARAN_TELEMETRY__HISTORY_INTERVAL_S": "0.5",  # the charts' samples, quicker than the default 5 s
        # alice, whom the Vhosts page grants a permission (RabbitMQ refuses a user that exists nowhere)
        "TRIMARAN_AUTH__USERS": json.dumps([{"name": "alice", "password": "a"}]),
    }
    running = RunningServer(ARGS, cwd=tmp_path_factory.mktemp("page"), env=env).start()
    try:
        yield running
    finally:
        assert running.stop() == 0, running.output()


def get(server: RunningServer, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_page_files_are_served_with_their_types_and_a_strict_policy(server: RunningServer) -> None:
    for path in ("/ui", "/ui/"):
        status, headers, body = get(server, path)
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert body == asset("index.html")
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
    for name, content_type in FILES.items():
        status, headers, body = get(server, f"/ui/{name}")
        assert status == 200 and headers["content-type"] == content_type and body == asset(name)
    assert get(server, "/ui/../pyproject.toml")[0] == 404
    assert get(server, "/ui/secrets.txt")[0] == 404


def test_page_writes_server_values_as_text_only() -> None:
    script = asset("app.js").decode()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script
    html = asset("index.html").decode()
    assert "http://" not in html and "https://" not in html  # no CDN: everything ships in the package


def click(browser: Any, selector: str, label: str) -> None:
    """Click the button with ``label`` among ``selector``, looked up and clicked in one go: the page
    re-renders its tables on every refresh, which makes an element found a moment earlier stale."""
    from selenium.webdriver.common.by import By

    def attempt() -> bool:
        for button in browser.find_elements(By.CSS_SELECTOR, selector):
            if button.text == label:
                button.click()
                return True
        return False

    wait(attempt)


@needs_browser
def test_login_queue_purge_and_kick(server: RunningServer, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    base = f"http://127.0.0.1:{server.ports['http']}"
    browser.get(f"{base}/ui")
    browser.find_element(By.ID, "token").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    error = wait(lambda: browser.find_element(By.ID, "error").text)
    assert error.startswith("Log in failed")

    token = browser.find_element(By.ID, "token")
    token.clear()
    token.send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    version = wait(lambda: browser.find_element(By.CSS_SELECTOR, '#facts dd[data-fact="version"]').text)
    assert version.startswith("0.")
    build = browser.find_element(By.CSS_SELECTOR, '#facts dd[data-fact="build"]').text
    assert build in ("compiled", "source")
    assert browser.find_element(By.ID, "server").text.endswith(f" · {build}")
    wait(lambda: browser.find_element(By.CSS_SELECTOR, "#rates td").text != "-", timeout=6)
    snap(browser, "overview")

    mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
    publisher = connect(mqtt, "page-publisher", version=V5)
    try:
        for n in range(3):
            publisher.client.publish("$queue/browser-jobs", f"job {n}".encode(), qos=1).wait_for_publish(5)
        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="queues"]').click()
        row = '#queue-rows tr[data-queue="browser-jobs"]'
        wait(lambda: browser.find_element(By.CSS_SELECTOR, f'{row} td[data-field="depth"]').text == "3")

        click(browser, f"{row} button", "Peek")
        wait(lambda: "job 0" in browser.find_element(By.ID, "peek-rows").text)
        snap(browser, "queues")

        click(browser, f"{row} button", "Purge")
        browser.switch_to.alert.accept()
        wait(lambda: browser.find_element(By.CSS_SELECTOR, f'{row} td[data-field="depth"]').text == "0")

        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="publish"]').click()
        browser.find_element(By.ID, "publish-topic").send_keys("$queue/browser-jobs")
        browser.find_element(By.ID, "publish-payload").send_keys("from the page")
        browser.find_element(By.CSS_SELECTOR, "#publish-form button").click()
        result = wait(lambda: browser.find_element(By.ID, "publish-result").text)
        assert result == "stored in browser-jobs at offset 3", result  # offsets 0-2 were purged
        snap(browser, "publish")

        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="sessions"]').click()
        wait(
            lambda: browser.find_element(By.CSS_SELECTOR, '#session-rows tr[data-client-id="page-publisher"]')
        )
        snap(browser, "sessions")

        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="connections"]').click()
        client_row = '#connection-rows tr[data-client-id="page-publisher"]'
        kick = wait(lambda: browser.find_element(By.CSS_SELECTOR, f"{client_row} button"))
        snap(browser, "connections")
        kick.click()
        browser.switch_to.alert.accept()
        reason, _ = publisher.disconnects.get(timeout=10)
        assert reason.value == 0x98  # administrative action
        wait(lambda: not browser.find_elements(By.CSS_SELECTOR, client_row))
    finally:
        publisher.client.loop_stop()

    # The publisher's connection was an event for the webhook endpoint, which cannot be reached.
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="webhooks"]').click()
    hook_row = '#webhook-rows tr[data-webhook="webhook-0"]'
    health = f'{hook_row} td[data-field="health"]'
    assert wait(lambda: browser.find_element(By.CSS_SELECTOR, health).text == "failing")
    row_text = browser.find_element(By.CSS_SELECTOR, hook_row).text
    port = WEBHOOK_URL.split(":")[2].split("/")[0]
    assert f"http://127.0.0.1:{port}/…" in row_text and "secret-path" not in row_text
    assert "client.*" in row_text
    last_error = browser.find_element(By.CSS_SELECTOR, f'{hook_row} td[data-field="last-error"]').text
    assert "cannot connect" in last_error, last_error
    assert browser.find_element(By.ID, "webhooks-none").is_displayed() is False
    snap(browser, "webhooks")
    # A node alone: the cluster tab says so (tests/cluster shows one with its nodes).
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="cluster"]').click()
    assert wait(lambda: browser.find_element(By.ID, "cluster-none").is_displayed())


def _chart(browser: Any, chart: str) -> tuple[int, list[float | None]]:
    """A chart's drawn samples and the newest value of each of its series (app.js sets both)."""
    from selenium.webdriver.common.by import By

    svg = browser.find_element(By.ID, chart)
    samples = int(svg.get_attribute("data-samples") or 0)
    last = [float(v) if v else None for v in (svg.get_attribute("data-last") or "").split(",")]
    return samples, last


@needs_browser
def test_charts_move_under_load(server: RunningServer, browser: Any) -> None:
    import threading

    from selenium.webdriver.common.by import By

    browser.get(f"http://127.0.0.1:{server.ports['http']}/ui")
    if browser.find_element(By.ID, "login").is_displayed():
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
    tab = browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="overview"]')
    wait(tab.is_displayed)  # (the login's answer shows the tabs: under load, not at once)
    tab.click()
    before, _ = wait(lambda: (c := _chart(browser, "chart-messages"))[0] >= 2 and c)

    mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
    subscriber = connect(mqtt, "chart-subscriber", version=V5)
    subscriber.client.subscribe("charts/#", qos=0)
    publisher = connect(mqtt, "chart-publisher", version=V5)
    stop = threading.Event()

    def load() -> None:
        n = 0
        while not stop.is_set():
            publisher.client.publish("charts/load", b"x" * 32, qos=0)
            if n % 10 == 0:
                publisher.client.publish("$queue/chart-jobs", b"job", qos=1)
            n += 1
            time.sleep(0.002)

    pump = threading.Thread(target=load, daemon=True)
    pump.start()
    try:
        # Messages in and out per second rise above zero, and new samples keep arriving. (The drawing
        # before the load can already show rates: the module's server carries the earlier tests'.)
        samples, (rate_in, rate_out, _dropped) = wait(
            lambda: (
                (c := _chart(browser, "chart-messages"))[0] > before
                and (c[1][0] or 0) > 10
                and (c[1][1] or 0) > 0
                and c
            ),
            timeout=15,
        )
        assert samples > before and rate_in is not None and rate_in > 10 and rate_out is not None
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-messages polyline")
        _, (connections, *_) = wait(lambda: (c := _chart(browser, "chart-connections"))[1][0] and c)
        assert connections is not None and connections >= 2
        snap(browser, "overview-charts")

        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="queues"]').click()
        legend = "#chart-queue-depth + .legend"
        wait(lambda: "chart-jobs" in browser.find_element(By.CSS_SELECTOR, legend).text, timeout=15)
        first, _ = _chart(browser, "chart-queue-depth")
        # The deepest queue is the first line: chart-jobs grows, nobody consumes it.
        depth = wait(lambda: (c := _chart(browser, "chart-queue-depth"))[0] > first and c[1][0], timeout=15)
        assert depth is not None and depth > 0
        published = wait(lambda: _chart(browser, "chart-queue-published")[1][0], timeout=15)
        assert published is not None and published > 0
        snap(browser, "queue-charts")
    finally:
        stop.set()
        pump.join(5)
        publisher.client.loop_stop()
        subscriber.client.loop_stop()


@needs_browser
def test_limits_page_sets_shows_and_clears_limits(server: RunningServer, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base = f"http://127.0.0.1:{server.ports['http']}"
    browser.get(f"{base}/ui")
    if browser.find_element(By.ID, "login").is_displayed():
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="limits"]').click()

    mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
    client = connect(mqtt, "limits-page", version=V5)
    try:
        connections = browser.find_element(By.ID, "vhost-limit-connections")
        connections.clear()
        connections.send_keys("7")
        browser.find_element(By.CSS_SELECTOR, "#vhost-limit-form button").click()
        row = '#vhost-limit-rows tr[data-vhost="/"]'
        limit = f'{row} td[data-field="max-connections"]'
        wait(lambda: browser.find_element(By.CSS_SELECTOR, limit).text == "7")
        # This client at least (the charts' clients may still be going).
        assert int(browser.find_element(By.CSS_SELECTOR, f'{row} td[data-field="connections"]').text) >= 1
    finally:
        client.disconnect()

    browser.find_element(By.ID, "user-limit-name").send_keys("alice")
    messages = browser.find_element(By.ID, "user-limit-messages")
    messages.clear()
    messages.send_keys("250")
    browser.find_element(By.CSS_SELECTOR, "#user-limit-form button").click()
    user_row = '#user-limit-rows tr[data-user="alice"]'
    wait(lambda: browser.find_element(By.CSS_SELECTOR, f'{user_row} td[data-field="messages"]').text == "250")

    picker = Select(browser.find_element(By.ID, "vhost"))
    assert [o.text for o in picker.options] == ["all", "/"]
    picker.select_by_visible_text("/")
    assert wait(lambda: browser.find_elements(By.CSS_SELECTOR, row))
    snap(browser, "limits")

    click(browser, f"{user_row} button", "Clear")
    browser.switch_to.alert.accept()
    wait(lambda: not browser.find_elements(By.CSS_SELECTOR, user_row))
    click(browser, f"{row} button", "Clear")
    browser.switch_to.alert.accept()
    # The row stays while the vhost has connections, without limits.
    wait(
        lambda: (
            not browser.find_elements(By.CSS_SELECTOR, row)
            or browser.find_element(By.CSS_SELECTOR, limit).text == "0"
        )
    )


@needs_browser
def test_vhosts_page_adds_a_vhost_sets_a_permission_and_filters_by_vhost(
    server: RunningServer, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(f"http://127.0.0.1:{server.ports['http']}/ui")
    if browser.find_element(By.ID, "login").is_displayed():
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="vhosts"]').click()
    wait(lambda: browser.find_elements(By.CSS_SELECTOR, '#vhost-rows tr[data-vhost="/"]'))

    browser.find_element(By.ID, "vhost-name").send_keys("team-b")
    browser.find_element(By.CSS_SELECTOR, "#vhost-form button").click()
    row = '#vhost-rows tr[data-vhost="team-b"]'
    wait(lambda: browser.find_elements(By.CSS_SELECTOR, row))
    vhost_field = browser.find_element(By.ID, "permission-vhost")
    vhost_field.clear()
    vhost_field.send_keys("team-b")
    browser.find_element(By.ID, "permission-user").send_keys("alice")
    read = browser.find_element(By.ID, "permission-read")
    read.clear()
    read.send_keys("^reports")
    browser.find_element(By.CSS_SELECTOR, "#permission-form button").click()
    permission = '#permission-rows tr[data-permission="team-b alice"]'
    assert "^reports" in wait(lambda: browser.find_element(By.CSS_SELECTOR, permission).text)

    picker = Select(browser.find_element(By.ID, "vhost"))
    wait(lambda: "team-b" in [o.text for o in picker.options])
    picker.select_by_visible_text("/")
    wait(
        lambda: (
            not browser.find_elements(By.CSS_SELECTOR, permission)
            and not browser.find_elements(By.CSS_SELECTOR, row)
        )
    )
    picker.select_by_visible_text("team-b")
    wait(lambda: browser.find_elements(By.CSS_SELECTOR, permission))
    snap(browser, "vhosts")
    picker.select_by_visible_text("all")

    click(browser, f"{row} button", "Delete")
    browser.switch_to.alert.accept()
    wait(lambda: not browser.find_elements(By.CSS_SELECTOR, row))
    assert not browser.find_elements(By.CSS_SELECTOR, permission)  # it went with the vhost
    wait(lambda: "team-b" not in [o.text for o in Select(browser.find_element(By.ID, "vhost")).options])


@needs_browser
def test_bridges_tab_shows_a_bridge_and_restarts_it(tmp_path: Path, browser: Any) -> None:
    """A server of its own, with a bridge to a real Mosquitto (skipped without one): its row, its
    charts moving as messages cross, a restart."""
    from selenium.webdriver.common.by import By

    env = {"TRIMARAN_TELEMETRY__HISTORY_INTERVAL_S": "0.5"}  # the charts' samples, as the server above
    with bridged_with_admin(tmp_path, TOKEN, ["# out 1 edge/ cloud/"], env) as (server, port):
        browser.get(f"http://127.0.0.1:{server.ports['http']}/ui")
        if browser.find_element(By.ID, "login").is_displayed():
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.CSS_SELECTOR, "#login button").click()
        tab = browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="bridges"]')
        wait(tab.is_displayed)  # (the login's answer shows the tabs: under load, not at once)
        tab.click()
        row = '#bridge-rows tr[data-bridge="cloud"]'

        def shown(field: str) -> str:
            return str(browser.find_element(By.CSS_SELECTOR, f'{row} td[data-field="{field}"]').text)

        assert wait(lambda: shown("state").startswith("connected for "))
        assert shown("address") == f"127.0.0.1:{port} (MQTT 3.1.1)"
        assert (shown("last-error"), shown("backlog")) == ("-", "0")
        assert browser.find_element(By.ID, "bridges-none").is_displayed() is False

        sensor = connect(Endpoints("127.0.0.1", server.ports["mqtt"]), "page-sensor", version=V5)
        try:
            for n in range(3):
                sensor.publish(f"edge/t{n}", b"21.5", qos=1)
            assert wait(lambda: shown("sent") == "3")  # the remote acknowledged each

            def sent_per_s() -> float:
                sensor.publish("edge/more", b"21.5", qos=1)  # one more each look: every sample has some
                _, (sent, _received) = _chart(browser, "chart-bridge-rates-cloud")
                return sent or 0.0

            # The bridge's charts: messages out per second above zero, the backlog drawn.
            assert wait(sent_per_s, timeout=15) > 0
            assert browser.find_elements(By.CSS_SELECTOR, "#chart-bridge-rates-cloud polyline")
            samples, (backlog,) = _chart(browser, "chart-bridge-backlog-cloud")
            assert samples >= 2 and backlog is not None
        finally:
            sensor.disconnect()
        snap(browser, "bridges")

        click(browser, f"{row} button", "Restart")
        assert server.wait_for_log_count("bridge cloud: connected", 2), server.output()
        assert wait(lambda: shown("state").startswith("connected for "))
