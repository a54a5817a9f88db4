"""A user's own tests written against okq.testing's fixtures, as text: what
tests/integration/test_testing_plugin.py runs with pytester and
tests/acceptance/test_testing_install.py runs in a project outside okq's tree.

Every test of USER_TESTS passes on every store; FAILING_TEST fails with
``assert 2 == 3`` only if the worker really completed the two items it was given
(a plugin that did nothing would not fail it that way).
"""

from __future__ import annotations

#: The user's test module (asyncio_mode = auto in their configuration).
USER_TESTS = '''
import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from okq.errors import InvalidRequest, QueueNotFound
from okq.testing.drain import NotDrained
from okq.wire import ProduceItem
from okq.worker import Failed

SCHEMES = {"memory": "memory://", "file": "file://", "moto": "s3://"}


def test_the_node_is_on_the_store_asked_for(okq_server, okq_store_kind):
    assert okq_server.store_url.startswith(SCHEMES[okq_store_kind])
    assert okq_server.url.startswith("http://127.0.0.1:")


async def test_produce_and_lease(okq_client, okq_queue):
    queue = okq_queue("orders")
    await okq_client.produce(queue, [b"a", b"b"])
    leased = await okq_client.lease(queue, 10)
    assert sorted(item.bytes for item in leased) == [b"a", b"b"]
    assert await okq_client.complete(queue, [item.token for item in leased]) == 2


def test_sync_client(okq_sync_client, okq_queue):
    queue = okq_queue()
    okq_sync_client.produce(queue, [b"x"])
    assert okq_sync_client.stats(queue).available == 1


def test_queue_factory(okq_sync_client, okq_queue):
    dead = okq_queue("dead")
    queue = okq_queue("jobs", max_attempts=2, dead_queue=dead)
    assert queue.startswith("jobs-") and queue != okq_queue("jobs")
    info = okq_sync_client.queue_info(queue)
    assert (info.max_attempts, info.dead_queue) == (2, dead)
    with pytest.raises(InvalidRequest) as refused:
        okq_queue(max_attempts=-1)
    assert refused.value.field == "max_attempts"


def test_sqs(okq_sqs):
    url = okq_sqs.create_queue(QueueName="sqs-orders")["QueueUrl"]
    okq_sqs.send_message(QueueUrl=url, MessageBody="hello")
    [message] = okq_sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert message["Body"] == "hello"
    okq_sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


async def test_drain(okq_client, okq_queue, okq_drain):
    dead = okq_queue("dead")
    queue = okq_queue("jobs", max_attempts=2, dead_queue=dead)
    await okq_client.produce(queue, [b"ok", b"poison", b"fine"])

    async def handler(item):
        if item.bytes == b"poison":
            raise Failed("cannot digest")

    done = await okq_drain(queue, handler)
    assert (done.completed, done.retried, done.dead, done.failed) == (2, 1, 1, 2)
    assert sorted(done.payloads) == [b"fine", b"ok", b"poison", b"poison"]
    assert (await okq_client.stats(queue)).available == 0
    assert (await okq_client.stats(dead)).available == 1


def test_drain_from_a_sync_test(okq_sync_client, okq_queue, okq_drain):
    queue = okq_queue()
    okq_sync_client.produce(queue, [b"1", b"2"])
    seen = []

    async def handler(item):
        seen.append(item.bytes)

    assert asyncio.run(okq_drain(queue, handler)).completed == 2
    assert sorted(seen) == [b"1", b"2"]


async def test_a_queue_with_an_item_for_later_does_not_drain(okq_client, okq_queue, okq_drain):
    queue = okq_queue()
    later = datetime.now(UTC) + timedelta(minutes=5)
    await okq_client.produce(queue, [b"now", ProduceItem(bytes=b"later", enqueue_at=later)])

    async def handler(item):
        pass

    with pytest.raises(NotDrained, match="1 scheduled"):
        await okq_drain(queue, handler, timeout=0.5)


async def test_drain_of_a_missing_queue_raises(okq_drain):
    async def handler(item):
        pass

    with pytest.raises(QueueNotFound):
        await okq_drain("no-such-queue", handler)
'''

#: A test that fails, with FAILURE, only if the worker really completed two items.
FAILING_TEST = '''

async def test_fails_on_purpose(okq_client, okq_queue, okq_drain):
    queue = okq_queue()
    await okq_client.produce(queue, [b"one", b"two"])

    async def handler(item):
        pass

    assert (await okq_drain(queue, handler)).completed == 3
'''

#: How many tests USER_TESTS has: all pass.
PASSED = 9
#: What FAILING_TEST says.
FAILURE = "assert 2 == 3"

#: The pytest configuration of the user's project (pyproject.toml).
PYTEST_CONFIG = '''
[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
'''
