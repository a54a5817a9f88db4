"""Dead queues over HTTP against a real ``okq serve`` node (file store): a dead
queue must exist and must not lead back, one in use cannot be deleted, and a
redriven dead letter is not counted as completed (issue 8, defects 11 and 13).

One node for the module; each test uses its own queue names.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.nodes import Node, okq_node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("dead-queue-node")
    with okq_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


def call(node: Node, verb: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST /v1/{verb} with a JSON body; the status and the decoded reply."""
    parts = urlsplit(node.url)
    assert parts.hostname == "127.0.0.1"
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", f"/v1/{verb}", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ok(node: Node, verb: str, body: dict[str, Any]) -> Any:
    status, reply = call(node, verb, body)
    assert status in (200, 201), (verb, body, status, reply)
    return reply


def refused(node: Node, verb: str, body: dict[str, Any], status: int, code: str) -> Any:
    got, reply = call(node, verb, body)
    assert (got, reply.get("code")) == (status, code), (verb, body, got, reply)
    return reply


def test_a_dead_queue_that_does_not_exist_is_refused(node: Node) -> None:
    reply = refused(node, "queues.create", {"name": "nx-orders", "dead_queue": "nx-dlq"},
                    400, "invalid_request")
    assert reply["details"]["field"] == "dead_queue"
    assert "'nx-dlq' does not exist" in reply["message"]
    refused(node, "queues.info", {"name": "nx-orders"}, 404, "queue_not_found")

    ok(node, "queues.create", {"name": "nx-plain", "max_attempts": 2})
    reply = refused(node, "queues.update", {"name": "nx-plain", "dead_queue": "nx-dlq"},
                    400, "invalid_request")
    assert reply["details"]["field"] == "dead_queue"
    assert ok(node, "queues.info", {"name": "nx-plain"})["dead_queue"] is None


def test_dead_queue_loops_are_refused_and_stats_answer(node: Node) -> None:
    ok(node, "queues.create", {"name": "lp-1"})
    ok(node, "queues.create", {"name": "lp-2", "dead_queue": "lp-1"})
    ok(node, "queues.create", {"name": "lp-3", "dead_queue": "lp-2"})
    loops = {"lp-3": "lp-1 -> lp-3 -> lp-2 -> lp-1", "lp-2": "lp-1 -> lp-2 -> lp-1"}
    for target, loop in loops.items():
        reply = refused(node, "queues.update", {"name": "lp-1", "dead_queue": target},
                        400, "invalid_request")
        assert reply["details"]["field"] == "dead_queue"
        assert loop in reply["message"], reply
    assert ok(node, "queues.info", {"name": "lp-1"})["dead_queue"] is None
    ok(node, "queue.produce", {"queue_name": "lp-2", "items": [{"utf8": "x"}]})
    for name, dead in (("lp-1", 0), ("lp-2", 0), ("lp-3", 1)):
        assert ok(node, "queue.stats", {"queue_name": name})["dead"] == dead


def test_a_dead_queue_in_use_cannot_be_deleted(node: Node) -> None:
    ok(node, "queues.create", {"name": "del-dlq"})
    ok(node, "queues.create", {"name": "del-jobs", "dead_queue": "del-dlq"})
    reply = refused(node, "queues.delete", {"name": "del-dlq"}, 409, "queue_in_use")
    assert reply["details"]["used_by"] == ["del-jobs"]
    assert "'del-jobs'" in reply["message"] and "nothing was deleted" in reply["message"]
    assert ok(node, "queues.info", {"name": "del-dlq"})["name"] == "del-dlq"

    ok(node, "queues.create", {"name": "del-dlq2"})
    ok(node, "queues.update", {"name": "del-jobs", "dead_queue": "del-dlq2"})
    assert ok(node, "queues.delete", {"name": "del-dlq"}) == {"name": "del-dlq"}
    names = {q["name"] for q in ok(node, "queues.list", {})["queues"]}
    assert "del-dlq" not in names and {"del-jobs", "del-dlq2"} <= names


def test_a_redriven_dead_letter_is_not_counted_as_completed(node: Node) -> None:
    ok(node, "queues.create", {"name": "rd-dlq"})
    ok(node, "queues.create", {"name": "rd-jobs", "max_attempts": 1, "dead_queue": "rd-dlq"})
    ok(node, "queue.produce", {"queue_name": "rd-jobs", "items": [{"utf8": "x"}, {"utf8": "y"}]})
    leased = ok(node, "queue.lease", {"queue_name": "rd-jobs", "batch_size": 2})["items"]
    assert ok(node, "queue.retry", {"queue_name": "rd-jobs", "items": [
        {"token": i["token"], "error": "no"} for i in leased]}) == {
        "queue_name": "rd-jobs", "retried": 2, "dead_lettered": 2}  # out of attempts
    assert ok(node, "queue.stats", {"queue_name": "rd-jobs"})["dead"] == 2

    assert ok(node, "dead.redrive", {"queue_name": "rd-dlq"}) == {"queue_name": "rd-dlq",
                                                                  "moved": 2}
    dlq = ok(node, "queue.stats", {"queue_name": "rd-dlq"})
    assert dlq["completed"] == 0, dlq  # neither completed work...
    assert (dlq["available"], dlq["in_flight"], dlq["dead_lettered"]) == (0, 0, 0)  # ...nor dead
    jobs = ok(node, "queue.stats", {"queue_name": "rd-jobs"})
    assert (jobs["available"], jobs["dead"]) == (2, 0)
    back = ok(node, "items.list", {"queue_name": "rd-jobs"})["items"]
    assert sorted(i["utf8"] for i in back) == ["x", "y"]
    assert {i["meta"]["redriven_from"] for i in back} == {"rd-dlq"}

    # A dead letter a worker of the dead queue completes is completed work.
    ok(node, "queue.produce", {"queue_name": "rd-dlq", "items": [{"utf8": "handled"}]})
    [one] = ok(node, "queue.lease", {"queue_name": "rd-dlq"})["items"]
    ok(node, "queue.complete", {"queue_name": "rd-dlq", "tokens": [one["token"]]})
    assert ok(node, "queue.stats", {"queue_name": "rd-dlq"})["completed"] == 1


def test_a_retry_says_how_many_it_dead_lettered(node: Node) -> None:
    ok(node, "queues.create", {"name": "rc-dlq"})
    ok(node, "queues.create", {"name": "rc-jobs", "max_attempts": 5, "dead_queue": "rc-dlq"})
    ok(node, "queue.produce", {"queue_name": "rc-jobs",
                               "items": [{"utf8": "a"}, {"utf8": "b"}, {"utf8": "c"}]})
    a, b, c = ok(node, "queue.lease", {"queue_name": "rc-jobs", "batch_size": 3})["items"]
    assert ok(node, "queue.retry", {"queue_name": "rc-jobs", "items": [
        {"token": a["token"]}, {"token": b["token"], "dead": True}]}) == {
        "queue_name": "rc-jobs", "retried": 2, "dead_lettered": 1}
    status, reply = call(node, "queue.retry", {"queue_name": "rc-jobs", "items": [
        {"token": c["token"], "dead": True}, {"token": a["token"]}]})  # a's lease is over
    assert (status, reply["code"]) == (409, "lease_lost")
    assert [f["index"] for f in reply["details"]["failed"]] == [1]
    assert ok(node, "queue.stats", {"queue_name": "rc-jobs"})["dead"] == 2
