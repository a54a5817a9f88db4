"""The client and the ``Worker`` behind a load balancer that fails: a node in this
process on loopback, and a front (a small aiohttp proxy, as nginx would be) that
answers 502 or lets a call land and then loses its reply, as a node SIGKILLed
mid-request does behind nginx. docs/API.md, "Failures and retries", is the table
these tests check; the shell worker's side is in tests/acceptance/test_shell_worker.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from okq.client import Client
from okq.errors import OutcomeUnknown, QueueNotFound, Unavailable
from okq.retrying import Backoff
from okq.server.app import create_app
from okq.settings import Settings
from okq.store import MemoryStore
from okq.wire import LeasedItemOut, ProduceItem
from okq.worker import Worker
from tests.nodes import free_port

KEY = "client-failures-key-0123456789"
FAST = Backoff(attempts=5, base=0.02, cap=0.1)


class InProcNode:
    """An okq node on a loopback port in this process; ``start`` again after ``stop``
    serves the same store on the same port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.store = MemoryStore()
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        settings = Settings(store="memory://", signing_keys=KEY, self_check=False, linger=0)
        self.runner = web.AppRunner(create_app(settings, self.store), shutdown_timeout=1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@dataclass
class Front:
    """A proxy in front of a node. ``faults[path]`` lists what happens to the next calls
    of that path (``okq/v1/<path>``): "502" answers 502 without forwarding; "lost"
    forwards the call, lets it land, then answers 502 (its outcome unknown)."""

    upstream: str
    faults: dict[str, list[str]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        self.seen[path] = self.seen.get(path, 0) + 1
        script = self.faults.get(path) or []
        fault = script.pop(0) if script else None
        if fault == "502":
            return web.Response(status=502, text="<html>502 Bad Gateway</html>")
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.upstream}/v1/{path}", data=await request.read(),
                headers={"Content-Type": request.content_type,
                         "Accept": request.headers.get("Accept", "")}) as resp:
            body = await resp.read()
            if fault == "lost":
                return web.Response(status=502, text="<html>502 Bad Gateway</html>")
            return web.Response(status=resp.status, body=body,
                                content_type=resp.content_type)


@pytest.fixture
async def node() -> AsyncIterator[InProcNode]:
    n = InProcNode(free_port())
    await n.start()
    yield n
    await n.stop()


@pytest.fixture
async def front(node: InProcNode) -> AsyncIterator[Front]:
    f = Front(node.url)
    app = web.Application()
    app.router.add_post("/v1/{path}", f.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    f.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    yield f
    await runner.cleanup()


async def until(what: str, cond: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# -- the client ---------------------------------------------------------------------------


async def test_client_retries_gateway_errors_and_a_node_that_is_not_up_yet(
        node: InProcNode, front: Front) -> None:
    async with Client(front.url, backoff=FAST) as c:
        await c.create_queue("jobs")
        front.faults = {"queue.stats": ["502", "502"], "queue.lease": ["lost"]}
        await c.produce("jobs", ["a"])
        assert (await c.stats("jobs")).available == 1
        assert front.seen["queue.stats"] == 3
        # a lease whose reply was lost is sent again; the lost delivery comes back
        # at its lease timeout, like any lease a consumer never finishes
        assert await c.lease("jobs", 1, lease_timeout=5) == []
        assert front.seen["queue.lease"] == 2
    # a refused connection, then the node comes up: the client tries again
    await node.stop()
    async with Client(node.url, backoff=Backoff(attempts=20, base=0.05, cap=0.2)) as c:
        stats = asyncio.create_task(c.stats("jobs"))
        await asyncio.sleep(0.3)
        assert not stats.done()
        await node.start()
        assert (await stats).in_flight == 1
    # tries are bounded: a node that stays down is Unavailable, with what happened
    await node.stop()
    async with Client(node.url, backoff=FAST) as c:
        with pytest.raises(Unavailable, match="cannot reach okq at") as caught:
            await c.stats("jobs")
        assert caught.value.sent is False
    await node.start()


async def test_a_produce_of_unknown_outcome_is_retried_only_when_keyed(
        front: Front, caplog: pytest.LogCaptureFixture) -> None:
    async with Client(front.url, backoff=FAST) as c:
        await c.create_queue("jobs")
        front.faults = {"queue.produce": ["lost"]}
        with caplog.at_level(logging.WARNING, "okq.client"), \
                pytest.raises(OutcomeUnknown, match="idempotency key"):
            await c.produce("jobs", ["unkeyed"])
        assert front.seen["queue.produce"] == 1  # not sent again
        assert "may or may not have taken effect" in caplog.text
        # it had landed: once
        assert [i.utf8 for i in (await c.list_items("jobs")).items] == ["unkeyed"]

        front.faults = {"queue.produce": ["lost", "502"]}
        ids = await c.produce("jobs", [ProduceItem(utf8="keyed", key="k1")])
        assert front.seen["queue.produce"] == 4  # sent again until it was answered
        items = (await c.list_items("jobs")).items
        assert sorted(i.utf8 or "" for i in items) == ["keyed", "unkeyed"]
        assert ids == [i.id for i in items if i.utf8 == "keyed"]

        # a 502 does not say whether a node saw the call: a call that is not
        # harmless to repeat is not sent again, even when it never landed
        front.faults = {"queue.purge": ["502"]}
        with pytest.raises(OutcomeUnknown):
            await c.purge("jobs")
        assert front.seen["queue.purge"] == 1


# -- the Worker -----------------------------------------------------------------------------


async def test_worker_rides_out_gateway_errors(front: Front) -> None:
    done: list[str] = []

    async def handler(item: LeasedItemOut) -> None:
        done.append(item.utf8 or "")

    async with Client(front.url, backoff=FAST) as c:
        await c.create_queue("jobs")
        await c.produce("jobs", ["1", "2", "3"])
        # more 502s in a row than the client tries: the worker waits them out
        front.faults = {"queue.lease": ["502"] * 12, "queue.complete": ["lost"]}
        worker = Worker(c, "jobs", handler, poll=0.2)
        worker.wait_base, worker.wait_max = 0.05, 0.2  # type: ignore[misc]
        run = asyncio.create_task(worker.run())
        await until("three completed", lambda: worker.stats.completed == 3)
        worker.stop()
        stats = await asyncio.wait_for(run, 10)
    assert sorted(done) == ["1", "2", "3"]
    assert stats.errors == []


async def test_worker_started_while_its_node_is_down_waits_for_it(node: InProcNode) -> None:
    async with Client(node.url) as c:
        await c.create_queue("jobs", lease_timeout=1)
        await c.produce("jobs", ["x"])
    await node.stop()
    done: list[str] = []

    async def handler(item: LeasedItemOut) -> None:
        done.append(item.utf8 or "")

    async with Client(node.url, backoff=FAST) as c:
        worker = Worker(c, "jobs", handler, poll=0.2)
        worker.wait_base, worker.wait_max = 0.05, 0.2  # type: ignore[misc]
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(1)
        assert not run.done(), run
        await node.start()
        await until("the item completed", lambda: worker.stats.completed == 1)
        worker.stop()
        await asyncio.wait_for(run, 10)
        assert done == ["x"]
        # an error that waiting cannot help still stops it at once
        with pytest.raises(QueueNotFound):
            await asyncio.wait_for(Worker(c, "nope", handler).run(), 10)


async def test_worker_logs_handler_failures_with_item_and_attempt(
        node: InProcNode, caplog: pytest.LogCaptureFixture) -> None:
    async def handler(item: LeasedItemOut) -> None:
        raise ValueError(f"cannot parse {item.utf8}")

    async with Client(node.url) as c:
        await c.create_queue("jobs", max_attempts=2)
        [item_id] = await c.produce("jobs", ["bad"])
        worker = Worker(c, "jobs", handler, poll=0.2, backoff_base=0.05, limit=1)
        with caplog.at_level(logging.WARNING, "okq.worker"):
            stats = await asyncio.wait_for(worker.run(), 15)
    assert stats.dead == 1
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert [(r.levelno, item_id in r.getMessage()) for r in failures] == \
        [(logging.WARNING, True), (logging.ERROR, True)]
    assert "(attempt 1)" in failures[0].getMessage()
    assert "(attempt 2)" in failures[1].getMessage()
    assert "ValueError: cannot parse bad" in failures[0].getMessage()
    assert failures[0].exc_info is not None  # with the traceback


async def test_worker_uses_the_queues_lease_timeout_unless_given_one(
        node: InProcNode) -> None:
    leased: list[LeasedItemOut] = []

    async def handler(item: LeasedItemOut) -> None:
        leased.append(item)

    async with Client(node.url) as c:
        await c.create_queue("jobs", lease_timeout=10)
        await c.produce("jobs", ["a", "b"])
        for given, expected in (({}, 10.0), ({"lease_timeout": 40.0}, 40.0)):
            before = time.time()
            worker = Worker(c, "jobs", handler, poll=0.2, limit=1, **given)
            await asyncio.wait_for(worker.run(), 10)
            seconds = leased[-1].lease_deadline.timestamp() - before
            assert expected - 2 < seconds <= expected + 1, (given, seconds)
            assert worker.renew_every == expected / 2
