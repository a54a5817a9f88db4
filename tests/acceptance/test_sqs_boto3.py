"""okq's SQS front end driven by an unmodified boto3 client: every action, checked by
its effects (what a later receive, count or listing shows), not only its status.

One real ``okq serve`` node per store (file store and SeaweedFS) serves the whole
module; every test works on queues of its own, named uniquely. Message digests are
checked against this module's own implementation of SQS's documented algorithm,
not okq's. Visibility timeouts are 1-2 s so that the waits stay short.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.nodes import Node
from tests.sqs_support import STORES, sqs_client, sqs_node_on, sqs_query_client

STALE_HEADER = "x-okq-stale-receipt"

Client = Any  # a boto3 SQS client (boto3 has no static types here)


# -- SQS's digests, from AWS's description ------------------------------------------


def ref_md5_body(body: str) -> str:
    """MD5OfMessageBody: the MD5 of the body's UTF-8 bytes, in hex."""
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def ref_md5_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes as AWS documents it: for each attribute in name order,
    the 4-byte big-endian length and UTF-8 bytes of its name, the same for its data
    type, one transport byte (1 for String and Number, 2 for Binary), then the 4-byte
    length and bytes of its value; the MD5 of all that, in hex."""

    def prefixed(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    out = b""
    for name in sorted(attributes):
        value = attributes[name]
        data_type = value["DataType"]
        out += prefixed(name.encode("utf-8")) + prefixed(data_type.encode("utf-8"))
        if data_type.split(".")[0] == "Binary":
            raw = value["BinaryValue"]
            out += b"\x02" + prefixed(raw if isinstance(raw, bytes) else base64.b64decode(raw))
        else:
            out += b"\x01" + prefixed(value["StringValue"].encode("utf-8"))
    return hashlib.md5(out, usedforsecurity=False).hexdigest()


def test_reference_digest_on_bytes_worked_by_hand() -> None:
    """The reference digest itself, on values worked out by hand from the description
    (so that a wrong reference cannot make the tests below agree with a wrong node)."""
    expected = hashlib.md5(
        b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x06String" + b"\x01" + b"\x00\x00\x00\x01x"
        + b"\x00\x00\x00\x01b" + b"\x00\x00\x00\x06Binary" + b"\x02" + b"\x00\x00\x00\x02\x00\xff",
        usedforsecurity=False).hexdigest()
    got = ref_md5_attributes({"b": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
                              "a": {"DataType": "String", "StringValue": "x"}})
    assert got == expected


# -- fixtures and helpers -------------------------------------------------------------


@pytest.fixture(scope="module", params=STORES)
def node(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One node with the SQS API for the whole module, per store."""
    with sqs_node_on(request, tmp_path_factory.mktemp(f"sqs-boto3-{request.param}")) as n:
        yield n


@pytest.fixture(scope="module")
def client(node: Node) -> Client:
    return sqs_client(node)


@pytest.fixture(scope="module")
def query_client(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Client:
    """boto3 speaking SQS's query protocol (forms and XML), as older SDKs do."""
    return sqs_query_client(node, tmp_path_factory.mktemp("sqs-query-model"))


class Names:
    """Unique queue names for one test: ``name("dlq")`` -> ``t<hex>-dlq``, ``name()``
    -> ``t<hex>-q``, ``name("")`` -> the prefix of them all."""

    def __init__(self) -> None:
        self.stem = f"t{uuid.uuid4().hex[:12]}"

    def __call__(self, suffix: str = "q") -> str:
        return f"{self.stem}-{suffix}"


@pytest.fixture
def name() -> Names:
    return Names()


def make_queue(client: Client, queue: str, **attributes: str) -> str:
    return str(client.create_queue(QueueName=queue, Attributes=attributes)["QueueUrl"])


def arn_of(client: Client, url: str) -> str:
    return str(client.get_queue_attributes(QueueUrl=url,
                                           AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def counts(client: Client, url: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed)."""
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    return (int(got["ApproximateNumberOfMessages"]),
            int(got["ApproximateNumberOfMessagesNotVisible"]),
            int(got["ApproximateNumberOfMessagesDelayed"]))


def receive(client: Client, url: str, **params: Any) -> list[dict[str, Any]]:
    params.setdefault("WaitTimeSeconds", 0)
    return list(client.receive_message(QueueUrl=url, **params).get("Messages", []))


def receive_all(client: Client, url: str, n: int, timeout: float = 10,
                **params: Any) -> list[dict[str, Any]]:
    """Receive until ``n`` messages came (SQS may answer a receive with fewer)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += receive(client, url, MaxNumberOfMessages=min(10, n - len(got)),
                       WaitTimeSeconds=1, **params)
    return got


def error_code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def eventually(check: Callable[[], Any], timeout: float = 10, what: str = "") -> Any:
    """``check()``'s first truthy answer, polling; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.1)


# -- queues ---------------------------------------------------------------------------


def test_create_queue_with_every_attribute_and_tags(client: Client,
                                                    name: Names) -> None:
    source, other = name("src"), name("other")
    probe = make_queue(client, name("probe"))
    prefix = arn_of(client, probe).rsplit(":", 1)[0]
    allow = {"redrivePermission": "byQueue", "sourceQueueArns": [f"{prefix}:{source}"]}
    dlq = make_queue(client, name("dlq"), RedriveAllowPolicy=json.dumps(allow))
    dlq_arn = arn_of(client, dlq)
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 4}
    attributes = {"VisibilityTimeout": "7", "MessageRetentionPeriod": "3600",
                  "DelaySeconds": "2", "ReceiveMessageWaitTimeSeconds": "3",
                  "MaximumMessageSize": "2048", "RedrivePolicy": json.dumps(redrive)}
    url = client.create_queue(QueueName=source, Attributes=attributes,
                              tags={"team": "core", "env": "test"})["QueueUrl"]
    assert url.endswith(f"/{source}")
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    for key in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds",
                "ReceiveMessageWaitTimeSeconds", "MaximumMessageSize"):
        assert got[key] == attributes[key], key
    assert json.loads(got["RedrivePolicy"]) == redrive
    assert got["QueueArn"] == f"{prefix}:{source}"
    dlq_got = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])
    assert json.loads(dlq_got["Attributes"]["RedriveAllowPolicy"]) == allow
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core", "env": "test"}
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    # the dead-letter queue's RedriveAllowPolicy refuses a source it does not list
    with pytest.raises(ClientError) as err:
        make_queue(client, other, RedrivePolicy=json.dumps(redrive))
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName=other)


def test_create_queue_again(client: Client, name: Names) -> None:
    queue = name()
    url = make_queue(client, queue, VisibilityTimeout="5", DelaySeconds="1")
    assert make_queue(client, queue, VisibilityTimeout="5", DelaySeconds="1") == url
    assert make_queue(client, queue) == url  # no attributes asked: nothing to disagree
    with pytest.raises(client.exceptions.QueueNameExists):
        make_queue(client, queue, VisibilityTimeout="6", DelaySeconds="1")
    with pytest.raises(client.exceptions.QueueNameExists):
        make_queue(client, queue, MaximumMessageSize="4096")
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    assert got["Attributes"] == {"VisibilityTimeout": "5"}


def test_create_queue_refusals(client: Client, name: Names) -> None:
    for fifo_name, attributes in ((name("plain") + ".fifo", {}),
                                  (name("nosuffix"), {"FifoQueue": "true"}),
                                  ("x" * 77 + ".fifo", {"FifoQueue": "true"})):
        with pytest.raises(ClientError) as err:
            client.create_queue(QueueName=fifo_name, Attributes=attributes)
        assert error_code(err) == "InvalidParameterValue", fifo_name
    for bad in ("has space", "slash/name", "x" * 81, "dot.name"):
        with pytest.raises(ClientError) as err:
            client.create_queue(QueueName=bad)
        assert error_code(err) == "InvalidParameterValue", bad
    urls = client.list_queues(QueueNamePrefix=name("")).get("QueueUrls", [])
    assert urls == []


def test_get_queue_url(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    assert client.get_queue_url(QueueName=name())["QueueUrl"] == url
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName=name("missing"))


def test_list_queues_by_prefix_and_pages(client: Client, name: Names) -> None:
    urls = sorted(make_queue(client, name(f"page{i}")) for i in range(5))
    make_queue(client, name("other"))
    listed = client.list_queues(QueueNamePrefix=name("page"))
    assert sorted(listed["QueueUrls"]) == urls and "NextToken" not in listed
    pages: list[list[str]] = []
    params: dict[str, Any] = {"QueueNamePrefix": name("page"), "MaxResults": 2}
    while True:
        page = client.list_queues(**params)
        pages.append(page.get("QueueUrls", []))
        if "NextToken" not in page:
            break
        params["NextToken"] = page["NextToken"]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(u for p in pages for u in p) == urls
    assert len(client.list_queues(QueueNamePrefix=name(""))["QueueUrls"]) == 6


def test_delete_queue(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="doomed")
    client.delete_queue(QueueUrl=url)
    calls: list[Callable[[], Any]] = [
        lambda: client.get_queue_url(QueueName=name()),
        lambda: client.send_message(QueueUrl=url, MessageBody="x"),
        lambda: client.receive_message(QueueUrl=url),
        lambda: client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
        lambda: client.purge_queue(QueueUrl=url),
        lambda: client.delete_queue(QueueUrl=url)]
    for call in calls:
        with pytest.raises(client.exceptions.QueueDoesNotExist):
            call()
    assert client.list_queues(QueueNamePrefix=name()).get("QueueUrls", []) == []


def test_queue_attributes_counts_and_single_names(client: Client,
                                                  name: Names) -> None:
    url = make_queue(client, name())
    began = time.time()
    assert counts(client, url) == (0, 0, 0)
    for body in ("a", "b", "c"):
        client.send_message(QueueUrl=url, MessageBody=body)
    client.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    assert counts(client, url) == (3, 0, 1)
    got = receive_all(client, url, 2, VisibilityTimeout=60)
    assert len(got) == 2
    assert counts(client, url) == (1, 2, 1)
    every = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert every["QueueArn"].startswith("arn:aws:sqs:us-east-1:")
    assert every["QueueArn"].endswith(f":{name()}")
    assert abs(int(every["CreatedTimestamp"]) - began) < 30
    for key, value in every.items():  # each alone answers just itself, with the same value
        alone = client.get_queue_attributes(QueueUrl=url, AttributeNames=[key])["Attributes"]
        assert alone == {key: value}
    with pytest.raises(client.exceptions.InvalidAttributeName):
        client.get_queue_attributes(QueueUrl=url, AttributeNames=["NoSuchAttribute"])


def test_set_queue_attributes(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    dlq = make_queue(client, name("dlq"))
    redrive = {"deadLetterTargetArn": arn_of(client, dlq), "maxReceiveCount": 3}
    client.set_queue_attributes(QueueUrl=url, Attributes={
        "VisibilityTimeout": "1", "DelaySeconds": "0", "MaximumMessageSize": "4096",
        "MessageRetentionPeriod": "120", "RedrivePolicy": json.dumps(redrive)})
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (got["VisibilityTimeout"], got["MaximumMessageSize"],
            got["MessageRetentionPeriod"]) == ("1", "4096", "120")
    assert json.loads(got["RedrivePolicy"]) == redrive
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    # the new visibility timeout is the receive's default: the message is back after 1 s
    client.send_message(QueueUrl=url, MessageBody="x")
    (first,) = receive(client, url)
    assert receive(client, url) == []
    (again,) = receive(client, url, WaitTimeSeconds=5)
    assert again["MessageId"] == first["MessageId"]
    client.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in got
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == []
    with pytest.raises(client.exceptions.InvalidAttributeValue):
        client.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "-1"})


def test_queue_defaults_take_effect(client: Client, name: Names) -> None:
    url = make_queue(client, name(), DelaySeconds="1", ReceiveMessageWaitTimeSeconds="1",
                     MaximumMessageSize="1024")
    began = time.monotonic()
    assert client.receive_message(QueueUrl=url).get("Messages") is None
    waited = time.monotonic() - began
    assert 0.9 <= waited < 3, f"an empty receive waited {waited:.2f}s, not the queue's 1 s"
    client.send_message(QueueUrl=url, MessageBody="default delay")
    assert receive(client, url) == [] and counts(client, url) == (0, 0, 1)
    client.send_message(QueueUrl=url, MessageBody="no delay", DelaySeconds=0)
    assert [m["Body"] for m in receive(client, url)] == ["no delay"]
    assert [m["Body"] for m in receive(client, url, WaitTimeSeconds=5)] == ["default delay"]
    client.send_message(QueueUrl=url, MessageBody="x" * 1024)
    with pytest.raises(ClientError) as err:
        client.send_message(QueueUrl=url, MessageBody="x" * 1025)
    assert error_code(err) == "InvalidParameterValue"


def test_purge_queue(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}"} for i in range(4)])
    client.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=60)
    assert len(receive(client, url, VisibilityTimeout=60)) == 1
    client.purge_queue(QueueUrl=url)
    assert counts(client, url) == (0, 0, 0)
    assert receive(client, url, WaitTimeSeconds=1, MaxNumberOfMessages=10) == []
    client.send_message(QueueUrl=url, MessageBody="after")
    with pytest.raises(client.exceptions.PurgeQueueInProgress):  # one purge in 60 s
        client.purge_queue(QueueUrl=url)
    assert [m["Body"] for m in receive(client, url)] == ["after"]


def test_receive_with_visibility_timeout_zero(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="peek")
    (first,) = receive(client, url, VisibilityTimeout=0)
    (again,) = receive(client, url, AttributeNames=["ApproximateReceiveCount"])
    assert again["MessageId"] == first["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


# -- sending --------------------------------------------------------------------------

ATTRIBUTES: dict[str, dict[str, Any]] = {
    "text": {"DataType": "String", "StringValue": "héllo wörld"},
    "count": {"DataType": "Number", "StringValue": "-12.50"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
    "kind": {"DataType": "String.custom", "StringValue": "my-kind"},
    "big": {"DataType": "Number.int", "StringValue": "123456789012345678901234567890"},
    "packed": {"DataType": "Binary.gz", "BinaryValue": b"\x1f\x8b\x08"},
    "foo.a": {"DataType": "String", "StringValue": "A"},
    "foo.b": {"DataType": "String", "StringValue": "B"},
    "food": {"DataType": "String", "StringValue": "not foo.*"},
}
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


def test_send_message_digests_and_attributes(client: Client,
                                             name: Names) -> None:
    url = make_queue(client, name())
    body = "body ünïcødé ✓ \U0001f600"
    sent = client.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=ATTRIBUTES,
                               MessageSystemAttributes={"AWSTraceHeader": {
                                   "DataType": "String", "StringValue": TRACE}})
    assert sent["MD5OfMessageBody"] == ref_md5_body(body)
    assert sent["MD5OfMessageAttributes"] == ref_md5_attributes(ATTRIBUTES)
    assert sent["MD5OfMessageSystemAttributes"] == ref_md5_attributes(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}})
    (got,) = receive(client, url, MessageAttributeNames=["All"], AttributeNames=["All"],
                     VisibilityTimeout=0)
    assert (got["MessageId"], got["Body"]) == (sent["MessageId"], body)
    assert got["MD5OfBody"] == ref_md5_body(body)
    assert got["MessageAttributes"] == ATTRIBUTES
    assert got["MD5OfMessageAttributes"] == ref_md5_attributes(ATTRIBUTES)
    assert got["Attributes"]["AWSTraceHeader"] == TRACE
    plain = client.send_message(QueueUrl=url, MessageBody="plain")
    assert "MD5OfMessageAttributes" not in plain and "MD5OfMessageSystemAttributes" not in plain


@pytest.mark.parametrize("wanted, names", [
    (["All"], sorted(ATTRIBUTES)),
    ([".*"], sorted(ATTRIBUTES)),
    (["blob"], ["blob"]),
    (["foo.*"], ["foo.a", "foo.b"]),
    (["kind", "foo.b", "absent"], ["foo.b", "kind"]),
])
def test_receive_selects_message_attributes(client: Client, name: Names,
                                            wanted: list[str], names: list[str]) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=ATTRIBUTES)
    (got,) = receive(client, url, MessageAttributeNames=wanted)
    subset = {k: ATTRIBUTES[k] for k in names}
    assert got["MessageAttributes"] == subset
    assert got["MD5OfMessageAttributes"] == ref_md5_attributes(subset)


def test_receive_without_attribute_names_returns_none(client: Client,
                                                      name: Names) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=ATTRIBUTES)
    (got,) = receive(client, url)
    assert "MessageAttributes" not in got and "MD5OfMessageAttributes" not in got
    assert "Attributes" not in got


def test_delayed_message(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    sent_at = time.monotonic()
    client.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=2)
    assert receive(client, url) == []
    assert counts(client, url) == (0, 0, 1)
    got = receive(client, url, WaitTimeSeconds=5)
    took = time.monotonic() - sent_at
    assert [m["Body"] for m in got] == ["later"], f"nothing after {took:.2f}s"
    assert 1.9 <= took < 4, f"a 2 s delay ended after {took:.2f}s"


def test_send_message_batch_delays(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    out = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "now", "MessageBody": "now"},
        {"Id": "later", "MessageBody": "later", "DelaySeconds": 60}])
    assert sorted(s["Id"] for s in out["Successful"]) == ["later", "now"]
    assert counts(client, url) == (1, 0, 1)
    assert [m["Body"] for m in receive(client, url, MaxNumberOfMessages=10)] == ["now"]


def test_deduplication_id(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    first = client.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="d-1")
    second = client.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="d-1")
    other = client.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="d-2")
    assert second["MessageId"] == first["MessageId"] != other["MessageId"]
    got = receive_all(client, url, 2, VisibilityTimeout=60)
    assert sorted(m["MessageId"] for m in got) == sorted([first["MessageId"],
                                                          other["MessageId"]])
    assert receive(client, url, WaitTimeSeconds=1) == []
    assert counts(client, url) == (0, 2, 0)


def test_send_message_batch_with_bad_entries(client: Client,
                                             name: Names) -> None:
    url = make_queue(client, name())
    good_attrs = {"n": {"DataType": "Number", "StringValue": "42"}}
    out = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "one", "MessageBody": "first", "MessageAttributes": good_attrs},
        {"Id": "empty", "MessageBody": ""},
        {"Id": "two", "MessageBody": "second"},
        {"Id": "nan", "MessageBody": "x", "MessageAttributes": {
            "n": {"DataType": "Number", "StringValue": "not a number"}}},
        {"Id": "badtype", "MessageBody": "x", "MessageAttributes": {
            "n": {"DataType": "Text", "StringValue": "v"}}},
    ])
    ok = {s["Id"]: s for s in out["Successful"]}
    assert sorted(ok) == ["one", "two"]
    assert ok["one"]["MD5OfMessageBody"] == ref_md5_body("first")
    assert ok["one"]["MD5OfMessageAttributes"] == ref_md5_attributes(good_attrs)
    assert ok["two"]["MD5OfMessageBody"] == ref_md5_body("second")
    failed = {f["Id"]: f for f in out["Failed"]}
    assert sorted(failed) == ["badtype", "empty", "nan"]
    assert all(f["SenderFault"] is True and f["Code"] for f in failed.values())
    got = receive_all(client, url, 2, VisibilityTimeout=60)
    assert receive(client, url, WaitTimeSeconds=1) == []
    assert sorted(m["Body"] for m in got) == ["first", "second"]
    assert sorted(m["MessageId"] for m in got) == sorted(s["MessageId"] for s in ok.values())


# -- receiving ------------------------------------------------------------------------


def test_max_number_of_messages(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)])
    assert len(receive(client, url, VisibilityTimeout=60)) == 1  # the default is 1
    three = receive(client, url, MaxNumberOfMessages=3, VisibilityTimeout=60)
    assert len(three) == 3
    rest = receive(client, url, MaxNumberOfMessages=10, VisibilityTimeout=60)
    assert len(rest) == 1
    assert len({m["MessageId"] for m in three + rest}) == 4
    with pytest.raises(ClientError) as err:
        receive(client, url, MaxNumberOfMessages=11)
    assert error_code(err) == "InvalidParameterValue"


def test_long_poll_returns_when_a_message_is_sent(client: Client, node: Node,
                                                  name: Names) -> None:
    url = make_queue(client, name())
    sender = sqs_client(node)

    def send_later() -> None:
        time.sleep(0.5)
        sender.send_message(QueueUrl=url, MessageBody="ping")

    thread = threading.Thread(target=send_later)
    began = time.monotonic()
    thread.start()
    got = receive(client, url, WaitTimeSeconds=5)
    took = time.monotonic() - began
    thread.join()
    assert [m["Body"] for m in got] == ["ping"]
    assert 0.4 <= took < 2.5, f"a long poll answered {took:.2f}s after it began"


def test_long_poll_on_an_empty_queue(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    began = time.monotonic()
    answer = client.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    took = time.monotonic() - began
    assert "Messages" not in answer
    assert 0.9 <= took < 3, f"WaitTimeSeconds=1 answered after {took:.2f}s"


def test_visibility_timeout_and_system_attributes(client: Client,
                                                  name: Names) -> None:
    url = make_queue(client, name())
    before = int(time.time() * 1000)
    sent = client.send_message(QueueUrl=url, MessageBody="again")
    (first,) = receive(client, url, VisibilityTimeout=1, AttributeNames=["All"])
    a1 = first["Attributes"]
    assert a1["ApproximateReceiveCount"] == "1"
    assert before - 1000 <= int(a1["SentTimestamp"]) <= int(a1["ApproximateFirstReceiveTimestamp"])
    assert int(a1["ApproximateFirstReceiveTimestamp"]) <= int(time.time() * 1000) + 1000
    assert a1["SenderId"]
    assert "SequenceNumber" not in a1  # a FIFO queue's attribute only, as on SQS
    assert receive(client, url) == []  # invisible for its timeout
    (second,) = receive(client, url, WaitTimeSeconds=5, MessageSystemAttributeNames=["All"])
    a2 = second["Attributes"]
    assert second["MessageId"] == first["MessageId"] == sent["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    assert a2["ApproximateReceiveCount"] == "2"
    assert a2["SentTimestamp"] == a1["SentTimestamp"]
    assert a2["ApproximateFirstReceiveTimestamp"] == a1["ApproximateFirstReceiveTimestamp"]
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"],
                                     VisibilityTimeout=0)
    (third,) = receive(client, url, AttributeNames=["ApproximateReceiveCount"],
                       MessageSystemAttributeNames=["SentTimestamp"])
    assert third["Attributes"] == {"ApproximateReceiveCount": "3",
                                   "SentTimestamp": a1["SentTimestamp"]}


@pytest.mark.parametrize("attribute", ["ApproximateReceiveCount", "SentTimestamp",
                                       "ApproximateFirstReceiveTimestamp", "SenderId",
                                       "AWSTraceHeader"])
def test_single_system_attribute(client: Client, name: Names,
                                 attribute: str) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="m", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}})
    (got,) = receive(client, url, MessageSystemAttributeNames=[attribute])
    assert list(got["Attributes"]) == [attribute]
    if attribute == "AWSTraceHeader":
        assert got["Attributes"][attribute] == TRACE


# -- deleting -------------------------------------------------------------------------


def test_delete_message_and_batch(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}"} for i in range(4)])
    got = receive_all(client, url, 4, VisibilityTimeout=1)
    assert len(got) == 4
    client.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    out = client.delete_message_batch(QueueUrl=url, Entries=[
        *({"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[1:])),
        {"Id": "junk", "ReceiptHandle": "not-a-receipt-handle"}])
    assert sorted(s["Id"] for s in out["Successful"]) == ["e0", "e1", "e2"]
    (junk,) = out["Failed"]
    assert (junk["Id"], junk["Code"], junk["SenderFault"]) == \
        ("junk", "ReceiptHandleIsInvalid", True)
    assert counts(client, url) == (0, 0, 0)
    # past their visibility timeout, none comes back
    assert receive(client, url, WaitTimeSeconds=2, MaxNumberOfMessages=10) == []


def test_bad_receipt_handles(client: Client, name: Names) -> None:
    a, b = make_queue(client, name("a")), make_queue(client, name("b"))
    client.send_message(QueueUrl=a, MessageBody="in a")
    (msg,) = receive(client, a, VisibilityTimeout=30)
    handle = msg["ReceiptHandle"]
    forged = handle[:-4] + ("AAAA" if handle[-4:] != "AAAA" else "BBBB")
    for bad, queue in (("garbage", a), (forged, a), (handle, b)):
        with pytest.raises(client.exceptions.ReceiptHandleIsInvalid):
            client.delete_message(QueueUrl=queue, ReceiptHandle=bad)
        with pytest.raises(client.exceptions.ReceiptHandleIsInvalid):
            client.change_message_visibility(QueueUrl=queue, ReceiptHandle=bad,
                                             VisibilityTimeout=0)
    assert counts(client, a) == (0, 1, 0)  # none of that touched it
    client.delete_message(QueueUrl=a, ReceiptHandle=handle)
    assert counts(client, a) == (0, 0, 0)


def test_stale_delete_succeeds_without_deleting(client: Client,
                                                name: Names) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="contested")
    (first,) = receive(client, url, VisibilityTimeout=1)
    (second,) = receive(client, url, WaitTimeSeconds=5, VisibilityTimeout=1,
                        AttributeNames=["ApproximateReceiveCount"])
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    stale = client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert stale["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert stale["ResponseMetadata"]["HTTPHeaders"].get(STALE_HEADER) == "1"
    assert counts(client, url) == (0, 1, 0)  # still there, with the newer receiver
    fresh = client.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert STALE_HEADER not in fresh["ResponseMetadata"]["HTTPHeaders"]
    assert counts(client, url) == (0, 0, 0)
    assert receive(client, url, WaitTimeSeconds=2) == []  # past the second timeout too


# -- visibility -----------------------------------------------------------------------


def test_change_message_visibility(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message(QueueUrl=url, MessageBody="slow")
    (first,) = receive(client, url, VisibilityTimeout=1)
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                     VisibilityTimeout=3)
    time.sleep(1.5)
    assert receive(client, url) == []  # extended past its first timeout
    assert counts(client, url) == (0, 1, 0)
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                     VisibilityTimeout=0)
    (again,) = receive(client, url, VisibilityTimeout=30,
                       AttributeNames=["ApproximateReceiveCount"])
    assert again["MessageId"] == first["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(client.exceptions.MessageNotInflight):
        client.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                         VisibilityTimeout=10)
    client.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    with pytest.raises(ClientError) as gone:  # deleted: SQS's answer for a message gone
        client.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                                         VisibilityTimeout=10)
    assert error_code(gone) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        client.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                                         VisibilityTimeout=43_201)
    assert error_code(err) == "InvalidParameterValue"


def test_change_message_visibility_batch(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": b, "MessageBody": b} for b in ("back", "kept")])
    got = {m["Body"]: m for m in receive_all(client, url, 2, VisibilityTimeout=30)}
    assert sorted(got) == ["back", "kept"]
    out = client.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "back", "ReceiptHandle": got["back"]["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "kept", "ReceiptHandle": got["kept"]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "junk", "ReceiptHandle": "junk-handle", "VisibilityTimeout": 0}])
    assert sorted(s["Id"] for s in out["Successful"]) == ["back", "kept"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in out["Failed"]] == \
        [("junk", "ReceiptHandleIsInvalid", True)]
    assert [m["Body"] for m in receive(client, url, MaxNumberOfMessages=10,
                                       VisibilityTimeout=30)] == ["back"]
    # a handle whose message was received again since is not in flight any more
    out = client.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "stale", "ReceiptHandle": got["back"]["ReceiptHandle"], "VisibilityTimeout": 5}])
    (stale,) = out["Failed"]
    assert stale["Id"] == "stale" and stale["SenderFault"] is True
    # the code as SQS's query protocol spells it, with or without its prefix
    assert stale["Code"] in ("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight")


# -- dead letters ---------------------------------------------------------------------


def redrive_pair(client: Client, name: Names, max_receives: int
                 ) -> tuple[str, str, str]:
    """A dead-letter queue and a source (1 s visibility) sending to it: URLs and the
    dead-letter queue's ARN."""
    dlq = make_queue(client, name("dlq"))
    dlq_arn = arn_of(client, dlq)
    source = make_queue(client, name("src"), VisibilityTimeout="1", RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receives}))
    return source, dlq, dlq_arn


def dead_letter(client: Client, source: str, dlq: str, bodies: list[str]) -> None:
    """Send ``bodies`` to a source whose maxReceiveCount is 1, receive them once, give
    them back, and wait until they are all in the dead-letter queue."""
    client.send_message_batch(QueueUrl=source, Entries=[
        {"Id": f"m{i}", "MessageBody": b, "MessageAttributes": {
            "origin": {"DataType": "String", "StringValue": b}}} for i, b in enumerate(bodies)])
    for msg in receive_all(client, source, len(bodies)):
        client.change_message_visibility(QueueUrl=source, ReceiptHandle=msg["ReceiptHandle"],
                                         VisibilityTimeout=0)
    eventually(lambda: receive(client, source) == [] and counts(client, dlq)[0] == len(bodies),
               what="the dead letters")


def test_redrive_to_dead_letter_queue(client: Client, name: Names) -> None:
    source, dlq, _ = redrive_pair(client, name, 2)
    client.send_message(QueueUrl=source, MessageBody="poison")
    (one,) = receive(client, source, AttributeNames=["ApproximateReceiveCount"])
    (two,) = receive(client, source, WaitTimeSeconds=5,
                     AttributeNames=["ApproximateReceiveCount"])
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in (one, two)] == ["1", "2"]
    assert receive(client, source, WaitTimeSeconds=2) == []  # no third receive: dead
    (dead,) = receive_all(client, dlq, 1, timeout=5, AttributeNames=["All"],
                          VisibilityTimeout=30)
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"] == arn_of(client, source)
    assert counts(client, source) == (0, 0, 0)
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]


def test_dead_letter_keeps_message_id_and_sent_timestamp(client: Client,
                                                         name: Names) -> None:
    """SQS moves a message to its dead-letter queue with its original message id, and
    (standard queues) its enqueue timestamp unchanged."""
    source, dlq, _ = redrive_pair(client, name, 1)
    sent = client.send_message(QueueUrl=source, MessageBody="poison")
    (first,) = receive(client, source, AttributeNames=["SentTimestamp"])
    client.change_message_visibility(QueueUrl=source, ReceiptHandle=first["ReceiptHandle"],
                                     VisibilityTimeout=0)
    (dead,) = receive_all(client, dlq, 1, timeout=5, AttributeNames=["SentTimestamp"])
    assert dead["MessageId"] == sent["MessageId"]
    assert dead["Attributes"]["SentTimestamp"] == first["Attributes"]["SentTimestamp"]


def test_dead_letters_keep_message_attributes(client: Client, name: Names) -> None:
    """SQS keeps a message's attributes when it moves it to the dead-letter queue, and
    when a move task moves it back."""
    source, dlq, dlq_arn = redrive_pair(client, name, 1)
    dead_letter(client, source, dlq, ["kept"])
    want = {"origin": {"DataType": "String", "StringValue": "kept"}}
    (dead,) = receive(client, dlq, MessageAttributeNames=["All"], VisibilityTimeout=30)
    client.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"],
                                     VisibilityTimeout=0)  # back, for the move task
    assert dead.get("MessageAttributes") == want
    assert dead["MD5OfMessageAttributes"] == ref_md5_attributes(want)
    handle = client.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert wait_for_task(client, dlq_arn, handle)["Status"] == "COMPLETED"
    (back,) = receive_all(client, source, 1, MessageAttributeNames=["All"])
    assert back.get("MessageAttributes") == want


def test_native_headers_are_string_message_attributes(client: Client, node: Node,
                                                       name: Names) -> None:
    """One thing, two names: the native API's headers are received over SQS as String
    message attributes, and a message's String attributes are a native lease's headers
    (Number, Binary and custom types stay typed, over SQS only)."""
    from okq.client import SyncClient

    url = make_queue(client, name())
    with SyncClient(node.url) as native:
        native.produce(name(), [{"payload": "native", "headers": {"a": "1", "foo.b": "B"}}])
        (got,) = receive(client, url, MessageAttributeNames=["All"], VisibilityTimeout=0)
        want = {"a": {"DataType": "String", "StringValue": "1"},
                "foo.b": {"DataType": "String", "StringValue": "B"}}
        assert got["Body"] == "native" and got["MessageAttributes"] == want
        assert got["MD5OfMessageAttributes"] == ref_md5_attributes(want)
        (some,) = receive(client, url, MessageAttributeNames=["foo.*"], VisibilityTimeout=0)
        assert some["MessageAttributes"] == {"foo.b": want["foo.b"]}
        client.delete_message(QueueUrl=url, ReceiptHandle=some["ReceiptHandle"])

        client.send_message(QueueUrl=url, MessageBody="over sqs", MessageAttributes=ATTRIBUTES)
        (leased,) = native.lease(name())
        assert leased.utf8 == "over sqs"
        assert leased.headers == {"text": "héllo wörld", "foo.a": "A", "foo.b": "B",
                                  "food": "not foo.*"}
        assert set(leased.meta["sqs"]["attrs"]) == set(ATTRIBUTES)  # typed, as kept
        native.retry(name(), leased.token, count_attempt=False)
    (again,) = receive(client, url, MessageAttributeNames=["All"])
    assert again["MessageAttributes"] == ATTRIBUTES  # unchanged by the native lease


def test_list_dead_letter_source_queues_pages(client: Client, name: Names) -> None:
    dlq = make_queue(client, name("dlq"))
    policy = json.dumps({"deadLetterTargetArn": arn_of(client, dlq), "maxReceiveCount": 5})
    sources = sorted(make_queue(client, name(f"s{i}"), RedrivePolicy=policy) for i in range(3))
    make_queue(client, name("unrelated"))
    assert sorted(client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]) == sources
    first = client.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=2)
    rest = client.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=2,
                                                 NextToken=first["NextToken"])
    assert len(first["queueUrls"]) == 2 and "NextToken" not in rest
    assert sorted(first["queueUrls"] + rest["queueUrls"]) == sources


def wait_for_task(client: Client, source_arn: str, handle: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        tasks = client.list_message_move_tasks(SourceArn=source_arn, MaxResults=10)["Results"]
        task = next(t for t in tasks if t["TaskHandle"] == handle)
        return task if task["Status"] != "RUNNING" else None

    return dict(eventually(done, what="the message move task"))


def test_message_move_tasks(client: Client, name: Names) -> None:
    source, dlq, dlq_arn = redrive_pair(client, name, 1)
    dead_letter(client, source, dlq, ["d1", "d2"])
    handle = client.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    task = wait_for_task(client, dlq_arn, handle)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 2)
    assert task["SourceArn"] == dlq_arn
    back = receive_all(client, source, 2, VisibilityTimeout=30)
    assert sorted(m["Body"] for m in back) == ["d1", "d2"]
    assert counts(client, dlq) == (0, 0, 0)
    # to a third queue instead of the source
    third = make_queue(client, name("third"))
    third_arn = arn_of(client, third)
    dead_letter(client, source, dlq, ["d3"])
    handle2 = client.start_message_move_task(SourceArn=dlq_arn, DestinationArn=third_arn)[
        "TaskHandle"]
    task2 = wait_for_task(client, dlq_arn, handle2)
    assert (task2["Status"], task2["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    assert task2["DestinationArn"] == third_arn
    assert [m["Body"] for m in receive_all(client, third, 1)] == ["d3"]
    assert counts(client, dlq) == (0, 0, 0) and receive(client, source) == []
    latest = client.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert [t["TaskHandle"] for t in latest] == [handle2]


def test_cancel_unknown_message_move_task(client: Client) -> None:
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.cancel_message_move_task(TaskHandle=base64.b64encode(b"no such task").decode())


# -- tags and permissions -------------------------------------------------------------


def test_tags(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    assert "Tags" not in client.list_queue_tags(QueueUrl=url)
    client.tag_queue(QueueUrl=url, Tags={"a": "1", "b": "2"})
    client.tag_queue(QueueUrl=url, Tags={"b": "two", "c": ""})
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"a": "1", "b": "two", "c": ""}
    client.untag_queue(QueueUrl=url, TagKeys=["a", "c", "never-set"])
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"b": "two"}
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.tag_queue(QueueUrl=url + "-missing", Tags={"a": "1"})


def test_add_permission_is_unsupported(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    with pytest.raises(client.exceptions.UnsupportedOperation):
        client.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["123456789012"],
                              Actions=["SendMessage"])



# -- the query protocol through boto3 -------------------------------------------------


def test_query_protocol_empty_results(client: Client, query_client: Client,
                                      name: Names) -> None:
    """Replies whose result has no members still carry their ``<Action>Result``
    element: botocore's query parser needs it (a KeyError otherwise)."""
    url = make_queue(query_client, name())
    assert query_client.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages") is None
    assert query_client.list_queues(QueueNamePrefix=name("none")).get("QueueUrls") is None
    assert query_client.list_queue_tags(QueueUrl=url).get("Tags") is None
    assert query_client.list_dead_letter_source_queues(QueueUrl=url).get("queueUrls") is None
    assert query_client.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "RedrivePolicy"]).get("Attributes") is None
    assert query_client.list_queues(QueueNamePrefix=name(""))["QueueUrls"] == [url]
    client.send_message(QueueUrl=url, MessageBody="one")
    (got,) = receive_all(query_client, url, 1)
    assert got["Body"] == "one"


#: Bodies whose characters XML normalises when written raw (CR and CR LF become LF),
#: beside tabs and line feeds, which must come back as sent too.
LINE_ENDS = ["cr\rinside", "crlf\r\nend", "\r", "\r\r\n\n", "tab\there", "lf\nend",
             " \t\r\n edges \n\r\t "]


def test_line_ends_round_trip_over_the_query_protocol(query_client: Client,
                                                       name: Names) -> None:
    """Bodies and message attribute values keep every CR, LF and tab, and their
    digests match, through botocore's query protocol (form in, XML out)."""
    url = make_queue(query_client, name())
    for i, body in enumerate(LINE_ENDS):
        attributes = {"text": {"DataType": "String", "StringValue": body},
                      "n": {"DataType": "Number", "StringValue": str(i)}}
        sent = query_client.send_message(QueueUrl=url, MessageBody=body,
                                         MessageAttributes=attributes)
        assert sent["MD5OfMessageBody"] == ref_md5_body(body)
        assert sent["MD5OfMessageAttributes"] == ref_md5_attributes(attributes)
    got = receive_all(query_client, url, len(LINE_ENDS), MessageAttributeNames=["All"])
    assert sorted(m["Body"] for m in got) == sorted(LINE_ENDS)
    for message in got:
        assert message["MD5OfBody"] == ref_md5_body(message["Body"])
        attributes = message["MessageAttributes"]
        assert attributes["text"]["StringValue"] == message["Body"]
        assert message["MD5OfMessageAttributes"] == ref_md5_attributes(attributes)


# -- message ids ------------------------------------------------------------------------

UUID_SHAPE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_message_ids_serve_as_batch_entry_ids(client: Client, query_client: Client,
                                             name: Names) -> None:
    """MessageIds are UUID-shaped, unique and the same on every receive, so the
    common ``Id=MessageId`` works in both batch actions, in both protocols."""
    url = make_queue(client, name())
    sent = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(6)])["Successful"]
    one = client.send_message(QueueUrl=url, MessageBody="body 6")["MessageId"]
    ids = sorted([s["MessageId"] for s in sent] + [one])
    assert len(set(ids)) == 7 and all(UUID_SHAPE.fullmatch(i) for i in ids), ids
    first = receive_all(client, url, 7, VisibilityTimeout=30)
    assert sorted(m["MessageId"] for m in first) == ids
    back = client.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
        for m in first])
    assert (sorted(s["Id"] for s in back["Successful"]), back.get("Failed", [])) == (ids, [])
    again = receive_all(query_client, url, 7, VisibilityTimeout=30)
    assert sorted(m["MessageId"] for m in again) == ids  # stable across receives
    done = query_client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"]} for m in again])
    assert (sorted(s["Id"] for s in done["Successful"]), done.get("Failed", [])) == (ids, [])
    assert counts(client, url) == (0, 0, 0)


def test_message_id_survives_dead_letters_and_a_move_back(client: Client,
                                                         name: Names) -> None:
    source, dlq, dlq_arn = redrive_pair(client, name, 1)
    sent = client.send_message(QueueUrl=source, MessageBody="moved")["MessageId"]
    assert UUID_SHAPE.fullmatch(sent)
    (first,) = receive(client, source)
    client.change_message_visibility(QueueUrl=source, ReceiptHandle=first["ReceiptHandle"],
                                     VisibilityTimeout=0)
    (dead,) = receive_all(client, dlq, 1, timeout=5)
    assert (first["MessageId"], dead["MessageId"]) == (sent, sent)
    client.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"],
                                     VisibilityTimeout=0)
    wait_for_task(client, dlq_arn, client.start_message_move_task(SourceArn=dlq_arn)[
        "TaskHandle"])
    (back,) = receive_all(client, source, 1, timeout=5)
    assert back["MessageId"] == sent
    client.delete_message_batch(QueueUrl=source, Entries=[
        {"Id": back["MessageId"], "ReceiptHandle": back["ReceiptHandle"]}])
    assert counts(client, source) == (0, 0, 0)


# -- a queue name as QueueUrl -----------------------------------------------------------


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_bare_queue_name_as_queue_url(client: Client, query_client: Client, name: Names,
                                      protocol: str) -> None:
    """SQS accepts a queue's name where its URL is asked for."""
    sqs = client if protocol == "json" else query_client
    queue = name()
    make_queue(client, queue)
    sqs.send_message(QueueUrl=queue, MessageBody="by name")
    (got,) = receive_all(sqs, queue, 1)
    assert got["Body"] == "by name"
    assert sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"].endswith(f":{queue}")
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=got["ReceiptHandle"])
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=name("missing"), MessageBody="x")
    assert error_code(err) == "AWS.SimpleQueueService.NonExistentQueue"


# -- X-Amzn-Trace-Id --------------------------------------------------------------------


def with_trace_header(sqs: Client, value: str) -> Client:
    """``sqs`` with ``X-Amzn-Trace-Id: value`` on every request (as the X-Ray SDK and
    AWS load balancers add it)."""
    def add(request: Any, **_: Any) -> None:
        request.headers["X-Amzn-Trace-Id"] = value

    sqs.meta.events.register_first("before-sign.sqs.*", add)
    return sqs


def test_trace_header_becomes_aws_trace_header(node: Node, name: Names) -> None:
    traced = with_trace_header(sqs_client(node), "Root=1-5759e988-bd862e3fe1be46a994272793")
    url = make_queue(traced, name())
    plain = traced.send_message(QueueUrl=url, MessageBody="from header")
    assert "MD5OfMessageSystemAttributes" not in plain  # none was sent as an attribute
    own = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-own"}}
    sent = traced.send_message(QueueUrl=url, MessageBody="own attribute",
                               MessageSystemAttributes=own)
    assert sent["MD5OfMessageSystemAttributes"] == ref_md5_attributes(own)
    traced.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "batch header"},
        {"Id": "b", "MessageBody": "batch own", "MessageSystemAttributes": own}])
    got = receive_all(traced, url, 4, AttributeNames=["AWSTraceHeader"])
    assert {m["Body"]: m["Attributes"]["AWSTraceHeader"] for m in got} == {
        "from header": "Root=1-5759e988-bd862e3fe1be46a994272793",
        "own attribute": "Root=1-own", "batch header": "Root=1-5759e988-bd862e3fe1be46a994272793",
        "batch own": "Root=1-own"}
    client = sqs_client(node)
    client.send_message(QueueUrl=url, MessageBody="untraced")
    (untraced,) = receive_all(client, url, 1, AttributeNames=["All"])
    assert "AWSTraceHeader" not in untraced["Attributes"]


# -- presigned URLs ---------------------------------------------------------------------


def test_generate_presigned_url(client: Client, query_client: Client, name: Names) -> None:
    """URLs from boto3's own presigner (query protocol), fetched by a plain HTTP GET."""
    url = make_queue(client, name())
    send = query_client.generate_presigned_url(
        "send_message", Params={"QueueUrl": url, "MessageBody": "by presigned URL"},
        ExpiresIn=60, HttpMethod="GET")
    with urllib.request.urlopen(send, timeout=10) as reply:
        assert reply.status == 200 and b"<MessageId>" in reply.read()
    (got,) = receive_all(client, url, 1)
    assert got["Body"] == "by presigned URL"
    listed = query_client.generate_presigned_url(
        "list_queues", Params={"QueueNamePrefix": name("")}, ExpiresIn=60, HttpMethod="GET")
    with urllib.request.urlopen(listed, timeout=10) as reply:
        assert url.encode() in reply.read()


# -- parity rows no other test covers (docs/SQS.md) -------------------------------------


def test_parity_of_kept_attributes_owner_and_fifo_only_parameters(client: Client,
                                                                  name: Names) -> None:
    """Policy and encryption settings are kept and returned; LastModifiedTimestamp
    moves with a change; QueueOwnerAWSAccountId must be the namespace;
    ReceiveRequestAttemptId is ignored; MessageGroupId is kept and returned."""
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    url = make_queue(client, name(), Policy=policy, SqsManagedSseEnabled="true",
                     KmsMasterKeyId="alias/okq", KmsDataKeyReusePeriodSeconds="300")
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (json.loads(got["Policy"]), got["SqsManagedSseEnabled"], got["KmsMasterKeyId"],
            got["KmsDataKeyReusePeriodSeconds"]) == (json.loads(policy), "true", "alias/okq",
                                                     "300")
    assert got["LastModifiedTimestamp"] == got["CreatedTimestamp"]
    time.sleep(1.1)  # timestamps are in seconds
    client.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0"})
    changed = client.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "LastModifiedTimestamp"])["Attributes"]["LastModifiedTimestamp"]
    assert int(changed) > int(got["CreatedTimestamp"])
    namespace = got["QueueArn"].split(":")[4]
    assert client.get_queue_url(QueueName=name(), QueueOwnerAWSAccountId=namespace)[
        "QueueUrl"] == url
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName=name(), QueueOwnerAWSAccountId="123456789012")
    client.send_message(QueueUrl=url, MessageBody="grouped", MessageGroupId="g1")
    (message,) = receive_all(client, url, 1, ReceiveRequestAttemptId="attempt-1",
                             AttributeNames=["MessageGroupId"])
    assert message["Attributes"] == {"MessageGroupId": "g1"}


def test_parity_of_the_tag_limit(client: Client, name: Names) -> None:
    url = make_queue(client, name())
    client.tag_queue(QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)})
    with pytest.raises(ClientError) as err:
        client.tag_queue(QueueUrl=url, Tags={"one-too-many": "v"})
    assert error_code(err) == "InvalidParameterValue"
    assert len(client.list_queue_tags(QueueUrl=url)["Tags"]) == 50


def test_parity_of_a_move_task_rate(client: Client, name: Names) -> None:
    """MaxNumberOfMessagesPerSecond is honoured: 3 messages at 1 a second take 2 s
    or more."""
    source, dlq, dlq_arn = redrive_pair(client, name, 1)
    dead_letter(client, source, dlq, ["r1", "r2", "r3"])
    began = time.monotonic()
    handle = client.start_message_move_task(SourceArn=dlq_arn,
                                            MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    task = wait_for_task(client, dlq_arn, handle)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"],
            task["MaxNumberOfMessagesPerSecond"]) == ("COMPLETED", 3, 1)
    assert time.monotonic() - began >= 2.0
