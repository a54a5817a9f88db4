"""A node's operations, in process: what /health costs and tells, the depth
gauges, queue updates over HTTP, long-poll admission when callers go away, and
the SQS API metered and authorized by the same pipeline as the native API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from okq.errors import InvalidRequest
from okq.server.app import create_app
from okq.server.console import FLEET_CACHE
from okq.server.health import Health, StoreWatch
from okq.server.state import HEALTH, METRICS, SERVICE
from okq.settings import Settings
from okq.store import CountingStore, FaultyStore, MemoryStore, Store
from tests.sqs_support import sqs_client

KEY = "node-ops-test-key-0123456789"

class Node:
    """A node on a loopback port, served as ``okq serve`` serves it (a handler is
    not cancelled when its client goes away), and a client session to it."""

    def __init__(self, app: web.Application, runner: web.AppRunner, url: str) -> None:
        self.app, self.runner, self.url = app, runner, url
        self.session = aiohttp.ClientSession(base_url=url)

    def get(self, path: str) -> Any:
        return self.session.get(path)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.session.post(path, **kwargs)

    async def close(self) -> None:
        await self.session.close()
        await self.runner.cleanup()


Start = Callable[..., Awaitable[Node]]


@pytest.fixture
async def start_node() -> AsyncIterator[Start]:
    nodes: list[Node] = []

    async def start(store: Store, **overrides: Any) -> Node:
        fields = {"store": "memory://", "signing_keys": KEY, "self_check": False,
                  "linger": 0.002, "report_interval": 0, **overrides}
        app = create_app(Settings(**fields), store)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        nodes.append(Node(app, runner, f"http://127.0.0.1:{port}"))
        return nodes[-1]

    yield start
    for node in nodes:
        await node.close()


async def call(client: Node, verb: str, body: dict[str, Any],
               status: int = 200) -> dict[str, Any]:
    async with client.post(f"/v1/{verb}", json=body) as resp:
        out: dict[str, Any] = await resp.json()
        assert resp.status == status, out
        return out


# -- the console ------------------------------------------------------------------------


async def test_the_console_is_served_with_a_strict_policy_and_can_be_turned_off(
        start_node: Start) -> None:
    node = await start_node(MemoryStore())
    async with node.get("/ui") as resp:
        assert resp.status == 200 and str(resp.url).endswith("/ui/")
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert "app.js" in await resp.text()
    async with node.get("/ui/app.js") as resp:
        assert resp.status == 200 and resp.content_type == "text/javascript"
    for path in ("/ui/missing.js", "/ui/..%2Fconsole.py", "/ui/%2E%2E/app.py"):
        async with node.get(path) as resp:
            assert resp.status == 404, path
    off = await start_node(MemoryStore(), console=False)
    async with off.get("/ui/") as resp:
        assert resp.status == 404
    assert (await call(off, "auth.whoami", {}))["role"] == "admin"  # no key asked: admin
    assert (await call(off, "fleet.status", {}))["processes"] == []


async def test_fleet_status_shows_the_nodes_reporting_and_their_price(
        start_node: Start) -> None:
    store = MemoryStore()
    nodes = [await start_node(store, report_interval=0.2) for _ in range(2)]
    await call(nodes[0], "queues.create", {"name": "q"}, 201)
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # each node reports 0.2 s after it starts, then every 0.2 s
        await asyncio.sleep(0.25)
        nodes[0].app[FLEET_CACHE].clear()  # each node keeps its answer 5 s
        fleet = await call(nodes[0], "fleet.status", {})
        if len(fleet["processes"]) == 2 or asyncio.get_running_loop().time() > deadline:
            break
    assert {p["kind"] for p in fleet["processes"]} == {"node"}
    assert all(p["live"] for p in fleet["processes"])
    assert fleet["node"] in {p["id"] for p in fleet["processes"]}
    assert fleet["per_s"].get("put", 0) > 0 and fleet["dollars_per_month"] > 0
    assert fleet["roles"] == [] and fleet["prices"]["put"] == 0.005 / 1000
    await nodes[1].close()  # a clean stop takes its report away
    nodes.remove(nodes[1])
    nodes[0].app[FLEET_CACHE].clear()
    assert len((await call(nodes[0], "fleet.status", {}))["processes"]) == 1


# -- /health ------------------------------------------------------------------------


async def test_health_probes_cost_no_store_request_while_the_store_answers(
        start_node: Start) -> None:
    counting = CountingStore(MemoryStore())
    client = await start_node(counting)
    await call(client, "queues.create", {"name": "q"}, 201)
    before = counting.total
    for _ in range(20):
        resp = await client.get("/health")
        assert resp.status == 200
        body = await resp.json()
        assert body["status"] == "ok" and body["store"] == "memory"
        assert 0 <= body["store_heard"] < 30
    assert counting.total == before  # a LIST per probe before


async def test_a_quiet_node_asks_the_store_once_for_many_probes() -> None:
    now = [1000.0]
    counting = CountingStore(MemoryStore())
    health = Health(StoreWatch(counting, now=lambda: now[0]), "ns", quiet=30)
    verdicts = await asyncio.gather(*(health.check() for _ in range(10)))
    assert all(v.ok for v in verdicts)
    assert counting.requests == {"head": 1}  # one GET-class request, shared
    now[0] += 29
    assert (await health.check()).ok
    assert counting.total == 1
    now[0] += 2  # quiet for longer than 30 s: asked again
    assert (await health.check()).ok
    assert counting.total == 2


async def test_a_failing_store_is_reported_then_rechecked() -> None:
    now = [1000.0]
    faulty = FaultyStore(MemoryStore())
    faulty.inject("*", "error", times=-1)
    watch = StoreWatch(faulty, now=lambda: now[0])
    health = Health(watch, "ns", recheck=2)
    verdict = await health.check()
    assert not verdict.ok and verdict.failure == "StorageError"
    calls = len(faulty.calls)
    now[0] += 1
    assert not (await health.check()).ok
    assert len(faulty.calls) == calls  # answered from the notes within `recheck`
    faulty.clear()
    now[0] += 2
    assert (await health.check()).ok  # asked again, and the store answered


async def test_a_node_request_failing_turns_health_red_at_once() -> None:
    now = [1000.0]
    faulty = FaultyStore(MemoryStore())
    watch = StoreWatch(faulty, now=lambda: now[0])
    health = Health(watch, "ns")
    await watch.put("ns/x", b"1")
    assert (await health.check()).ok
    faulty.inject("*", "error", times=-1)
    now[0] += 0.5
    with pytest.raises(Exception, match="injected"):
        await watch.get("ns/x")
    assert not (await health.check()).ok


async def test_health_tells_no_endpoint_bucket_or_store_error_text(start_node: Start) -> None:
    faulty = FaultyStore(MemoryStore())
    faulty.url = "s3://secret-bucket/tenant-prefix?endpoint=http://10.1.2.3:9000"
    client = await start_node(faulty)
    faulty.inject("*", "error", times=-1)
    client.app[HEALTH].watch.answered = None  # as if the node had never reached it
    resp = await client.get("/health")
    assert resp.status == 503
    text = await resp.text()
    for secret in ("secret-bucket", "tenant-prefix", "10.1.2.3", "injected", "health/probe"):
        assert secret not in text, text
    body = await resp.json()
    assert body["status"] == "store unavailable: StorageError" and body["store"] == "s3"


# -- long polls whose caller went away ------------------------------------------------


async def test_an_abandoned_long_poll_frees_its_max_waiting_slot(start_node: Start) -> None:
    client = await start_node(MemoryStore(), max_waiting=1)
    await call(client, "queues.create", {"name": "q"}, 201)
    body = {"queue_name": "q", "request_timeout": 60}

    async def long_poll() -> None:
        async with client.post("/v1/queue.lease", json=body) as resp:
            await resp.read()

    abandoned = asyncio.create_task(long_poll())
    service = client.app[SERVICE]
    while service.waiting("q") < 1:
        assert not abandoned.done()
        await asyncio.sleep(0.01)
    await call(client, "queue.lease", {**body, "request_timeout": 0.1}, 429)  # taken
    abandoned.cancel()  # the caller goes away: its connection closes
    with contextlib.suppress(asyncio.CancelledError):
        await abandoned
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 10
    while service.waiting("q") and loop.time() < give_up:
        await asyncio.sleep(0.05)
    assert service.waiting("q") == 0  # before: held until its 60 s request_timeout
    await call(client, "queue.lease", {**body, "request_timeout": 0.1})


# -- queues.update and dead queues ---------------------------------------------------------


async def test_dead_queue_is_cleared_over_http_with_an_empty_string(start_node: Start) -> None:
    client = await start_node(MemoryStore())
    await call(client, "queues.create", {"name": "dlq"}, 201)
    await call(client, "queues.create", {"name": "q", "dead_queue": "dlq"}, 201)
    kept = await call(client, "queues.update", {"name": "q", "dead_queue": None})
    assert kept["dead_queue"] == "dlq"  # null: unchanged
    cleared = await call(client, "queues.update", {"name": "q", "dead_queue": ""})
    assert cleared["dead_queue"] is None
    assert (await call(client, "queues.info", {"name": "q"}))["dead_queue"] is None
    await call(client, "queues.delete", {"name": "dlq"})  # no longer anyone's dead queue


async def test_two_racing_updates_cannot_close_a_dead_queue_loop(start_node: Start) -> None:
    faulty = FaultyStore(MemoryStore())
    client = await start_node(faulty)
    for name in ("a", "b"):
        await call(client, "queues.create", {"name": name}, 201)
    # Both updates check the chain before either's manifest write lands.
    faulty.inject("put", "latency", key="/manifests/", delay=0.3, times=2)
    answers = await asyncio.gather(
        client.post("/v1/queues.update", json={"name": "a", "dead_queue": "b"}),
        client.post("/v1/queues.update", json={"name": "b", "dead_queue": "a"}))
    statuses = sorted(resp.status for resp in answers)
    for resp in answers:
        body = await resp.json()
        if resp.status == 400:
            assert body["details"]["field"] == "dead_queue" and "loop" in body["details"]
    assert statuses in ([200, 400], [400, 400]), statuses
    dead = {name: (await call(client, "queues.info", {"name": name}))["dead_queue"]
            for name in ("a", "b")}
    assert dead != {"a": "b", "b": "a"}, dead  # before: both landed, a loop
    ok = [resp for resp in answers if resp.status == 200]
    assert len([d for d in dead.values() if d]) == len(ok)  # what was answered 200 holds


# -- queue depth gauges ----------------------------------------------------------------


def _depth(text: str, queue: str, state: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'okq_queue_items{{queue="{queue}",state="{state}"}}'):
            return float(line.split()[-1])
    return None


async def test_depth_gauges_follow_the_queue_without_stats_calls(start_node: Start) -> None:
    counting = CountingStore(MemoryStore())
    client = await start_node(counting, depth_interval=0.2)
    await call(client, "queues.create", {"name": "q"}, 201)
    await call(client, "queue.produce", {"queue_name": "q", "items": [{"utf8": "a"}] * 3})

    async def scrape() -> str:
        async with client.get("/metrics") as resp:
            return await resp.text()

    assert _depth(await scrape(), "q", "available") == 3  # before: no gauge until stats
    await call(client, "queue.lease", {"queue_name": "q", "batch_size": 2})
    await asyncio.sleep(0.25)
    text = await scrape()
    assert _depth(text, "q", "available") == 1 and _depth(text, "q", "in_flight") == 2
    before = counting.total
    for _ in range(5):  # within the interval: the figures scraped, no store request
        await scrape()
    assert counting.total == before
    await call(client, "queues.delete", {"name": "q"})
    await asyncio.sleep(0.25)
    assert _depth(await scrape(), "q", "available") is None  # a deleted queue's gauge goes


# -- one pipeline: SQS metered and authorized as the native API is ---------------------------

SQS_AKID, SQS_SECRET = "AKIDPIPELINE", "pipeline-test-secret-0123456789"
READER, READER_SECRET = "AKIDREADER", "pipeline-reader-secret-0123456789"
ORDERS, ORDERS_SECRET = "AKIDORDERS", "pipeline-orders-secret-0123456789"


def items_total(node: Node, operation: str) -> float:
    value = node.app[METRICS].registry.get_sample_value("okq_items_total",
                                                        {"operation": operation})
    return value or 0.0


async def test_sqs_items_are_counted_in_okq_items_total_as_native_ones(
        start_node: Start) -> None:
    """Sends, receives, deletes and releases through the SQS API count in
    okq_items_total once each, beside the native API's (before: SQS counted none)."""
    node = await start_node(MemoryStore(), sqs_keys=f"{SQS_AKID}:{SQS_SECRET}")
    sqs = sqs_client(node.url, access_key=SQS_AKID, secret=SQS_SECRET)
    url = (await asyncio.to_thread(sqs.create_queue, QueueName="jobs"))["QueueUrl"]
    await asyncio.to_thread(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": str(n), "MessageBody": f"m{n}"} for n in range(3)])
    await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="m3")
    got = (await asyncio.to_thread(sqs.receive_message, QueueUrl=url,
                                   MaxNumberOfMessages=10))["Messages"]
    assert len(got) == 4
    await asyncio.to_thread(sqs.delete_message_batch, QueueUrl=url, Entries=[
        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got[:3])])
    await asyncio.to_thread(sqs.change_message_visibility, QueueUrl=url,
                            ReceiptHandle=got[3]["ReceiptHandle"], VisibilityTimeout=0)
    await call(node, "queue.produce", {"queue_name": "jobs", "items": [{"utf8": "n"}] * 2})
    counted = {op: items_total(node, op) for op in ("produced", "leased", "completed", "retried")}
    assert counted == {"produced": 6, "leased": 4, "completed": 3, "retried": 1}


async def test_an_sqs_key_acts_with_its_role_and_prefixes(start_node: Start) -> None:
    """SQS keys are principals as API keys are: a read-only key reads but may not
    send; a key limited to ``orders-`` acts on those queues only, and lists them only."""
    keys = (f"{SQS_AKID}:{SQS_SECRET},{READER}:{READER_SECRET}:default:read-only,"
            f"{ORDERS}:{ORDERS_SECRET}::producer:orders-")
    node = await start_node(MemoryStore(), sqs_keys=keys)
    admin = sqs_client(node.url, access_key=SQS_AKID, secret=SQS_SECRET)
    reader = sqs_client(node.url, access_key=READER, secret=READER_SECRET)
    orders = sqs_client(node.url, access_key=ORDERS, secret=ORDERS_SECRET)
    jobs = (await asyncio.to_thread(admin.create_queue, QueueName="jobs"))["QueueUrl"]
    mine = (await asyncio.to_thread(admin.create_queue, QueueName="orders-1"))["QueueUrl"]
    attributes = await asyncio.to_thread(reader.get_queue_attributes, QueueUrl=jobs,
                                         AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"
    for client, url in ((reader, jobs), (orders, jobs)):
        with pytest.raises(ClientError) as refused:
            await asyncio.to_thread(client.send_message, QueueUrl=url, MessageBody="x")
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    await asyncio.to_thread(orders.send_message, QueueUrl=mine, MessageBody="x")
    listed = await asyncio.to_thread(orders.list_queues)
    assert listed["QueueUrls"] == [mine]
    assert (await call(node, "queue.stats", {"queue_name": "jobs"}))["available"] == 0
    assert (await call(node, "queue.stats", {"queue_name": "orders-1"}))["available"] == 1


def test_sqs_keys_name_a_known_role() -> None:
    with pytest.raises(InvalidRequest, match="role must be one of"):
        Settings(store="memory://", sqs_keys="AKID:secret:default:owner").sqs_credentials()


async def test_a_node_signs_the_token_format_it_is_told_and_reads_both(start_node: Start) -> None:
    """A rolling upgrade from nodes that read only version 1 tokens: new nodes run
    with --token-format 1 until the old ones are gone, and every node completes
    tokens of either version."""
    store = MemoryStore()
    old_style = await start_node(store, token_format=1)
    default = await start_node(store)
    await call(default, "queues.create", {"name": "upgrade"}, 201)
    await call(default, "queue.produce",
               {"queue_name": "upgrade", "items": [{"utf8": str(n)} for n in range(4)]})
    v1 = await call(old_style, "queue.lease", {"queue_name": "upgrade", "batch_size": 2})
    v2 = await call(default, "queue.lease", {"queue_name": "upgrade", "batch_size": 2})
    assert [i["token"].count(".") for i in v1["items"]] == [1, 1]
    assert [i["token"].count(".") for i in v2["items"]] == [3, 3]
    # Each completed on the node that did not sign it: verified in full, not remembered.
    await call(default, "queue.complete",
               {"queue_name": "upgrade", "tokens": [i["token"] for i in v1["items"]]})
    await call(old_style, "queue.complete",
               {"queue_name": "upgrade", "tokens": [i["token"] for i in v2["items"]]})
    stats = await call(default, "queue.stats", {"queue_name": "upgrade"})
    assert stats["in_flight"] == 0 and stats["available"] == 0


# -- the produce linger ----------------------------------------------------------------


@pytest.mark.parametrize("items", [100, 10])
async def test_a_producer_in_a_closed_loop_waits_the_linger_only_with_small_calls(
        start_node: Start, items: int) -> None:
    """One connection producing call after call: a call of 100 items or more ends the
    linger once its connection (every connection of the last publish) is back, so
    only the first call waits it; a smaller call waits the whole linger, to share
    its segment."""
    linger = 0.4
    client = await start_node(MemoryStore(), linger=linger)
    await call(client, "queues.create", {"name": "q"}, 201)
    body = {"queue_name": "q", "items": [{"utf8": "a"}] * items}
    await call(client, "queue.produce", body)  # the first publish: nobody to wait for
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(4):
        await call(client, "queue.produce", body)
    took = loop.time() - began
    if items >= 100:
        assert took < linger  # four lingers would be 1.6 s
    else:
        assert took >= 4 * linger
    assert (await call(client, "queue.stats", {"queue_name": "q"}))["available"] == 5 * items
