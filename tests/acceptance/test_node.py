"""Real ``okq serve`` processes on loopback, on the file store and SeaweedFS,
driven by the Python client and by raw HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from okq import wire as s
from okq.client import Client, SyncClient, Worker
from okq.errors import (
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    Overloaded,
    QueueExists,
    QueueNotFound,
)
from okq.retrying import NO_RETRIES
from tests.nodes import Node, okq_node

STORES = ["file", pytest.param("seaweed", marks=pytest.mark.s3)]


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    if request.param == "file":
        yield f"file://{tmp_path / 'data'}", None
    else:
        endpoint = request.getfixturevalue("seaweed_endpoint")
        yield f"s3://okq-test/{uuid.uuid4().hex}", endpoint


@pytest.fixture(scope="module", params=STORES)
def node(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One node per store for the tests that use distinct queues (a node's start is a
    second of CPU); the tests that start and stop nodes of their own take ``store_url``."""
    tmp = tmp_path_factory.mktemp("node")
    if request.param == "file":
        url, endpoint = f"file://{tmp / 'data'}", None
    else:
        url = f"s3://okq-test/{uuid.uuid4().hex}"
        endpoint = request.getfixturevalue("seaweed_endpoint")
    with okq_node(url, tmp, endpoint_url=endpoint) as n:
        yield n


async def test_client_round_trip(node: Node) -> None:
    async with Client(node.url) as c:
        await c.create_queue("dead")
        info = await c.create_queue("jobs", lease_timeout=5, max_attempts=2, dead_queue="dead")
        assert (info.name, info.lease_timeout, info.dead_queue) == ("jobs", 5, "dead")
        ids = await c.produce("jobs", ["text", b"\x00\xffbinary"])
        items = await c.lease("jobs", 10)
        assert [i.id for i in items] == ids
        assert items[0].utf8 == "text" and items[1].bytes == b"\x00\xffbinary"
        deadline = await c.renew("jobs", items[0].token, lease_timeout=20)
        assert deadline > items[0].lease_deadline
        assert await c.complete("jobs", [items[0].token]) == 1
        assert await c.complete("jobs", [items[0].token]) == 1  # a retried completion
        await c.retry("jobs", items[1].token, dead=True, error="bad bytes")
        with pytest.raises(LeaseLost):
            await c.complete("jobs", [items[1].token])
        stats = await c.stats("jobs")
        assert (stats.available, stats.in_flight, stats.dead, stats.completed) == (0, 0, 1, 1)
        listed = await c.list_items("dead")
        assert [i.meta["source_queue"] for i in listed.items if i.meta] == ["jobs"]
        assert listed.items[0].error is None and listed.items[0].state == "available"
        assert await c.redrive("dead") == 1
        (back,) = await c.lease("jobs", 10)
        assert back.bytes == b"\x00\xffbinary" and back.attempts == 1
        await c.complete("jobs", [back.token])
        updated = await c.update_queue("jobs", max_attempts=7)
        assert (updated.max_attempts, updated.lease_timeout) == (7, 5)
        assert {"dead", "jobs"} <= {q.name for q in await c.list_queues()}
        await c.purge("dead")
        await c.delete_queue("jobs")
        with pytest.raises(QueueNotFound):
            await c.queue_info("jobs")
        with pytest.raises(InvalidRequest) as err:
            await c.lease("dead", 0)
        assert err.value.details["field"] == "batch_size"


async def test_raw_http_json(node: Node) -> None:
    async with aiohttp.ClientSession() as http:
        async def post(path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
            async with http.post(f"{node.url}/v1/{path}", json=body) as resp:
                return resp.status, await resp.json()

        assert (await post("queues.create", {"name": "raw"}))[0] == 201
        status, body = await post("queue.produce", {"queue_name": "raw", "items": [
            {"utf8": "hello"}, {"bytes": "/wE="}, {"utf8": "later",
                                                 "enqueue_at": "2099-01-01T00:00:00Z"}]})
        assert status == 200 and len(body["ids"]) == 3  # type: ignore[arg-type]
        status, body = await post("queue.lease", {"queue_name": "raw", "batch_size": 5})
        items = body["items"]
        assert [i["utf8"] for i in items] == ["hello", None]  # type: ignore[index,union-attr]
        assert items[1]["bytes"] == "/wE="  # type: ignore[index]
        tokens = [i["token"] for i in items]  # type: ignore[index,union-attr]
        status, body = await post("queue.complete", {"queue_name": "raw", "tokens": tokens})
        assert (status, body["completed"]) == (200, 2)
        status, body = await post("queue.stats", {"queue_name": "raw"})
        assert (body["scheduled"], body["completed"]) == (1, 2)
        async with http.get(f"{node.url}/openapi.json") as resp:
            doc = await resp.json()
        assert "/v1/queue.lease" in doc["paths"] and doc["openapi"].startswith("3.")
        async with http.get(f"{node.url}/metrics") as resp:
            metrics = await resp.text()
        for name in ("okq_http_requests_total", "okq_http_request_seconds_bucket",
                     "okq_store_requests_total", "okq_cas_conflicts_total", "okq_batch_items",
                     "okq_queue_items"):
            assert name in metrics, name
        assert 'okq_queue_items{queue="raw",state="scheduled"} 1.0' in metrics


async def test_tokens_verify_across_nodes(store_url: tuple[str, str | None],
                                          tmp_path: Path) -> None:
    url, endpoint = store_url
    with okq_node(url, tmp_path, endpoint_url=endpoint) as a, \
            okq_node(url, tmp_path, endpoint_url=endpoint) as b, \
            okq_node(url, tmp_path, endpoint_url=endpoint,
                     keys="some-other-fleet-key-0123456789") as stranger:
        async with Client(a.url) as ca, Client(b.url) as cb, Client(stranger.url) as cs:
            await ca.create_queue("shared")
            await ca.produce("shared", ["x", "y"])
            items = await cb.lease("shared", 2)
            with pytest.raises(InvalidToken):
                await cs.complete("shared", [items[0].token])
            await ca.renew("shared", items[0].token)
            assert await ca.complete("shared", [i.token for i in items]) == 2
            assert (await cs.stats("shared")).completed == 2


async def test_long_poll_is_answered_by_a_produce_on_another_node(
    store_url: tuple[str, str | None], tmp_path: Path
) -> None:
    url, endpoint = store_url
    with okq_node(url, tmp_path, endpoint_url=endpoint) as a, \
            okq_node(url, tmp_path, endpoint_url=endpoint) as b:
        async with Client(a.url) as ca, Client(b.url) as cb:
            await ca.create_queue("poll")
            began = time.monotonic()
            waiting = asyncio.create_task(ca.lease("poll", 1, request_timeout=20))
            await asyncio.sleep(0.5)
            await cb.produce("poll", ["ping"])
            (item,) = await waiting
            took = time.monotonic() - began
            assert item.utf8 == "ping"
            assert took < 5, f"a long poll took {took:.1f}s to see an item"


async def test_worker(node: Node) -> None:
    async with Client(node.url) as c:
        await c.create_queue("work", max_attempts=5)
        await c.produce("work", [f"{n}" for n in range(40)])
        seen: Counter[str] = Counter()

        async def handler(item: s.LeasedItemOut) -> None:
            seen[item.id] += 1
            n = int(item.utf8 or "0")
            if n % 7 == 0 and item.attempts == 1:
                raise RuntimeError(f"first try of {n} fails")
            if n == 3:
                await asyncio.sleep(1.6)  # longer than the lease: renewal keeps it

        worker = Worker(c, "work", handler, concurrency=8, lease_timeout=1, poll=0.5,
                        backoff_base=0.05)
        task = asyncio.create_task(worker.run())
        for _ in range(100):
            if worker.completed == 40:
                break
            await asyncio.sleep(0.1)
        worker.stop()
        await asyncio.wait_for(task, 15)
        assert worker.completed == 40
        assert worker.failed == 6  # 0, 7, 14, 21, 28, 35
        assert all(v == (2 if int(k.split(".")[1]) % 7 == 0 else 1) for k, v in seen.items())
        stats = await c.stats("work")
        assert (stats.available, stats.in_flight, stats.waiting_retry, stats.completed) == \
            (0, 0, 0, 40)


async def test_cancelled_worker_releases_running_items_and_leaves_no_task(node: Node) -> None:
    """Ctrl-C under asyncio.run cancels the worker's task: running handlers stop,
    their items go back at once without spending an attempt, and no request is left
    behind as an orphan task (its failure was the 'Task exception was never
    retrieved' traceback users saw)."""
    async with Client(node.url) as c:
        await c.create_queue("cancel")
        await c.produce("cancel", ["a", "b"])
        started: list[str] = []

        async def handler(item: s.LeasedItemOut) -> None:
            started.append(item.utf8 or "")
            await asyncio.sleep(3600)

        worker = Worker(c, "cancel", handler, concurrency=4, lease_timeout=600, poll=30)
        before = asyncio.all_tasks()
        task = asyncio.create_task(worker.run())
        for _ in range(200):
            if len(started) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(started) == ["a", "b"]
        await asyncio.sleep(0.3)  # the worker now waits in a long poll for two more
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert left == [], left  # no lease request or handler still running

        # Given back, not left leased. The node's side of the abandoned long poll may
        # take a released item for a moment: the node gives it back when it sees that
        # the poll's client has gone.
        again: list[s.LeasedItemOut] = []
        for _ in range(5):
            again += await c.lease("cancel", 2 - len(again), request_timeout=1)
            if len(again) == 2:
                break
        assert sorted(i.utf8 or "" for i in again) == ["a", "b"]
        assert [i.attempts for i in again] == [1, 1]  # the cancelled run spent no attempt


async def test_a_long_poll_whose_client_went_away_leases_nothing(node: Node) -> None:
    """A client that gives up on a long poll (a worker stopped by Ctrl-C) must not
    leave the next item leased to nobody until its lease times out."""
    async with Client(node.url) as c:
        await c.create_queue("gone")
        poll = asyncio.create_task(c.lease("gone", 1, lease_timeout=600, request_timeout=20))
        await asyncio.sleep(0.5)  # the node is waiting for an item
        poll.cancel()  # the client goes away
        with pytest.raises(asyncio.CancelledError):
            await poll
        await asyncio.sleep(0.2)
        await c.produce("gone", ["x"])  # wakes the abandoned poll on the node
        # the node gives the item back as soon as it sees the poll's client gone
        [item] = await c.lease("gone", 1, request_timeout=5)
        assert (item.utf8, item.attempts) == ("x", 1)  # the abandoned poll spent no attempt


async def test_create_queue_exist_ok(node: Node) -> None:
    async with Client(node.url) as c:
        first = await c.create_queue("once", max_attempts=4)
        with pytest.raises(QueueExists):
            await c.create_queue("once")
        again = await c.create_queue("once", exist_ok=True, max_attempts=9)
        assert again == first  # the existing queue, its settings unchanged
        fresh = await c.create_queue("new-with-exist-ok", exist_ok=True, lease_timeout=7)
        assert fresh.lease_timeout == 7


async def test_overload_is_answered_429(store_url: tuple[str, str | None],
                                        tmp_path: Path) -> None:
    url, endpoint = store_url
    with okq_node(url, tmp_path, endpoint_url=endpoint, extra=["--max-waiting", "2"]) as n:
        async with Client(n.url, backoff=NO_RETRIES) as c:  # the node's answer, as it is
            await c.create_queue("busy")
            polls = [asyncio.create_task(c.lease("busy", 1, request_timeout=3))
                     for _ in range(2)]
            await asyncio.sleep(0.5)
            with pytest.raises(Overloaded) as err:
                await c.lease("busy", 1, request_timeout=3)
            assert err.value.retry_after >= 1
            assert await asyncio.gather(*polls) == [[], []]


async def test_sigterm_flushes_and_nothing_is_lost(store_url: tuple[str, str | None],
                                                   tmp_path: Path) -> None:
    url, endpoint = store_url
    with okq_node(url, tmp_path, endpoint_url=endpoint, extra=["--linger", "0.3"]) as n:
        async with Client(n.url) as c:
            await c.create_queue("graceful")
            produce = asyncio.create_task(c.produce("graceful", ["in the batch"]))
            poll = asyncio.create_task(c.lease("graceful", 5, request_timeout=60))
            await asyncio.sleep(0.1)  # the produce is lingering, the poll waiting
            began = time.monotonic()
            n.proc.send_signal(signal.SIGTERM)
            ids = await produce  # finished, not dropped
            await poll  # answered promptly, not left hanging
            assert n.proc.wait(20) == 0
            assert time.monotonic() - began < 15
    with okq_node(url, tmp_path, endpoint_url=endpoint) as again:
        async with Client(again.url) as c:
            leased = await c.lease("graceful", 5)
            if not leased:  # the waiting poll got it before the node stopped
                items = await c.list_items("graceful")
                assert [i.id for i in items.items] == ids
            else:
                assert [i.id for i in leased] == ids


def test_sync_client(node: Node) -> None:
    with SyncClient(node.url) as c:
        c.create_queue("sync")
        c.produce("sync", ["a"])
        (item,) = c.lease("sync", 1)
        assert c.complete("sync", [item.token]) == 1
        assert json.loads(c.stats("sync").model_dump_json())["completed"] == 1
