"""Real SQS clients on okq's FIFO queues (docs/SQS.md): the AWS CLI (``python -m
awscli``) creating a FIFO queue, sending with a message group and a deduplication
id and receiving, and a real Celery worker on kombu's SQS transport running the
tasks of each message group in order.

kombu's SQS transport makes a queue whose name ends in ``.fifo`` a FIFO queue
(``FifoQueue=true`` at create), sends each message with the ``MessageGroupId`` of
its properties (``apply_async(..., MessageGroupId=...)``; ``default`` without one)
and a fresh ``MessageDeduplicationId`` (a UUID) unless the properties name one.

This module is also the Celery app of the worker it starts (``celery -A
tests.acceptance.test_sqs_fifo_clients``): :data:`app`, whose task appends to one
file in the directory named by ``OKQ_TEST_FIFO_RECORDS``, in the order the worker
ran it, and notes the SQS attributes kombu fetched with each message.

One node, on the file store, serves both tests.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery  # type: ignore[import-untyped]
from celery.signals import task_received  # type: ignore[import-untyped]

from tests.acceptance.sqs_celery_app import transport_options
from tests.acceptance.test_sqs_clients import (
    CeleryWorker,
    Sqs,
    aws,
    aws_json,
    unique,
    wait_for,
)
from tests.sqs_support import ACCESS_KEY, SECRET_KEY, sqs_client, sqs_node_on

#: Names the directory the worker's tasks record into (set in its environment only).
RECORDS_ENV = "OKQ_TEST_FIFO_RECORDS"
RAN = "ran"  # one line per task run: "<group> <index> <start> <end> <pid>"
RECEIVED = "received"  # one line per message received: JSON of its SQS attributes


def _append(name: str, line: str) -> None:
    with open(Path(os.environ[RECORDS_ENV]) / name, "a") as out:
        out.write(line + "\n")


def step(group: str, index: int, seconds: float) -> None:
    """A task of ``group``: note when it started and ended, taking ``seconds``."""
    began = time.time()
    time.sleep(seconds)
    _append(RAN, f"{group} {index} {began} {time.time()} {os.getpid()}")


def _note_received(request: Any, **_: Any) -> None:
    """The system attributes kombu fetched with a message, and its task's arguments."""
    if RECORDS_ENV not in os.environ:
        return
    sqs_message = request.message.delivery_info.get("sqs_message") or {}
    _append(RECEIVED, json.dumps({"args": list(request.args or ()),
                                  "attributes": sqs_message.get("Attributes", {})}))


task_received.connect(_note_received, weak=False)


def make_app(broker_url: str | None = None) -> Celery:
    """The app of sqs_celery_app's configuration, with its own task, and kombu asked
    to fetch each message's group and sequence number."""
    app = Celery("okq_sqs_fifo_test", broker=broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={**transport_options(), "fetch_message_attributes": {
            "MessageSystemAttributeNames": ["MessageGroupId", "SequenceNumber"]}},
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )
    app.task(name="okq_fifo.step", shared=False)(step)
    return app


app = make_app()


@pytest.fixture(scope="module", params=["file"])
def sqs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sqs]:
    tmp = tmp_path_factory.mktemp(f"sqs-fifo-clients-{request.param}")
    with sqs_node_on(request, tmp) as node:
        yield Sqs(node.url, ACCESS_KEY, SECRET_KEY, tmp)


# -- the AWS CLI --------------------------------------------------------------------


def test_aws_cli_on_a_fifo_queue(sqs: Sqs) -> None:
    name = unique("cli") + ".fifo"
    url = aws_json(sqs, "create-queue", "--queue-name", name, "--attributes",
                   "FifoQueue=true,ContentBasedDeduplication=false")["QueueUrl"]
    assert url.rstrip("/").endswith(f"/{name}")
    attrs = aws_json(sqs, "get-queue-attributes", "--queue-url", url, "--attribute-names",
                     "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
                     "FifoThroughputLimit")["Attributes"]
    assert attrs == {"FifoQueue": "true", "ContentBasedDeduplication": "false",
                     "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}

    sent = []
    numbered: dict[str, str] = {}  # MessageId -> the SequenceNumber its send answered
    for i in range(2):
        for group in ("g1", "g2"):
            reply = aws_json(sqs, "send-message", "--queue-url", url, "--message-body",
                             f"{group}-{i}", "--message-group-id", group,
                             "--message-deduplication-id", f"{group}-{i}")
            sent.append(reply["MessageId"])
            numbered[reply["MessageId"]] = reply["SequenceNumber"]
    again = aws_json(sqs, "send-message", "--queue-url", url, "--message-body", "dup",
                     "--message-group-id", "g1", "--message-deduplication-id", "g1-0")
    assert again["MessageId"] == sent[0]
    assert again["SequenceNumber"] == numbered[sent[0]]
    done = aws(sqs, "send-message", "--queue-url", url, "--message-body", "x",
               "--message-deduplication-id", "x")
    assert done.returncode != 0 and "MissingParameter" in done.stderr, done.stderr

    got: list[dict[str, Any]] = []
    for _ in range(4):  # a group's next message comes once the one before is deleted
        reply = aws_json(sqs, "receive-message", "--queue-url", url, "--attribute-names",
                         "All", "--max-number-of-messages", "10", "--wait-time-seconds", "1")
        messages = (reply or {}).get("Messages", [])
        if messages:
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                       for n, m in enumerate(messages)]
            deleted = aws_json(sqs, "delete-message-batch", "--queue-url", url,
                               "--entries", json.dumps(entries))
            assert len(deleted["Successful"]) == len(messages)
        got += messages
        if len(got) == len(sent):
            break
    order: dict[str, list[str]] = {}
    numbers: dict[str, list[int]] = {}
    for m in got:
        a = m["Attributes"]
        assert a["MessageDeduplicationId"] == m["Body"]
        assert a["SequenceNumber"] == numbered[m["MessageId"]]  # as its send answered
        assert len(a["SequenceNumber"]) == 20 and a["SequenceNumber"].isdigit()
        order.setdefault(a["MessageGroupId"], []).append(m["Body"])
        numbers.setdefault(a["MessageGroupId"], []).append(int(a["SequenceNumber"]))
    assert order == {g: [f"{g}-{i}" for i in range(2)] for g in ("g1", "g2")}
    assert all(n == sorted(n) for n in numbers.values())
    assert sorted(m["MessageId"] for m in got) == sorted(sent)


# -- a real Celery worker -----------------------------------------------------------


class FifoWorker(CeleryWorker):
    """``celery worker`` (solo pool) on this module's app, consuming one queue."""

    def __init__(self, sqs: Sqs, queue: str, records_dir: Path) -> None:
        super().__init__(sqs, queue, records_dir, app=f"{__name__}:app",
                         records_env=RECORDS_ENV)


def lines(records: Path, name: str) -> list[str]:
    path = records / name
    return path.read_text().splitlines() if path.exists() else []


def test_celery_tasks_of_a_group_run_in_order(sqs: Sqs, tmp_path: Path) -> None:
    """Tasks sent with ``MessageGroupId`` to a ``.fifo`` queue: kombu creates it as a
    FIFO queue; with two workers (late acknowledgement: a task's message is deleted
    once it ran), each group's tasks run in the order they were sent, one at a time
    (the next starts after the one before ended), each once."""
    records = tmp_path / "records"
    records.mkdir()
    sender = make_app(sqs.broker_url())
    queue = unique("celery") + ".fifo"
    groups = ("alpha", "beta", "gamma")
    steps = 4
    workers: list[FifoWorker] = []
    client = sqs_client(sqs.url)
    try:
        task = sender.tasks["okq_fifo.step"]
        for group in groups:  # a group's tasks one after the other: on a standard
            for i in range(steps):  # queue, two workers would run two of them at once
                task.apply_async((group, i, 0.2), queue=queue, MessageGroupId=group)
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
        got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (got["FifoQueue"], got["ApproximateNumberOfMessages"]) == (
            "true", str(steps * len(groups)))
        workers = [FifoWorker(sqs, queue, records) for _ in range(2)]
        wait_for(lambda: len(lines(records, RAN)) >= steps * len(groups), "every task",
                 workers[0], timeout=60)
        ran = [line.split() for line in lines(records, RAN)]
        assert len(ran) == steps * len(groups), ran
        assert len({pid for *_, pid in ran}) == 2, "both workers ran tasks"
        for group in groups:
            mine = [(int(i), float(start), float(end)) for g, i, start, end, _ in ran
                    if g == group]
            assert [i for i, _, _ in mine] == list(range(steps)), ran
            for (_, _, end), (_, start, _) in itertools.pairwise(mine):
                assert start >= end, (group, mine)
        received = [json.loads(line) for line in lines(records, RECEIVED)]
        assert len(received) == steps * len(groups)
        for group in groups:
            attributes = [r["attributes"] for r in received if r["args"][0] == group]
            assert {a["MessageGroupId"] for a in attributes} == {group}
            numbers = sorted(int(a["SequenceNumber"]) for a in attributes)
            assert len(set(numbers)) == steps
        wait_for(lambda: client.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])[
                "Attributes"] == {"ApproximateNumberOfMessages": "0",
                                  "ApproximateNumberOfMessagesNotVisible": "0"},
                 "an empty queue", workers[0], timeout=10)
    finally:
        for worker in workers:
            worker.stop()
        client.close()
        sender.close()
