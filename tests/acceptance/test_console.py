"""The web console (docs/CONSOLE.md) in a real headless Chromium, against a real fleet.

One fleet for the module (``okq.dev.fleet``: SeaweedFS, three ``okq serve`` nodes in
sequencer mode with an operator key, the compactor, nginx round-robin in front), so
that every page is served by whichever node nginx picks, and the fleet page has
three nodes to show. One Chromium for the module (Debian's ``chromium``, driven by
Playwright; no browser is downloaded), a fresh context per key.

With ``OKQ_CONSOLE_SCREENSHOTS=DIR`` each page's screenshot is saved in DIR (the
ones in docs/console/ are made so: see docs/CONSOLE.md).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from okq.client import SyncClient
from okq.dev.fleet import LocalFleet
from okq.dev.nginx import nginx_binary
from okq.dev.servers import ServerMissing, weed_binary

pytestmark = pytest.mark.s3

CHROMIUM = "/usr/bin/chromium"
OPERATOR = "console-test-operator-key"
SHOTS = os.environ.get("OKQ_CONSOLE_SCREENSHOTS")
TIMEOUT_MS = 10_000

playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is in the test extra")


def _require() -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium): "
                    "the console's browser tests need it")
    try:
        weed_binary()
        nginx_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    _require()
    local = LocalFleet(tmp_path_factory.mktemp("console"), 3, sequencer=True, role_ttl=3,
                       compactor_args=["--interval", "2", "--report-interval", "2"],
                       node_args=["--api-keys", OPERATOR, "--report-interval", "2"],
                       stop_timeout=10)
    with local:
        yield local


@pytest.fixture(scope="module")
def client(fleet: LocalFleet) -> Iterator[SyncClient]:
    c = SyncClient(fleet.url, api_key=OPERATOR, timeout=20)
    c.create_queue("jobs-dead")
    c.create_queue("jobs", dead_queue="jobs-dead", max_attempts=1)
    c.create_queue("emails")
    c.produce("jobs", ['{"to": "ops@example.com"}', "plain text"])
    for item in c.lease("jobs", 2, lease_timeout=30):  # two dead letters
        c.retry("jobs", item.token, dead=True, error="handler raised ValueError")
    c.produce("jobs", [{"payload": '{"order": 1, "sku": "A-17"}',
                        "headers": {"trace-id": "t-4711"}}, b"\x00\x01\xfe\xff"])
    c.produce("emails", [f"mail {n}" for n in range(5)])
    yield c
    c.close()


@pytest.fixture(scope="module")
def browser(fleet: LocalFleet) -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists()
                              else shutil.which("chromium"), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def _signed_in(browser: Any, fleet: LocalFleet, key: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(fleet.url + "/ui/")
    page.fill("#key", key)
    page.click("#connect")
    page.wait_for_selector("#role")
    return page


@pytest.fixture(scope="module")
def admin(browser: Any, fleet: LocalFleet, client: SyncClient) -> Iterator[Any]:
    page = _signed_in(browser, fleet, OPERATOR)
    yield page
    page.context.close()


def _open(page: Any, where: str, ready: str) -> None:
    page.goto(page.url.split("#")[0] + where)
    page.wait_for_selector(f"main[data-ready={ready}]")


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def _traffic_for_the_plots(client: SyncClient, page: Any, rounds: int) -> None:
    """Screenshots only: some produce and consume while the page samples (every 5 s),
    so that its plots have lines to show."""
    if not SHOTS:
        return
    for n in range(rounds):
        client.produce("emails", [f"batch {n} mail {i}" for i in range(20 + 15 * n)])
        for item in client.lease("emails", 12, lease_timeout=30):
            client.complete("emails", [item.token])
        page.wait_for_timeout(5_500)


def _cell(page: Any, queue: str, column: int) -> str:
    return str(page.inner_text(f"#queues tr[data-queue='{queue}'] td:nth-child({column})"))


def test_the_console_is_served_under_ui_and_asks_for_a_key(fleet: LocalFleet,
                                                            browser: Any) -> None:
    page = browser.new_page()
    page.goto(fleet.url + "/ui")
    assert page.url.endswith("/ui/")
    page.wait_for_selector("#key")
    page.fill("#key", "okq_0123456789abcdef_" + "x" * 43)
    page.click("#connect")
    assert "unknown, deleted or mistyped" in page.inner_text("[role=alert]")
    page.close()


def test_overview_lists_every_queue_with_its_depth(admin: Any, client: SyncClient) -> None:
    _open(admin, "#/", "overview")
    admin.wait_for_selector("#queues tr[data-queue='jobs']")
    assert _cell(admin, "emails", 2) == "5"  # available
    assert _cell(admin, "jobs", 2) == "2"
    assert _cell(admin, "jobs", 6) == "2"  # dead: in its dead-letter queue
    assert _cell(admin, "jobs-dead", 2) == "2"
    assert "jobs-dead" in _cell(admin, "jobs", 1)
    _traffic_for_the_plots(client, admin, 4)
    _shot(admin, "overview")


def test_queue_page_shows_settings_and_items_as_text_json_and_hex(
        admin: Any, client: SyncClient) -> None:
    _open(admin, "#/queue/jobs", "queue")
    assert "jobs-dead" in admin.inner_text("#settings")
    row = admin.locator("#items tr.item").first
    row.click()
    assert "A-17" in admin.locator("#items pre.payload").first.inner_text()
    assert "t-4711" in admin.locator("#items pre.headers").first.inner_text()
    assert admin.locator("#items pre.headers").count() == 1  # the other item has none
    admin.select_option("#payload-view", "json")
    admin.locator("#items tr.item").first.click()
    assert '"sku": "A-17"' in admin.locator("#items pre.payload").first.inner_text()
    admin.select_option("#payload-view", "hex")
    admin.locator("#items tr.item").first.click()
    assert admin.locator("#items pre.payload").first.inner_text().startswith("000000  7b 22")
    admin.select_option("#payload-view", "text")
    admin.click("#produce-open")
    admin.fill("#produce-payload", "from the console")
    admin.click("#produce-send")
    assert admin.inner_text(".msg.ok").startswith("produced ")
    assert "from the console" in [i.utf8 for i in client.list_items("jobs").items]
    if SHOTS:  # the picture shows an item opened as JSON
        admin.select_option("#payload-view", "json")
        admin.locator("#items tr.item").first.click()
    _shot(admin, "queue")


def test_purge_asks_for_the_queue_name_first(admin: Any, client: SyncClient) -> None:
    _open(admin, "#/queue/emails", "queue")
    admin.click("#purge")
    assert admin.is_disabled("#confirm-ok")
    admin.fill("#confirm-typed", "emails")
    admin.click("#confirm-ok")
    assert admin.inner_text(".msg.ok") == "purged emails"
    assert client.stats("emails").available == 0


def test_select_all_redrives_every_dead_letter_to_its_source(
        admin: Any, client: SyncClient) -> None:
    _open(admin, "#/dead/jobs-dead", "dead")
    assert admin.locator("#items tr.item").count() == 2
    assert "handler raised ValueError" in admin.inner_text("#items")
    assert admin.is_disabled("#redrive")
    admin.check("#select-all")
    assert admin.locator("input.pick:checked").count() == 2
    _shot(admin, "dead")
    admin.click("#redrive")
    admin.click("#confirm-ok")
    assert admin.inner_text(".msg.ok").startswith("moved 2 dead letter(s)")
    assert client.stats("jobs-dead").available == 0
    assert client.stats("jobs").available == 5  # 2 left, 1 produced above, 2 back


def test_a_read_only_key_sees_no_buttons(browser: Any, fleet: LocalFleet,
                                         client: SyncClient) -> None:
    key = client.create_key("read-only", name="dashboard").key
    page = _signed_in(browser, fleet, key)
    assert page.inner_text("#role") == "read-only"
    assert not page.is_visible("#nav-keys")
    for where, ready in [("#/", "overview"), ("#/queue/jobs", "queue"),
                         ("#/dead/jobs-dead", "dead"), ("#/fleet", "fleet")]:
        _open(page, where, ready)
        assert page.locator("button:visible").count() == 0, where
        assert page.locator("input:visible, textarea:visible").count() == 0, where
    page.context.close()


def test_fleet_page_shows_three_nodes_the_holder_and_the_compactor(
        admin: Any, fleet: LocalFleet, client: SyncClient) -> None:
    deadline = time.monotonic() + 15
    while True:  # the compactor reports after its first pass; every node within 1 s
        _open(admin, "#/fleet", "fleet")
        nodes = admin.locator("#processes tr[data-kind=node]").count()
        passed = admin.is_visible("#compactor") and "none yet" not in admin.inner_text(
            "#compactor")
        if (nodes == 3 and passed) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert nodes == 3
    assert passed
    holder = fleet.holder()
    assert holder is not None
    roles = admin.inner_text("#roles")
    assert holder.url in roles
    assert re.search(r"\$\d", admin.inner_text("main"))
    if SHOTS:
        admin.wait_for_timeout(30_000)  # three samples for the plot
    _shot(admin, "fleet")


def test_keys_page_makes_a_key_and_shows_its_secret_once(admin: Any) -> None:
    _open(admin, "#/keys", "keys")
    admin.fill("#key-name", "ci-producer")
    admin.select_option("#key-role", "producer")
    admin.fill("#key-prefixes", "jobs")
    admin.click("#key-create")
    assert admin.inner_text("#new-key").startswith("okq_")
    admin.wait_for_selector("#keys >> text=ci-producer")
    _shot(admin, "keys")
