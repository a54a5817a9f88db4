"""The ``okq`` command line as a user runs it, against one real ``okq serve`` node.

Every command runs as a real subprocess (the ``okq`` script next to
``sys.executable``) with ``OKQ_URL`` set, and the tests read what a user reads:
text tables and messages, ``--output json``, exit codes. Bulk checks (thousands
of exported items) read the queues back with the Python client.

Error paths exit non-zero with a one-line ``error:`` message (or click's usage
message, exit 2) and never a traceback: every run of the file is checked for
``Traceback``, and so is the node's log at the end.

Several tests guard against bugs found while this file was written (markup in
output, multi-line errors, partial produces, lost export records): each fails
if its bug comes back.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from okq import wire as s
from okq.client import Client
from tests.nodes import Node, free_port, live_items, okq_node

_SCRIPT = Path(sys.executable).with_name("okq")
OKQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "okq.cli"]
WIDE = "200"  # table width: rich wraps to 80 columns when stdout is not a terminal

#: every stdout and stderr of the file's runs (but those of the xfail tests, which
#: pin crashes), for the traceback check at the end
OUTPUTS: list[str] = []
_IN_XFAIL = [False]


@pytest.fixture(autouse=True)
def _note_xfail(request: pytest.FixtureRequest) -> Iterator[None]:
    _IN_XFAIL[0] = request.node.get_closest_marker("xfail") is not None
    yield
    _IN_XFAIL[0] = False


def record(*outputs: str) -> None:
    if not _IN_XFAIL[0]:
        OUTPUTS.extend(outputs)


# -- running the CLI ------------------------------------------------------------------


@dataclass
class Run:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def error_line(self) -> str:
        """The one-line message of a failed command (ours, or click's usage error)."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        if self.rc == 2:  # click: "Usage: ...", "Try ...", "Error: ..."
            assert lines and lines[0].startswith("Usage: "), self
            assert lines[-1].startswith("Error: "), self
            return lines[-1]
        assert len(lines) == 1, f"expected one line of stderr, got {lines}"
        assert lines[0].startswith("error: "), self
        return lines[0]


def env_for(url: str | None, extra: dict[str, str] | None = None,
            columns: str | None = WIDE) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OKQ_") and k not in ("COLUMNS", "LINES")}
    if url is not None:
        env["OKQ_URL"] = url
    if columns is not None:
        env["COLUMNS"] = columns
    env.update(extra or {})
    return env


class Cli:
    """``cli("stats", "q")`` runs ``okq stats q`` against the module's node."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp

    def __call__(self, *args: str, stdin: str | None = None, url: str | None = "",
                 env: dict[str, str] | None = None, columns: str | None = WIDE,
                 timeout: float = 60) -> Run:
        proc = subprocess.run(
            [*OKQ, *args], input=stdin if stdin is not None else "",
            capture_output=True, text=True, timeout=timeout,
            env=env_for(self.url if url == "" else url, env, columns))
        run = Run(args, proc.returncode, proc.stdout, proc.stderr)
        record(run.out, run.err)
        assert "Traceback" not in run.out + run.err, f"okq {' '.join(args)}:\n{run.err}"
        return run

    def ok(self, *args: str, **kw: Any) -> Run:
        run = self(*args, **kw)
        assert run.rc == 0, f"okq {' '.join(args)} exited {run.rc}:\n{run.out}{run.err}"
        return run

    def js(self, *args: str, **kw: Any) -> Any:
        return self.ok("-o", "json", *args, **kw).json()

    def fails(self, *args: str, code: int = 1, **kw: Any) -> str:
        """Run a command that must fail; return its one-line message."""
        return self.check_failed(self(*args, **kw), code)

    @staticmethod
    def check_failed(run: Run, code: int = 1) -> str:
        assert run.rc == code, f"okq {' '.join(run.args)}: exit {run.rc}, wanted {code}\n{run.err}"
        assert run.out == "", run.out
        return run.error_line()

    def many_fail(self, cases: list[tuple[tuple[str, ...], int, str]], **kw: Any) -> None:
        """Run independent failing commands side by side (each CLI start costs most of a
        second); each ``(args, exit code, fragment)`` must fail with that code and a
        message containing the fragment."""
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda case: self(*case[0], **kw), cases))
        for (args, code, fragment), run in zip(cases, runs, strict=True):
            msg = self.check_failed(run, code)
            assert fragment in msg, (args, msg)


def rows(text: str) -> list[list[str]]:
    """The body rows of a rich table, as lists of stripped cells."""
    return [[c.strip() for c in line.strip()[1:-1].split("│")]
            for line in text.splitlines() if line.startswith("│")]


def sync(coro: Any) -> Any:
    return asyncio.run(coro)


def live(url: str, queue: str) -> list[s.ItemOut]:
    return sync(live_items(url, queue))


def payloads(items: list[s.ItemOut]) -> Counter[bytes]:
    return Counter(i.bytes for i in items)


async def _stats(url: str, queue: str) -> s.StatsResponse:
    async with Client(url) as c:
        return await c.stats(queue)


def stats(url: str, queue: str) -> s.StatsResponse:
    return sync(_stats(url, queue))


async def _produce(url: str, queue: str, *items: str) -> None:
    async with Client(url) as c:
        await c.produce(queue, list(items))


async def _make_queue(url: str, name: str, items: tuple[str, ...],
                      settings: dict[str, Any]) -> None:
    async with Client(url) as c:
        await c.create_queue(name, **settings)
        if items:
            await c.produce(name, list(items))


def make_queue(url: str, name: str, *items: str, **settings: Any) -> None:
    """Set-up through the client, where the CLI is not what a test is about."""
    sync(_make_queue(url, name, items, settings))


# -- the node -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("cli-node")
    with okq_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


@pytest.fixture(scope="module")
def cli(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(node.url, tmp_path_factory.mktemp("cli"))


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
    assert rows(run.out) == [["qa", "7s", "3600s", "3", "qa-dead", "0"]]

    info = cli.js("queues", "info", "qa")
    assert {k: info[k] for k in ("name", "lease_timeout", "retention", "max_attempts",
                                 "dead_queue", "retention_dead_letter", "produced")} == {
        "name": "qa", "lease_timeout": 7.0, "retention": 3600.0, "max_attempts": 3,
        "dead_queue": "qa-dead", "retention_dead_letter": False, "produced": 0}
    assert rows(cli.ok("queues", "info", "qa-dead").out) == [
        ["qa-dead", "30s", "345600s", "unlimited", "-", "0"]]

    listed = {q["name"]: q for q in cli.js("queues", "list")}
    assert {"qa", "qa-dead"} <= listed.keys() and listed["qa"]["max_attempts"] == 3

    updated = cli.js("queues", "update", "qa", "--max-attempts", "5", "--lease-timeout", "9")
    assert (updated["max_attempts"], updated["lease_timeout"], updated["dead_queue"]) == (
        5, 9.0, "qa-dead")  # settings not given keep their values
    run = cli.ok("queues", "update", "qa", "--no-retention-dead-letter")
    assert rows(run.out) == [["qa", "9s", "3600s", "5", "qa-dead", "0"]]
    cli.many_fail([
        (("queues", "update", "qa"), 2, "give at least one setting to change"),
        (("queues", "create", "qa"), 1, "error: queue 'qa' already exists"),
        (("queues", "create", "bad name!"), 1, "name: String should match pattern"),
    ])

    assert cli.ok("queues", "delete", "qa").out.strip() == "deleted qa"
    assert cli.js("queues", "delete", "qa-dead") == {"name": "qa-dead"}
    text_rows = {r[0]: r for r in rows(cli.ok("queues", "list").out)}
    assert not {"qa", "qa-dead"} & text_rows.keys()
    assert cli.fails("queues", "info", "qa") == "error: queue 'qa' does not exist"


# -- produce -------------------------------------------------------------------------------


def test_produce_from_arguments_stdin_and_plain_file(cli: Cli) -> None:
    make_queue(cli.url, "pr")
    assert cli.ok("produce", "pr", "a1", "a2").out.strip() == "produced 2 items to pr"
    assert cli.ok("produce", "pr", "solo").out.strip() == "produced 1 item to pr"
    got = cli.js("produce", "pr", stdin="s1\ns2\n\ns3\n")  # blank lines are skipped
    assert got["queue_name"] == "pr" and len(got["ids"]) == 3
    lines = cli.tmp / "lines.txt"
    lines.write_text("f1\nf2 with spaces\n\nf3 ünïcødé\n", encoding="utf-8")
    got = cli.js("produce", "pr", "--file", str(lines))
    assert len(got["ids"]) == 3 == len(set(got["ids"]))
    cli.ok("produce", "pr", "-f", "-", stdin="dash\n")  # '-' is stdin

    table = rows(cli.ok("items", "pr").out)
    assert [r[4] for r in table] == ["a1", "a2", "solo", "s1", "s2", "s3", "f1",
                                     "f2 with spaces", "f3 ünïcødé", "dash"]
    assert {r[1] for r in table} == {"available"}


def test_produce_jsonl_items_and_idempotency_keys(cli: Cli) -> None:
    make_queue(cli.url, "pj")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    records = [
        {"utf8": "text item", "key": "k-1"},
        {"bytes": base64.b64encode(b"\x00\xff\x10raw").decode(), "key": "k-2"},
        {"utf8": "same key again", "key": "k-1"},  # deduped: the first id comes back
        {"utf8": "scheduled", "enqueue_at": later},
        "a plain JSON string",
        {"record": 1, "nested": [1, 2]},  # any other record is itself the payload
    ]
    path = cli.tmp / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    first = cli.js("produce", "pj", "--file", str(path))["ids"]
    assert len(first) == 6 and first[0] == first[2] and len(set(first)) == 5

    items = {i["id"]: i for i in cli.js("items", "pj")}
    assert len(items) == 5
    assert items[first[0]]["utf8"] == "text item"
    assert base64.b64decode(items[first[1]]["bytes"]) == b"\x00\xff\x10raw"
    assert items[first[1]]["utf8"] is None
    assert items[first[3]]["state"] == "scheduled"
    assert items[first[4]]["utf8"] == "a plain JSON string"
    assert json.loads(items[first[5]]["utf8"]) == {"record": 1, "nested": [1, 2]}
    row = {r[0]: r for r in rows(cli.ok("items", "pj").out)}
    assert row[first[1]][4] == "<6 bytes>" and row[first[3]][1] == "scheduled"

    again = cli.js("produce", "pj", "--file", str(path))["ids"]
    assert again[:3] == first[:3]  # keyed items: same ids, no duplicates
    st = stats(cli.url, "pj")
    assert (st.available, st.scheduled) == (4 + 2, 1 + 1)  # keyless ones were produced again

    # --key: one key, or KEY:N for several items
    ids1 = cli.js("produce", "pj", "--key", "batch-7", "x", "y")["ids"]
    ids2 = cli.js("produce", "pj", "--key", "batch-7", "x", "y")["ids"]
    assert ids1 == ids2 and len(set(ids1)) == 2
    plain = cli.tmp / "keyed.txt"
    plain.write_text("l1\nl2\n")
    ids3 = cli.js("produce", "pj", "--file", str(plain), "--key", "file-9")["ids"]
    assert cli.js("produce", "pj", "--file", str(plain), "--key", "file-9")["ids"] == ids3
    assert stats(cli.url, "pj").available == 6 + 2 + 2


def test_produce_jsonl_honours_at(cli: Cli) -> None:
    make_queue(cli.url, "pj-at")
    path = cli.tmp / "at.jsonl"
    path.write_text('{"utf8": "later"}\n')
    cli.ok("produce", "pj-at", "--file", str(path), "--at", "+3600")
    st = stats(cli.url, "pj-at")
    assert (st.available, st.scheduled) == (0, 1)


# -- lease, complete, retry, dead letters ----------------------------------------------------

LEASE_LINE = re.compile(r"^(\S+)  attempts=(\d+)  deadline=(\d\d:\d\d:\d\d)  (.*)$")


def parse_lease_text(out: str) -> list[dict[str, str]]:
    lines = out.splitlines()
    got = []
    for first, second in zip(lines[::2], lines[1::2], strict=True):
        m = LEASE_LINE.match(first)
        assert m, first
        assert second.startswith("  token "), second
        got.append({"id": m[1], "attempts": m[2], "payload": m[4],
                    "token": second.split()[1]})
    return got


def test_lease_and_complete_text_and_json(cli: Cli) -> None:
    make_queue(cli.url, "lc", "p0", "p1", "p2", "p3", lease_timeout=30)
    ids = [i.id for i in live(cli.url, "lc")]

    text = parse_lease_text(cli.ok("lease", "lc").out)
    assert [(t["id"], t["attempts"], t["payload"]) for t in text] == [(ids[0], "1", "p0")]

    began = datetime.now(UTC)
    leased = cli.js("lease", "lc", "-n", "2", "--lease-timeout", "5")
    ended = datetime.now(UTC)  # the CLI leased between the two (its start may be slow)
    assert [i["id"] for i in leased] == ids[1:3]
    assert [i["utf8"] for i in leased] == ["p1", "p2"]
    assert all(i["attempts"] == 1 and i["token"] for i in leased)
    deadline = datetime.fromisoformat(leased[0]["lease_deadline"].replace("Z", "+00:00"))
    five, slack = timedelta(seconds=5), timedelta(seconds=1)  # the lease's, not the queue's 30 s
    assert began + five - slack < deadline < ended + five + slack

    st = cli.js("stats", "lc")[0]
    assert (st["available"], st["in_flight"]) == (1, 3)
    assert cli.ok("complete", "lc", text[0]["token"]).out.strip() == "completed 1"
    done = cli.js("complete", "lc", *(i["token"] for i in leased))
    assert done == {"queue_name": "lc", "completed": 2}
    rest = parse_lease_text(cli.ok("lease", "lc", "-n", "10").out)
    assert [t["payload"] for t in rest] == ["p3"]
    assert cli.js("complete", "lc", rest[0]["token"])["completed"] == 1
    st = stats(cli.url, "lc")
    assert (st.available, st.in_flight, st.completed) == (0, 0, 4)
    assert cli.ok("lease", "lc").out.strip() == "no items ready"


def test_lease_wait_and_produce_at(cli: Cli) -> None:
    make_queue(cli.url, "lw")
    began = time.monotonic()
    assert cli.js("lease", "lw", "--wait", "0.5") == []
    assert time.monotonic() - began >= 0.5

    at = (datetime.now(UTC) + timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    cli.ok("produce", "lw", "--at", at, "much later")
    cli.ok("produce", "lw", "--at", "+8", "soon")  # still scheduled after a slow CLI exit
    st = stats(cli.url, "lw")
    assert (st.available, st.scheduled) == (0, 2)
    began = time.monotonic()
    got = cli.js("lease", "lw", "-n", "5", "--wait", "40")  # returns once "soon" is due
    assert [i["utf8"] for i in got] == ["soon"]
    assert time.monotonic() - began < 30


def test_retry_later_dead_letter_and_redrive(cli: Cli) -> None:
    make_queue(cli.url, "rd-dlq")
    make_queue(cli.url, "rd", "first", "second", dead_queue="rd-dlq")
    ids = [i.id for i in live(cli.url, "rd")]

    [one] = cli.js("lease", "rd")
    # an hour: still waiting at the end of the test however slow the machine
    assert cli.ok("retry", "rd", one["token"], "--at", "+3600", "--error", "later please"
                  ).out.strip() == "released"
    st = stats(cli.url, "rd")
    assert (st.available, st.waiting_retry) == (1, 1)
    items = {i["id"]: i for i in cli.js("items", "rd")}
    assert items[ids[0]]["state"] == "waiting" and items[ids[0]]["error"] == "later please"

    [two] = cli.js("lease", "rd")
    assert two["id"] == ids[1]
    run = cli.ok("retry", "rd", two["token"], "--dead", "--error", "bad input: no digits")
    assert run.out.strip() == "moved to the dead-letter queue"
    st = stats(cli.url, "rd")
    assert (st.available, st.dead, st.dead_lettered) == (0, 1, 1)

    dead_rows = rows(cli.ok("dead", "list", "rd-dlq").out)
    assert len(dead_rows) == 1
    assert dead_rows[0][4:] == ["rd", "bad input: no digits", "second"]
    [dead] = cli.js("dead", "list", "rd-dlq")
    assert dead["meta"]["source_queue"] == "rd" and dead["meta"]["source_id"] == ids[1]
    assert dead["meta"]["error"] == "bad input: no digits" and dead["utf8"] == "second"

    assert cli.ok("dead", "redrive", "rd-dlq").out.strip() == "moved 1 item back"
    assert cli.ok("dead", "list", "rd-dlq").out.strip() == "no dead items"
    assert cli.js("dead", "redrive", "rd-dlq") == {"queue_name": "rd-dlq", "moved": 0}
    back = [i for i in live(cli.url, "rd") if i.state == "available"]
    assert [i.utf8 for i in back] == ["second"]
    assert back[0].meta and back[0].meta["redriven_from"] == "rd-dlq"


# -- stats and items ----------------------------------------------------------------------


def test_stats_for_several_queues(cli: Cli) -> None:
    make_queue(cli.url, "st-a", "1", "2", "3")
    make_queue(cli.url, "st-b", "x")
    make_queue(cli.url, "st-c")
    cli.ok("produce", "st-b", "--at", "+600", "y")
    cli.ok("lease", "st-a")

    table = {r[0]: r for r in rows(cli.ok("stats", "st-a", "st-b", "st-c").out)}
    assert list(table) == ["st-a", "st-b", "st-c"]
    # queue, available, in flight, scheduled, waiting retry, dead, completed, oldest
    assert table["st-a"][1:7] == ["2", "1", "0", "0", "0", "0"]
    assert table["st-b"][1:7] == ["1", "0", "1", "0", "0", "0"]
    assert table["st-c"][1:8] == ["0", "0", "0", "0", "0", "0", "0.0s"]
    got = cli.js("stats", "st-a", "st-b", "st-c")
    assert [g["queue_name"] for g in got] == ["st-a", "st-b", "st-c"]
    assert [(g["available"], g["in_flight"], g["scheduled"]) for g in got] == [
        (2, 1, 0), (1, 0, 1), (0, 0, 0)]
    assert cli.fails("stats", code=2).startswith("Error: Missing argument")


def test_items_limit_and_all(cli: Cli) -> None:
    make_queue(cli.url, "it", *(f"item {n}" for n in range(107)))
    make_queue(cli.url, "it-empty")
    assert [r[4] for r in rows(cli.ok("items", "it", "--limit", "2").out)] == [
        "item 0", "item 1"]
    assert len(cli.js("items", "it")) == 100  # the default limit
    assert [i["utf8"] for i in cli.js("items", "it", "--all")] == [
        f"item {n}" for n in range(107)]
    assert cli.ok("items", "it-empty").out.strip() == "no live items"


def test_items_all_on_a_large_queue(cli: Cli, export_source: dict[str, Any]) -> None:
    got = cli.js("items", export_source["queue"], "--all")
    assert len(got) == export_source["count"]


def test_stats_watch_refreshes_until_interrupted(cli: Cli) -> None:
    make_queue(cli.url, "sw", "one")
    master, slave = pty.openpty()  # a terminal: rich redraws the table in place
    proc = subprocess.Popen([*OKQ, "stats", "--watch", "--interval", "0.5", "sw"],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                            env=env_for(cli.url))
    os.close(slave)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _wait_for(lambda: screen.count("┏".encode()) >= 1, 15)
        sync(_make_queue(cli.url, "sw-other", (), {}))  # let a refresh go by
        sync(_produce(cli.url, "sw", "two"))
        # two refreshes at least, the last one showing the new count
        _wait_for(lambda: screen.count("┏".encode()) >= 3 and re.search(
            r"│ sw\s+│ 2 ", screen.decode(errors="replace")) is not None, 15)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        os.close(master)
    text = screen.decode(errors="replace")
    record(text, err.decode())
    assert "Traceback" not in text + err.decode()
    assert proc.returncode in (0, 130), (proc.returncode, err)
    assert err.decode().strip() in ("", "Aborted!")


def test_stats_watch_in_a_pipe_prints_a_line_per_refresh(cli: Cli) -> None:
    """Piped, the live table would draw nothing: each refresh prints a line per queue
    at once (a log to tail or grep), and Ctrl-C ends it cleanly."""
    make_queue(cli.url, "swp", "one")
    make_queue(cli.url, "swp-b")
    proc = subprocess.Popen([*OKQ, "stats", "--watch", "--interval", "0.3", "swp", "swp-b"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_for(cli.url))
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _wait_for(lambda: len(lines) >= 4, 15)  # two refreshes, each a line per queue
        sync(_produce(cli.url, "swp", "two"))
        _wait_for(lambda: any(" swp available=2 " in line for line in lines), 15)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        reader.join(5)
    record("\n".join(lines), err)
    assert "Traceback" not in err
    assert proc.returncode in (0, 130), (proc.returncode, err)
    pattern = re.compile(r"^\d\d:\d\d:\d\d (swp|swp-b) available=\d+ in_flight=\d+ "
                         r"scheduled=\d+ waiting_retry=\d+ dead=\d+ completed=\d+ "
                         r"oldest=[\d.]+s$")
    assert all(pattern.match(line) for line in lines), lines
    assert [line.split()[1] for line in lines[:4]] == ["swp", "swp-b", "swp", "swp-b"]
    assert "swp available=1 " in lines[0]


def test_serve_help_shows_number_types(cli: Cli) -> None:
    """Numeric settings read as numbers: --help says INTEGER or FLOAT, and a word
    where a number belongs is a usage error before anything starts."""
    text = cli.ok("serve", "--help", url=None).out
    types = dict(re.findall(r"^  (--[a-z-]+) ([A-Z]+)", text, re.MULTILINE))
    assert {k: types[k] for k in ("--port", "--max-batch", "--max-item-bytes",
                                  "--max-waiting", "--linger", "--max-wait")} == {
        "--port": "INTEGER", "--max-batch": "INTEGER", "--max-item-bytes": "INTEGER",
        "--max-waiting": "INTEGER", "--linger": "FLOAT", "--max-wait": "FLOAT"}
    assert types["--store"] == "TEXT" and types["--log-level"] == "TEXT"
    cli.many_fail([
        (("serve", "--port", "http"), 2, "'http' is not a valid integer"),
        (("serve", "--linger", "soon"), 2, "'soon' is not a valid float"),
    ], url=None)


def _wait_for(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- export and import ------------------------------------------------------------------------

EXPORT_PLAIN = 2990


@pytest.fixture(scope="module")
def export_source(cli: Cli) -> dict[str, Any]:
    """Queue ``ex`` with 3,000 live items: text, binary, scheduled, one leased."""
    make_queue(cli.url, "ex")
    lines = cli.tmp / "ex-source.txt"
    lines.write_text("".join(f"plain item {n:05d}\n" for n in range(EXPORT_PLAIN)))
    cli.ok("produce", "ex", "--file", str(lines))
    later = (datetime.now(UTC) + timedelta(hours=3)).isoformat()
    extra = [{"bytes": base64.b64encode(bytes([n, 0, 255])).decode()} for n in range(5)]
    extra += [{"utf8": f"scheduled {n}", "enqueue_at": later} for n in range(5)]
    jl = cli.tmp / "ex-source.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in extra))
    cli.ok("produce", "ex", "--file", str(jl))
    cli.ok("lease", "ex", "--lease-timeout", "3600")  # a leased item is live too
    items = live(cli.url, "ex")
    assert len(items) == EXPORT_PLAIN + 10
    return {"queue": "ex", "count": len(items), "ids": [i.id for i in items],
            "payloads": payloads(items)}


@pytest.fixture(scope="module")
def exported(cli: Cli, export_source: dict[str, Any]) -> Path:
    path = cli.tmp / "ex.jsonl"
    run = cli.ok("export", "ex", str(path))
    assert run.out.strip() == f"exported {export_source['count']} items to {path}"
    return path


def export_ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_export_writes_every_live_item_once(exported: Path,
                                            export_source: dict[str, Any]) -> None:
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [r["id"] for r in records] == export_source["ids"]
    got = Counter(base64.b64decode(r["bytes"]) if "bytes" in r else r["utf8"].encode()
                  for r in records)
    assert got == export_source["payloads"]
    assert sum("enqueue_at" in r for r in records) == 5


def test_export_refuses_an_existing_file(cli: Cli, exported: Path) -> None:
    before = exported.read_bytes()
    msg = cli.fails("export", "ex", str(exported), code=2)
    assert "exists: use --resume" in msg
    assert exported.read_bytes() == before
    again = cli.js("export", "ex", str(exported), "--resume")
    assert again == {"queue_name": "ex", "exported": 0, "file": str(exported)}
    assert exported.read_bytes() == before


@pytest.mark.parametrize("cut", ["torn-line", "line-boundary", "first-line-torn"])
def test_export_resume_after_interruption(cli: Cli, exported: Path, cut: str) -> None:
    full = exported.read_bytes()
    path = cli.tmp / f"ex-{cut}.jsonl"
    if cut == "torn-line":  # killed while writing a line, 40% in
        data = full[: int(len(full) * 0.4)]
        assert not data.endswith(b"\n")
    elif cut == "line-boundary":  # killed right after a flush
        data = full[: full.index(b"\n", int(len(full) * 0.7)) + 1]
    else:  # only part of the first line was written
        data = full[:12]
    path.write_bytes(data)
    run = cli.js("export", "ex", str(path), "--resume")
    assert path.read_bytes() == full  # every live item, exactly once, in order
    assert run["exported"] == len(export_ids(exported)) - data.count(b"\n")


def test_export_resume_when_only_the_newline_is_missing(cli: Cli, exported: Path) -> None:
    full = exported.read_bytes()
    cut = full.index(b"\n", len(full) // 2)
    path = cli.tmp / "ex-no-newline.jsonl"
    path.write_bytes(full[:cut])  # the last record is whole; its "\n" never made it
    cli.ok("export", "ex", str(path), "--resume")
    assert Counter(export_ids(path)) == Counter(export_ids(exported))


def _import_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # as okq import computes it


def _checkpoint(path: Path, queue: str) -> Path:
    return path.with_name(path.name + f".okq-import-{queue}")


def _assert_imported_once(url: str, queue: str, source: dict[str, Any]) -> None:
    items = live(url, queue)
    assert len(items) == source["count"]
    assert payloads(items) == source["payloads"]
    st = stats(url, queue)
    assert (st.available, st.scheduled) == (source["count"] - 5, 5)


def test_import_then_import_again(cli: Cli, exported: Path,
                                  export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-a")
    run = cli.ok("import", "im-a", str(exported))
    assert run.out.strip() == f"imported {export_source['count']} items"
    assert not _checkpoint(exported, "im-a").exists()
    _assert_imported_once(cli.url, "im-a", export_source)
    # a second run (checkpoint gone): the idempotency keys keep it from duplicating
    again = cli.js("import", "im-a", str(exported))
    assert again["queue_name"] == "im-a" and again["skipped"] == 0
    _assert_imported_once(cli.url, "im-a", export_source)


def _produce_lines_as_import_would(cli: Cli, exported: Path, queue: str, upto: int,
                                   keyed: bool) -> None:
    digest = _import_digest(exported)
    part = cli.tmp / f"part-{queue}.jsonl"
    with part.open("w") as fh:
        for n, line in enumerate(exported.read_text().splitlines()[:upto], 1):
            rec = json.loads(line)
            item = {k: rec[k] for k in ("utf8", "bytes", "enqueue_at") if k in rec}
            if keyed:
                item["key"] = f"import:{digest}:{n}"
            fh.write(json.dumps(item) + "\n")
    cli.ok("produce", queue, "--file", str(part))


def test_import_resumes_from_its_checkpoint(cli: Cli, exported: Path,
                                            export_source: dict[str, Any]) -> None:
    """An import killed after 1,000 lines, resumed after the keys expired: only the
    checkpoint stands between the rerun and duplicates."""
    make_queue(cli.url, "im-b")
    _produce_lines_as_import_would(cli, exported, "im-b", 1000, keyed=False)
    _checkpoint(exported, "im-b").write_text(f"{_import_digest(exported)} 1000\n")
    run = cli.ok("import", "im-b", str(exported))
    left = export_source["count"] - 1000
    assert run.out.strip() == f"imported {left} items (1000 already imported)"
    assert not _checkpoint(exported, "im-b").exists()
    _assert_imported_once(cli.url, "im-b", export_source)


def test_import_checkpoint_behind_the_produced_lines(cli: Cli, exported: Path,
                                                     export_source: dict[str, Any]) -> None:
    """Killed after producing lines up to 1,500 but before writing the checkpoint
    past 1,000: the idempotency keys absorb the 500 lines produced twice."""
    make_queue(cli.url, "im-c")
    _produce_lines_as_import_would(cli, exported, "im-c", 1500, keyed=True)
    _checkpoint(exported, "im-c").write_text(f"{_import_digest(exported)} 1000\n")
    got = cli.js("import", "im-c", str(exported))
    assert got == {"queue_name": "im-c", "imported": export_source["count"] - 1000,
                   "skipped": 1000}
    _assert_imported_once(cli.url, "im-c", export_source)


def test_import_ignores_a_checkpoint_of_another_file(cli: Cli, exported: Path,
                                                     export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-d")
    _checkpoint(exported, "im-d").write_text("0123456789abcdef 2000\n")
    got = cli.js("import", "im-d", str(exported))
    assert (got["imported"], got["skipped"]) == (export_source["count"], 0)
    _assert_imported_once(cli.url, "im-d", export_source)


def test_import_killed_midway_then_rerun(cli: Cli, exported: Path,
                                         export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-e")
    checkpoint = _checkpoint(exported, "im-e")
    proc = subprocess.Popen([*OKQ, "import", "im-e", str(exported)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_for(cli.url))
    try:
        while proc.poll() is None and not checkpoint.exists():
            time.sleep(0.002)
        proc.kill()  # as soon as the first batch is checkpointed (or it already finished)
    finally:
        proc.communicate()
    interrupted = proc.returncode == -signal.SIGKILL and checkpoint.exists()
    run = cli.js("import", "im-e", str(exported))
    assert run["imported"] + run["skipped"] == export_source["count"]
    assert (run["skipped"] > 0) == interrupted
    _assert_imported_once(cli.url, "im-e", export_source)


# -- errors ----------------------------------------------------------------------------------


def test_error_unknown_queue(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "uq")
    expected = "error: queue 'nope' does not exist"
    cli.many_fail([(args, 1, expected) for args in [
        ("stats", "nope"), ("produce", "nope", "x"), ("lease", "nope"), ("items", "nope"),
        ("dead", "list", "nope"), ("export", "nope", str(tmp_path / "nope.jsonl")),
        ("work", "-q", "nope", "--", "cat"), ("work", "-q", "uq", "-Q", "nope", "--", "cat"),
    ]])
    assert not (tmp_path / "nope.jsonl").exists()


def test_error_unreachable_node(cli: Cli) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    cli.many_fail([(args, 1, f"error: cannot reach okq at {closed}") for args in
                   (("stats", "q"), ("produce", "q", "x"), ("queues", "list"))], url=closed)


def test_error_message_is_one_line_in_a_pipe(cli: Cli) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    run = cli("stats", "q", url=closed, columns=None)  # no COLUMNS, as in a pipe or CI log
    assert run.rc == 1
    assert len(run.err.strip().splitlines()) == 1, run.err


def test_error_bad_flag_values(cli: Cli) -> None:
    make_queue(cli.url, "bf", "untouched")
    cli.many_fail([
        (("lease", "bf", "-n", "abc"), 2, "'abc' is not a valid integer"),
        (("lease", "bf", "-n", "0"), 1, "batch_size"),
        (("lease", "bf", "-n", "5000"), 1, "batch_size"),
        (("lease", "bf", "--lease-timeout", "0"), 1, "lease_timeout"),
        (("lease", "bf", "--wait", "soon"), 2, "'soon' is not a valid float"),
        (("-o", "xml", "stats", "bf"), 2, "'xml' is not one of"),
        (("queues", "update", "bf", "--max-attempts", "-1"), 1, "max_attempts"),
        (("queues", "create", "bf2", "--retention", "0"), 1, "retention"),
        (("work", "-q", "bf", "-j", "0", "--", "cat"), 2, "--concurrency"),
        (("work", "-q", "bf", "-c", "cat", "--", "cat"), 2, "not both"),
        (("stats", "bf", "--bogus"), 2, "No such option"),
        (("--timeout", "x", "stats", "bf"), 2, "'x' is not a valid float"),
    ])
    st = stats(cli.url, "bf")
    assert (st.available, st.in_flight) == (1, 0)  # nothing leased by the refused calls


def test_error_bad_at_time(cli: Cli) -> None:
    make_queue(cli.url, "bt")
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("produce", "bt", "--at", value, "x"), 2,
         f"Invalid value for --at: '{value}' is not an RFC 3339 time or +SECONDS")
        for value in ("tomorrow", "+soon", "2024-13-45", "+nan")]
    cases.append((("retry", "bt", "some-token", "--at", "noon"), 2,
                  "Invalid value for --at: 'noon' is not an RFC 3339 time or +SECONDS"))
    cli.many_fail(cases)
    assert live(cli.url, "bt") == []


@pytest.mark.parametrize("args", [("--at", "9999-01-01T00:00:00Z"), ("--at", "1900-01-01"),
                                  ("--key", "k" * 300)], ids=["at-9999", "at-1900", "key"])
def test_error_out_of_range_item_fields_are_one_line(cli: Cli, args: tuple[str, str]) -> None:
    cli("queues", "create", "bt-range")
    code = 2 if args[0] == "--at" else 1  # --at is checked by the CLI as a bad flag value
    msg = cli.fails("produce", "bt-range", *args, "x", code=code)
    assert args[0].lstrip("-") in msg


@pytest.mark.parametrize("value", ["+inf", "+1e20"])
def test_error_at_out_of_range(cli: Cli, value: str) -> None:
    make_queue(cli.url, f"ao{len(value)}")
    msg = cli.fails("produce", f"ao{len(value)}", "--at", value, "x", code=2)
    assert "--at" in msg


def test_error_malformed_jsonl_names_the_line(cli: Cli) -> None:
    make_queue(cli.url, "mj")
    cases = {
        '{"utf8": "ok"}\n{not json\n': "line 2: not JSON",
        '{"utf8": "ok"}\n\n[1, 2]\n': "line 3: expected an object or a string",
        '{"bytes": "!!not base64"}\n': "line 1: bytes: Value error, must be base64",
        '{"utf8": "a", "bytes": "AA=="}\n': "line 1: ",
        '{"utf8": "x", "enqueue_at": "when?"}\n': "line 1: enqueue_at: ",
        '{"utf8": "x", "key": ""}\n': "line 1: key: ",
    }
    runs: list[tuple[tuple[str, ...], int, str]] = []
    for n, (body, fragment) in enumerate(cases.items()):
        path = cli.tmp / f"bad-{n}.jsonl"
        path.write_text(body)
        runs.append((("produce", "mj", "--file", str(path)), 1, fragment))
    runs.append((("import", "mj", str(cli.tmp / "bad-0.jsonl")), 1, "line 2: not JSON"))
    cli.many_fail(runs)
    assert live(cli.url, "mj") == []  # nothing produced from the bad files


def test_error_malformed_jsonl_late_in_the_file_produces_nothing(cli: Cli) -> None:
    make_queue(cli.url, "mj-late")
    path = cli.tmp / "late.jsonl"
    path.write_text("".join(json.dumps({"utf8": f"n{n}"}) + "\n" for n in range(700))
                    + "{oops\n")
    msg = cli.fails("produce", "mj-late", "--file", str(path))
    assert "line 701" in msg
    assert live(cli.url, "mj-late") == [] or "500" in msg


def test_error_missing_file(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "mf", "x")
    missing = tmp_path / "no-such-file.txt"
    cli.many_fail([
        (("produce", "mf", "--file", str(missing)), 1,
         f"No such file or directory: '{missing}'"),
        (("import", "mf", str(missing)), 2, "does not exist"),
        (("produce", "mf", "--file", str(tmp_path)), 1, "Is a directory"),
        (("export", "mf", str(tmp_path / "no-dir" / "out.jsonl")), 1,
         "No such file or directory"),
    ])


def test_error_missing_file_with_brackets_in_its_name(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "mf-b")
    missing = tmp_path / "[/x] report.txt"
    msg = cli.fails("produce", "mf-b", "--file", str(missing))
    assert str(missing) in msg


def test_error_stale_and_forged_tokens(cli: Cli) -> None:
    make_queue(cli.url, "tk", "a", "b")
    [first] = cli.js("lease", "tk")
    cli.ok("retry", "tk", first["token"])  # released: the token is stale
    [second] = cli.js("lease", "tk", "-n", "1")
    head, _, sig = second["token"].rpartition(".")
    forged = f"{head}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}"
    cli.many_fail([
        (("complete", "tk", first["token"]), 1, "the lease was lost"),
        (("retry", "tk", first["token"]), 1, "the lease was lost"),
        (("complete", "tk", forged), 1, "tokens[0] has a bad signature"),
        (("complete", "tk", "garbage"), 1, "tokens[0] is not an okq lease token"),
        (("retry", "tk", forged, "--dead"), 1, "bad signature"),
    ])
    assert cli.js("complete", "tk", second["token"])["completed"] == 1
    st = stats(cli.url, "tk")
    assert (st.completed, st.in_flight) == (1, 0)


def test_api_key_required(cli: Cli, tmp_path: Path) -> None:
    with okq_node(f"file://{tmp_path / 'keyed'}", tmp_path, extra=["--api-keys", "k1,k2"]
                  ) as keyed:
        try:
            need = "error: a valid API key is required"
            cli.many_fail([(("queues", "list"), 1, need),
                           (("--api-key", "wrong", "queues", "create", "ak"), 1, need)],
                          url=keyed.url)
            cli.many_fail([(("produce", "ak", "x"), 1, need)], url=keyed.url,
                          env={"OKQ_API_KEY": "nope"})
            cli.ok("--api-key", "k1", "queues", "create", "ak", url=keyed.url)
            cli.ok("produce", "ak", "x", url=keyed.url, env={"OKQ_API_KEY": "k2"})
            got = cli.js("--api-key", "k2", "lease", "ak", url=keyed.url)
            assert [i["utf8"] for i in got] == ["x"]
            st = cli.js("stats", "ak", url=keyed.url, env={"OKQ_API_KEY": "k1"})
            assert st[0]["in_flight"] == 1
        finally:
            record(keyed.output())
            assert "Traceback" not in keyed.output()


# -- payloads are shown as they are ---------------------------------------------------------


def test_lease_shows_a_payload_with_brackets(cli: Cli) -> None:
    make_queue(cli.url, "mk-lease", "[/x] closing tag")
    run = cli("lease", "mk-lease")
    assert run.rc == 0 and "[/x] closing tag" in run.out


def test_tables_show_payloads_and_errors_verbatim(cli: Cli) -> None:
    make_queue(cli.url, "mk-dlq")
    make_queue(cli.url, "mk", "[bold]hi[/bold]", "list[x]", dead_queue="mk-dlq")
    table = rows(cli.ok("items", "mk").out)
    [leased] = cli.js("lease", "mk")
    cli.ok("retry", "mk", leased["token"], "--dead", "--error", "bad value [x]")
    dead = rows(cli.ok("dead", "list", "mk-dlq").out)
    assert [r[4] for r in table] == ["[bold]hi[/bold]", "list[x]"]
    assert dead[0][5] == "bad value [x]"


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(cli: Cli, node: Node) -> None:
    assert not [o for o in OUTPUTS if "Traceback" in o]
    assert "Traceback" not in node.output()
