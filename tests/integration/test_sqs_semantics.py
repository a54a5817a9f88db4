"""The SQS API's semantics where okq decides them (okq/sqs/actions.py), in this
process: each "node" is an ``SqsApi`` over its own engine and queue service, and the
nodes share one store and one manual clock, so that what one node did is seen by the
other only through the bucket, and time moves only when a test moves it.

The wire (boto3, both protocols) is tested by tests/acceptance/test_sqs_boto3.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from okq import Engine, ManualClock
from okq.service import QueueService
from okq.sqs.actions import Call, SqsApi
from okq.sqs.errors import SqsError
from okq.sqs.moves import Moves
from okq.sqs.queues import Names
from okq.store import Store
from tests.engines import make_engine

NAMES = Names("http://okq.test", "us-east-1", "default")


@pytest.fixture
def kind() -> str:
    return "memory"  # the actions' logic is above the store


class Node:
    """One node of the SQS API: ``await node.X(**params)`` runs action X."""

    def __init__(self, engine: Engine, sweep: float = 30.0) -> None:
        self.engine = engine
        self.service = QueueService(engine)
        self.api = SqsApi(1_048_576, Moves(sweep=sweep))

    def call(self) -> Call:
        return Call(self.service, NAMES, "AKIDTEST")

    def __getattr__(self, action: str) -> Any:
        async def run(**params: Any) -> dict[str, Any]:
            return await self.api.action(action)(self.call(), params)

        return run

    async def stats_of(self, queue: str) -> int:
        """Messages ready in ``queue``."""
        return (await self.service.stats(queue)).available

    async def close(self) -> None:
        await self.api.close()
        await self.engine.close()


@pytest.fixture
async def nodes(store: Store, clock: ManualClock) -> AsyncIterator[tuple[Node, Node]]:
    a = Node(await make_engine(store, clock).start())
    b = Node(await make_engine(store, clock).start())
    yield a, b
    await a.close()
    await b.close()


async def queue_url(node: Node, name: str = "q", **attributes: str) -> str:
    return str((await node.CreateQueue(QueueName=name, Attributes=attributes))["QueueUrl"])


async def receive(node: Node, url: str, **params: Any) -> list[dict[str, Any]]:
    got = await node.ReceiveMessage(QueueUrl=url, AttributeNames=["All"], **params)
    return list(got.get("Messages", []))


async def refused(code: str, action: Any, **params: Any) -> SqsError:
    with pytest.raises(SqsError) as err:
        await action(**params)
    assert err.value.shape == code, err.value.message
    return err.value


# -- receive ----------------------------------------------------------------------------


async def test_receive_with_visibility_timeout_zero_leaves_the_message_visible(
        nodes: tuple[Node, Node]) -> None:
    """SQS: ``VisibilityTimeout=0`` on a receive makes the message receivable again at
    once (the receive still counts). The clock does not move in this test."""
    a, b = nodes
    url = await queue_url(a)
    await a.SendMessage(QueueUrl=url, MessageBody="m")
    (first,) = await receive(a, url, VisibilityTimeout=0)
    (again,) = await receive(b, url, VisibilityTimeout=0)
    (third,) = await receive(a, url)
    assert first["MessageId"] == again["MessageId"] == third["MessageId"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in (first, again, third)] == \
        ["1", "2", "3"]
    assert await receive(b, url) == []  # the queue's own 30 s hides it now
    await a.DeleteMessage(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])


# -- visibility changes -------------------------------------------------------------------


async def test_change_visibility_of_a_deleted_message_is_invalid_parameter(
        nodes: tuple[Node, Node]) -> None:
    """SQS answers InvalidParameterValue for a message that no longer exists, and
    MessageNotInflight for one still in the queue that this handle no longer holds."""
    a, b = nodes
    url = await queue_url(a)
    await a.SendMessage(QueueUrl=url, MessageBody="m")
    (first,) = await receive(a, url, VisibilityTimeout=0)
    (second,) = await receive(b, url, VisibilityTimeout=60)
    for timeout in (10, 0):  # held by the second receive: not in flight for this handle
        await refused("MessageNotInflight", b.ChangeMessageVisibility, QueueUrl=url,
                      ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=timeout)
    await b.DeleteMessage(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    for handle in (first, second):  # deleted: whichever handle names it
        for timeout in (10, 0):
            err = await refused("InvalidParameterValue", a.ChangeMessageVisibility,
                                QueueUrl=url, ReceiptHandle=handle["ReceiptHandle"],
                                VisibilityTimeout=timeout)
            assert "ReceiptHandle" in err.message and "does not exist" in err.message
    out = await a.ChangeMessageVisibilityBatch(QueueUrl=url, Entries=[
        {"Id": "gone", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 5}])
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("gone", "InvalidParameterValue")]


async def test_change_visibility_of_a_dead_lettered_message_is_invalid_parameter(
        nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    dlq = await queue_url(a, "dlq")
    arn = NAMES.arn("dlq")
    url = await queue_url(a, "src", RedrivePolicy=f'{{"deadLetterTargetArn": "{arn}", '
                                                  '"maxReceiveCount": 1}')
    await a.SendMessage(QueueUrl=url, MessageBody="poison")
    (got,) = await receive(a, url)
    await a.ChangeMessageVisibility(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"],
                                    VisibilityTimeout=0)  # its one receive is used up
    assert await receive(a, url) == []
    assert [m["Body"] for m in await receive(a, dlq)] == ["poison"]
    await refused("InvalidParameterValue", a.ChangeMessageVisibility, QueueUrl=url,
                  ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=10)


async def test_visibility_is_capped_at_12_hours_from_the_first_receive(
        nodes: tuple[Node, Node], clock: ManualClock) -> None:
    a, b = nodes
    url = await queue_url(a)
    await a.SendMessage(QueueUrl=url, MessageBody="long")
    (got,) = await receive(a, url, VisibilityTimeout=43_200)
    handle = got["ReceiptHandle"]
    clock.advance(11 * 3600)
    err = await refused("InvalidParameterValue", b.ChangeMessageVisibility, QueueUrl=url,
                        ReceiptHandle=handle, VisibilityTimeout=3601)
    assert "VisibilityTimeout" in err.message and "43200" in err.message
    await b.ChangeMessageVisibility(QueueUrl=url, ReceiptHandle=handle,
                                    VisibilityTimeout=3600)  # to 12 h exactly: allowed
    # released and received again: the cap still counts from the first receive
    await a.ChangeMessageVisibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    (again,) = await receive(a, url, VisibilityTimeout=60)
    assert again["Attributes"]["ApproximateFirstReceiveTimestamp"] == \
        got["Attributes"]["ApproximateFirstReceiveTimestamp"]
    await refused("InvalidParameterValue", a.ChangeMessageVisibility, QueueUrl=url,
                  ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=3601)
    await a.ChangeMessageVisibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                                    VisibilityTimeout=3599)
    out = await b.ChangeMessageVisibilityBatch(QueueUrl=url, Entries=[
        {"Id": "over", "ReceiptHandle": again["ReceiptHandle"], "VisibilityTimeout": 7200}])
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("over", "InvalidParameterValue")]


# -- purge --------------------------------------------------------------------------------


async def test_a_second_purge_within_60_seconds_is_refused_on_every_node(
        nodes: tuple[Node, Node], clock: ManualClock) -> None:
    a, b = nodes
    url = await queue_url(a)
    await a.SendMessage(QueueUrl=url, MessageBody="before")
    await a.PurgeQueue(QueueUrl=url)
    await a.SendMessage(QueueUrl=url, MessageBody="between")
    clock.advance(59)
    for node in (b, a):  # the other node knows it from the bucket alone
        err = await refused("PurgeQueueInProgress", node.PurgeQueue, QueueUrl=url)
        assert err.code == "AWS.SimpleQueueService.PurgeQueueInProgress"
    assert [m["Body"] for m in await receive(b, url, VisibilityTimeout=0)] == ["between"]
    clock.advance(1)
    await b.PurgeQueue(QueueUrl=url)
    assert await receive(a, url) == []
    await refused("PurgeQueueInProgress", a.PurgeQueue, QueueUrl=url)
    other = await queue_url(a, "other")  # per queue
    await a.PurgeQueue(QueueUrl=other)


async def test_two_purges_racing_through_two_nodes_run_once(
        nodes: tuple[Node, Node], clock: ManualClock) -> None:
    """The interval is checked inside the purge's own CAS: of two purges sent at
    once to two nodes, one runs and the other is PurgeQueueInProgress."""
    a, b = nodes
    url = await queue_url(a)
    outcomes = await asyncio.gather(a.PurgeQueue(QueueUrl=url), b.PurgeQueue(QueueUrl=url),
                                    return_exceptions=True)
    refusals = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refusals) == 1, outcomes
    assert getattr(refusals[0], "code", "") == "AWS.SimpleQueueService.PurgeQueueInProgress"


# -- message move tasks ---------------------------------------------------------------------


async def dead_letters(node: Node, bodies: list[str]) -> tuple[str, str, str]:
    """A source queue whose messages die after one receive, its dead-letter queue
    holding ``bodies``: (source URL, dead-letter queue URL, its ARN)."""
    dlq = await queue_url(node, "dlq")
    arn = NAMES.arn("dlq")
    src = await queue_url(node, "src", RedrivePolicy=f'{{"deadLetterTargetArn": "{arn}", '
                                                     '"maxReceiveCount": 1}')
    await node.SendMessageBatch(QueueUrl=src, Entries=[
        {"Id": f"m{i}", "MessageBody": b} for i, b in enumerate(bodies)])
    assert len(await receive(node, src, MaxNumberOfMessages=10, VisibilityTimeout=0)) == \
        len(bodies)
    assert await receive(node, src, MaxNumberOfMessages=10) == []  # now dead letters
    assert (await node.service.stats("dlq")).available == len(bodies)
    return src, dlq, arn


async def task_of(node: Node, arn: str) -> dict[str, Any]:
    (task,) = (await node.ListMessageMoveTasks(SourceArn=arn))["Results"]
    return dict(task)


async def until(check: Any, timeout: float = 20) -> Any:
    """``await check()``'s first truthy answer, polling (real time: runners sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (got := await check()):
        assert loop.time() < deadline, f"timed out waiting for {check}"
        await asyncio.sleep(0.05)
    return got


async def test_move_tasks_are_the_same_whichever_node_is_asked(
        nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    _, _, arn = await dead_letters(a, ["d1", "d2", "d3"])
    handle = (await a.StartMessageMoveTask(SourceArn=arn,
                                           MaxNumberOfMessagesPerSecond=1))["TaskHandle"]
    seen = await task_of(b, arn)
    assert (seen["TaskHandle"], seen["Status"], seen["ApproximateNumberOfMessagesToMove"]) == \
        (handle, "RUNNING", 3)
    err = await refused("InvalidParameterValue", b.StartMessageMoveTask, SourceArn=arn)
    assert "already a task running" in err.message
    await b.CancelMessageMoveTask(TaskHandle=handle)  # a's runner stops
    for node in (a, b):
        await until(lambda node=node: _status_is(node, arn, "CANCELLED"))
    await refused("UnsupportedOperation", a.CancelMessageMoveTask, TaskHandle=handle)
    assert (await a.stats_of("dlq")) > 0  # cancelled before it moved them all
    second = (await b.StartMessageMoveTask(SourceArn=arn))["TaskHandle"]
    assert second != handle
    await until(lambda: _status_is(a, arn, "COMPLETED"))
    listed = (await a.ListMessageMoveTasks(SourceArn=arn, MaxResults=10))["Results"]
    assert [t["TaskHandle"] for t in listed] == [second, handle]


async def _status_is(node: Node, arn: str, status: str) -> bool:
    return (await task_of(node, arn))["Status"] == status


async def test_a_task_whose_node_stopped_is_resumed_by_another(
        nodes: tuple[Node, Node], clock: ManualClock) -> None:
    """Node a stops mid-task (its runner writes nothing on the way out, as when it is
    killed); once a's claim lapses, node b takes the task over when asked about it,
    and every dead letter goes back exactly once."""
    a, b = nodes
    src, _, arn = await dead_letters(a, ["d1", "d2", "d3"])
    handle = (await a.StartMessageMoveTask(SourceArn=arn,
                                           MaxNumberOfMessagesPerSecond=1))["TaskHandle"]
    await until(lambda: a.stats_of("src"))  # the first one moved
    await a.api.close()
    assert (await task_of(b, arn))["Status"] == "RUNNING"  # a's claim still holds
    assert not b.api.moves.runners
    clock.advance(75)  # a's claim and any lease it took have lapsed
    assert (await task_of(b, arn))["TaskHandle"] == handle
    assert b.api.moves.runners  # b runs it now
    await until(lambda: _status_is(b, arn, "COMPLETED"))
    got = await receive(b, src, MaxNumberOfMessages=10)
    assert sorted(m["Body"] for m in got) == ["d1", "d2", "d3"]
    assert await b.stats_of("dlq") == 0
    assert (await task_of(a, arn))["ApproximateNumberOfMessagesMoved"] == 3


async def test_cancelling_a_task_whose_node_stopped_ends_it(
        nodes: tuple[Node, Node], clock: ManualClock) -> None:
    a, b = nodes
    _, _, arn = await dead_letters(a, ["d1", "d2"])
    handle = (await a.StartMessageMoveTask(SourceArn=arn,
                                           MaxNumberOfMessagesPerSecond=1))["TaskHandle"]
    await a.api.close()
    clock.advance(75)
    await b.CancelMessageMoveTask(TaskHandle=handle)  # no runner holds it: ended at once
    assert (await task_of(b, arn))["Status"] == "CANCELLED"
    assert not b.api.moves.runners


async def test_a_node_sweeping_its_namespace_resumes_a_stopped_task(
        store: Store, clock: ManualClock) -> None:
    """Nobody asks about the task: a node that serves the namespace finds it on its
    sweep once the claim lapsed."""
    a = Node(await make_engine(store, clock).start())
    b = Node(await make_engine(store, clock).start(), sweep=0.05)
    try:
        _, _, arn = await dead_letters(a, ["d1", "d2"])
        await a.StartMessageMoveTask(SourceArn=arn, MaxNumberOfMessagesPerSecond=1)
        await a.api.close()
        await b.ListQueues()  # b serves the namespace: it sweeps it from now on
        await asyncio.sleep(0.2)
        assert not b.api.moves.runners  # a's claim still holds
        clock.advance(75)

        async def completed() -> bool:  # read from the bucket: a listing would resume it
            (task, *_) = await a.service.move_tasks_of("dlq")
            return task.status == "COMPLETED"

        await until(completed)
        (task, *_) = await a.service.move_tasks_of("dlq")
        assert task.owner == b.api.moves.owner
        assert await a.stats_of("src") == 2 and await a.stats_of("dlq") == 0
    finally:
        await a.close()
        await b.close()
