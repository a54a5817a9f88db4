"""SQS's two wire protocols, reduced to one shape.

The JSON protocol (``X-Amz-Target: AmazonSQS.<Action>``, what boto3 sends today)
carries parameters as the API reference names them; the query protocol (form
``Action=...``, older SDKs) flattens them (``Attribute.1.Name``,
``SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue``). Both are
parsed into the JSON protocol's shape, and a reply (a dict of that shape) is
rendered back as JSON or as the query protocol's XML. The actions never see which.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from xml.sax.saxutils import escape as _escape

from okq.sqs.errors import SqsError

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
XML_NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

# -- the query protocol's parameters -------------------------------------------------

#: Flattened lists of maps: name in the query -> (name in JSON, key field, value field).
_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
}
#: Flattened lists: name in the query -> name in JSON.
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
}
_ENTRIES = re.compile(r"\w+BatchRequestEntry")
_INDEX = re.compile(r"[1-9][0-9]{0,3}")


def from_query(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The query protocol's parameters (without ``Action`` and ``Version``) in the
    JSON protocol's shape. A repeated or malformed name is MalformedQueryString."""
    tree: dict[str, Any] = {}
    for name, value in pairs:
        parts = name.split(".")
        node = tree
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SqsError("MalformedQueryString", f"parameter {name} is repeated")
            node = child
        if parts[-1] in node or not all(parts):
            raise SqsError("MalformedQueryString", f"parameter {name} is repeated or malformed")
        node[parts[-1]] = value
    return _shape(tree, "")


def _numbered(node: Any, name: str) -> list[Any]:
    """``{"1": a, "2": b}`` as ``[a, b]``, in index order."""
    if not isinstance(node, dict) or not all(_INDEX.fullmatch(k) for k in node):
        raise SqsError("MalformedQueryString", f"{name} must be followed by .1, .2, ...")
    return [node[k] for k in sorted(node, key=int)]


def _shape(tree: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, node in tree.items():
        here = f"{where}{key}"
        if key in _MAPS:
            name, k, v = _MAPS[key]
            out[name] = {}
            for entry in _numbered(node, here):
                if not isinstance(entry, dict) or k not in entry:
                    raise SqsError("MissingParameter", f"{here}.N.{k} is required")
                if not isinstance(entry[k], str):
                    raise SqsError("MalformedQueryString", f"{here}.N.{k} must be a value")
                value = entry.get(v, "")
                out[name][entry[k]] = _shape(value, here + ".") if isinstance(value, dict) \
                    else value
        elif key in _LISTS:
            out[_LISTS[key]] = [_leaf(x, here) for x in _numbered(node, here)]
        elif _ENTRIES.fullmatch(key):
            out["Entries"] = [_shape(e, here + ".") if isinstance(e, dict) else
                              _malformed(here) for e in _numbered(node, here)]
        else:
            out[key] = _shape(node, here + ".") if isinstance(node, dict) else node
    return out


def _leaf(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise SqsError("MalformedQueryString", f"{name}.N must be a value")
    return value


def _malformed(name: str) -> dict[str, Any]:
    raise SqsError("MalformedQueryString", f"{name}.N must have fields")


def from_json(body: bytes) -> dict[str, Any]:
    """The JSON protocol's body: one object (an empty body is no parameters)."""
    if not body.strip():
        return {}
    try:
        params = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SqsError("SerializationException", f"the body is not valid JSON: {reason}") \
            from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "the body must be a JSON object")
    try:  # a lone surrogate escape (\\ud800 to \\udfff) is no character: it cannot be kept
        json.dumps(params, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise SqsError("SerializationException", "the body's text must be valid Unicode "
                       "(a lone surrogate escape is not)") from None
    return params


# -- replies --------------------------------------------------------------------------


def json_error(err: SqsError) -> tuple[bytes, dict[str, str]]:
    """The JSON protocol's error: body and headers (boto3 reads the query code from
    ``x-amzn-query-error``, and the exception class from ``__type``)."""
    body = json.dumps({"__type": f"com.amazonaws.sqs#{err.shape}", "message": err.message})
    fault = "Sender" if err.sender_fault else "Receiver"
    return body.encode(), {"x-amzn-query-error": f"{err.code};{fault}"}


def xml_error(err: SqsError, request_id: str) -> bytes:
    fault = "Sender" if err.sender_fault else "Receiver"
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{XML_NAMESPACE}"><Error>'
            f"<Type>{fault}</Type><Code>{escape(err.code)}</Code>"
            f"<Message>{escape(err.message)}</Message><Detail/></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>").encode()


#: How a JSON reply's member is written in XML: a repeated element per entry.
_XML_LISTS = {
    "Messages": "Message",
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}
_XML_MAPS = {  # member -> (element, key element, value element)
    "Attributes": ("Attribute", "Name", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
}


#: Actions whose reply has no result element (SQS models no output for them). Every
#: other action's reply carries ``<{Action}Result>``, empty or not: a query-protocol
#: client looks for it (botocore raises KeyError on an empty ReceiveMessage without it).
NO_RESULT = frozenset({"AddPermission", "ChangeMessageVisibility", "DeleteMessage",
                       "DeleteQueue", "PurgeQueue", "RemovePermission",
                       "SetQueueAttributes", "TagQueue", "UntagQueue"})


def xml_reply(action: str, result: dict[str, Any], request_id: str) -> bytes:
    """The query protocol's reply to ``action``."""
    body = "".join(_xml_member(action, k, v) for k, v in result.items())
    wrapped = "" if action in NO_RESULT and not result else \
        f"<{action}Result>{body}</{action}Result>"
    return (f'<?xml version="1.0"?><{action}Response xmlns="{XML_NAMESPACE}">{wrapped}'
            f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
            f"</{action}Response>").encode()


def _xml_member(action: str, key: str, value: Any) -> str:
    if key == "Successful":
        return "".join(_xml_element(f"{action}ResultEntry", v) for v in value)
    if key in _XML_LISTS:
        return "".join(_xml_element(_XML_LISTS[key], v) for v in value)
    if key in _XML_MAPS:
        element, k, v = _XML_MAPS[key]
        return "".join(_xml_element(element, {k: name, v: val}) for name, val in value.items())
    return _xml_element(key, value)


#: What XML 1.0 cannot carry at all, even escaped: shown as U+FFFD.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


#: Characters a parser would not give back as sent: XML normalises a raw carriage
#: return (and CR LF) to a line feed, so it is written as a character reference, as
#: SQS writes it.
_REFERENCES = {"\r": "&#xD;"}


def escape(text: str) -> str:
    """``text`` as XML character data: escaped (a carriage return as ``&#xD;``, which
    a parser gives back as sent), and what XML cannot hold replaced."""
    return _escape(_NOT_XML.sub("\ufffd", text), _REFERENCES)


def _xml_element(name: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = "".join(_xml_member("", k, v) for k, v in value.items())
    elif isinstance(value, bool):
        inner = "true" if value else "false"
    else:
        inner = escape(str(value))
    return f"<{name}>{inner}</{name}>"
