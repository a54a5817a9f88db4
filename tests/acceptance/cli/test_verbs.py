"""The verbs the CLI came to last and the messages it got wrong: ``okq purge``
(asks first), ``okq renew``, ``okq stats`` of every queue, the group's options
after the command (``okq stats jobs -o json``), the attempts of a dead letter, a
second ``okq import`` of one file, one wording of the long-poll limit, the limit
of an oversized item, and a ``file://`` store whose parent directory is missing.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest

from okq.client import Client
from tests.acceptance.cli.support import (
    OKQ,
    Cli,
    check_no_traceback,
    env_for,
    live,
    make_queue,
    rows,
    stats,
    sync,
    wait_for,
)
from tests.nodes import Node

# -- purge and renew --------------------------------------------------------------------------


def test_purge_asks_first(cli: Cli) -> None:
    for name in ("pg-no", "pg-yes", "pg-flag"):
        make_queue(cli.url, name, "1", "2", "3")
    with ThreadPoolExecutor(3) as pool:  # independent runs, side by side
        unasked, yes, flag = pool.map(lambda args: cli(*args[1:], stdin=args[0]), [
            ("", "purge", "pg-no"), ("y\n", "purge", "pg-yes"),
            ("", "purge", "pg-flag", "--yes", "-o", "json")])
    # no terminal to ask on (nor a y): nothing is dropped
    assert (unasked.rc, unasked.out) == (1, ""), unasked
    assert unasked.err.startswith("drop every item of pg-no? [y/N]: ") and \
        "Aborted!" in unasked.err
    assert (yes.rc, yes.out.strip()) == (0, "purged pg-yes"), yes
    assert (flag.rc, json.loads(flag.out)) == (0, {"queue_name": "pg-flag", "purged": True})
    assert [stats(cli.url, q).available for q in ("pg-no", "pg-yes", "pg-flag")] == [3, 0, 0]


async def _lease(url: str, queue: str) -> tuple[str, datetime]:
    async with Client(url) as c:
        [item] = await c.lease(queue, lease_timeout=5)
    return item.token, item.lease_deadline


def test_renew_extends_a_lease(cli: Cli) -> None:
    make_queue(cli.url, "rn", "work")
    token, deadline = sync(_lease(cli.url, "rn"))
    renewed = cli.js("renew", "rn", token, "--lease-timeout", "3600")
    until = datetime.fromisoformat(renewed["lease_deadline"])
    assert (until - deadline).total_seconds() > 3000


# -- stats of every queue, and the group's options after the command ---------------------------


def test_stats_without_a_name_shows_every_queue(cli: Cli) -> None:
    make_queue(cli.url, "all-a", "1", "2")
    make_queue(cli.url, "all-b")
    with ThreadPoolExecutor(2) as pool:
        text, js = pool.map(lambda args: cli.ok(*args), [("stats",), ("stats", "-o", "json")])
    table = {r[0]: r for r in rows(text.out)}
    assert table["all-a"][1] == "2" and table["all-b"][1] == "0"
    got = {g["queue_name"]: g for g in js.json()}  # -o after the command: a list, as JSON
    assert got["all-a"]["available"] == 2 and got["all-b"]["available"] == 0
    assert set(got) == set(table)


def test_group_options_work_after_the_command(cli: Cli) -> None:
    make_queue(cli.url, "late", "x")
    # a nested command; --url after the command wins over OKQ_URL; --timeout taken too
    got = cli.ok("queues", "info", "late", "--output", "json", "--url", cli.url,
                 "--timeout", "30", url="http://127.0.0.1:9").json()
    assert got["name"] == "late"


# -- dead letters, import ----------------------------------------------------------------------


async def _fail_three_times(url: str, queue: str) -> None:
    async with Client(url) as c:
        for n in range(3):
            [item] = await c.lease(queue)
            await c.retry(queue, item.token, error=f"boom {n}")


def test_dead_list_shows_the_attempts_a_dead_letter_used(cli: Cli) -> None:
    make_queue(cli.url, "dl-dead")
    make_queue(cli.url, "dl-src", "poison", dead_queue="dl-dead", max_attempts=3)
    sync(_fail_three_times(cli.url, "dl-src"))
    wait_for(lambda: len(live(cli.url, "dl-dead")) == 1, 10)
    [row] = rows(cli.ok("dead", "list", "dl-dead").out)
    # id, state, attempts, produced, from, error, payload
    assert (row[2], row[4], row[5], row[6]) == ("3", "dl-src", "boom 2", "poison")


def test_a_second_import_says_nothing_was_added(cli: Cli) -> None:
    make_queue(cli.url, "imp")
    path = cli.tmp / "imp.jsonl"
    path.write_text("".join(json.dumps({"utf8": f"record {n}"}) + "\n" for n in range(40)))
    assert cli.js("import", "imp", str(path)) == {
        "queue_name": "imp", "imported": 40, "duplicates": 0, "skipped": 0}
    again = cli.ok("import", "imp", str(path)).out.strip()
    assert again == "imported 0 items (40 produced before: their idempotency keys were taken)"
    assert stats(cli.url, "imp").available == 40


# -- one wording of a limit, and the limit in the details --------------------------------------


def test_long_poll_limits_are_worded_once(cli: Cli) -> None:
    make_queue(cli.url, "lp")
    phrase = "request_timeout must be 0 to 900 seconds (the node's --max-wait)"
    cli.many_fail([
        (("lease", "lp", "--wait", "5000"), 1, phrase),  # over the widest a node allows
        (("lease", "lp", "--wait", "1000"), 1, phrase),  # over this node's --max-wait
    ])


def test_an_oversized_item_is_refused_with_its_limit(cli: Cli) -> None:
    make_queue(cli.url, "big")
    items = [{"utf8": "ok"}, {"bytes": base64.b64encode(b"x" * ((1 << 20) + 1)).decode()}]
    request = urllib.request.Request(
        f"{cli.url}/v1/queue.produce", headers={"Content-Type": "application/json"},
        data=json.dumps({"queue_name": "big", "items": items}).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 413
    details = json.loads(err.value.read())["details"]
    err.value.close()
    assert (details["field"], details["limit"]) == ("items[1]", 1 << 20)


# -- a file:// store whose parent is missing ----------------------------------------------------


def test_a_file_store_whose_parent_is_missing_is_refused(cli: Cli) -> None:
    missing = cli.tmp / "no-such-dir" / "data"
    run = subprocess.run([*OKQ, "serve", "--store", f"file://{missing}", "--port", "0"],
                         capture_output=True, text=True, timeout=60, env=env_for(None))
    assert run.returncode == 1, run
    assert run.stderr.strip() == (
        f"Error: the file store {missing} does not exist, nor does its parent directory "
        f"{missing.parent}: check the path; to start a new store there, create "
        f"{missing.parent} first")
    assert not missing.parent.exists()


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
