"""The web console (/ui) in headless Chromium against a real 3-node cluster with API tokens required.

Debian's chromium (installed by scripts/setup) is driven by Playwright; nothing is downloaded and
the page reaches nothing but the node. Each view is checked against the API's own answers, and a
screenshot of it is written to test-output/console/ (printed at the end of each test).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.client import Consumer

from .harness import Cluster, running, wait_until

pytestmark = pytest.mark.timeout(240)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "console"
ADMIN_TOKEN = "console-test-admin-token-0123456789"
VIEWER_TOKEN = "console-test-viewer-token-0123456789"  # consume + produce on orders*, no admin
SECURITY = f"""
[security]
[[security.tokens]]
name = "ops"
token = "{ADMIN_TOKEN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]
[[security.tokens]]
name = "console"
token = "{VIEWER_TOKEN}"
consume = ["orders*"]
produce = ["orders*"]
[delivery]
tick_ms = 100
[limits]
lag_sample_ms = 500
"""

if not os.path.exists(CHROMIUM):  # scripts/setup installs it; ./scripts/test never gets here
    pytest.skip(f"{CHROMIUM} is missing: run ./scripts/setup test", allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(
        Cluster(tmp_path_factory.mktemp("console"), nodes=3, extra_toml=SECURITY), ADMIN_TOKEN
    ) as cluster:
        _fill(cluster)
        yield cluster


def _ok(r: requests.Response) -> Any:
    assert r.status_code in (200, 201), r.text
    return r.json()


def _fill(c: Cluster) -> None:
    """orders: 3 queues with 5, 4 and 3 messages; billing committed 2, 4, 0 (lag 3 + 0 + 3);
    workers dead-lettered one poison message (max_deliveries 1)."""
    c.create_topic("orders", queues=3)
    c.create_topic("audit", queues=1)  # the viewer's token may not see it
    for q, n in enumerate((5, 4, 3)):
        _ok(c.produce("orders", [{"value": f"order {q}-{i}", "key": f"k{i}", "queue": q} for i in range(n)]))
    body = {"topic": "orders", "offsets": {"0": 2, "1": 4, "2": 0}}
    _ok(c.session.put(c.url() + "/v1/groups/billing/offsets", json=body))
    _ok(c.session.put(c.url() + "/v1/topics/orders/subscriptions/workers", json={"max_deliveries": 1}))
    _ok(c.produce("orders", [{"value": "poison pill", "key": "bad", "queue": 1}]))
    sub = "/v1/topics/orders/subscriptions/workers"
    got = _ok(c.post(sub + "/receive", {"max": 100, "wait_ms": 2000, "visibility_ms": 60000}))["messages"]
    poison = [m for m in got if m["value"] == "poison pill"]
    _ok(c.post(sub + "/ack", {"receipts": [m["receipt"] for m in got if m not in poison]}))
    (result,) = _ok(c.post(sub + "/nack", {"receipts": [poison[0]["receipt"]]}))["results"]
    assert result.get("dead_lettered") is True, result


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, c: Cluster) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Before the token is entered the API answers 401, which the browser logs; that is expected.
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "401" not in m.text else None)
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(c.url("n1")) else outside.append(r.url))
    page.goto(c.url("n1") + "/ui")
    page.fill("#token", VIEWER_TOKEN)
    page.click("#token-form button[type=submit]")
    yield page
    context.close()
    assert not outside, f"the console reached outside its node: {outside}"
    assert not errors, f"errors in the page: {errors}"


def shot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, f"{path}: {len(data)} bytes"
    print(f"screenshot: {path}")
    return path


def test_the_console_files_are_served_without_a_token_and_locked_to_the_node(c: Cluster) -> None:
    for path, kind in (("/ui", "text/html"), ("/ui/", "text/html"), ("/ui/console.js", "text/javascript")):
        r = requests.get(c.url("n2") + path, timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(kind), (path, r.status_code)
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    for bad in ("/ui/..%2Fconsole.py", "/ui/console.py", "/ui/nothing.js"):
        r = requests.get(c.url("n2") + bad, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", bad
    # The data is not: without a token the API refuses.
    assert requests.get(c.url("n2") + "/v1/topics/orders/groups", timeout=10).status_code == 401


def test_without_a_token_the_page_says_the_api_refused(browser: Browser, c: Cluster) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(c.url("n2") + "/ui")
    expect(page.locator("#banner")).to_contain_text("401 unauthorized", timeout=10_000)
    expect(page.locator("#banner")).to_contain_text("Enter an API token")
    context.close()


def test_cluster_view_shows_every_node_and_the_leader_and_term_of_every_group(page: Page, c: Cluster) -> None:
    rows = page.locator("#groups-table tbody tr[data-group]")
    expect(rows).to_have_count(4, timeout=10_000)
    expect(page.locator("#nodes-table tbody tr[data-node]")).to_have_count(3)
    expect(page.locator("#nodes-table .badge.good")).to_have_count(3)  # all "up"
    for g in c.get("/v1/cluster").json()["groups"]:
        replicas = page.locator(f'#groups-table tr[data-group="{g["group_id"]}"] [data-replica]')
        expect(replicas).to_have_count(3)

    def page_agrees_with_the_api() -> bool:
        """The page shows the leaders and terms the API shows. Both are read again until they
        agree: a leadership may move (the balancer after start-up, an election on a busy machine)
        between the API's answer and the page's next poll."""
        for g in c.get("/v1/cluster").json()["groups"]:
            row = page.locator(f'#groups-table tr[data-group="{g["group_id"]}"]')
            star = row.locator(f'[data-replica="{g["leader"]}"]')
            if (row.locator("td.leader").inner_text(), row.locator("td.term").inner_text()) != (
                g["leader"],
                str(g["term"]),
            ) or "★" not in star.inner_text():
                return False
        return True

    wait_until(page_agrees_with_the_api, 30, interval_s=0.5, what="the page showing the API's leaders")
    expect(page.locator("#cluster-cards")).to_contain_text("3/3")
    shot(page, "cluster")


def test_topics_view_shows_the_queues_offsets_and_consumer_groups_of_a_topic(page: Page, c: Cluster) -> None:
    page.click("nav a[data-view=topics]")
    # The viewer's token sees its topics only (orders and its dead-letter topic), not audit.
    expect(page.locator("#topics-table tbody tr[data-topic]")).to_have_count(2, timeout=10_000)
    expect(page.locator('#topics-table tr[data-topic="audit"]')).to_have_count(0)
    # The dead-letter topic is shown under its source, marked as its dead letters.
    rows = page.locator("#topics-table tbody tr[data-topic]")
    expect(rows.nth(0)).to_have_attribute("data-topic", "orders")
    expect(rows.nth(1)).to_have_attribute("data-topic", "orders.workers.dlq")
    expect(rows.nth(1)).to_have_attribute("data-dead-letter-of", "orders")
    expect(rows.nth(1).locator("td").first).to_contain_text("└ orders.workers.dlq")
    expect(page.locator('#topics-table tr[data-topic="orders"][data-dead-letter-of]')).to_have_count(0)
    page.click('#topics-table tr[data-topic="orders"]')
    queues = c.get("/v1/topics/orders").json()["queues"]
    assert [q["high_offset"] for q in queues] == [5, 5, 3]
    for q in queues:
        row = page.locator(f'#queues-table tr[data-queue="{q["queue"]}"]')
        expect(row.locator("td.high")).to_have_text(str(q["high_offset"]), timeout=10_000)
        expect(row.locator("td.low")).to_have_text(str(q["low_offset"]))

    def leaders_shown() -> bool:  # read again until they agree: a leadership may move meanwhile
        return all(
            q["leader"] in page.locator(f'#queues-table tr[data-queue="{q["queue"]}"]').inner_text()
            for q in c.get("/v1/topics/orders").json()["queues"]
        )

    wait_until(leaders_shown, 30, interval_s=0.5, what="the page showing each queue's leader")
    billing = page.locator('#topic-groups-table tr[data-consumer="billing"]')
    expect(billing).to_contain_text("7")  # (5 - 2) + (5 - 4) + (3 - 0)
    expect(page.locator('#topic-groups-table tr[data-consumer="workers"]')).to_be_visible()
    shot(page, "topics")


def _chart_pixels(page: Page) -> int:
    pixels: int = page.evaluate(
        """() => { let n = 0;
                   for (const c of document.querySelectorAll('#lag-charts canvas')) {
                     const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                     for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
                   }
                   return n; }"""
    )
    return pixels


def test_groups_view_charts_the_lag_over_time(page: Page, c: Cluster) -> None:
    page.click("nav a[data-view=groups]")
    row = page.locator('#consumers-table tr[data-consumer="billing"][data-topic="orders"]')
    expect(row.locator("td.lag")).to_have_text("7", timeout=10_000)
    before = _chart_pixels(page)
    assert before > 0
    # The lag grows with new messages, and the page sees it on its next samples.
    _ok(c.produce("orders", [{"value": f"more {i}", "queue": 2} for i in range(5)]))
    expect(row.locator("td.lag")).to_have_text("12", timeout=10_000)
    series = wait_until(
        lambda: (
            (s := page.evaluate("() => document.querySelectorAll('#consumers-table canvas.spark').length"))
            and s
        ),
        10,
    )
    assert series >= 2  # billing and workers on orders

    # The chart's series holds the growth (7, then 12) and the chart is drawn from it. (Its count
    # of painted pixels is no measure of the line: the time labels and the Y scale change with
    # every redraw, and CI once saw fewer pixels after the lag grew.)
    def billing_lags() -> list[int] | None:
        lags = [lag for _, lag in page.evaluate("() => lagSeries('billing\\u0000orders')")]
        return lags if lags and max(lags) >= 12 else None

    lags = wait_until(billing_lags, 10, what="the chart's series of billing reaching 12")
    assert min(lags) <= 7, lags
    assert _chart_pixels(page) > 0
    row.click()
    detail = page.locator("#consumer-queues-table tbody tr[data-queue]")
    expect(detail).to_have_count(3)
    expect(page.locator('#consumer-queues-table tr[data-queue="2"]')).to_contain_text("8")  # 8 - 0
    shot(page, "groups")


def test_a_dead_letter_can_be_browsed_and_redriven_by_clicking(page: Page, c: Cluster) -> None:
    sub = "/v1/topics/orders/subscriptions/workers"
    page.click("nav a[data-view=dlq]")
    page.click('#dlq-table tr[data-dlq="orders.workers.dlq"]', timeout=10_000)
    letter = page.locator("#dlq-messages tbody tr[data-offset]")
    expect(letter).to_have_count(1, timeout=10_000)
    expect(letter).to_contain_text("poison pill")
    expect(letter).to_contain_text("nacked")
    shot(page, "dead-letters")
    page.click("#redrive-all")
    expect(page.locator("#banner")).to_contain_text("Redrove 1 message", timeout=10_000)
    expect(page.locator("#dlq-messages tbody")).to_contain_text("no dead letters", timeout=10_000)
    assert c.get(sub + "/dlq").json()["messages"] == []
    # A receive answers with what is ready first (the messages produced since, from any queue), so
    # receive until the redriven one comes, acknowledging each answer.
    redriven: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while not redriven and time.monotonic() < deadline:
        got = _ok(c.post(sub + "/receive", {"max": 100, "wait_ms": 3000}))["messages"]
        redriven = [m for m in got if m["value"] == "poison pill"]
        if got:
            _ok(c.post(sub + "/ack", {"receipts": [m["receipt"] for m in got]}))
    assert [(m["attempt"], m["headers"].get("raftmq-redrive-group")) for m in redriven] == [(1, "workers")]
    shot(page, "dead-letters-redriven")


def test_a_malformed_topic_link_opens_the_topics_view_without_an_error(page: Page, c: Cluster) -> None:
    """``#topics/%E0`` is not valid percent-encoding: the view opens with no topic selected."""
    page.goto(c.url("n1") + "/ui#topics/%E0")
    expect(page.locator("#view-topics")).to_be_visible(timeout=10_000)
    expect(page.locator("#topics-table tbody tr[data-topic]")).to_have_count(2, timeout=10_000)
    expect(page.locator("#topic-detail")).to_be_hidden()


XSS = '<img src=x onerror="window.__xss = 1">'


def test_the_message_browser_pages_a_queue_in_text_json_and_hex(page: Page, c: Cluster) -> None:
    """A queue's messages by offset, 20 a page, with key, value, headers and time; a hostile value
    and header are shown as text (no element is made from them, no handler runs)."""
    results = _ok(
        c.produce(
            "orders",
            [{"value": XSS, "key": "<b>key</b>", "headers": {"h": "<i>x</i>"}, "queue": 0}]
            + [{"value": '{"amount": 12, "items": ["a"]}', "key": f"j{i}", "queue": 0} for i in range(24)]
            + [{"value_b64": "AAH/", "queue": 0}],
        )
    )["results"]
    first = results[0]["offset"]
    high = results[-1]["offset"] + 1
    assert [r["offset"] for r in results] == list(range(first, high))
    # Linkable: the topic's queue list links each queue's browser; the oldest page is shown first.
    page.goto(c.url("n1") + "/ui#topics/orders")
    page.click('#queues-table tr[data-queue="0"] a.browse', timeout=10_000)
    assert page.url.endswith("#messages/orders/0")
    rows = page.locator("#messages-table tbody tr[data-offset]")
    expect(rows).to_have_count(20, timeout=10_000)
    expect(rows.first).to_have_attribute("data-offset", "0")
    expect(page.locator("#messages-title")).to_have_text("Messages of orders, queue 0")
    # Next page, then straight to an offset.
    page.click("#messages-next")
    expect(rows.first).to_have_attribute("data-offset", "20", timeout=10_000)
    assert page.url.endswith("#messages/orders/0/20")
    page.fill("#messages-offset", str(first))
    page.click("#messages-form button[type=submit]")
    hostile = page.locator(f'#messages-table tr[data-offset="{first}"]')
    expect(hostile.locator("td.payload")).to_have_text(XSS, timeout=10_000)
    expect(hostile.locator("td.key")).to_have_text("<b>key</b>")
    expect(hostile.locator("td.headers")).to_have_text("h: <i>x</i>")
    expect(hostile.locator("td.time")).to_contain_text("T")  # ISO time
    assert page.locator("#messages-table img, #messages-table b, #messages-table i").count() == 0
    assert page.evaluate("() => window.__xss") is None
    shot(page, "messages-text")
    # JSON view: pretty-printed, and a value that is not JSON says so.
    page.select_option("#messages-format", "json")
    json_row = page.locator(f'#messages-table tr[data-offset="{first + 1}"] td.payload')
    expect(json_row).to_contain_text('"amount": 12,\n  "items": [', timeout=10_000)
    expect(hostile.locator("td.payload")).to_contain_text("not JSON: " + XSS)
    shot(page, "messages-json")
    # Hex view: bytes and printable characters; the binary message's bytes exactly.
    page.select_option("#messages-format", "hex")
    expect(hostile.locator("td.payload")).to_contain_text("3c 69 6d 67 20 73 72 63", timeout=10_000)
    expect(hostile.locator("td.payload")).to_contain_text("<img src=x onerr")
    page.click("#messages-newest")
    binary = page.locator(f'#messages-table tr[data-offset="{high - 1}"] td.payload')
    expect(binary).to_contain_text("00000000  00 01 ff", timeout=10_000)
    expect(page.locator("#messages-next")).to_be_disabled()
    assert page.url.endswith(f"#messages/orders/0/{high - 20}")
    shot(page, "messages-hex")


def test_a_malformed_message_browser_link_opens_the_topics_view(page: Page, c: Cluster) -> None:
    page.goto(c.url("n1") + "/ui#messages/orders/x")
    expect(page.locator("#view-topics")).to_be_visible(timeout=10_000)
    expect(page.locator("#topics-table tbody tr[data-topic]")).to_have_count(2, timeout=10_000)


def test_the_nodes_keep_each_groups_lag_history(c: Cluster) -> None:
    """Every node samples each group's lag (every 500 ms here) and answers its own rings."""

    def billing_samples(node: str) -> list[list[int]]:
        answer = _ok(c.get("/v1/topics/orders/groups/lag", node=node))
        assert answer["topic"] == "orders" and answer["node"] == node and answer["interval_ms"] == 500
        assert answer["history_ms"] == 15 * 60 * 1000
        found = [g["samples"] for g in answer["groups"] if g["group"] == "billing"]
        return found[0] if found else []

    for node in ("n1", "n2", "n3"):
        samples = wait_until(
            lambda n=node: len(s := billing_samples(n)) >= 3 and s, 60, what=f"{node}'s samples"
        )
        times = [t for t, _ in samples]
        assert times == sorted(times) and samples[-1][1] >= 7, samples  # (sampled during _fill too)
    # Same permission as the groups view, and nothing else in the query.
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    r = requests.get(c.url("n2") + "/v1/topics/audit/groups/lag", headers=viewer, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = c.get("/v1/topics/orders/groups/lag?since=0")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    r = c.get("/v1/topics/nothing/groups/lag")
    assert r.status_code == 404 and r.json()["error"]["code"] == "topic_not_found"


def test_the_lag_chart_shows_the_nodes_history_when_the_page_opens(page: Page, c: Cluster) -> None:
    wait_until(
        lambda: any(
            len(g["samples"]) >= 4
            for g in _ok(c.get("/v1/topics/orders/groups/lag", node="n1"))["groups"]
            if g["group"] == "billing"
        ),
        60,
        what="n1's samples of billing",
    )
    opened_ms = page.evaluate("() => Date.now()")
    page.click("nav a[data-view=groups]")
    row = page.locator('#consumers-table tr[data-consumer="billing"][data-topic="orders"]')
    expect(row.locator("td.lag")).to_have_text(re.compile(r"^[0-9,]+$"), timeout=10_000)
    series = page.evaluate("() => lagSeries('billing\\u0000orders')")
    older = [t for t, _ in series if t < opened_ms]
    assert len(older) >= 4, series  # before the page took a sample of its own
    shot(page, "groups-history")


def test_the_lag_charts_y_labels_fit_in_the_canvas(page: Page, c: Cluster) -> None:
    """Labels up to "15,000,000" are drawn inside the chart: nothing at its left edge."""
    page.click("nav a[data-view=groups]")
    expect(page.locator("#consumers-table tbody tr[data-consumer]").first).to_be_visible(timeout=10_000)
    painted_at_left_edge = page.evaluate(
        """() => { const c = document.createElement('canvas'); c.width = 600; c.height = 300;
                   const now = Date.now();
                   const points = [[now - 60000, 0], [now, 12345678]];
                   drawChart(c, [{name: 'big', color: '#000', points}], {});
                   const d = c.getContext('2d').getImageData(0, 0, 3, c.height).data;
                   let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""
    )
    assert painted_at_left_edge == 0


def test_one_dead_letter_is_redriven_alone_when_it_is_the_oldest_of_its_queue(page: Page, c: Cluster) -> None:
    """The API redrives a queue's dead letters in order, so "Redrive this message" is offered on the
    oldest of each queue only; the others say they come after it. Per-queue buttons say "all"."""
    sub = "/v1/topics/orders/subscriptions/workers"
    _ok(c.produce("orders", [{"value": f"bad {i}", "queue": 2} for i in range(2)]))

    def dead_lettered() -> bool:
        got = _ok(c.post(sub + "/receive", {"max": 100, "wait_ms": 1000}))["messages"]
        bad = [m["receipt"] for m in got if m.get("value", "").startswith("bad ")]  # (one is binary)
        done = [m["receipt"] for m in got if m["receipt"] not in bad]
        if done:
            _ok(c.post(sub + "/ack", {"receipts": done}))
        if bad:
            _ok(c.post(sub + "/nack", {"receipts": bad}))
        return [m["value"] for m in c.get(sub + "/dlq").json()["messages"]] == ["bad 0", "bad 1"]

    wait_until(dead_lettered, 60, what="both bad messages dead-lettered")
    page.goto(c.url("n1") + "/ui#dlq/orders/workers")  # linkable
    rows = page.locator("#dlq-messages tbody tr[data-offset]")
    expect(rows).to_have_count(2, timeout=10_000)
    expect(page.locator('#dlq-table tr[data-dlq="orders.workers.dlq"]')).to_have_class(re.compile("selected"))
    expect(page.locator("#dlq-table tr[data-dlq] td.source").first).to_have_text("orders")
    expect(rows.nth(0).locator("button.redrive-one")).to_have_text("Redrive this message")
    expect(rows.nth(1).locator("button")).to_have_count(0)
    expect(rows.nth(1)).to_contain_text("after the ones above")
    expect(page.locator('#redrive-queues button[data-queue="2"]')).to_have_text("Redrive all of queue 2 (2)")
    assert page.locator("#dlq-messages").inner_text().count("Redrive") == 1
    first = rows.nth(0).get_attribute("data-offset")
    shot(page, "dead-letters-per-message")
    rows.nth(0).locator("button.redrive-one").click()
    expect(page.locator("#banner")).to_contain_text(
        f"Redrove the dead letter at offset {first} of queue 2 to orders for workers", timeout=10_000
    )
    expect(rows).to_have_count(1, timeout=10_000)
    expect(rows.nth(0)).to_contain_text("bad 1")
    expect(rows.nth(0).locator("button.redrive-one")).to_be_visible()
    assert [m["value"] for m in c.get(sub + "/dlq").json()["messages"]] == ["bad 1"]
    got = _ok(c.post(sub + "/receive", {"max": 100, "wait_ms": 3000}))["messages"]
    assert [(m["queue"], m.get("value")) for m in got] == [(2, "bad 0")]  # (the rest was acked above)
    _ok(c.post(sub + "/ack", {"receipts": [m["receipt"] for m in got]}))
    page.click('#redrive-queues button[data-queue="2"]')
    expect(page.locator("#dlq-messages tbody")).to_contain_text("no dead letters", timeout=10_000)


def test_a_topic_is_created_and_deleted_with_an_admin_token(browser: Browser, c: Cluster) -> None:
    """Without admin the API's refusal is shown and nothing is made; with an admin token the topic
    is created (then shown), and deleted after a confirmation."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: d.accept() if "Delete topic orders-new" in d.message else d.dismiss())
    page.goto(c.url("n1") + "/ui#topics")
    page.fill("#token", VIEWER_TOKEN)  # consume and produce on orders*, no admin
    page.click("#token-form button[type=submit]")
    expect(page.locator("#topics-table tbody tr[data-topic]")).to_have_count(2, timeout=10_000)
    page.fill("#create-name", "orders-new")
    page.fill("#create-queues", "2")
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#banner")).to_contain_text("403 forbidden", timeout=10_000)
    assert c.get("/v1/topics/orders-new").status_code == 404
    page.fill("#token", ADMIN_TOKEN)
    page.click("#token-form button[type=submit]")
    page.fill("#create-name", "orders-new")
    page.fill("#create-queues", "2")
    page.fill("#create-retention", "6")
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#banner")).to_contain_text("Created topic orders-new with 2 queues", timeout=10_000)
    assert page.url.endswith("#topics/orders-new")
    expect(page.locator("#topic-title")).to_have_text("Topic orders-new", timeout=10_000)
    expect(page.locator("#queues-table tbody tr[data-queue]")).to_have_count(2, timeout=10_000)
    described = _ok(c.get("/v1/topics/orders-new"))
    assert len(described["queues"]) == 2 and described["retention_ms"] == 6 * 3600 * 1000
    shot(page, "topic-created")
    page.click("#delete-topic")
    expect(page.locator("#banner")).to_contain_text("Deleted topic orders-new", timeout=10_000)
    wait_until(lambda: c.get("/v1/topics/orders-new").status_code == 404, 30, what="the topic deleted")
    expect(page.locator('#topics-table tr[data-topic="orders-new"]')).to_have_count(0, timeout=10_000)
    assert page.url.endswith("#topics")
    context.close()
    assert not errors, errors


def test_a_consumer_groups_detail_has_its_own_link(page: Page, c: Cluster) -> None:
    page.click("nav a[data-view=groups]")
    page.click('#consumers-table tr[data-consumer="billing"][data-topic="orders"]', timeout=10_000)
    assert page.url.endswith("#groups/billing/orders")
    expect(page.locator("#consumer-title")).to_have_text("billing on orders", timeout=10_000)
    page.goto(c.url("n1") + "/ui#cluster")
    page.goto(c.url("n1") + "/ui#groups/billing/orders")  # opened from the link alone
    expect(page.locator("#consumer-queues-table tbody tr[data-queue]")).to_have_count(3, timeout=10_000)
    expect(page.locator("#consumer-title")).to_have_text("billing on orders")
    expect(page.locator('#consumers-table tr[data-consumer="billing"]')).to_have_class(re.compile("selected"))


def test_a_consumer_groups_detail_shows_its_members_and_state(page: Page, c: Cluster) -> None:
    """Two clustering consumers (the Python client) of group shipping on orders: the group's detail
    lists them with their queues, says the group is stable, names each queue's holder; when one
    leaves, the other takes every queue."""
    bootstrap = [c.url(n) for n in c.nodes]

    def consumer(member_id: str) -> Consumer:
        return Consumer(
            bootstrap, group="shipping", topics="orders", member_id=member_id, token=VIEWER_TOKEN, wait_ms=200
        )

    packer1, packer2 = consumer("packer-1"), consumer("packer-2")
    try:
        page.goto(c.url("n1") + "/ui#groups/shipping/orders")
        members = page.locator("#group-members-table tbody tr[data-member]")
        expect(members).to_have_count(2, timeout=20_000)
        expect(page.locator("#group-state")).to_have_text("stable", timeout=20_000)
        expect(page.locator('#group-members-table tr[data-member="packer-1"] td.queues')).to_have_text("0, 1")
        expect(page.locator('#group-members-table tr[data-member="packer-2"] td.queues')).to_have_text("2")
        expect(page.locator('#group-members-table tr[data-member="packer-1"] td.seen')).to_contain_text(
            re.compile("just now|s ago")
        )
        # Per queue: the holder next to the committed offset and lag (the consumers commit).
        expect(page.locator('#consumer-queues-table tr[data-queue="2"] td.holder')).to_have_text(
            "packer-2", timeout=20_000
        )
        expect(page.locator('#consumer-queues-table tr[data-queue="0"] td.holder')).to_have_text("packer-1")
        answer = _ok(c.get("/v1/topics/orders/groups/shipping/members", node="n2"))
        held = {m["member_id"]: m["queues"] for m in answer["members"]}
        assert held == {"packer-1": [0, 1], "packer-2": [2]}
        expect(page.locator("#members-note")).to_contain_text("2 members")
        shot(page, "group-members")
        packer2.close()
        expect(members).to_have_count(1, timeout=20_000)
        expect(page.locator('#group-members-table tr[data-member="packer-1"] td.queues')).to_have_text(
            "0, 1, 2", timeout=20_000
        )
        expect(page.locator("#group-state")).to_have_text("stable", timeout=20_000)
        shot(page, "group-members-after-leave")
    finally:
        packer2.close()
        packer1.close()
    # The same permission as the group's lag: the viewer may read orders' groups, not audit's.
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    r = requests.get(c.url("n2") + "/v1/topics/orders/groups/shipping/members", headers=viewer, timeout=10)
    assert r.status_code == 200, r.text
    r = requests.get(c.url("n2") + "/v1/topics/audit/groups/shipping/members", headers=viewer, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
