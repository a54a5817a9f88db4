"""Where the CLI connects (``OKQ_URL``, ``--url``, a server that is not okq) and
the ``queues`` commands, against the file's ``okq serve`` node (conftest.py).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.acceptance.cli.support import Cli, check_no_traceback, rows
from tests.nodes import Node, free_port

# -- where the CLI connects ---------------------------------------------------------------


def test_url_from_env_and_flag(cli: Cli) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    cli.ok("queues", "create", "url-q")  # OKQ_URL
    # --url wins over OKQ_URL
    assert "url-q" in cli.ok("--url", cli.url, "queues", "list", url=closed).out
    cli.many_fail([(("stats", "url-q"), 1, f"cannot reach okq at {closed}")], url=closed)
    cli.many_fail([(("--url", closed, "stats", "url-q"), 1, f"cannot reach okq at {closed}")])


class _NotOkq(http.server.BaseHTTPRequestHandler):
    """Another HTTP service on the port --url names: answers every POST with
    ``status`` and ``body`` (set per server class)."""

    status = 404
    body = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def not_okq_server(status: int, body: bytes) -> Iterator[str]:
    handler = type("Handler", (_NotOkq,), {"status": status, "body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(("status", "body", "what"), [
    (404, b"", "HTTP 404 with no okq error body"),
    (404, b"<html>404: Not Found</html>", "HTTP 404 with no okq error body"),
    (200, b"<html>welcome</html>", "HTTP 200 with a reply that is not an okq reply"),
], ids=["404-empty", "404-html", "200-html"])
def test_url_of_a_server_that_is_not_okq(cli: Cli, status: int, body: bytes,
                                         what: str) -> None:
    """Another service on --url is named as such, not left as a bare 'HTTP 404'."""
    with not_okq_server(status, body) as url:
        msg = cli.fails("stats", "q", url=url)
    assert msg == f"error: {url} answered {what}; is it an okq node? (check --url or OKQ_URL)"


# -- queues --------------------------------------------------------------------------------


def test_queues_create_list_info_update_delete(cli: Cli) -> None:
    cli.ok("queues", "create", "qa-dead")
    run = cli.ok("queues", "create", "qa", "--lease-timeout", "7", "--max-attempts", "3",
                 "--dead-queue", "qa-dead", "--retention", "3600")
    assert rows(run.out) == [["qa", "7s", "3600s", "3", "qa-dead", "1", "0"]]

    info = cli.js("queues", "info", "qa")
    assert {k: info[k] for k in ("name", "lease_timeout", "retention", "max_attempts",
                                 "dead_queue", "retention_dead_letter", "produced")} == {
        "name": "qa", "lease_timeout": 7.0, "retention": 3600.0, "max_attempts": 3,
        "dead_queue": "qa-dead", "retention_dead_letter": False, "produced": 0}
    assert rows(cli.ok("queues", "info", "qa-dead").out) == [
        ["qa-dead", "30s", "345600s", "unlimited", "-", "1", "0"]]

    listed = {q["name"]: q for q in cli.js("queues", "list")}
    assert {"qa", "qa-dead"} <= listed.keys() and listed["qa"]["max_attempts"] == 3

    updated = cli.js("queues", "update", "qa", "--max-attempts", "5", "--lease-timeout", "9")
    assert (updated["max_attempts"], updated["lease_timeout"], updated["dead_queue"]) == (
        5, 9.0, "qa-dead")  # settings not given keep their values
    run = cli.ok("queues", "update", "qa", "--no-retention-dead-letter", "--partitions", "3")
    assert rows(run.out) == [["qa", "9s", "3600s", "5", "qa-dead", "3", "0"]]
    assert [q["name"] for q in cli.js("queues", "list")].count("qa") == 1  # its partitions
    run = cli.ok("queues", "update", "qa", "--read-only", "0,2")
    assert rows(run.out)[0][5] == "3 (2 read-only)"
    assert cli.js("queues", "update", "qa", "--read-only", "")["read_only"] == []
    cli.many_fail([
        (("queues", "update", "qa"), 2, "give at least one setting to change"),
        (("queues", "update", "qa", "--partitions", "2"), 1,
         "error: partitions can be raised, not lowered: the queue has 3"),
        (("queues", "create", "qa"), 1, "error: queue 'qa' already exists"),
        (("queues", "create", "bad name!"), 1, "name: String should match pattern"),
    ])

    assert cli.ok("queues", "delete", "qa").out.strip() == "deleted qa"
    assert cli.js("queues", "delete", "qa-dead") == {"name": "qa-dead"}
    text_rows = {r[0]: r for r in rows(cli.ok("queues", "list").out)}
    assert not {"qa", "qa-dead"} & text_rows.keys()
    assert cli.fails("queues", "info", "qa") == "error: queue 'qa' does not exist"


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
