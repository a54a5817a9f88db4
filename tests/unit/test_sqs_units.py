"""The SQS front end's pure parts: the query protocol's flattening and XML replies
(okq/sqs/protocol.py), Signature Version 4 checked against botocore's own signer
(okq/sqs/auth.py), and message attribute digests and selection (okq/sqs/messages.py).

Expected values come from outside the code under test: botocore signs the requests
and canonicalises paths and queries; attribute digests are computed here from the
algorithm the SQS Developer Guide documents, and checked against digests published
by other SQS implementations' tests.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import ValidationError

from okq.settings import Settings
from okq.sqs.auth import Caller, Signed, canonical_path, canonical_query, verify
from okq.sqs.errors import SqsError
from okq.sqs.messages import Attribute, md5_of_attributes, message_id, select, trace_header
from okq.sqs.protocol import from_query, json_error, xml_error, xml_reply

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}
AKID = "AKIDUNIT"
SECRET = "unit-secret-0123456789"
KEYS = {AKID: (SECRET, "default")}
HOST = "127.0.0.1:9324"


def attributes_md5(attributes: dict[str, tuple[str, str | bytes]]) -> str:
    """MD5OfMessageAttributes as the SQS Developer Guide describes it ("Calculating
    the MD5 message digest for message attributes"): the attributes sorted by name,
    each encoded as name, data type, one transport byte (1 for String and Number,
    2 for Binary) and value, every part but the transport byte prefixed by its
    length in four big-endian bytes."""
    out = b""
    for name in sorted(attributes):
        data_type, value = attributes[name]
        raw = value if isinstance(value, bytes) else value.encode("utf-8")
        transport = b"\x02" if data_type.split(".")[0] == "Binary" else b"\x01"
        for part in (name.encode("utf-8"), data_type.encode("utf-8")):
            out += len(part).to_bytes(4, "big") + part
        out += transport + len(raw).to_bytes(4, "big") + raw
    return hashlib.md5(out, usedforsecurity=False).hexdigest()


# -- the query protocol's parameters ---------------------------------------------------


def test_from_query_flattens_queue_attributes_in_index_order() -> None:
    params = from_query([
        ("QueueName", "jobs"),
        ("Attribute.10.Name", "DelaySeconds"), ("Attribute.10.Value", "3"),
        ("Attribute.2.Name", "VisibilityTimeout"), ("Attribute.2.Value", "5"),
        ("Tag.1.Key", "team"), ("Tag.1.Value", "ops"),
    ])
    assert params == {"QueueName": "jobs", "Tags": {"team": "ops"},
                      "Attributes": {"VisibilityTimeout": "5", "DelaySeconds": "3"}}
    assert list(params["Attributes"]) == ["VisibilityTimeout", "DelaySeconds"]


def test_from_query_flattens_message_attributes() -> None:
    params = from_query([
        ("QueueUrl", "http://h/default/q"), ("MessageBody", "hello"),
        ("MessageAttribute.1.Name", "color"),
        ("MessageAttribute.1.Value.StringValue", "blue"),
        ("MessageAttribute.1.Value.DataType", "String"),
        ("MessageAttribute.2.Name", "blob"),
        ("MessageAttribute.2.Value.BinaryValue", "AAE="),
        ("MessageAttribute.2.Value.DataType", "Binary"),
        ("MessageAttribute.3.Name", "list"),
        ("MessageAttribute.3.Value.DataType", "String"),
        ("MessageAttribute.3.Value.StringListValue.2", "y"),
        ("MessageAttribute.3.Value.StringListValue.1", "x"),
        ("MessageSystemAttribute.1.Name", "AWSTraceHeader"),
        ("MessageSystemAttribute.1.Value.StringValue", "Root=1-abc"),
        ("MessageSystemAttribute.1.Value.DataType", "String"),
    ])
    assert params == {
        "QueueUrl": "http://h/default/q", "MessageBody": "hello",
        "MessageAttributes": {
            "color": {"StringValue": "blue", "DataType": "String"},
            "blob": {"BinaryValue": "AAE=", "DataType": "Binary"},
            "list": {"DataType": "String", "StringListValues": ["x", "y"]},
        },
        "MessageSystemAttributes": {
            "AWSTraceHeader": {"StringValue": "Root=1-abc", "DataType": "String"}},
    }


def test_from_query_flattens_batch_entries() -> None:
    params = from_query([
        ("QueueUrl", "u"),
        ("SendMessageBatchRequestEntry.2.Id", "b"),
        ("SendMessageBatchRequestEntry.2.MessageBody", "second"),
        ("SendMessageBatchRequestEntry.2.DelaySeconds", "4"),
        ("SendMessageBatchRequestEntry.1.Id", "a"),
        ("SendMessageBatchRequestEntry.1.MessageBody", "first"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Name", "n"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue", "7"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType", "Number"),
    ])
    assert params == {"QueueUrl": "u", "Entries": [
        {"Id": "a", "MessageBody": "first",
         "MessageAttributes": {"n": {"StringValue": "7", "DataType": "Number"}}},
        {"Id": "b", "MessageBody": "second", "DelaySeconds": "4"},
    ]}
    deletes = from_query([("DeleteMessageBatchRequestEntry.1.Id", "x"),
                          ("DeleteMessageBatchRequestEntry.1.ReceiptHandle", "h1")])
    assert deletes == {"Entries": [{"Id": "x", "ReceiptHandle": "h1"}]}


def test_from_query_flattens_name_lists() -> None:
    params = from_query([("AttributeName.2", "VisibilityTimeout"), ("AttributeName.1", "All"),
                         ("MessageAttributeName.1", "color.*"),
                         ("MessageSystemAttributeName.1", "SenderId"),
                         ("TagKey.1", "team"), ("MaxNumberOfMessages", "10")])
    assert params == {"AttributeNames": ["All", "VisibilityTimeout"],
                      "MessageAttributeNames": ["color.*"],
                      "MessageSystemAttributeNames": ["SenderId"],
                      "TagKeys": ["team"], "MaxNumberOfMessages": "10"}


@pytest.mark.parametrize("pairs", [
    [("QueueName", "a"), ("QueueName", "b")],  # repeated
    [("Attribute.x.Name", "VisibilityTimeout"), ("Attribute.x.Value", "5")],  # not an index
    [("Attribute.0.Name", "VisibilityTimeout")],  # indexes start at 1
    [("Attribute.01.Name", "VisibilityTimeout")],  # no leading zeros
    [("Attribute..Name", "VisibilityTimeout")],  # an empty segment
    [("Attribute.1.Name.", "VisibilityTimeout")],  # a trailing dot
    [("AttributeName.1.Deep", "All")],  # a list of names holds values only
    [("AttributeName", "All")],  # a list needs its .N
    [("SendMessageBatchRequestEntry.1", "x")],  # an entry needs fields
    [("QueueUrl", "u"), ("QueueUrl.1", "v")],  # a value and a structure at once
    [("QueueUrl.1", "v"), ("QueueUrl", "u")],
], ids=["repeated", "not-index", "zero", "leading-zero", "empty-segment", "trailing-dot",
        "deep-list", "list-without-index", "entry-without-fields", "value-then-struct",
        "struct-then-value"])
def test_from_query_refuses_malformed_names(pairs: list[tuple[str, str]]) -> None:
    with pytest.raises(SqsError) as err:
        from_query(pairs)
    assert (err.value.shape, err.value.code, err.value.status) == \
        ("MalformedQueryString", "MalformedQueryString", 400)


def test_from_query_needs_the_name_of_a_map_entry() -> None:
    with pytest.raises(SqsError) as err:
        from_query([("Attribute.1.Value", "5")])
    assert err.value.code == "MissingParameter"


# -- replies ---------------------------------------------------------------------------


def parse(body: bytes, root: str) -> ET.Element:
    tree = ET.fromstring(body)
    assert tree.tag == f"{{{NS['sqs']}}}{root}"
    return tree


def texts(element: ET.Element, path: str) -> list[str]:
    return [e.text or "" for e in element.findall(path, NS)]


def test_xml_reply_of_a_value_and_request_id() -> None:
    root = parse(xml_reply("CreateQueue", {"QueueUrl": "http://h/default/q"}, "rid-1"),
                 "CreateQueueResponse")
    assert texts(root, "sqs:CreateQueueResult/sqs:QueueUrl") == ["http://h/default/q"]
    assert texts(root, "sqs:ResponseMetadata/sqs:RequestId") == ["rid-1"]


def test_xml_reply_without_result() -> None:
    root = parse(xml_reply("DeleteMessage", {}, "rid-2"), "DeleteMessageResponse")
    assert root.find("sqs:DeleteMessageResult", NS) is None
    assert texts(root, "sqs:ResponseMetadata/sqs:RequestId") == ["rid-2"]


@pytest.mark.parametrize("action", ["ReceiveMessage", "ListQueues", "ListQueueTags",
                                    "GetQueueAttributes", "ListDeadLetterSourceQueues"])
def test_xml_reply_of_an_empty_result_keeps_its_element(action: str) -> None:
    """An action SQS models a result for answers ``<ActionResult/>`` when the result
    is empty (botocore's query parser looks the element up by name)."""
    root = parse(xml_reply(action, {}, "r"), f"{action}Response")
    (result,) = root.findall(f"sqs:{action}Result", NS)
    assert list(result) == [] and not (result.text or "").strip()


#: Text XML would not give back as written raw: CR and CR LF read as LF.
LINE_ENDS = ["a\rb", "\r\n", "\r", "x\r\r\ny", "\t\n\r", " \r "]


@pytest.mark.parametrize("body", LINE_ENDS)
def test_xml_reply_keeps_carriage_returns(body: str) -> None:
    message = {"MessageId": "m", "Body": body,
               "MessageAttributes": {"a": {"DataType": "String", "StringValue": body}}}
    raw = xml_reply("ReceiveMessage", {"Messages": [message]}, "r")
    assert b"\r" not in raw and b"&#xD;" in raw
    root = parse(raw, "ReceiveMessageResponse")
    assert texts(root, "sqs:ReceiveMessageResult/sqs:Message/sqs:Body") == [body]
    assert texts(root, "sqs:ReceiveMessageResult/sqs:Message/sqs:MessageAttribute/"
                       "sqs:Value/sqs:StringValue") == [body]


def test_xml_reply_of_lists_and_maps() -> None:
    root = parse(xml_reply("ListQueues", {"QueueUrls": ["http://h/a", "http://h/b"]}, "r"),
                 "ListQueuesResponse")
    assert texts(root, "sqs:ListQueuesResult/sqs:QueueUrl") == ["http://h/a", "http://h/b"]
    root = parse(xml_reply("GetQueueAttributes",
                           {"Attributes": {"VisibilityTimeout": "5", "DelaySeconds": "0"}}, "r"),
                 "GetQueueAttributesResponse")
    got = {a.findtext("sqs:Name", None, NS): a.findtext("sqs:Value", None, NS)
           for a in root.findall("sqs:GetQueueAttributesResult/sqs:Attribute", NS)}
    assert got == {"VisibilityTimeout": "5", "DelaySeconds": "0"}


def test_xml_reply_of_received_messages() -> None:
    message = {"MessageId": "m1", "ReceiptHandle": "h1", "MD5OfBody": "d", "Body": "<a & b>",
               "Attributes": {"ApproximateReceiveCount": "1"},
               "MD5OfMessageAttributes": "e",
               "MessageAttributes": {"color": {"DataType": "String", "StringValue": "blue"},
                                     "blob": {"DataType": "Binary", "BinaryValue": "AAE="}}}
    root = parse(xml_reply("ReceiveMessage", {"Messages": [message, {**message, "Body": "2"}]},
                           "r"), "ReceiveMessageResponse")
    first, second = root.findall("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert texts(first, "sqs:Body") == ["<a & b>"] and texts(second, "sqs:Body") == ["2"]
    assert texts(first, "sqs:Attribute/sqs:Name") == ["ApproximateReceiveCount"]
    assert texts(first, "sqs:Attribute/sqs:Value") == ["1"]
    attrs = {a.findtext("sqs:Name", None, NS): a for a in first.findall("sqs:MessageAttribute", NS)}
    assert set(attrs) == {"color", "blob"}
    assert texts(attrs["color"], "sqs:Value/sqs:DataType") == ["String"]
    assert texts(attrs["color"], "sqs:Value/sqs:StringValue") == ["blue"]
    assert texts(attrs["blob"], "sqs:Value/sqs:BinaryValue") == ["AAE="]
    assert texts(first, "sqs:MD5OfMessageAttributes") == ["e"]


def test_xml_reply_of_a_batch() -> None:
    result = {"Successful": [{"Id": "a", "MessageId": "m", "MD5OfMessageBody": "d"}],
              "Failed": [{"Id": "b", "SenderFault": True, "Code": "InvalidMessageContents",
                          "Message": "bad"}]}
    root = parse(xml_reply("SendMessageBatch", result, "r"), "SendMessageBatchResponse")
    ok = root.findall("sqs:SendMessageBatchResult/sqs:SendMessageBatchResultEntry", NS)
    assert [texts(e, "sqs:Id") + texts(e, "sqs:MessageId") for e in ok] == [["a", "m"]]
    (failed,) = root.findall("sqs:SendMessageBatchResult/sqs:BatchResultErrorEntry", NS)
    assert {c.tag.split("}")[1]: c.text for c in failed} == {
        "Id": "b", "SenderFault": "true", "Code": "InvalidMessageContents", "Message": "bad"}


def test_error_shapes_of_both_protocols() -> None:
    err = SqsError("TooManyEntriesInBatchRequest", "eleven <entries>")
    root = parse(xml_error(err, "rid-3"), "ErrorResponse")
    assert texts(root, "sqs:Error/sqs:Type") == ["Sender"]
    assert texts(root, "sqs:Error/sqs:Code") == \
        ["AWS.SimpleQueueService.TooManyEntriesInBatchRequest"]
    assert texts(root, "sqs:Error/sqs:Message") == ["eleven <entries>"]
    assert texts(root, "sqs:RequestId") == ["rid-3"]
    body, headers = json_error(err)
    assert json.loads(body) == {"__type": "com.amazonaws.sqs#TooManyEntriesInBatchRequest",
                                "message": "eleven <entries>"}
    assert headers == {"x-amzn-query-error":
                       "AWS.SimpleQueueService.TooManyEntriesInBatchRequest;Sender"}
    assert json_error(SqsError("InternalFailure", "x"))[1] == \
        {"x-amzn-query-error": "InternalFailure;Receiver"}


# -- Signature Version 4 ---------------------------------------------------------------


def botocore_signed(url: str = f"http://{HOST}/default/q", body: bytes = b"Action=ListQueues",
                    *, secret: str = SECRET, service: str = "sqs",
                    headers: dict[str, str] | None = None,
                    params: dict[str, str] | None = None) -> Signed:
    """A request signed by botocore, as the node receives it: the Host header the
    HTTP client adds, and the path and query as they travel."""
    request = AWSRequest("POST", url, data=body, params=params, headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
        "User-Agent": "unit-test", **(headers or {})})
    SigV4Auth(Credentials(AKID, secret), service, "us-east-1").add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    sent = CIMultiDict(prepared.headers.items())
    sent["Host"] = parts.netloc
    return Signed("POST", parts.path, parts.query, CIMultiDictProxy(sent),
                  prepared.body or b"")


def changed(req: Signed, **fields: Any) -> Signed:
    values = {"method": req.method, "raw_path": req.raw_path, "raw_query": req.raw_query,
              "headers": req.headers, "body": req.body, **fields}
    return Signed(**values)


def with_header(req: Signed, name: str, value: str) -> Signed:
    headers = CIMultiDict(req.headers)
    headers[name] = value
    return changed(req, headers=CIMultiDictProxy(headers))


def refusal(req: Signed, keys: dict[str, tuple[str, str]] = KEYS,
            now: float | None = None) -> SqsError:
    with pytest.raises(SqsError) as err:
        verify(req, keys, unsigned_namespace=None, now=now)
    return err.value


def test_verify_accepts_botocore_signatures() -> None:
    assert verify(botocore_signed(), KEYS, unsigned_namespace=None) == Caller(AKID, "default")
    json_call = botocore_signed(f"http://{HOST}/", b'{"QueueNamePrefix": "a"}', headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    assert verify(json_call, KEYS, unsigned_namespace=None) == Caller(AKID, "default")
    assert verify(botocore_signed(), {AKID: (SECRET, "otherns")}, unsigned_namespace=None) == \
        Caller(AKID, "otherns")
    query = botocore_signed(f"http://{HOST}/default/q", b"", params={"Action": "ListQueues",
                                                                      "QueueNamePrefix": "a/é~"})
    assert query.raw_query
    assert verify(query, KEYS, unsigned_namespace=None) == Caller(AKID, "default")


def test_verify_ignores_headers_outside_the_signature() -> None:
    req = with_header(botocore_signed(), "User-Agent", "another-agent")
    assert verify(req, KEYS, unsigned_namespace=None).access_key == AKID


@pytest.mark.parametrize("change", ["body", "path", "query", "method", "header", "new-date"])
def test_verify_refuses_a_changed_request(change: str) -> None:
    req = botocore_signed(headers={"X-Amz-Target": "AmazonSQS.ListQueues"})
    altered = {
        "body": lambda: changed(req, body=b"Action=ListQueuez"),
        "path": lambda: changed(req, raw_path="/default/other"),
        "query": lambda: changed(req, raw_query="Action=DeleteQueue"),
        "method": lambda: changed(req, method="PUT"),
        "header": lambda: with_header(req, "X-Amz-Target", "AmazonSQS.DeleteQueue"),
        "new-date": lambda: with_header(req, "X-Amz-Date", time.strftime(
            "%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 61))),
    }[change]()
    assert verify(req, KEYS, unsigned_namespace=None).access_key == AKID  # the control
    assert refusal(altered).code == "SignatureDoesNotMatch"


def test_verify_refuses_wrong_keys() -> None:
    assert refusal(botocore_signed(secret="not-the-secret")).code == "SignatureDoesNotMatch"
    assert refusal(botocore_signed(), {"AKIDOTHER": (SECRET, "default")}).code == \
        "InvalidClientTokenId"
    assert refusal(botocore_signed(service="s3")).code == "SignatureDoesNotMatch"


def test_verify_of_unsigned_requests() -> None:
    req = botocore_signed()
    headers = CIMultiDict(req.headers)
    del headers["Authorization"]
    unsigned = changed(req, headers=CIMultiDictProxy(headers))
    err = refusal(unsigned)
    assert (err.code, err.status) == ("MissingAuthenticationToken", 403)
    assert verify(unsigned, KEYS, unsigned_namespace="dev") == Caller(None, "dev")


def test_verify_refuses_a_request_dated_over_15_minutes_away() -> None:
    req = botocore_signed()
    assert verify(req, KEYS, unsigned_namespace=None, now=time.time() + 14 * 60).access_key
    assert verify(req, KEYS, unsigned_namespace=None, now=time.time() - 14 * 60).access_key
    for skew in (16 * 60, -16 * 60):
        err = refusal(req, now=time.time() + skew)
        assert err.code == "SignatureDoesNotMatch" and "expired" in err.message.lower()


# -- presigned URLs (Signature Version 4 in the query string) -------------------------


def presigned(url: str = f"http://{HOST}/default/q", *, method: str = "GET",
              params: dict[str, str] | None = None, expires: int = 60,
              secret: str = SECRET, sign_payload: bool = True) -> Signed:
    """A request presigned by botocore's SigV4QueryAuth (what generate_presigned_url
    uses), as the node receives it: the signature in the query string, no body."""
    request = AWSRequest(method, url, params=params if params is not None else {
        "Action": "ReceiveMessage", "MaxNumberOfMessages": "2", "Note": "a+b &c=d é/~"})
    request.context["payload_signing_enabled"] = sign_payload
    SigV4QueryAuth(Credentials(AKID, secret), "sqs", "us-east-1", expires=expires
                   ).add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    assert "X-Amz-Signature=" in parts.query and "Authorization" not in prepared.headers
    return Signed(method, parts.path, parts.query,
                  CIMultiDictProxy(CIMultiDict({"Host": parts.netloc})), prepared.body or b"")


def test_verify_accepts_presigned_urls() -> None:
    for req in (presigned(), presigned(method="POST"),
                presigned(f"https://{HOST}/", sign_payload=False),  # UNSIGNED-PAYLOAD
                presigned(params={"Action": "ListQueues"})):
        assert verify(req, KEYS, unsigned_namespace=None) == Caller(AKID, "default")


def test_verify_refuses_a_changed_presigned_url() -> None:
    req = presigned()
    sig = req.raw_query.rsplit("X-Amz-Signature=", 1)[1]
    other = "0" * 64 if sig != "0" * 64 else "1" * 64
    altered = [
        changed(req, raw_query=req.raw_query.replace("MaxNumberOfMessages=2",
                                                     "MaxNumberOfMessages=9")),
        changed(req, raw_query=req.raw_query + "&QueueUrl=other"),
        changed(req, raw_query=req.raw_query.replace("X-Amz-Expires=60", "X-Amz-Expires=600")),
        changed(req, raw_query=req.raw_query.replace(sig, other)),
        changed(req, raw_path="/default/other"),
        changed(req, method="POST"),
        changed(req, body=b"Action=DeleteQueue"),  # a body the URL did not sign
        with_header(req, "Host", "127.0.0.2:9324"),
    ]
    for n, bad in enumerate(altered):
        assert refusal(bad).code == "SignatureDoesNotMatch", n
    assert refusal(presigned(secret="not-the-secret")).code == "SignatureDoesNotMatch"
    assert refusal(presigned(), {"AKIDOTHER": (SECRET, "default")}).code == \
        "InvalidClientTokenId"


def test_verify_refuses_an_expired_presigned_url() -> None:
    req = presigned(expires=60)
    assert verify(req, KEYS, unsigned_namespace=None, now=time.time() + 55).access_key
    err = refusal(req, now=time.time() + 65)
    assert (err.code, err.status) == ("RequestExpired", 400) and "expired" in err.message
    # a URL may last long, but not be dated in the future beyond the allowed skew
    long = presigned(expires=7 * 24 * 3600)
    assert verify(long, KEYS, unsigned_namespace=None, now=time.time() + 6 * 24 * 3600)
    assert refusal(long, now=time.time() - 16 * 60).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize(("change", "code"), [
    (lambda q: q.replace("X-Amz-Expires=60", "X-Amz-Expires=604801"), "IncompleteSignature"),
    (lambda q: q.replace("X-Amz-Expires=60", "X-Amz-Expires=-5"), "IncompleteSignature"),
    (lambda q: q.replace("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-HMAC-SHA1"),
     "IncompleteSignature"),
    (lambda q: "&".join(p for p in q.split("&") if not p.startswith("X-Amz-Date=")),
     "IncompleteSignature"),
    (lambda q: q + "&X-Amz-Signature=" + "0" * 64, "IncompleteSignature"),  # repeated
    (lambda q: "&".join(p for p in q.split("&") if not p.startswith("X-Amz-SignedHeaders")) +
     "&X-Amz-SignedHeaders=user-agent", "IncompleteSignature"),  # host not signed
])
def test_verify_refuses_a_malformed_presigned_url(change: Any, code: str) -> None:
    req = presigned()
    assert refusal(changed(req, raw_query=change(req.raw_query))).code == code


@pytest.mark.parametrize("params", [
    {"X-Amz-Algorithm": "x"},
    {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Signature": "not-hex", "Action": "A"},
    {"X-Amz-Credential": "", "X-Amz-Signature": "0" * 64, "X-Amz-Expires": "-1"},
])
def test_a_header_signed_request_with_x_amz_query_parameters_verifies(
        params: dict[str, str]) -> None:
    """With an Authorization header a request is header-signed (found by the fuzzer:
    it was refused as a malformed presigned URL); its X-Amz-* query parameters are
    parameters under the header's signature, so changing one is refused."""
    req = botocore_signed(params=params)
    assert verify(req, KEYS, unsigned_namespace=None) == Caller(AKID, "default")
    edited = changed(req, raw_query=req.raw_query.replace("X-Amz-", "X-Amz-Other", 1))
    assert refusal(edited).code == "SignatureDoesNotMatch"


def test_a_presigned_url_with_an_authorization_header_is_checked_by_the_header() -> None:
    """A header signature taken from another request does not sign the presigned URL,
    and the URL's own signature in the query does not rescue it."""
    req = presigned()
    other = botocore_signed()
    forged = changed(req, headers=other.headers)  # Authorization and what it signs
    assert refusal(forged).code == "SignatureDoesNotMatch"
    assert refusal(with_header(req, "Authorization", "AWS4-HMAC-SHA256 x")).code == \
        "IncompleteSignature"


def test_verify_needs_the_action_header_signed() -> None:
    """X-Amz-Target names the JSON protocol's action: it must be under the signature."""
    req = with_header(presigned(method="POST"), "X-Amz-Target", "AmazonSQS.DeleteQueue")
    assert refusal(req).code == "IncompleteSignature"
    added = with_header(botocore_signed(), "X-Amz-Target", "AmazonSQS.DeleteQueue")
    assert refusal(added).code == "IncompleteSignature"


PATHS = ["/", "/default/q", "/a/./b/../c", "//a//b/", "/a%20b", "/a b", "/..", "/a/",
         "/x/~y%7E", "/a:b@c", "/%41", "/default/q-1_2"]
QUERIES = ["", "b=2&a=1", "a=1&a=0", "x=a%20b", "empty=", "flag", "k=a~b-c_d.e",
           "a%2Fb=c%2Fd", "Action=ReceiveMessage&AttributeName.1=All"]


def botocore_canonical(url: str) -> list[str]:
    """The lines of botocore's canonical request for a POST of ``url``."""
    signer = SigV4Auth(Credentials(AKID, SECRET), "sqs", "us-east-1")
    return str(signer.canonical_request(AWSRequest("POST", url))).split("\n")


@pytest.mark.parametrize("path", PATHS)
def test_canonical_path_is_botocores(path: str) -> None:
    assert canonical_path(urlsplit(f"http://{HOST}{path}").path) == \
        botocore_canonical(f"http://{HOST}{path}")[1]


@pytest.mark.parametrize("query", QUERIES)
def test_canonical_query_is_botocores(query: str) -> None:
    assert canonical_query(query) == botocore_canonical(f"http://{HOST}/?{query}")[2]


def test_canonical_query_of_botocore_params() -> None:
    """botocore signs ``params`` percent-encoded; the node sees them as they travel."""
    request = AWSRequest("POST", f"http://{HOST}/", params={"Z": "1", "a/b": "c/d", "x~": "é"})
    signer = SigV4Auth(Credentials(AKID, SECRET), "sqs", "us-east-1")
    expected = str(signer.canonical_request(request)).split("\n")[2]
    assert canonical_query(urlsplit(request.prepare().url).query) == expected


# -- message attributes ----------------------------------------------------------------

#: Digests published by other SQS implementations' tests (localstack; sqslite, whose
#: expected value comes from the AWS SDK for Go's checksum).
PUBLISHED = [
    ({"timestamp": ("Number", "1493147359900")}, "235c5c510d26fb653d073faed50ae77c"),
    ({"ordinal": ("Number", "1"), "category": ("String", "test")},
     "d21ae90c49061e927f57df5f5d72be1f"),
]


@pytest.mark.parametrize(("attributes", "digest"), PUBLISHED)
def test_md5_of_attributes_matches_published_digests(
        attributes: dict[str, tuple[str, str]], digest: str) -> None:
    assert attributes_md5(dict(attributes)) == digest  # this file's reading of the guide
    assert md5_of_attributes({k: Attribute(*v) for k, v in attributes.items()}) == digest


def test_md5_of_attributes_with_binary_and_custom_types() -> None:
    attributes: dict[str, tuple[str, str | bytes]] = {
        "zeta": ("String.custom", "héllo"),
        "alpha": ("Binary.png", b"\x00\x01\xff"),
        "Mid": ("Number.int", "-42.5e3"),
    }
    expected = attributes_md5(attributes)
    assert md5_of_attributes({k: Attribute(*v) for k, v in attributes.items()}) == expected
    # by hand, for one binary attribute: no helper shared with the code under test
    raw = (b"\x00\x00\x00\x01" b"b" b"\x00\x00\x00\x06" b"Binary" b"\x02"
           b"\x00\x00\x00\x02" b"\x00\xff")
    assert md5_of_attributes({"b": Attribute("Binary", b"\x00\xff")}) == \
        hashlib.md5(raw, usedforsecurity=False).hexdigest()


ATTRS = {name: Attribute("String", name) for name in
         ("color", "color.dark", "colour", "size", "s.x")}


@pytest.mark.parametrize(("names", "expected"), [
    (["All"], set(ATTRS)),
    ([".*"], set(ATTRS)),
    (["size", "All"], set(ATTRS)),
    ([], set()),
    (["color"], {"color"}),
    (["color.*"], {"color.dark"}),
    (["col.*"], set()),  # a prefix ends at a dot: "col.*" is not "col*"
    (["s.*", "size"], {"s.x", "size"}),
    (["nothing", "other.*"], set()),
])
def test_select(names: list[str], expected: set[str]) -> None:
    assert set(select(ATTRS, names)) == expected
    assert all(select(ATTRS, names)[k] is ATTRS[k] for k in expected)
    assert select({}, names) == {}


# -- message ids -------------------------------------------------------------------------


def test_message_id_is_a_uuid_of_the_item_id() -> None:
    """The item id's hex digits, the index in ten of them: unique, stable, and a
    valid batch entry id."""
    assert message_id("01a234fd5fe4-a5d80f0b77.0") == "01a234fd-5fe4-a5d8-0f0b-770000000000"
    assert message_id("01a234fd5fe4-a5d80f0b77.4660") == "01a234fd-5fe4-a5d8-0f0b-770000001234"
    ids = {message_id(f"01a234fd5fe4-a5d80f0b77.{n}") for n in range(1000)} | \
        {message_id(f"01a234fd5fe4-a5d80f0b78.{n}") for n in range(1000)}
    assert len(ids) == 2000
    assert all(str(uuid.UUID(i)) == i and len(i) == 36 for i in ids)


def test_message_id_of_an_unknown_form_is_still_a_uuid() -> None:
    odd = [message_id(i) for i in ("not-an-item", "01a234fd5fe4-a5d80f0b77.99999999999999")]
    assert all(str(uuid.UUID(i)) == i for i in odd) and odd[0] != odd[1]
    assert message_id("not-an-item") == odd[0]


def test_trace_header_is_kept_only_when_sqs_could_keep_it() -> None:
    assert trace_header("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1") == \
        "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    assert [trace_header(v) for v in (None, "", "Root=\x00", "Root=\udcff")] == [None] * 4


# -- --sqs-unsigned ----------------------------------------------------------------------


@pytest.mark.parametrize("keys", [{"require_api_keys": True}, {"api_keys": "operator-key"}])
def test_sqs_unsigned_is_refused_where_api_keys_are_asked(keys: dict[str, Any]) -> None:
    """Unsigned SQS requests act with every right in the namespace: beside API keys
    they would walk round them, so the settings refuse the pair, naming both."""
    with pytest.raises(ValidationError) as err:
        Settings(store="memory://", sqs_unsigned=True, **keys)
    assert "--sqs-unsigned cannot go with --api-keys or --require-api-keys" in str(err.value)
    assert Settings(store="memory://", sqs_unsigned=True).sqs_unsigned  # alone: allowed
    assert Settings(store="memory://", sqs_unsigned=True, sqs=False, **keys)  # no SQS API
    assert Settings(store="memory://", sqs_keys="AKID:secret", **keys).sqs_keys
