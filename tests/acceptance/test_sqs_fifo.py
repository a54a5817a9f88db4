"""SQS FIFO queues through an unmodified boto3 client (docs/SQS.md, the CreateQueue,
SendMessage and ReceiveMessage rows and the FIFO attributes; docs/DESIGN.md
"Ordered delivery"): creation and attributes, the refusals, order within a message
group, one receive of a group in flight at a time, deduplication by id and by
content in either scope, dead letters and SequenceNumber.

One real ``okq serve`` node per store (the file store with queues of one partition,
SeaweedFS with queues of three) serves the whole module; every test works on queues
of its own. Visibility timeouts are 1 s where a test waits for one to pass.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.acceptance.test_sqs_boto3 import (
    Client,
    Names,
    arn_of,
    counts,
    error_code,
        make_queue,
    receive,
    receive_all,
)
from tests.nodes import Node
from tests.sqs_support import STORES, sqs_client, sqs_node_on

FIFO_ATTRIBUTES = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
                   "FifoThroughputLimit")
SEQUENCE = re.compile(r"[0-9]{20}")


@pytest.fixture(scope="module", params=STORES)
def node(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One node with the SQS API for the whole module, per store."""
    with sqs_node_on(request, tmp_path_factory.mktemp(f"sqs-fifo-{request.param}")) as n:
        yield n


@pytest.fixture(scope="module")
def client(node: Node) -> Client:
    return sqs_client(node)


@pytest.fixture
def name() -> Names:
    return Names()


def fifo(client: Client, name: Names, suffix: str = "q", **attributes: str) -> str:
    """A new FIFO queue ``<unique>-<suffix>.fifo``: its URL."""
    return make_queue(client, f"{name(suffix)}.fifo", FifoQueue="true", **attributes)


def refused(call: Any, **params: Any) -> str:
    """The error code of a call that must fail."""
    with pytest.raises(ClientError) as err:
        call(**params)
    return error_code(err)


def all_attributes(client: Client, url: str) -> dict[str, str]:
    return dict(client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])


def send(client: Client, url: str, body: str, group: str, dedup: str | None = None) -> str:
    """Send one message of ``group`` (deduplicated by ``dedup``, else by its body or
    not at all); its MessageId."""
    params: dict[str, Any] = {"QueueUrl": url, "MessageBody": body, "MessageGroupId": group}
    if dedup is not None:
        params["MessageDeduplicationId"] = dedup
    reply = client.send_message(**params)
    assert SEQUENCE.fullmatch(reply["SequenceNumber"]), reply
    return str(reply["MessageId"])


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"] for m in messages]


def by_group(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Bodies per MessageGroupId, in the order received."""
    out: dict[str, list[str]] = {}
    for m in messages:
        out.setdefault(m["Attributes"]["MessageGroupId"], []).append(m["Body"])
    return out


def delete(client: Client, url: str, *messages: dict[str, Any]) -> None:
    for m in messages:
        client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def drain(client: Client, url: str, n: int, timeout: float = 10,
          **params: Any) -> list[dict[str, Any]]:
    """Receive and delete until ``n`` messages came: every message, in the order
    received (a group's next messages come only once those before are deleted)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        batch = receive(client, url, MaxNumberOfMessages=10, WaitTimeSeconds=1, **params)
        delete(client, url, *batch)
        got += batch
    return got


# -- queues ---------------------------------------------------------------------------


def test_fifo_queue_attributes(client: Client, name: Names) -> None:
    """A FIFO queue returns FifoQueue and the three FIFO settings with their defaults,
    keeps the ones asked at create and changed later, and checks
    FifoThroughputLimit against DeduplicationScope; a standard queue has none."""
    url = fifo(client, name)
    assert url.endswith(f"/{name()}.fifo")
    got = all_attributes(client, url)
    assert {k: got[k] for k in FIFO_ATTRIBUTES} == {
        "FifoQueue": "true", "ContentBasedDeduplication": "false",
        "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
    assert got["QueueArn"].endswith(f":{name()}.fifo")
    asked = client.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "FifoQueue", "DeduplicationScope"])["Attributes"]
    assert asked == {"FifoQueue": "true", "DeduplicationScope": "queue"}
    # create again with the same attributes: the same queue
    assert fifo(client, name) == url

    chosen = {"ContentBasedDeduplication": "true", "DeduplicationScope": "messageGroup",
              "FifoThroughputLimit": "perMessageGroupId"}
    other = fifo(client, name, "chosen", **chosen)
    assert {k: all_attributes(client, other)[k] for k in chosen} == chosen

    # SetQueueAttributes keeps them and checks the pair
    set_ = client.set_queue_attributes
    set_(QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    assert refused(set_, QueueUrl=url, Attributes={
        "FifoThroughputLimit": "perMessageGroupId"}) == "InvalidAttributeValue"
    set_(QueueUrl=url, Attributes={"FifoThroughputLimit": "perMessageGroupId",
                                   "DeduplicationScope": "messageGroup"})
    assert refused(set_, QueueUrl=url, Attributes={
        "DeduplicationScope": "queue"}) == "InvalidAttributeValue"
    for bad in ({"ContentBasedDeduplication": "yes"}, {"DeduplicationScope": "group"},
                {"FifoThroughputLimit": "perGroup"}):
        assert refused(set_, QueueUrl=url, Attributes=bad) == "InvalidAttributeValue", bad
    # FifoQueue is set at create, never changed, whatever the value
    for value in ("true", "false"):
        assert refused(set_, QueueUrl=url, Attributes={"FifoQueue": value}) \
            == "InvalidAttributeName"
    got = all_attributes(client, url)
    assert {k: got[k] for k in FIFO_ATTRIBUTES} == {
        "FifoQueue": "true", "ContentBasedDeduplication": "true",
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}

    # a standard queue: none of the four, and they are unknown names to it
    standard = make_queue(client, name("std"), FifoQueue="false")
    assert not set(FIFO_ATTRIBUTES) & set(all_attributes(client, standard))
    for attribute, value in (("FifoQueue", "true"), ("FifoQueue", "false"),
                             ("ContentBasedDeduplication", "false"),
                             ("DeduplicationScope", "queue"),
                             ("FifoThroughputLimit", "perQueue")):
        assert refused(set_, QueueUrl=standard, Attributes={attribute: value}) \
            == "InvalidAttributeName", attribute


def test_fifo_create_refusals(client: Client, name: Names) -> None:
    """Names and attributes CreateQueue refuses, and no queue is made by a refusal."""
    create = client.create_queue
    stem = name("")
    cases: list[tuple[str, dict[str, str], str]] = [
        (f"{stem}plain.fifo", {}, "InvalidParameterValue"),
        (f"{stem}false.fifo", {"FifoQueue": "false"}, "InvalidParameterValue"),
        (f"{stem}nosuffix", {"FifoQueue": "true"}, "InvalidParameterValue"),
        (f"{stem}dot.name.fifo", {"FifoQueue": "true"}, "InvalidParameterValue"),
        (".fifo", {"FifoQueue": "true"}, "InvalidParameterValue"),
        (stem + "x" * (76 - len(stem)) + ".fifo", {"FifoQueue": "true"},
         "InvalidParameterValue"),  # 81 characters
        (f"{stem}v.fifo", {"FifoQueue": "yes"}, "InvalidAttributeValue"),
        (f"{stem}v.fifo", {"FifoQueue": "true", "ContentBasedDeduplication": "1"},
         "InvalidAttributeValue"),
        (f"{stem}v.fifo", {"FifoQueue": "true", "DeduplicationScope": "message"},
         "InvalidAttributeValue"),
        (f"{stem}v.fifo", {"FifoQueue": "true", "FifoThroughputLimit": "perGroup"},
         "InvalidAttributeValue"),
        # perMessageGroupId needs DeduplicationScope=messageGroup
        (f"{stem}v.fifo", {"FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"},
         "InvalidAttributeValue"),
        (f"{stem}v.fifo", {"FifoQueue": "true", "DeduplicationScope": "queue",
                           "FifoThroughputLimit": "perMessageGroupId"},
         "InvalidAttributeValue"),
        # the FIFO settings on a standard queue
        (f"{stem}s", {"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),
        (f"{stem}s", {"FifoQueue": "false", "DeduplicationScope": "queue"},
         "InvalidAttributeName"),
        (f"{stem}s", {"FifoThroughputLimit": "perQueue"}, "InvalidAttributeName"),
    ]
    for queue, attributes, code in cases:
        assert refused(create, QueueName=queue, Attributes=attributes) == code, \
            (queue, attributes)
    listed = client.list_queues(QueueNamePrefix=stem).get("QueueUrls", [])
    assert listed == []
    # the longest name: 80 characters, the suffix included
    longest = stem + "x" * (75 - len(stem)) + ".fifo"
    assert len(longest) == 80
    assert make_queue(client, longest, FifoQueue="true").endswith(f"/{longest}")


def test_fifo_create_again_with_other_fifo_settings_is_refused(client: Client,
                                                               name: Names) -> None:
    """CreateQueue of an existing queue is idempotent only when the attributes asked
    agree (docs/SQS.md, CreateQueue); the FIFO settings are attributes like any."""
    fifo(client, name)
    for attributes in ({"ContentBasedDeduplication": "true"},
                       {"DeduplicationScope": "messageGroup"}):
        with pytest.raises(client.exceptions.QueueNameExists):
            client.create_queue(QueueName=f"{name()}.fifo",
                                Attributes={"FifoQueue": "true", **attributes})
    got = all_attributes(client, client.get_queue_url(QueueName=f"{name()}.fifo")["QueueUrl"])
    assert (got["ContentBasedDeduplication"], got["DeduplicationScope"]) == ("false", "queue")


def test_fifo_redrive_policy_names_a_queue_of_its_type(client: Client, name: Names) -> None:
    fifo_dlq, std_dlq = fifo(client, name, "fdlq"), make_queue(client, name("sdlq"))

    def policy(url: str) -> str:
        return json.dumps({"deadLetterTargetArn": arn_of(client, url), "maxReceiveCount": 2})

    create = client.create_queue
    assert refused(create, QueueName=f"{name('f')}.fifo", Attributes={
        "FifoQueue": "true", "RedrivePolicy": policy(std_dlq)}) == "InvalidParameterValue"
    assert refused(create, QueueName=name("s"), Attributes={
        "RedrivePolicy": policy(fifo_dlq)}) == "InvalidParameterValue"
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName=f"{name('f')}.fifo")
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName=name("s"))
    source = fifo(client, name, "src")
    standard = make_queue(client, name("std"))
    set_ = client.set_queue_attributes
    assert refused(set_, QueueUrl=source, Attributes={
        "RedrivePolicy": policy(std_dlq)}) == "InvalidParameterValue"
    assert refused(set_, QueueUrl=standard, Attributes={
        "RedrivePolicy": policy(fifo_dlq)}) == "InvalidParameterValue"
    assert "RedrivePolicy" not in all_attributes(client, source)
    assert "RedrivePolicy" not in all_attributes(client, standard)
    set_(QueueUrl=source, Attributes={"RedrivePolicy": policy(fifo_dlq)})
    set_(QueueUrl=standard, Attributes={"RedrivePolicy": policy(std_dlq)})
    assert json.loads(all_attributes(client, source)["RedrivePolicy"]) == {
        "deadLetterTargetArn": arn_of(client, fifo_dlq), "maxReceiveCount": 2}
    assert client.list_dead_letter_source_queues(QueueUrl=fifo_dlq)["queueUrls"] == [source]


# -- sending --------------------------------------------------------------------------


def test_fifo_send_refusals(client: Client, name: Names) -> None:
    """MessageGroupId is required, and a deduplication id unless the queue deduplicates
    by content; a per-message delay is refused; nothing refused is added. In a batch
    each bad entry is Failed and the others are sent, in order."""
    url = fifo(client, name)
    sm = client.send_message
    assert refused(sm, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d") \
        == "MissingParameter"
    assert refused(sm, QueueUrl=url, MessageBody="x", MessageGroupId="g") \
        == "InvalidParameterValue"  # no dedup id, no ContentBasedDeduplication
    for delay in (0, 5):
        assert refused(sm, QueueUrl=url, MessageBody="x", MessageGroupId="g",
                       MessageDeduplicationId="d", DelaySeconds=delay) \
            == "InvalidParameterValue", delay
    for group in ("has space", "g" * 129, ""):
        assert refused(sm, QueueUrl=url, MessageBody="x", MessageGroupId=group,
                       MessageDeduplicationId="d") == "InvalidParameterValue", group
    for dedup in ("has space", "d" * 129, "é"):
        assert refused(sm, QueueUrl=url, MessageBody="x", MessageGroupId="g",
                       MessageDeduplicationId=dedup) == "InvalidParameterValue", dedup
    assert counts(client, url) == (0, 0, 0)
    # the longest ids and ASCII punctuation are fine
    punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    send(client, url, "edge", punct + "g" * (128 - len(punct)), "d" * 128)

    out = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "one", "MessageBody": "b1", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
        {"Id": "nogroup", "MessageBody": "x", "MessageDeduplicationId": "2"},
        {"Id": "nodedup", "MessageBody": "x", "MessageGroupId": "g"},
        {"Id": "delay", "MessageBody": "x", "MessageGroupId": "g",
         "MessageDeduplicationId": "3", "DelaySeconds": 1},
        {"Id": "two", "MessageBody": "b2", "MessageGroupId": "g", "MessageDeduplicationId": "4"},
    ])
    assert [s["Id"] for s in out["Successful"]] == ["one", "two"]
    one, two = (int(s["SequenceNumber"]) for s in out["Successful"])
    assert one < two  # one group: numbered in order
    failed = {f["Id"]: (f["Code"], f["SenderFault"]) for f in out["Failed"]}
    assert failed == {"nogroup": ("MissingParameter", True),
                      "nodedup": ("InvalidParameterValue", True),
                      "delay": ("InvalidParameterValue", True)}
    got = receive_all(client, url, 3, AttributeNames=["MessageGroupId"])
    assert by_group(got) == {punct + "g" * (128 - len(punct)): ["edge"], "g": ["b1", "b2"]}
    assert receive(client, url, MaxNumberOfMessages=10) == []


def test_fifo_queue_delay_applies(client: Client, name: Names) -> None:
    """The queue's DelaySeconds applies to a FIFO queue's messages."""
    url = fifo(client, name, DelaySeconds="1")
    send(client, url, "late", "g", "d1")
    assert counts(client, url) == (0, 0, 1)
    assert receive(client, url) == []
    (got,) = receive_all(client, url, 1, timeout=5)
    assert got["Body"] == "late"


# -- order ----------------------------------------------------------------------------


def test_fifo_order_across_sends_and_a_batch(client: Client, name: Names) -> None:
    """Each group's messages come in the order their sends were answered, a batch's
    in its order; every message has its MessageGroupId, MessageDeduplicationId and a
    SequenceNumber of 20 digits growing within its group."""
    url = fifo(client, name)
    # on SeaweedFS (3 partitions) these groups are in three partitions
    sent: dict[str, list[str]] = {"a": [], "d": [], "e": []}
    ids: dict[str, str] = {}
    for i in range(3):
        for group in ("a", "d"):
            body = f"{group}{i}"
            ids[body] = send(client, url, body, group, f"s-{body}")
            sent[group].append(body)
    entries = []
    for i in range(3, 6):
        for group in ("e", "d", "a"):
            body = f"{group}{i}"
            entries.append({"Id": body, "MessageBody": body, "MessageGroupId": group,
                            "MessageDeduplicationId": f"s-{body}"})
            sent[group].append(body)
    out = client.send_message_batch(QueueUrl=url, Entries=entries)
    assert out["Failed"] == [] and [s["Id"] for s in out["Successful"]] == \
        [e["Id"] for e in entries]
    ids.update({s["Id"]: s["MessageId"] for s in out["Successful"]})
    send(client, url, "a6", "a", "s-a6")
    sent["a"].append("a6")

    # the first receive: the head of every group, each with what follows it
    first = receive(client, url, MaxNumberOfMessages=10, AttributeNames=["All"])
    for group, got_bodies in by_group(first).items():
        assert got_bodies == sent[group][:len(got_bodies)], (group, got_bodies)
    assert set(by_group(first)) == set(sent)
    assert receive(client, url, MaxNumberOfMessages=10) == []  # every group held
    delete(client, url, *first)
    total = sum(len(b) for b in sent.values())
    got = first + drain(client, url, total - len(first), AttributeNames=["All"])
    assert by_group(got) == sent
    numbers: dict[str, list[int]] = {}
    for m in got:
        a = m["Attributes"]
        assert m["MessageId"] == ids.get(m["Body"], m["MessageId"])
        assert a["MessageDeduplicationId"] == f"s-{m['Body']}"
        assert SEQUENCE.fullmatch(a["SequenceNumber"]), a["SequenceNumber"]
        numbers.setdefault(a["MessageGroupId"], []).append(int(a["SequenceNumber"]))
    for group, seq in numbers.items():
        assert seq == sorted(seq) and len(set(seq)) == len(seq), (group, seq)
    assert len({n for seq in numbers.values() for n in seq}) == len(got)
    assert counts(client, url) == (0, 0, 0)


def test_fifo_one_receive_returns_a_batch_of_a_group_in_order(client: Client,
                                                                name: Names) -> None:
    """A batch's messages of one group come in one receive, in order; only the
    attributes asked for are returned; released, they come back in order."""
    url = fifo(client, name)
    sent = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": f"m{i}", "MessageGroupId": "g",
         "MessageDeduplicationId": f"d{i}"} for i in range(5)])
    got = receive(client, url, MaxNumberOfMessages=10, AttributeNames=["SequenceNumber"])
    assert bodies(got) == [f"m{i}" for i in range(5)]
    assert all(set(m["Attributes"]) == {"SequenceNumber"} for m in got)
    seq = [int(m["Attributes"]["SequenceNumber"]) for m in got]
    assert seq == sorted(seq) and len(set(seq)) == 5
    # what each send answered is what its receive shows
    assert [m["Attributes"]["SequenceNumber"] for m in got] == [
        s["SequenceNumber"] for s in sent["Successful"]]
    assert receive(client, url, MaxNumberOfMessages=10) == []
    out = client.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
        for i, m in enumerate(got)])
    assert out["Failed"] == []
    again = receive(client, url, MaxNumberOfMessages=3,
                    MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"])
    assert [(m["Body"], m["Attributes"]) for m in again] == [
        (f"m{i}", {"MessageGroupId": "g", "MessageDeduplicationId": f"d{i}"})
        for i in range(3)]


def test_fifo_one_receive_of_a_group_in_flight(client: Client, name: Names) -> None:
    """While a message of a group is in flight no later message of that group is
    received, whether sent alone or in a batch; the other group's are; deleting the
    head lets the group go on."""
    url = fifo(client, name)
    send(client, url, "a0", "a", "a0")  # alone; the rest in one batch
    client.send_message_batch(QueueUrl=url, Entries=[  # a and e: two partitions on SeaweedFS
        {"Id": body, "MessageBody": body, "MessageGroupId": body[0],
         "MessageDeduplicationId": body} for body in ("e0", "a1", "e1", "a2", "e2")])
    (first,) = receive(client, url, AttributeNames=["MessageGroupId"])
    (second,) = receive(client, url, AttributeNames=["MessageGroupId"])
    g1, g2 = first["Attributes"]["MessageGroupId"], second["Attributes"]["MessageGroupId"]
    assert {first["Body"], second["Body"]} == {"a0", "e0"} and g1 != g2
    assert receive(client, url, MaxNumberOfMessages=10) == []
    assert counts(client, url)[1] == 2
    delete(client, url, first)
    rest = receive(client, url, MaxNumberOfMessages=10)
    assert bodies(rest) == [f"{g1}1", f"{g1}2"]  # g2 is still held by its head
    assert receive(client, url, MaxNumberOfMessages=10) == []
    delete(client, url, second)
    (nxt,) = receive(client, url)  # one message asked: the next of g2 only
    assert nxt["Body"] == f"{g2}1"
    assert receive(client, url, MaxNumberOfMessages=10) == []
    delete(client, url, nxt, *rest)
    (last,) = receive(client, url, MaxNumberOfMessages=10)
    assert last["Body"] == f"{g2}2"
    delete(client, url, last)
    assert counts(client, url) == (0, 0, 0)


def test_fifo_released_or_expired_head_comes_back_first(client: Client, name: Names) -> None:
    """ChangeMessageVisibility to 0, or a visibility timeout running out, puts the
    message back at the head of its group, received before the ones after it."""
    url = fifo(client, name)
    send(client, url, "m0", "g", "d0")  # alone; the rest after it, in one batch
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": f"m{i}", "MessageGroupId": "g",
         "MessageDeduplicationId": f"d{i}"} for i in (1, 2)])
    (head,) = receive(client, url, VisibilityTimeout=30)
    assert head["Body"] == "m0"
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=head["ReceiptHandle"],
                                     VisibilityTimeout=0)
    (again,) = receive(client, url, VisibilityTimeout=1, AttributeNames=["All"])
    assert (again["Body"], again["Attributes"]["ApproximateReceiveCount"]) == ("m0", "2")
    began = time.monotonic()
    assert receive(client, url, MaxNumberOfMessages=10) == []  # held by m0
    later = receive(client, url, MaxNumberOfMessages=10, WaitTimeSeconds=5,
                    AttributeNames=["ApproximateReceiveCount"])
    assert time.monotonic() - began >= 0.5
    seen = [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in later]
    assert seen == [("m0", "3"), ("m1", "1"), ("m2", "1")][:len(seen)] and seen, seen
    client.delete_message(QueueUrl=url, ReceiptHandle=later[0]["ReceiptHandle"])
    for m in later[1:]:  # the rest goes back, to be received again
        client.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                         VisibilityTimeout=0)
    # a batch's message released comes back before the rest of the batch
    (m1,) = receive(client, url)
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
                                     VisibilityTimeout=0)
    rest = receive(client, url, MaxNumberOfMessages=10, AttributeNames=["ApproximateReceiveCount"])
    assert [m["Body"] for m in rest] == ["m1", "m2"]  # one batch: one receive
    assert int(rest[0]["Attributes"]["ApproximateReceiveCount"]) > \
        int(rest[1]["Attributes"]["ApproximateReceiveCount"])
    delete(client, url, *rest)
    assert counts(client, url) == (0, 0, 0)


def test_fifo_long_poll_answers_when_the_head_is_visible_again(client: Client,
                                                                name: Names) -> None:
    """A long poll on a FIFO queue whose only group is held by a message in flight is
    answered when that message's visibility timeout runs out (docs/SQS.md,
    ReceiveMessage: answered as soon as a message arrives), as a standard queue's is,
    not at the long poll's next idle look (0.25 s doubling to 5 s)."""
    url = fifo(client, name)
    send(client, url, "m0", "g", "d0")
    assert bodies(receive(client, url, VisibilityTimeout=2)) == ["m0"]
    began = time.monotonic()
    (again,) = receive(client, url, WaitTimeSeconds=10)
    took = time.monotonic() - began
    assert again["Body"] == "m0"
    assert 1.5 <= took < 3.0, f"the message visible again after 2 s was received after {took:.2f} s"


def test_standard_queue_group_orders_nothing(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    for body in ("s0", "s1"):
        client.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    got = [receive_all(client, url, 1, AttributeNames=["MessageGroupId"])[0]
           for _ in range(2)]  # one after the other, the first still in flight
    assert sorted(bodies(got)) == ["s0", "s1"]
    assert [m["Attributes"] for m in got] == [{"MessageGroupId": "g"}] * 2


# -- deduplication --------------------------------------------------------------------


def test_fifo_deduplication_by_id(client: Client, name: Names) -> None:
    """A send repeated with the same deduplication id is answered with the first
    MessageId and adds nothing, even with another body, in a batch, or after the
    first was deleted; another id adds a message."""
    url = fifo(client, name)
    sent = client.send_message(QueueUrl=url, MessageBody="first", MessageGroupId="g",
                               MessageDeduplicationId="d1")
    first, first_seq = sent["MessageId"], sent["SequenceNumber"]
    again = client.send_message(QueueUrl=url, MessageBody="first", MessageGroupId="g",
                                MessageDeduplicationId="d1")  # answered as the first
    assert (again["MessageId"], again["SequenceNumber"]) == (first, first_seq)
    assert send(client, url, "another body", "g", "d1") == first
    other = send(client, url, "first", "g", "d2")
    assert other != first
    out = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "again", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
        {"Id": "new", "MessageBody": "third", "MessageGroupId": "g",
         "MessageDeduplicationId": "d3"},
        {"Id": "twice", "MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "d3"},
    ])
    assert out["Failed"] == []
    replies = {s["Id"]: s["MessageId"] for s in out["Successful"]}
    assert replies["again"] == first and replies["twice"] == replies["new"]
    seqs = {s["Id"]: s["SequenceNumber"] for s in out["Successful"]}
    assert seqs["again"] == first_seq and seqs["twice"] == seqs["new"] > first_seq
    got = drain(client, url, 3)
    assert [(m["Body"], m["MessageId"]) for m in got] == [
        ("first", first), ("first", other), ("third", replies["new"])]
    assert send(client, url, "after delete", "g", "d1") == first
    assert counts(client, url) == (0, 0, 0)
    assert receive(client, url) == []


def test_fifo_deduplication_by_content(client: Client, name: Names) -> None:
    """With ContentBasedDeduplication the body's SHA-256 is the id (not the message
    attributes); an explicit MessageDeduplicationId still wins."""
    url = fifo(client, name, ContentBasedDeduplication="true")
    first = send(client, url, "same body", "g")
    assert send(client, url, "same body", "g") == first
    # the body only: message attributes are not part of it
    assert client.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g",
                               MessageAttributes={"k": {"DataType": "String",
                                                        "StringValue": "v"}})[
        "MessageId"] == first
    other = send(client, url, "other body", "g")
    explicit = send(client, url, "same body", "g", "explicit")
    assert len({first, other, explicit}) == 3
    got = drain(client, url, 3)
    assert [(m["Body"], m["MessageId"]) for m in got] == [
        ("same body", first), ("other body", other), ("same body", explicit)]
    assert receive(client, url, MaxNumberOfMessages=10) == []


def test_fifo_deduplication_scope_message_group(client: Client, name: Names) -> None:
    """With DeduplicationScope=messageGroup an id (or a body) deduplicates within its
    group only: the same in two groups makes two messages."""
    url = fifo(client, name, DeduplicationScope="messageGroup",
               ContentBasedDeduplication="true")
    groups = [f"g{i}" for i in range(4)]
    by_id = {g: send(client, url, f"{g} by id", g, "shared-id") for g in groups}
    by_body = {g: send(client, url, "shared body", g) for g in groups}
    assert len(set(by_id.values()) | set(by_body.values())) == 8
    for g in groups:
        assert send(client, url, "any", g, "shared-id") == by_id[g]
        assert send(client, url, "shared body", g) == by_body[g]
    got = drain(client, url, 8, AttributeNames=["MessageGroupId"])
    assert by_group(got) == {g: [f"{g} by id", "shared body"] for g in groups}
    assert receive(client, url, MaxNumberOfMessages=10) == []


def test_fifo_deduplication_scope_queue_spans_groups(client: Client, name: Names) -> None:
    """With DeduplicationScope=queue (the default) a deduplication id, or a body with
    ContentBasedDeduplication, deduplicates across the whole queue: sent again in
    another group it adds nothing (docs/SQS.md: "within its group with
    DeduplicationScope=messageGroup", so queue-wide otherwise, as in SQS)."""
    url = fifo(client, name, ContentBasedDeduplication="true")
    groups = [f"g{i}" for i in range(6)]  # on SeaweedFS in all three partitions
    by_id = [send(client, url, f"{g} by id", g, "shared-id") for g in groups]
    by_body = [send(client, url, "shared body", g) for g in groups]
    assert by_id == by_id[:1] * len(groups), \
        "the same MessageDeduplicationId sent in other groups made new messages"
    assert by_body == by_body[:1] * len(groups), \
        "the same body (ContentBasedDeduplication) sent in other groups made new messages"
    got = drain(client, url, 2)
    assert bodies(got) == ["g0 by id", "shared body"]
    assert receive(client, url, MaxNumberOfMessages=10) == []


# -- dead letters ---------------------------------------------------------------------


def test_fifo_dead_letter_and_the_group_goes_on(client: Client, name: Names) -> None:
    """A FIFO message out of receives goes to its (FIFO) dead-letter queue with its
    group and ids; the message after it in its group is then received."""
    dlq = fifo(client, name, "dlq")
    source = fifo(client, name, "src", VisibilityTimeout="1", RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": arn_of(client, dlq), "maxReceiveCount": 2}))
    poison = send(client, source, "poison", "g", "p")
    send(client, source, "next", "g", "n")
    for attempt in (1, 2):
        (m,) = receive(client, source, AttributeNames=["ApproximateReceiveCount"])
        assert (m["Body"], m["Attributes"]["ApproximateReceiveCount"]) == \
            ("poison", str(attempt))
        assert receive(client, source) == []  # the group is held
        client.change_message_visibility(QueueUrl=source, ReceiptHandle=m["ReceiptHandle"],
                                         VisibilityTimeout=0)
    # a third receive would exceed maxReceiveCount: dead-lettered; the group goes on
    got = receive_all(client, source, 1, AttributeNames=["MessageGroupId"])
    assert [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in got] == [("next", "g")]
    (dead,) = receive_all(client, dlq, 1, AttributeNames=["All"])
    a = dead["Attributes"]
    assert (dead["Body"], dead["MessageId"]) == ("poison", poison)
    assert (a["MessageGroupId"], a["MessageDeduplicationId"]) == ("g", "p")
    assert a["DeadLetterQueueSourceArn"] == arn_of(client, source)
    assert SEQUENCE.fullmatch(a["SequenceNumber"])
    delete(client, source, *got)
    assert counts(client, source) == (0, 0, 0)
