"""The web console's presentation in headless Chromium against a real 3-node cluster with no API
tokens, as ``./scripts/dev`` runs it (issue 21, item 6): the first view is in the page itself, no
token is asked for, generations and times are readable and in one format, a group's members are
above the fold, each group's lag has its own chart, and a dead node stays in the replica lists
(marked down) with the failures still tolerated counted from what is left."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from raftmq.client import Consumer

from .harness import Cluster, wait_until
from .test_console import CHROMIUM_ARGS, shot

pytestmark = pytest.mark.timeout(300)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SMALL_LAG, BIG_LAG = 3, 4000


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("console-views"), nodes=3, extra_toml="[limits]\nlag_sample_ms = 500"
    ) as cl:
        cl.start()
        cl.wait_ready()
        cl.wait_balanced()
        _fill(cl)
        yield cl


def _ok(r: requests.Response) -> Any:
    assert r.status_code in (200, 201), r.text
    return r.json()


def _fill(c: Cluster) -> None:
    """lines (1 queue, BIG_LAG messages): group small lags SMALL_LAG, group big BIG_LAG; group
    workers dead-lettered one message."""
    c.create_topic("lines", queues=1)
    for start in range(0, BIG_LAG, 1000):
        _ok(c.produce("lines", [{"value": f"line {i}", "queue": 0} for i in range(start, start + 1000)]))
    _ok(
        c.session.put(
            c.url() + "/v1/groups/small/offsets",
            json={"topic": "lines", "offsets": {"0": BIG_LAG - SMALL_LAG}},
        )
    )
    _ok(c.session.put(c.url() + "/v1/groups/big/offsets", json={"topic": "lines", "offsets": {"0": 0}}))
    sub = "/v1/topics/lines/subscriptions/workers"
    _ok(c.session.put(c.url() + sub, json={"max_deliveries": 1}))
    got = _ok(c.post(sub + "/receive", {"max": 1, "wait_ms": 2000, "visibility_ms": 60000}))["messages"]
    (result,) = _ok(c.post(sub + "/nack", {"receipts": [got[0]["receipt"]]}))["results"]
    assert result.get("dead_lettered") is True, result


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, c: Cluster) -> Iterator[Page]:
    """A laptop's window (1280 x 720); no token entered (the cluster needs none)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page
    context.close()
    assert not errors, f"errors in the page: {errors}"


def test_the_first_view_is_in_the_page_before_any_request_of_its_own(page: Page, c: Cluster) -> None:
    """With every API request of the page held back (never answered), the cluster view is there
    once the page has loaded: the node wrote it into the page."""
    held: list[str] = []
    page.route(re.compile(r".*/v1/.*"), lambda route: held.append(route.request.url))
    page.goto(c.url("n1") + "/ui", wait_until="load")
    assert page.locator("#nodes-table tbody tr[data-node]").count() == 3
    assert page.locator("#groups-table tbody tr[data-group]").count() == 4
    assert page.locator('#groups-table tr[data-group="meta"] td.leader').inner_text() in c.nodes
    assert "loading" not in page.locator("#status").inner_text()
    assert page.locator("#cluster-cards").inner_text().startswith("3/3")
    assert held, "the page asked for nothing"  # (its requests were held: the view is the page's own)
    shot(page, "first-view")


def test_a_cluster_without_tokens_asks_for_none(page: Page, c: Cluster) -> None:
    page.goto(c.url("n1") + "/ui#topics")
    expect(page.locator('#topics-table tr[data-topic="lines"]')).to_be_visible(timeout=10_000)
    expect(page.locator("#create-note")).to_be_hidden()
    assert "needs a token" not in page.locator("#view-topics").inner_text()
    assert page.locator("#token").get_attribute("placeholder") == "API token (none needed)"


def test_a_groups_members_are_above_the_fold_with_a_readable_generation(page: Page, c: Cluster) -> None:
    """Opened from its link in a 1280 x 720 window, a group's members are in sight; its generation
    (the coordinator's term in the high 32 bits, a change counter in the low ones) reads term.change."""
    with Consumer(
        [c.url(n) for n in c.nodes], group="readers", topics="lines", member_id="reader-1", wait_ms=200
    ):
        page.goto(c.url("n1") + "/ui#groups/readers/lines")
        member = page.locator('#group-members-table tr[data-member="reader-1"]')
        expect(member).to_be_visible(timeout=20_000)
        expect(member.locator("td.generation")).to_have_text(re.compile(r"^\d+\.\d+$"), timeout=20_000)
        answer = _ok(c.get("/v1/topics/lines/groups/readers/members", node="n1"))
        generation = answer["generation"]
        assert generation >= 1 << 32, answer  # (term >= 1)
        readable = f"{generation >> 32}.{generation & 0xFFFFFFFF}"
        expect(page.locator("#members-note")).to_contain_text(f"generation {readable}")
        assert str(generation) not in page.locator("#view-groups").inner_text()
        applied = member.locator("td.generation")
        assert re.fullmatch(r"\d+\.\d+", applied.inner_text()), applied.inner_text()
        box = member.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 720, box
        shot(page, "group-members-above-the-fold")


def _line_top(page: Page, group: str) -> float:
    """Where the highest painted pixel of ``group``'s lag line is in its chart, 0 (top) to 1 (bottom)."""
    found: float = page.evaluate(
        """(group) => {
             const fig = document.querySelector(`#lag-charts figure[data-consumer="${group}"]`);
             const canvas = fig.querySelector("canvas");
             const swatch = getComputedStyle(fig.querySelector(".swatch")).color;
             const [r, g, b] = swatch.match(/\\d+/g).map(Number);
             const near = (i) => [r, g, b].every((v, k) => Math.abs(d[i + k] - v) < 8);
             const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
             for (let y = 0; y < canvas.height; y++)
               for (let x = 0; x < canvas.width; x++) {
                 const i = (y * canvas.width + x) * 4;
                 if (near(i) && d[i + 3] > 200)
                   return y / canvas.height;
               }
             return 1; }""",
        group,
    )
    return found


def test_each_groups_lag_has_its_own_chart_and_scale(page: Page, c: Cluster) -> None:
    """Group small lags 3 and group big 4,000 on one topic: each has a chart of its own, named in
    full above it, and small's line is not flattened at the bottom by big's."""
    page.goto(c.url("n1") + "/ui#groups")
    for group in ("small", "big"):
        figure = page.locator(f'#lag-charts figure[data-consumer="{group}"][data-topic="lines"]')
        expect(figure).to_be_visible(timeout=10_000)
        caption = figure.locator("figcaption")
        expect(caption).to_contain_text(f"{group} on lines")
        assert caption.evaluate("e => e.scrollWidth <= e.clientWidth")  # not cut off
    expect(page.locator('#lag-charts figure[data-consumer="small"] figcaption')).to_contain_text(
        f"lag {SMALL_LAG}"
    )
    wait_until(
        lambda: _line_top(page, "small") < 0.5, 20, interval_s=0.5, what="small's line in its upper half"
    )
    wait_until(lambda: _line_top(page, "big") < 0.5, 20, interval_s=0.5, what="big's line in its upper half")
    page.locator("#lag-charts").scroll_into_view_if_needed()
    shot(page, "lag-small-multiples")


def test_times_are_one_format_in_messages_and_dead_letters(page: Page, c: Cluster) -> None:
    page.goto(c.url("n1") + "/ui#messages/lines/0")
    time_cell = page.locator("#messages-table tbody tr[data-offset] td.time").first
    expect(time_cell).to_have_text(ISO, timeout=10_000)
    page.goto(c.url("n1") + "/ui#dlq/lines/workers")
    dead = page.locator("#dlq-messages tbody tr[data-offset] td.time").first
    expect(dead).to_have_text(ISO, timeout=10_000)
    status = page.locator("#status")
    expect(status).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\dZ"))
    shot(page, "dead-letters-iso-time")


def test_a_dead_node_stays_in_the_replica_lists_and_no_more_failures_are_tolerated(
    page: Page, c: Cluster
) -> None:
    """(Last: it kills n3.) With all three up one more failure is tolerated; with n3 dead, none,
    and every group still lists n3 among its replicas, marked down."""
    page.goto(c.url("n1") + "/ui#cluster")
    expect(page.locator("#tolerated .value")).to_have_text("1", timeout=10_000)
    expect(page.locator("#tolerated .label")).to_have_text("more node failure tolerated")
    c.kill("n3")
    wait_until(
        lambda: c.get("/v1/cluster", node="n1").json()["nodes"][2]["reachable"] is False, 20, what="n3 down"
    )
    expect(page.locator("#tolerated .value")).to_have_text("0", timeout=15_000)
    expect(page.locator("#tolerated .label")).to_have_text("more node failures tolerated")
    expect(page.locator("#nodes-table tr[data-node=n3] .badge.bad")).to_have_text("unreachable")
    for g in c.get("/v1/cluster", node="n1").json()["groups"]:
        assert "n3" in g["placement"], g
        row = page.locator(f'#groups-table tr[data-group="{g["group_id"]}"]')
        expect(row.locator("[data-replica]")).to_have_count(3)
        expect(row.locator('[data-replica="n3"][data-down]')).to_contain_text("down")
    shot(page, "cluster-node-down")
