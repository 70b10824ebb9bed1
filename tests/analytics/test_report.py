"""The audit's report: charts (without Spark), the HTML in words, and the pages in a real headless
Chromium (Debian's ``chromium`` and ``chromium-driver``; skipped with the reason when missing)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.legend import Legend
from matplotlib.text import Text

from trimaran.analytics import report
from trimaran.analytics.life import FATES
from trimaran.analytics.result import AuditResult

START = 1_790_000_000_000
GRID = list(range(START, START + 120_000, 1000))  # 120 one-second buckets


def _tables() -> dict[str, pd.DataFrame]:
    """Chart tables as ``figure_tables`` makes them: a steady queue, and a dead-letter queue that
    got one burst of 2,000 messages in one second and nothing else."""
    steady = pd.DataFrame({"queue": "orders", "kind": "published", "bucket": GRID, "n": 5})
    burst = pd.DataFrame({"queue": ["$dlq/jobs"], "kind": ["published"], "bucket": [GRID[60]], "n": [2000]})
    throughput = report.zero_filled(pd.concat([steady, burst]), ["queue", "kind"], "n", GRID)
    throughput["rate_per_s"] = throughput["n"] * 1.0
    quantiles = pd.DataFrame(
        [
            {"queue": q, "group": g, "acked": 100, "quantile": p, "ms": ms * (1 + 10 * p)}
            for q, g, ms in (
                ("orders", "$default", 10.0),
                ("orders", "billing", 30.0),
                ("$dlq/jobs", "$default", 5),
            )
            for p in report.QUANTILES
        ]
    )
    redeliveries = pd.DataFrame(
        {"queue": ["orders", "orders", "$dlq/jobs"], "group": ["$default", "$default", "$default"],
         "reason": ["first", "nack", "first"], "n": [90, 10, 2000]}
    )  # fmt: skip
    dead = pd.DataFrame({"queue": ["orders"], "group": ["$default"], "kind": ["dead_lettered"],
                         "reason": ["max_attempts"], "n": [3]})  # fmt: skip
    consumers = pd.DataFrame(
        {"queue": ["orders"], "group": ["$default"], "consumer": ["c1"], "deliveries": [9]}
    )
    lag = pd.DataFrame({"queue": "orders", "group": "$default", "bucket": GRID, "lag": 3})
    return {
        "throughput": throughput, "latency_quantiles": quantiles, "redeliveries": redeliveries,
        "dead_letters": dead, "consumers": consumers, "lag": lag,
    }  # fmt: skip


@pytest.fixture
def drawn() -> Iterator[dict[str, Any]]:
    """Every chart of ``_tables``, drawn (so tick labels and legends are laid out)."""
    with report.literal_text():
        figures = {name: fig for name, _, fig in report.figures(_tables())}
        for fig in figures.values():
            fig.canvas.draw()
        yield figures


def test_a_one_second_burst_is_drawn_with_a_marker_over_zero_filled_buckets(drawn: dict[str, Any]) -> None:
    ax = drawn["throughput.png"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    burst = lines["$dlq/jobs published"]
    assert list(burst.get_ydata()) == [0] * 60 + [2000] + [0] * 59  # idle buckets drawn as zero
    assert burst.get_marker() in ("None", "none", "", None)
    markers = [
        line for line in ax.get_lines() if line.get_marker() == "o" and line.get_color() == burst.get_color()
    ]
    assert [list(m.get_ydata()) for m in markers] == [[2000]]  # the sparse series' one busy bucket
    steady = lines["orders published"]
    assert not [
        line for line in ax.get_lines() if line.get_marker() == "o" and line.get_color() == steady.get_color()
    ]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 2000


def test_dollar_signs_in_names_are_literal_text(drawn: dict[str, Any]) -> None:
    """``$dlq/jobs`` and ``$default`` as typed, in legends, tick labels and titles of every chart."""
    seen = []
    for fig in drawn.values():
        for text in fig.findobj(Text):
            if "$" in text.get_text():
                assert not text.get_parse_math(), text.get_text()
                seen.append(text.get_text())
    assert "$dlq/jobs published" in seen
    assert "$dlq/jobs: publish -> ack latency" in seen
    assert "$dlq/jobs/$default" in seen  # a bar's tick label
    assert any(t.startswith("$default: p50 ") for t in seen)


def test_legends_sit_outside_the_data(drawn: dict[str, Any]) -> None:
    checked = 0
    for name, fig in drawn.items():
        for ax in fig.axes:
            legend = ax.get_legend()
            if isinstance(legend, Legend):
                renderer = fig.canvas.get_renderer()
                assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1, name
                checked += 1
    assert checked >= 4  # throughput, both latency charts, deliveries by reason, lag


def test_one_latency_chart_per_queue_with_times_in_words(drawn: dict[str, Any]) -> None:
    latency = {name: fig for name, fig in drawn.items() if name.startswith("latency-")}
    assert len(latency) == 2
    ax = drawn[f"latency-{report.slug('orders')}.png"].axes[0]
    assert ax.get_title() == "orders: publish -> ack latency"
    assert {line.get_label().split(":")[0] for line in ax.get_lines()} == {"$default", "billing"}
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "10 ms" in ticks and "100 ms" in ticks


def test_times_and_spans_in_words() -> None:
    assert report.when(START) == "2026-09-21 14:13:20.000 UTC"
    assert report.when(START, precise=False) == "21 Sep 2026 14:13:20 UTC"
    assert report.duration(656_000) == "10 minutes 56 seconds"
    assert report.duration(3 * 3600_000 + 60_000 + 5_000) == "3 hours 1 minute"
    assert report.elapsed(1_002) == "1,002 ms"
    assert report.slug("$dlq/orders:3") != report.slug("_dlq/orders:3")


# -- the report of an audit (Spark) -----------------------------------------------------------------


def test_each_groups_messages_are_counted_once(
    faulty_audit: tuple[AuditResult, Path, dict[str, set[str]]],
) -> None:
    """Per group, published splits exactly into the ledger's fates; the messages whose fate went
    missing are the ones unaccounted for, on their queue's row and their group's."""
    result, _, expected = faulty_audit
    for (queue, group), by in result.outcomes.items():
        if group is not None:
            assert by["published"] == sum(by.get(o, 0) for o in FATES), (queue, group, by)
        else:
            whole = ("finished", "stored", "expired", "dropped", "purged", "redriven", "lost")
            assert by["published"] == sum(by.get(o, 0) for o in whole), (queue, by)
    unaccounted = expected["accounted"]
    assert sum(by.get("lost", 0) for (_, g), by in result.outcomes.items() if g is None) == len(unaccounted)
    for message in unaccounted:
        assert result.outcomes[(message.partition(":")[0], None)]["lost"] >= 1
    assert result.outcomes[("orders", "billing")]["lost"] == 1  # its history of orders:N deleted
    assert result.outcomes[("ticks", None)]["published"] == result.outcomes[("ticks", None)]["stored"] + 2


def test_the_summary_is_words_not_reprs(faulty_audit: tuple[AuditResult, Path, dict[str, set[str]]]) -> None:
    _, directory, _ = faulty_audit
    page = (directory / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", re.sub(r"<style>.*?</style>", "", page, flags=re.S))
    for leftover in ("{'", "None", "group_message_pairs", "since_ms", "first_event_at", "events_by_kind"):
        assert leftover not in text
    assert re.search(r"from \d{1,2} \w{3} 20\d\d \d\d:\d\d:\d\d UTC to ", text)
    assert "14 rules of 16 broken, by 23 violations" in " ".join(text.split())


# -- in a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/system-deps.sh installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield session
    session.quit()


def _screenshot(browser: Any, path: Path, height: int) -> None:
    """The page's first ``height`` pixels (or all of it) as a PNG; also copied into the directory
    ``TRIMARAN_SCREENSHOTS`` names (how the README's pictures are made)."""
    full = int(browser.execute_script("return document.documentElement.scrollHeight"))
    browser.set_window_size(1400, min(full, height))
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    keep = os.environ.get("TRIMARAN_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / path.name)


def test_the_report_in_a_browser(
    browser: Any, faulty_audit: tuple[AuditResult, Path, dict[str, set[str]]], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    _, directory, expected = faulty_audit
    browser.get((directory / "index.html").as_uri())
    assert browser.title == "Trimaran queue audit"
    assert "14 rules of 16 broken" in browser.find_element(By.CSS_SELECTOR, "p.summary").text

    # The per-queue and per-group table.
    table = browser.find_element(By.ID, "outcomes")
    assert table.is_displayed()
    heads = [th.text for th in table.find_elements(By.TAG_NAME, "th")]
    for column in ("published", "acked", "redelivered", "dead-lettered", "expired", "dropped", "purged",
                   "still pending", "not yet delivered", "unaccounted"):  # fmt: skip
        assert column in heads
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in table.find_elements(By.TAG_NAME, "tr")
    ]
    assert ["orders", "billing"] in [r[:2] for r in rows] and ["$dlq/orders", "(queue)"] in [
        r[:2] for r in rows
    ]

    # A violation with its message's events inline, the offending event marked.
    (stray,) = expected["acked_stays_acked"]
    box = next(
        b for b in browser.find_elements(By.CSS_SELECTOR, "div.violation") if b.text.startswith(stray + " ")
    )
    assert "after its ack" in box.text
    marked = box.find_elements(By.CSS_SELECTOR, "table.timeline tr.bad")
    assert len(marked) == 1 and "delivered" in marked[0].text and "$default-c9" in marked[0].text
    images = browser.execute_script(
        "return [...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])"
    )
    assert images and all(ok for _, ok in images), images
    assert any("latency-" in src for src, _ in images)
    _screenshot(browser, tmp_path / "audit-report.png", 2400)
    browser.execute_script("document.getElementById('outcomes').previousElementSibling.scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "audit-outcomes.png"))
    if os.environ.get("TRIMARAN_SCREENSHOTS"):
        shutil.copy(tmp_path / "audit-outcomes.png", Path(os.environ["TRIMARAN_SCREENSHOTS"]))
    browser.execute_script("window.scrollTo(0, 0)")

    # One message's page: its groups and every event, with times, consumers and reasons.
    box.find_element(By.TAG_NAME, "a").click()
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Message {stray}"
    groups = browser.find_element(By.ID, "groups").text
    assert "$default acked" in groups and "finished" in groups  # its ledger line, and its state
    events = browser.find_element(By.CSS_SELECTOR, "table.timeline").find_elements(By.TAG_NAME, "tr")
    kinds = [tr.find_elements(By.TAG_NAME, "td")[4].text for tr in events[1:]]
    assert kinds == ["published", "delivered", "acked", "delivered"]
    assert "acked_stays_acked in group $default" in browser.find_element(By.TAG_NAME, "ul").text
    _screenshot(browser, tmp_path / "audit-message.png", 900)

    # A message whose fate in one group went missing: that group's ledger line says so.
    lost = next(m for m in expected["accounted"] if m.startswith("orders:"))
    browser.get((directory / "messages" / f"{report.slug(lost)}.html").as_uri())
    lines = {
        tr.find_elements(By.TAG_NAME, "td")[0].text: tr.find_elements(By.TAG_NAME, "td")[1].text
        for tr in browser.find_element(By.ID, "groups").find_elements(By.TAG_NAME, "tr")[1:]
    }
    assert lines == {"$default": "acked", "billing": "unaccounted for"}
    assert "accounted in group billing" in browser.find_element(By.TAG_NAME, "ul").text
    browser.back()

    # The message search.
    browser.find_element(By.LINK_TEXT, "messages").click()
    search = browser.find_element(By.ID, "search")
    search.send_keys("ticks:")
    shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#list li") if li.is_displayed()]
    assert shown and all(t.startswith("ticks:") for t in shown)
    assert browser.find_element(By.ID, "shown").text == str(len(shown))
