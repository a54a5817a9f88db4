"""The fuzzers of tests/fuzz.py on a few thousand inputs each, and the inputs they
found that okq mishandles, kept as regression examples.

The long form, 100,000 inputs per target, is ``python -m tests.fuzz``. Each target
here must run its inputs with no failure and must see inputs both accepted and
refused (a generator that never gets past the first check proves little). The
harness itself is checked too: a crash and a broken property are recorded, with
the smallest input, and the run goes on.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlencode

import msgpack
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import strategies as st

from okq.errors import FormatError
from okq.leases import decode_lease, encode_lease
from okq.model import decode_manifest, encode_manifest
from okq.server.app import create_app
from okq.settings import Settings
from okq.sqs import auth as sqs_auth
from okq.sqs.errors import SqsError
from okq.sqs.protocol import from_json, from_query
from okq.store import MemoryStore
from tests import fuzz
from tests.fuzz import (
    AKID,
    OPERATOR_KEY,
    SECRET,
    SQS_KEYS,
    SQS_URL,
    TARGETS,
    Node,
    Report,
    Violation,
    batches,
    botocore_signed,
    catching_logs,
    drive,
    mutate_bytes,
    okq_answer,
    run_target,
    signed_with_header,
    sqs_answer,
)

#: Inputs per target in CI (fewer for the HTTP targets, a few ms each): all targets
#: together take some 6 s. ``python -m tests.fuzz`` runs the long form.
SHORT = {name: 250 if "http" in name else 500 for name in TARGETS}


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_short_fuzz_run_finds_nothing(name: str) -> None:
    report = run_target(TARGETS[name], SHORT[name], seed=0)
    assert report.executed == SHORT[name]
    assert not report.failures, report.describe_failures()
    accepted = [o for o in report.outcomes if o.startswith(("accepted", "2"))]
    refused = [o for o in report.outcomes if o not in accepted]
    assert accepted and refused, report.summary()


# -- the harness -------------------------------------------------------------------------


def _explodes_on_ff(data: bytes) -> str:
    if b"\xff" in data:
        raise KeyError("ff")
    if len(data) > 30:
        raise Violation("too long")
    return "fine"


def test_failures_are_recorded_with_the_smallest_input_and_the_run_goes_on() -> None:
    report = Report("harness")
    inputs = batches(st.binary(max_size=40), mutate_bytes, 4)
    drive(report, inputs, _explodes_on_ff, 3_000, seed=7, per_batch=4)
    assert report.executed == 3_000
    assert report.outcomes["fine"] > 0
    crash = next(sig for sig in report.failures if sig.startswith("KeyError at "))
    assert crash.endswith(f"test_fuzz.py:{_explodes_on_ff.__code__.co_firstlineno + 2}")
    assert b"\xff" in ast.literal_eval(report.failures[crash][0])
    assert report.failures["too long"][1] == "too long"
    assert report.outcomes["FAILED"] == sum(report.failed.values())
    assert "FAILURE harness: KeyError at" in report.describe_failures()


def test_a_failure_keeps_its_smallest_input() -> None:
    report = Report("harness")
    for example in (b"a longer input", b"ab", b"abc"):
        report.fail("same", example, "why")
    assert report.failures == {"same": ("b'ab'", "why")}
    assert report.failed["same"] == 3


def test_the_command_lists_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in TARGETS)
    assert fuzz.main(["--inputs", "64", "--target", "segment,sqs-query", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "segment" in out and "sqs-query" in out and "64 inputs" in out
    assert out.rstrip().endswith("no failure")
    with pytest.raises(SystemExit):
        fuzz.main(["--target", "nonesuch"])


# -- regression examples: inputs the fuzzers found ---------------------------------------
# Each test feeds the exact input a fuzzer found (or the smallest one like it) and
# asserts what okq should do. They fail until okq is fixed.


@pytest.fixture
def node() -> Any:
    """A node in this process with no queues: the inputs below need none."""
    with catching_logs() as catcher:
        fuzzed = Node(seeded=False)
        yield fuzzed, catcher
        fuzzed.close()


OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
MSGPACK = {**OPERATOR, "Content-Type": "application/msgpack"}
#: A msgpack timestamp (ext -1, 96-bit form) 2**63 - 2 seconds after the epoch: msgpack
#: raises OverflowError (not a ValueError) turning it into a datetime.
FAR_TIMESTAMP = b"\xc7\x0c\xff\x19\xeap\xde\x7f\xff\xff\xff\xff\xff\xff\xfe"


@pytest.mark.parametrize("body", [
    FAR_TIMESTAMP,  # as the http fuzzer found it: the whole body
    msgpack.packb({"queue_name": "q", "items": [
        {"bytes": b"x", "enqueue_at": msgpack.Timestamp(2**62, 0)}]}),
], ids=["bare", "enqueue_at"])
def test_a_msgpack_timestamp_past_every_calendar_is_a_400(node: Any, body: bytes) -> None:
    fuzzed, catcher = node
    answer = fuzzed.post("/v1/queue.produce", body, MSGPACK)
    assert okq_answer(answer, catcher.take()) == "400 invalid_request"


def test_an_unknown_v1_path_answers_in_okqs_error_shape(node: Any) -> None:
    fuzzed, catcher = node
    answer = fuzzed.post("/v1/queue.produc", b'{"queue_name": "q"}',
                         {**OPERATOR, "Content-Type": "application/json"})
    assert okq_answer(answer, catcher.take()) == "404 not_found"


def test_a_json_body_nested_too_deeply_is_a_serialization_error() -> None:
    with pytest.raises(SqsError) as err:
        from_json(b"[" * 5_000 + b"]" * 5_000)
    assert err.value.shape == "SerializationException"


def test_the_sqs_api_answers_a_deeply_nested_json_body_with_a_400(node: Any) -> None:
    fuzzed, catcher = node
    headers = {"X-Amz-Target": "AmazonSQS.ListQueues",
               "Content-Type": "application/x-amz-json-1.0"}
    answer = fuzzed.post("/", b"[" * 5_000 + b"]" * 5_000, headers)
    assert sqs_answer(answer, True, catcher.take()) == "400 SerializationException"


FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON_PROTOCOL = {"Content-Type": "application/x-amz-json-1.0"}


def test_a_tag_with_a_lone_surrogate_escape_is_a_400_not_a_500(node: Any) -> None:
    """Found by the long run: the tag was kept in the queue's manifest, whose
    encoding then failed (a 500)."""
    fuzzed, catcher = node
    fuzzed.post("/", b'{"QueueName": "q"}', {**JSON_PROTOCOL,
                                              "X-Amz-Target": "AmazonSQS.CreateQueue"})
    catcher.take()
    body = b'{"QueueUrl": "http://127.0.0.1/default/q", "Tags": {"k\\udd92": "v"}}'
    answer = fuzzed.post("/", body, {**JSON_PROTOCOL, "X-Amz-Target": "AmazonSQS.TagQueue"})
    assert sqs_answer(answer, True, catcher.take()) == "400 SerializationException"


def test_an_sqs_query_error_naming_a_control_character_is_well_formed_xml(node: Any) -> None:
    """XML 1.0 has no U+0001 to U+0008, U+000B, U+000C, U+000E to U+001F, not even as
    character references: a reply that echoes them is not XML (the query protocol's
    clients cannot read it)."""
    fuzzed, catcher = node
    answer = fuzzed.post("/", b"Action=%04", FORM)
    ET.fromstring(answer.body)
    assert sqs_answer(answer, False, catcher.take()) == "400 InvalidAction"


def test_a_batch_entry_echoing_a_control_character_is_well_formed_xml(node: Any) -> None:
    """The same in a reply that succeeds: a failed entry of a batch says why, quoting
    what it was given (found by the sqs-http fuzzer, ChangeMessageVisibilityBatch)."""
    fuzzed, catcher = node
    body = urlencode([
        ("Action", "ChangeMessageVisibilityBatch"), ("QueueUrl", f"{SQS_URL}q"),
        ("ChangeMessageVisibilityBatchRequestEntry.1.Id", "a"),
        ("ChangeMessageVisibilityBatchRequestEntry.1.ReceiptHandle", "h\x01"),
        ("ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout", "5"),
    ]).encode()
    answer = fuzzed.post("/", body, FORM)
    assert answer.status == 200
    ET.fromstring(answer.body)
    assert sqs_answer(answer, False, catcher.take()) == "200"


def test_a_query_form_with_a_value_below_a_map_key_is_malformed() -> None:
    """Tag.1.Key.x makes the key of a tag a map: it cannot key the tags."""
    with pytest.raises(SqsError) as err:
        from_query([("Tag.1.Key.x", "v")])
    assert err.value.shape == "MalformedQueryString"


@pytest.mark.parametrize(("action", "params"), [
    ("ListQueues", {"QueueNamePrefix": ["e"]}),
    ("ListQueues", {"MaxResults": None}),
    ("ListDeadLetterSourceQueues", {"QueueUrl": f"{SQS_URL}dlq", "MaxResults": None}),
], ids=["prefix-list", "list-queues-null-max", "dead-letter-sources-null-max"])
def test_sqs_json_parameters_of_another_type_are_a_4xx(
        node: Any, action: str, params: dict[str, Any]) -> None:
    fuzzed, catcher = node
    redrive = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:default:dlq",
                          "maxReceiveCount": 3})
    for queue in ({"QueueName": "dlq"}, {"QueueName": "q", "Attributes": {
            "RedrivePolicy": redrive}}):  # a source queue: a page of one name to cut
        created = fuzzed.post("/", json.dumps(queue).encode(),
                              {**JSON_PROTOCOL, "X-Amz-Target": "AmazonSQS.CreateQueue"})
        assert created.status == 200, created.body
    answer = fuzzed.post("/", json.dumps(params).encode(),
                         {**JSON_PROTOCOL, "X-Amz-Target": f"AmazonSQS.{action}"})
    outcome = sqs_answer(answer, True, catcher.take())
    assert outcome == "200" or outcome.startswith("400 ")


def test_a_signed_header_that_is_not_utf8_is_refused_not_a_crash() -> None:
    """aiohttp hands a header byte that is not UTF-8 over as a lone surrogate."""
    req = botocore_signed("/", b"Action=ListQueues", {}, {
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    req = signed_with_header(req, "Content-Type", "application/x-www-form-urlencoded\udce9")
    with pytest.raises(SqsError) as err:
        sqs_auth.verify(req, SQS_KEYS, unsigned_namespace=None)
    assert err.value.status < 500


async def test_a_signed_header_that_is_not_utf8_is_a_4xx_over_http() -> None:
    """The same through a node's socket: the raw byte 0xe9 in a signed Host header."""
    settings = Settings(store="memory://", self_check=False, signing_keys="k" * 32,
                        sqs_keys=f"{AKID}:{SECRET}")
    server = TestServer(create_app(settings, MemoryStore()), host="127.0.0.1")
    await server.start_server()
    try:
        now = time.gmtime()
        date, stamp = time.strftime("%Y%m%d", now), time.strftime("%Y%m%dT%H%M%SZ", now)
        request = (
            f"POST / HTTP/1.1\r\nHost: sqs\xe9\r\nX-Amz-Date: {stamp}\r\n"
            f"Authorization: AWS4-HMAC-SHA256 Credential={AKID}/{date}/us-east-1/sqs/"
            f"aws4_request, SignedHeaders=host;x-amz-date, Signature={'0' * 64}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n").encode("latin-1")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        status_line = await reader.readline()
        writer.close()
        await writer.wait_closed()
    finally:
        await server.close()
    status = int(status_line.split()[1])
    assert 400 <= status < 500, status_line


def test_a_query_string_with_a_space_signed_by_botocore_verifies() -> None:
    """botocore signs a space as %20 and sends it as '+', as forms do."""
    req = botocore_signed("/", b"", {"QueueNamePrefix": "a b"}, {
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    assert "+" in req.raw_query
    assert sqs_auth.verify(req, SQS_KEYS, unsigned_namespace=None).access_key == AKID


def _lease(items: dict[Any, list[Any]]) -> bytes:
    out: bytes = msgpack.packb({"f": "lease", "v": 1, "segment": "s", "items": items, "ver": 1,
                                "nonce": "n", "sealed": False}, use_bin_type=True)
    return out


STATE = ["W", 1, 1, 5, None]


def test_a_lease_object_with_an_infinite_item_index_is_a_format_error() -> None:
    with pytest.raises(FormatError):
        decode_lease(_lease({float("inf"): STATE}))


@pytest.mark.parametrize("index", [-1, -5_000])
def test_a_lease_object_with_a_negative_item_index_does_not_round_trip_to_another(
        index: int) -> None:
    """decode_lease takes any integer index; encode_lease then wrote -1 as 4095 (a
    list lookup from the end) and -5000 not at all (IndexError)."""
    try:
        lease = decode_lease(_lease({index: STATE}))
    except FormatError:
        return  # refusing the index is as good
    assert decode_lease(encode_lease(lease)).items.keys() == {index}


def test_a_manifest_with_a_purge_record_round_trips() -> None:
    """decode_manifest takes a purge record with an empty request id; encode_manifest
    then dropped what it purged."""
    data = msgpack.packb({
        "f": "manifest", "v": 1, "queue": "q", "created": 1, "config": {}, "segments": [],
        "idem": {}, "produced": 0, "gc_floor": 0, "ver": 1, "nonce": "n",
        "purge": ["", {"s1": 5}]}, use_bin_type=True)
    try:
        manifest = decode_manifest(data)
    except FormatError:
        return  # refusing it is as good
    assert decode_manifest(encode_manifest(manifest)) == manifest


def test_the_fuzzed_node_answers_json_errors_in_its_shape(node: Any) -> None:
    """The judge of the http target reads what the node says: a sanity check."""
    fuzzed, catcher = node
    answer = fuzzed.post("/v1/queue.stats", json.dumps({"queue_name": "nope"}).encode(),
                         {**OPERATOR, "Content-Type": "application/json"})
    assert okq_answer(answer, catcher.take()) == "404 queue_not_found"
    with pytest.raises(Violation, match="HTTP 400 without okq's error shape"):
        okq_answer(fuzz.Answer(400, "application/json", answer.headers, b'{"error": 1}'),
                   None)
