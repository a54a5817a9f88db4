"""``okq produce``: arguments, stdin, plain and JSONL files, idempotency keys, ``--at``.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

from tests.acceptance.cli.support import (
    Cli,
    check_no_traceback,
    make_queue,
    rows,
    stats,
)
from tests.nodes import Node

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


# -- last ------------------------------------------------------------------------------------


def test_fifo_queue_and_groups(cli: Cli) -> None:
    """``queues create --fifo`` and ``produce --group`` (a JSON line's own group wins):
    a group's items come out in order, one handout at a time."""
    assert cli.js("queues", "create", "pf", "--fifo")["fifo"] is True
    assert "pf (fifo)" in cli.ok("queues", "info", "pf").out
    cli.ok("produce", "pf", "--group", "g1", "a", "b")
    cli.ok("produce", "pf", "--jsonl", "--group", "g1",
           stdin='{"utf8": "c"}\n{"utf8": "x", "group": "g2"}\n')
    got = cli.js("lease", "pf", "-n", "10")
    assert [(i["utf8"], i["meta"]["group"]) for i in got] == [("a", "g1"), ("b", "g1"),
                                                             ("x", "g2")]
    assert cli.js("lease", "pf", "-n", "10") == []  # c waits behind a and b
    cli.many_fail([
        (("produce", "pf", "--group", "has space", "y"), 2, "Invalid value for --group"),
        (("queues", "update", "pf", "--partitions", "2"), 1, "partitions of an ordered"),
    ])


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
