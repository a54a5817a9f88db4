"""``okq lease``, ``complete``, ``retry``, dead letters and redrive; ``stats`` (also
``--watch``, on a terminal and in a pipe), ``items`` and ``serve --help``.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta

from tests.acceptance.cli.support import (
    OKQ,
    Cli,
    check_no_traceback,
    env_for,
    live,
    make_queue,
    produce,
    record,
    rows,
    stats,
    wait_for,
)
from tests.nodes import Node

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
    make_queue(cli.url, "lc", "p0", "p1", "p2", "p3", lease_timeout=3600)
    ids = [i.id for i in live(cli.url, "lc")]

    text = parse_lease_text(cli.ok("lease", "lc").out)
    assert [(t["id"], t["attempts"], t["payload"]) for t in text] == [(ids[0], "1", "p0")]

    began = datetime.now(UTC)
    # the lease's own timeout, not the queue's hour; long enough that the leases are
    # still held when the next CLI calls read the stats, however slow the machine
    leased = cli.js("lease", "lc", "-n", "2", "--lease-timeout", "600")
    ended = datetime.now(UTC)  # the CLI leased between the two (its start may be slow)
    assert [i["id"] for i in leased] == ids[1:3]
    assert [i["utf8"] for i in leased] == ["p1", "p2"]
    assert all(i["attempts"] == 1 and i["token"] for i in leased)
    deadline = datetime.fromisoformat(leased[0]["lease_deadline"].replace("Z", "+00:00"))
    own, slack = timedelta(seconds=600), timedelta(seconds=1)
    assert began + own - slack < deadline < ended + own + slack

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


def test_a_retry_out_of_attempts_says_it_dead_lettered(cli: Cli) -> None:
    make_queue(cli.url, "oa-dlq")
    make_queue(cli.url, "oa", "once", "twice", dead_queue="oa-dlq", max_attempts=2)
    [one] = cli.js("lease", "oa")
    assert cli.js("retry", "oa", one["token"]) == {"queue_name": "oa", "retried": 1,
                                                   "dead_lettered": 0}
    [again] = [i for i in cli.js("lease", "oa", "-n", "2") if i["id"] == one["id"]]
    assert again["attempts"] == 2  # its last
    assert cli.ok("retry", "oa", again["token"]).out.strip() == "dead-lettered: out of attempts"
    assert stats(cli.url, "oa").dead == 1


def test_stats_for_several_queues(cli: Cli) -> None:
    make_queue(cli.url, "st-a", "1", "2", "3", lease_timeout=3600)  # still leased when read
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
    every = {r[0]: r for r in rows(cli.ok("stats").out)}  # no name: every queue
    assert {"st-a", "st-b", "st-c"} <= set(every) and every["st-a"][:7] == table["st-a"][:7]


def test_items_limit_and_all(cli: Cli) -> None:
    make_queue(cli.url, "it", *(f"item {n}" for n in range(107)))
    make_queue(cli.url, "it-empty")
    assert [r[4] for r in rows(cli.ok("items", "it", "--limit", "2").out)] == [
        "item 0", "item 1"]
    assert len(cli.js("items", "it")) == 100  # the default limit
    assert [i["utf8"] for i in cli.js("items", "it", "--all")] == [
        f"item {n}" for n in range(107)]
    assert cli.ok("items", "it-empty").out.strip() == "no live items"


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
        wait_for(lambda: screen.count("┏".encode()) >= 1, 15)
        make_queue(cli.url, "sw-other")  # let a refresh go by
        produce(cli.url, "sw", "two")
        # two refreshes at least, the last one showing the new count
        wait_for(lambda: screen.count("┏".encode()) >= 3 and re.search(
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
        wait_for(lambda: len(lines) >= 4, 15)  # two refreshes, each a line per queue
        produce(cli.url, "swp", "two")
        wait_for(lambda: any(" swp available=2 " in line for line in lines), 15)
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


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
