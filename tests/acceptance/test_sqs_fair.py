"""Fair sharing between message groups on an SQS standard queue, through an unmodified
boto3 client: a standard queue's ``MessageGroupId`` names the message's group
(okq.model.with_group), and a receive shares its messages out among the groups
(okq/scheduler.py, ``Scheduler._pick_fair``), so that one group's deep backlog does
not hold the others back.

One real ``okq serve`` node on the file store (queues of one partition) serves the
module; each test works on a queue of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_sqs_boto3 import Client, Names, make_queue, receive
from tests.nodes import Node
from tests.sqs_support import sqs_client, sqs_node

NINE = tuple("BCDEFGHIJ")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp: Path = tmp_path_factory.mktemp("sqs-fair")
    with sqs_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


@pytest.fixture(scope="module")
def client(node: Node) -> Client:
    return sqs_client(node)


@pytest.fixture
def name() -> Names:
    return Names()


def send(client: Client, url: str, who: str, count: int, grouped: bool) -> None:
    """``count`` messages with bodies ``{who}-{i}``, of group ``who`` when ``grouped``,
    ten a SendMessageBatch call."""
    for start in range(0, count, 10):
        entries: list[dict[str, Any]] = []
        for i in range(start, min(start + 10, count)):
            entry = {"Id": str(i), "MessageBody": f"{who}-{i}"}
            if grouped:
                entry["MessageGroupId"] = who
            entries.append(entry)
        reply = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not reply.get("Failed"), reply


def first_received(client: Client, url: str, n: int) -> Counter[str]:
    """Receive (10 at most a call) and delete at once, until ``n`` messages came;
    counted by their bodies' names up to "-"."""
    counts: Counter[str] = Counter()
    got = 0
    for _ in range(3 * n):
        if got >= n:
            break
        batch = receive(client, url, MaxNumberOfMessages=10,
                        MessageSystemAttributeNames=["MessageGroupId"])
        if not batch:
            continue
        counts.update(m["Body"].split("-")[0] for m in batch)
        got += len(batch)
        reply = client.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(batch)])
        assert not reply.get("Failed"), reply
    assert got >= n, f"received {got} of {n}: {dict(counts)}"
    return counts


def test_a_message_group_with_100_times_the_backlog_does_not_hold_back_the_others(
    client: Client, name: Names
) -> None:
    """A standard queue: group A's 1,000 messages sent first, then 10 of each of
    B..J. The first 12 receives of 10 (each deleted at once) bring all of the nine's
    90 and no more than 30 of A's: with a tenth each, the nine are done after 100. (A
    receive takes from two segments at most: here, where each group's messages are a
    segment of their own, two groups a receive, in turns.)"""
    url = make_queue(client, name())
    send(client, url, "A", 1000, grouped=True)
    for g in NINE:
        send(client, url, g, 10, grouped=True)
    counts = first_received(client, url, 120)
    short = {g: counts[g] for g in NINE if counts[g] < 10}
    assert not short, f"groups short of their 10 in the first 120: {short}; all: {dict(counts)}"
    assert counts["A"] <= 30, dict(counts)
    # A group's messages come with their MessageGroupId, as sent.
    [m] = receive(client, url, MaxNumberOfMessages=1,
                  MessageSystemAttributeNames=["MessageGroupId"])
    assert m["Attributes"]["MessageGroupId"] == m["Body"].split("-")[0]


def test_without_message_groups_the_backlog_comes_first(client: Client, name: Names) -> None:
    """The control: the same sends without MessageGroupId; the first 90 received are
    all A's (the oldest first), and the measure above fails on them."""
    url = make_queue(client, name())
    send(client, url, "A", 300, grouped=False)
    for g in NINE:
        send(client, url, g, 10, grouped=False)
    counts = first_received(client, url, 90)
    assert counts == {"A": 90}
