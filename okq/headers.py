"""Item headers: string names to string values that travel with an item, and where
an item's ``meta`` keeps them.

A header is exactly what the SQS API accepts as a message attribute of type
``String``, so that the two are one thing: native headers are received over SQS
as String message attributes, and an SQS message's String attributes are leased
and browsed through the native API as headers. The rules (``okq.limits``): at most
``MAX_HEADERS`` of them, names of 1 to 256 letters, digits, ``_``, ``-`` and ``.``
(no ``..``, not starting or ending with ``.``, not starting with ``AWS.`` or
``Amazon.``), non-empty values of the characters SQS allows, and at most
``MAX_HEADERS_BYTES`` of names and values in all (UTF-8).

Stored: the native API keeps headers in ``meta["headers"]``; the SQS API keeps its
message attributes, typed, in ``meta["sqs"]["attrs"]`` (``{name: [type, value]}``,
okq/sqs/messages.py), as it always did, so that a node that predates headers still
serves them over SQS. Each front end reads both: :func:`headers_of` is the headers
an item shows, :func:`native_headers` those the SQS API adds to its attributes.
Dead-lettering, redrive, retries and compactor merges keep ``meta`` whole, and
headers with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from okq.limits import MAX_HEADERS, MAX_HEADERS_BYTES

#: Where an item's meta keeps native headers, and the SQS API's own fields.
HEADERS_KEY = "headers"
SQS_KEY = "sqs"
#: The characters SQS accepts in a body or attribute value (XML 1.0's).
BAD_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,256}")


def valid_name(name: Any) -> bool:
    """Whether ``name`` is a header's (and an SQS message attribute's) name."""
    return (isinstance(name, str) and _NAME.fullmatch(name) is not None and ".." not in name
            and not name.startswith(".") and not name.endswith(".")
            and not name.lower().startswith(("aws.", "amazon.")))


def check_headers(value: Any) -> dict[str, str]:
    """``value`` as headers; ValueError saying what is wrong (the caller names the field)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be an object of string names to string values")
    if len(value) > MAX_HEADERS:
        raise ValueError(f"holds {len(value)} headers; the limit is {MAX_HEADERS}")
    size = 0
    for name, text in value.items():
        if not valid_name(name):
            raise ValueError(f"{str(name)[:40]!r} is not a header name: 1 to 256 letters, "
                             "digits, '_', '-' and '.', no '..', not starting or ending with "
                             "'.', not starting with 'AWS.' or 'Amazon.'")
        if not isinstance(text, str) or not text:
            raise ValueError(f"header {name!r} must be a non-empty string")
        if BAD_CHARS.search(text):
            raise ValueError(f"header {name!r} holds a control character or a lone surrogate")
        size += len(name) + len(text.encode())
    if size > MAX_HEADERS_BYTES:
        raise ValueError(f"names and values are {size} bytes; the limit is {MAX_HEADERS_BYTES}")
    return dict(value)


def with_headers(meta: dict[str, Any] | None,
                 headers: Mapping[str, str] | None) -> dict[str, Any] | None:
    """``meta`` with ``headers`` kept in it (unchanged when there are none)."""
    if not headers:
        return meta
    return {**(meta or {}), HEADERS_KEY: dict(headers)}


def native_headers(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """The headers the native API stored in ``meta``."""
    kept = meta.get(HEADERS_KEY) if meta else None
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, str)}


def sqs_string_attributes(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """The message attributes of type ``String`` the SQS API stored in ``meta``."""
    sqs = meta.get(SQS_KEY) if meta else None
    attrs = sqs.get("attrs") if isinstance(sqs, dict) else None
    if not isinstance(attrs, dict):
        return {}
    return {k: kept[1] for k, kept in attrs.items()
            if isinstance(kept, list) and len(kept) == 2 and kept[0] == "String"
            and isinstance(kept[1], str)}


def headers_of(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """The headers an item shows: its native headers and its SQS String attributes."""
    if not meta:
        return {}
    return {**sqs_string_attributes(meta), **native_headers(meta)}


def split_meta(meta: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """An item's meta as the native API shows it (without its headers) and its headers."""
    if not meta:
        return meta, {}
    headers = headers_of(meta)
    if HEADERS_KEY in meta:
        meta = {k: v for k, v in meta.items() if k != HEADERS_KEY} or None
    return meta, headers
