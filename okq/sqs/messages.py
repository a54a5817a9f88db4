"""Messages as SQS sees them: bodies, message attributes and their MD5 digests,
and how they are kept in an okq item.

An SQS message is an okq item whose payload is the body (UTF-8) and whose ``meta``
holds what SQS adds under the key ``sqs``: message attributes (binary values as
base64, so that the native API's JSON can show them), the trace header, the group
and deduplication ids and the sender's access key. Items produced through okq's
own API are received through SQS with their headers as message attributes of type
``String``, and String attributes are the native API's headers (okq/headers.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from okq.errors import InvalidRequest
from okq.headers import BAD_CHARS, SQS_KEY, native_headers, valid_name
from okq.keys import parse_item_id
from okq.sqs.errors import SqsError, invalid

_BAD_CHARS = BAD_CHARS  # the characters SQS accepts in a body or attribute value
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.\-]{1,245})?")
MAX_ATTRIBUTES = 10
META_KEY = SQS_KEY


@dataclass(frozen=True)
class Attribute:
    """One message attribute: its data type and its value (str, or bytes for Binary)."""

    data_type: str
    value: str | bytes

    @property
    def binary(self) -> bool:
        return self.data_type.startswith("Binary")

    def size(self, name: str) -> int:
        """Bytes it counts towards the message size, as SQS counts them."""
        raw = self.value if isinstance(self.value, bytes) else self.value.encode()
        return len(name.encode()) + len(self.data_type.encode()) + len(raw)

    def reply(self) -> dict[str, Any]:
        """As ``MessageAttributeValue`` in a reply."""
        if isinstance(self.value, bytes):
            return {"DataType": self.data_type,
                    "BinaryValue": base64.b64encode(self.value).decode()}
        return {"DataType": self.data_type, "StringValue": self.value}

    def keep(self) -> list[str]:
        """As kept in ``meta``: [type, value], binary values in base64."""
        if isinstance(self.value, bytes):
            return [self.data_type, base64.b64encode(self.value).decode()]
        return [self.data_type, self.value]

    @classmethod
    def kept(cls, raw: list[str]) -> Attribute:
        data_type, value = raw
        if data_type.startswith("Binary"):
            return cls(data_type, base64.b64decode(value))
        return cls(data_type, value)


def trace_header(value: str | None) -> str | None:
    """A request's ``X-Amzn-Trace-Id``, kept as its sends' ``AWSTraceHeader``; None
    when absent, empty or holding what SQS does not allow in a value (a load balancer
    may add the header: a send is not refused for it)."""
    if not value or _BAD_CHARS.search(value):
        return None
    return value


def check_body(body: Any, max_size: int) -> str:
    if body is None:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if not isinstance(body, str) or not body:
        raise invalid("The message body must be a non-empty string.")
    bad = _BAD_CHARS.search(body)
    if bad is not None:
        raise SqsError("InvalidMessageContents",
                       f"Invalid binary character '#x{ord(bad.group()):X}' was found in the "
                       "message body, the set of allowed characters is #x9 | #xA | #xD | "
                       "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    return body


def parse_attributes(raw: Any, *, system: bool = False) -> dict[str, Attribute]:
    """``MessageAttributes`` (or ``MessageSystemAttributes``) checked as SQS checks them."""
    if raw is None:
        return {}
    kind = "system attribute" if system else "attribute"
    if not isinstance(raw, dict):
        raise invalid(f"Message{'System' if system else ''}Attributes must be a map")
    if len(raw) > MAX_ATTRIBUTES:
        raise invalid(f"Number of message {kind}s [{len(raw)}] exceeds the allowed maximum "
                      f"[{MAX_ATTRIBUTES}].")
    return {name: _attribute(name, value, kind, system) for name, value in raw.items()}


def _attribute(name: Any, value: Any, kind: str, system: bool) -> Attribute:
    if system and name != "AWSTraceHeader":
        raise invalid(f"Message system attribute name '{name}' is invalid.")
    if not system:
        _check_name(name)
    if not isinstance(value, dict):
        raise invalid(f"The message {kind} '{name}' must have a value")
    data_type = value.get("DataType")
    if not isinstance(data_type, str) or not _DATA_TYPE.fullmatch(data_type):
        raise invalid(f"The message {kind} '{name}' has an invalid message attribute type, "
                      "the set of supported type prefixes is Binary, Number, and String.")
    if system and data_type != "String":
        raise invalid(f"The message system attribute '{name}' must be of type String")
    if data_type.startswith("Binary"):
        return Attribute(data_type, _binary(name, value.get("BinaryValue"), kind))
    text = value.get("StringValue")
    if not isinstance(text, str) or not text:
        raise invalid(f"Message {kind} '{name}' must contain a non-empty value of message "
                      f"attribute type '{data_type.split('.')[0]}'.")
    if _BAD_CHARS.search(text):
        raise SqsError("InvalidMessageContents",
                       f"Message {kind} '{name}' contains characters SQS does not allow")
    if data_type.startswith("Number"):
        _check_number(name, text)
    return Attribute(data_type, text)


def _check_name(name: Any) -> None:
    if not valid_name(name):
        raise invalid(f"Message attribute name '{name}' is invalid: 1 to 256 letters, digits, "
                      "'_', '-' and '.', no '..', not starting or ending with '.', not "
                      "starting with 'AWS.' or 'Amazon.'")


def _binary(name: str, value: Any, kind: str) -> bytes:
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"Message {kind} '{name}' has a BinaryValue that is not "
                          "base64") from None
    else:
        data = b""
    if not data:
        raise invalid(f"Message {kind} '{name}' must contain a non-empty value of message "
                      "attribute type 'Binary'.")
    return data


def _check_number(name: str, text: str) -> None:
    try:
        number = Decimal(text)
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite() or len(number.as_tuple().digits) > 38:
        raise invalid(f"Can't cast the value of message (user) attribute '{name}' to a "
                      "number.")


def message_id(item_id: str) -> str:
    """The SQS MessageId of an okq item: its id's 32 hex digits in a UUID's form.

    An item id is ``{created_ms:012x}-{10 random hex}.{index}``; the index is written
    in 10 hex digits, so the MessageId is as unique and as stable as the item id (and
    reads back to it), and is a valid batch entry id (``Id=MessageId`` is a common
    habit). An id of another form (none is made today) is hashed into a UUID."""
    try:
        segment, index = parse_item_id(item_id)
    except InvalidRequest:
        segment, index = "", -1
    if not 0 <= index < 16**10:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"okq-item:{item_id}"))
    digits = segment.replace("-", "") + f"{index:010x}"
    return str(uuid.UUID(hex=digits))


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, Attribute]) -> str:
    """SQS's digest of message attributes: each, by name, as length-prefixed name,
    data type, a transport byte (1 string, 2 binary) and length-prefixed value."""
    out = bytearray()
    for name in sorted(attributes):
        attr = attributes[name]
        for part in (name.encode(), attr.data_type.encode()):
            out += struct.pack(">I", len(part)) + part
        raw = attr.value if isinstance(attr.value, bytes) else attr.value.encode()
        out += (b"\x02" if attr.binary else b"\x01") + struct.pack(">I", len(raw)) + raw
    return hashlib.md5(bytes(out), usedforsecurity=False).hexdigest()


def select(attributes: Mapping[str, Attribute], names: list[str]) -> dict[str, Attribute]:
    """The attributes a receive asked for: ``All`` or ``.*``, names, and prefixes
    ``name.*``."""
    if not names or not attributes:
        return {}
    if "All" in names or ".*" in names:
        return dict(attributes)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    wanted = set(names)
    return {k: v for k, v in attributes.items()
            if k in wanted or (prefixes and k.startswith(prefixes))}


def stored(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """What SQS kept in an item's meta (empty for an item of the native API)."""
    kept = meta.get(META_KEY) if meta else None
    return kept if isinstance(kept, dict) else {}


def stored_attributes(kept: Mapping[str, Any]) -> dict[str, Attribute]:
    raw = kept.get("attrs")
    if not isinstance(raw, dict):
        return {}
    try:
        return {k: Attribute.kept(v) for k, v in raw.items()}
    except (ValueError, TypeError, binascii.Error):
        return {}


def message_attributes(meta: Mapping[str, Any] | None) -> dict[str, Attribute]:
    """An item's message attributes: those SQS kept, and its native headers as
    attributes of type ``String`` (an item has one or the other, by the front end
    that produced it; should a name be in both, SQS's typed attribute wins)."""
    headers = {k: Attribute("String", v) for k, v in native_headers(meta).items()}
    return {**headers, **stored_attributes(stored(meta))}
