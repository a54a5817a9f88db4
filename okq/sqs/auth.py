"""AWS Signature Version 4, verified as SQS verifies it.

A request names its key in the ``Authorization`` header's credential scope
(``AKID/20261201/us-east-1/sqs/aws4_request``); the node rebuilds the canonical
request from what arrived (method, path, query, the signed headers, the body's
SHA-256), derives the signing key from the key's secret and compares signatures in
constant time. A request dated more than 15 minutes from the node's clock is
refused, as SQS refuses it, so that a captured request cannot be replayed later.
Only header signatures are accepted (no presigned URLs); a signature must cover
``host`` and the body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, unquote_plus

from okq.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]{64})\s*$"
)
_UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Caller:
    """Who signed a request: the access key id (None: unsigned) and its namespace."""

    access_key: str | None
    namespace: str


@dataclass(frozen=True)
class Signed:
    """What a request carries, as received."""

    method: str
    raw_path: str  # the path as sent, %-escapes and all, without the query
    raw_query: str
    headers: Mapping[str, str]  # case-insensitive (aiohttp's CIMultiDictProxy)
    body: bytes


def verify(req: Signed, keys: Mapping[str, tuple[str, str]], *, unsigned_namespace: str | None,
           now: float | None = None) -> Caller:
    """The caller of ``req``, or SqsError. ``keys`` maps access key id -> (secret,
    namespace); ``unsigned_namespace`` is where unsigned requests act, if allowed."""
    header = req.headers.get("Authorization")
    if header is None:
        if "X-Amz-Signature" in req.raw_query:
            raise SqsError("IncompleteSignature", "okq accepts only signatures in the "
                           "Authorization header, not presigned URLs")
        if unsigned_namespace is not None:
            return Caller(None, unsigned_namespace)
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    m = _AUTH.match(header.strip())
    if m is None:
        raise SqsError("IncompleteSignature", "the Authorization header is not "
                       "'AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...'")
    access_key, scope = _credential(m["cred"])
    if access_key not in keys:
        raise SqsError("InvalidClientTokenId",
                       "The security token included in the request is invalid.")
    secret, namespace = keys[access_key]
    amz_date = _date(req.headers, scope[0], now)
    signed = m["signed"].split(";")
    if "host" not in signed:
        raise SqsError("IncompleteSignature", "the signature must cover the host header")
    canonical = _canonical_request(req, signed)
    # a header byte that is not UTF-8 reaches here as a lone surrogate: back to its byte
    raw = canonical.encode("utf-8", "surrogateescape")
    to_sign = "\n".join([ALGORITHM, amz_date, "/".join(scope), hashlib.sha256(raw).hexdigest()])
    expected = hmac.new(signing_key(secret, *scope[:3]), to_sign.encode(),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, m["sig"]):
        raise SqsError("SignatureDoesNotMatch",
                       "The request signature we calculated does not match the signature you "
                       "provided. Check your AWS Secret Access Key and signing method.")
    return Caller(access_key, namespace)


def _credential(cred: str) -> tuple[str, list[str]]:
    """``AKID/date/region/service/aws4_request`` -> (AKID, [date, region, service, ...])."""
    parts = cred.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]):
        raise SqsError("IncompleteSignature", f"malformed credential scope {cred!r}")
    if parts[3] != "sqs":
        raise SqsError("SignatureDoesNotMatch",
                       f"Credential should be scoped to correct service: 'sqs', not {parts[3]!r}")
    return parts[0], parts[1:]


def _date(headers: Mapping[str, str], scope_date: str, now: float | None) -> str:
    """The request's X-Amz-Date, checked against the scope and the node's clock."""
    amz_date = headers.get("X-Amz-Date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SqsError("IncompleteSignature",
                       "the request needs an X-Amz-Date header (YYYYMMDDTHHMMSSZ)") from None
    if amz_date[:8] != scope_date:
        raise SqsError("SignatureDoesNotMatch",
                       "the date of the credential scope is not the date of X-Amz-Date")
    skew = when.timestamp() - (time.time() if now is None else now)
    if abs(skew) > MAX_SKEW_S:
        clock = datetime.fromtimestamp(time.time() if now is None else now, UTC)
        raise SqsError("SignatureDoesNotMatch",
                       f"Signature expired: {amz_date} is more than 15 minutes from the "
                       f"server's time {clock:%Y%m%dT%H%M%SZ}")
    return amz_date


def _canonical_request(req: Signed, signed: list[str]) -> str:
    headers = []
    for name in signed:
        values: list[str] = req.headers.getall(name, []) if hasattr(req.headers, "getall") \
            else [v for v in [req.headers.get(name)] if v is not None]
        if not values:
            raise SqsError("IncompleteSignature", f"signed header {name!r} is missing")
        headers.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    payload = req.headers.get("X-Amz-Content-SHA256")
    actual = hashlib.sha256(req.body).hexdigest()
    if payload is not None and payload != actual:
        why = "an unsigned payload" if payload == _UNSIGNED else "a body hash that differs"
        raise SqsError("SignatureDoesNotMatch", f"the request has {why}: the body must be signed")
    return "\n".join([req.method.upper(), canonical_path(req.raw_path),
                      canonical_query(req.raw_query), "\n".join(headers) + "\n",
                      ";".join(signed), actual])


def canonical_path(raw_path: str) -> str:
    """The path as signers other than S3's normalise it: dot segments and empty
    segments removed, then escaped once more."""
    out: list[str] = []
    for part in raw_path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part and part != ".":
            out.append(part)
    path = "/" + "/".join(out)
    if raw_path.endswith("/") and out:
        path += "/"
    return quote(path, safe="/~")


def canonical_query(raw_query: str) -> str:
    pairs = []
    for pair in raw_query.split("&") if raw_query else []:
        key, _, value = pair.partition("=")
        # a form-encoded query writes a space as '+' (botocore signs it as %20)
        pairs.append((quote(unquote_plus(key), safe="-_.~"),
                      quote(unquote_plus(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key
