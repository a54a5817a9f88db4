"""AWS Signature Version 4, verified as SQS verifies it.

A request names its key in the ``Authorization`` header's credential scope
(``AKID/20261201/us-east-1/sqs/aws4_request``); the node rebuilds the canonical
request from what arrived (method, path, query, the signed headers, the body's
SHA-256), derives the signing key from the key's secret and compares signatures in
constant time. A request dated more than 15 minutes from the node's clock is
refused, as SQS refuses it, so that a captured request cannot be replayed later.

A presigned URL (a request without an ``Authorization`` header; with one, the request
is header-signed and ``X-Amz-*`` query parameters are only parameters, under the
header's signature) carries the same signature in its query string (``X-Amz-Algorithm``,
``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-Expires``, ``X-Amz-SignedHeaders``,
``X-Amz-Signature``), over the query without ``X-Amz-Signature``; it is checked the
same way, and is refused once ``X-Amz-Expires`` seconds have passed since its date
(at most 7 days), or when dated more than 15 minutes ahead. A signature must cover
``host``, ``X-Amz-Target`` when sent, and the body (a presigned URL without a body
may be signed over ``UNSIGNED-PAYLOAD``, as botocore's presigner may sign it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, unquote_plus

from okq.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60
MAX_EXPIRES_S = 7 * 24 * 3600  # the longest a presigned URL may last, as in AWS
#: The query parameters of a presigned URL (X-Amz-Security-Token optional).
PRESIGN_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                  "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token")
_DATE = re.compile(r"\d{8}T\d{6}Z")
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


@dataclass(frozen=True)
class _Auth:
    """A request's signature, from its Authorization header or its query string."""

    credential: str
    signed: list[str]  # the signed headers' names, lower case
    signature: str
    amz_date: str
    expires: int | None  # seconds a presigned URL lasts (None: a header signature)


def verify(req: Signed, keys: Mapping[str, tuple[str, str]], *, unsigned_namespace: str | None,
           now: float | None = None) -> Caller:
    """The caller of ``req``, or SqsError. ``keys`` maps access key id -> (secret,
    namespace); ``unsigned_namespace`` is where unsigned requests act, if allowed."""
    auth = _signature(req)
    if auth is None:
        if unsigned_namespace is not None:
            return Caller(None, unsigned_namespace)
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    access_key, scope = _credential(auth.credential)
    if access_key not in keys:
        raise SqsError("InvalidClientTokenId",
                       "The security token included in the request is invalid.")
    secret, namespace = keys[access_key]
    _check_date(auth, scope[0], time.time() if now is None else now)
    if "host" not in auth.signed:
        raise SqsError("IncompleteSignature", "the signature must cover the host header")
    if "X-Amz-Target" in req.headers and "x-amz-target" not in auth.signed:
        raise SqsError("IncompleteSignature", "the signature must cover the X-Amz-Target "
                       "header, which names the action")
    key = signing_key(secret, *scope[:3])
    for payload in _payloads(req, auth):
        canonical = _canonical_request(req, auth, payload)
        # a header byte that is not UTF-8 reaches here as a lone surrogate: back to its byte
        raw = canonical.encode("utf-8", "surrogateescape")
        to_sign = "\n".join([ALGORITHM, auth.amz_date, "/".join(scope),
                             hashlib.sha256(raw).hexdigest()])
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, auth.signature):
            return Caller(access_key, namespace)
    raise SqsError("SignatureDoesNotMatch",
                   "The request signature we calculated does not match the signature you "
                   "provided. Check your AWS Secret Access Key and signing method.")


def _signature(req: Signed) -> _Auth | None:
    """The request's signature (None: unsigned); a malformed signature is
    IncompleteSignature. A request with an Authorization header is header-signed,
    whatever its query holds: its X-Amz-* query parameters are then parameters like
    any other, covered by the header's signature. Only a request without that header
    is read as a presigned URL."""
    header = req.headers.get("Authorization")
    if header is None:
        return _presigned(req.raw_query)
    m = _AUTH.match(header.strip())
    if m is None:
        raise SqsError("IncompleteSignature", "the Authorization header is not "
                       "'AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...'")
    amz_date = req.headers.get("X-Amz-Date", "")
    if not _DATE.fullmatch(amz_date):
        raise SqsError("IncompleteSignature",
                       "the request needs an X-Amz-Date header (YYYYMMDDTHHMMSSZ)")
    return _Auth(m["cred"], m["signed"].lower().split(";"), m["sig"], amz_date, None)


def _presigned(raw_query: str) -> _Auth | None:
    """The signature of a presigned URL: the X-Amz-* parameters of its query string
    (None if it has none)."""
    found: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True):
        if key in PRESIGN_PARAMS:
            if key in found:
                raise SqsError("IncompleteSignature", f"the query string repeats {key}")
            found[key] = value
    if not found.keys() & {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature"}:
        return None  # not presigned (another X-Amz-* parameter is only a parameter)
    missing = [k for k in PRESIGN_PARAMS if k not in found and k != "X-Amz-Security-Token"]
    if missing:
        raise SqsError("IncompleteSignature", f"a presigned URL needs {', '.join(missing)}")
    if found["X-Amz-Algorithm"] != ALGORITHM:
        raise SqsError("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}")
    if not re.fullmatch("[0-9a-f]{64}", found["X-Amz-Signature"]):
        raise SqsError("IncompleteSignature", "X-Amz-Signature must be 64 hex digits")
    if not _DATE.fullmatch(found["X-Amz-Date"]):
        raise SqsError("IncompleteSignature", "X-Amz-Date must be YYYYMMDDTHHMMSSZ")
    expires = found["X-Amz-Expires"]
    if not (expires.isascii() and expires.isdigit() and 1 <= int(expires) <= MAX_EXPIRES_S):
        raise SqsError("IncompleteSignature",
                       f"X-Amz-Expires must be a number of seconds from 1 to {MAX_EXPIRES_S}")
    return _Auth(found["X-Amz-Credential"], found["X-Amz-SignedHeaders"].lower().split(";"),
                 found["X-Amz-Signature"], found["X-Amz-Date"], int(expires))


def _credential(cred: str) -> tuple[str, list[str]]:
    """``AKID/date/region/service/aws4_request`` -> (AKID, [date, region, service, ...])."""
    parts = cred.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]):
        raise SqsError("IncompleteSignature", f"malformed credential scope {cred!r}")
    if parts[3] != "sqs":
        raise SqsError("SignatureDoesNotMatch",
                       f"Credential should be scoped to correct service: 'sqs', not {parts[3]!r}")
    return parts[0], parts[1:]


def _check_date(auth: _Auth, scope_date: str, now: float) -> None:
    """The signature's date against its scope and the node's clock: a header signature
    is refused more than 15 minutes away; a presigned URL is refused once expired, or
    when dated more than 15 minutes ahead."""
    if auth.amz_date[:8] != scope_date:
        raise SqsError("SignatureDoesNotMatch",
                       "the date of the credential scope is not the date of X-Amz-Date")
    when = datetime.strptime(auth.amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    clock = f"{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%SZ}"
    if auth.expires is not None and now > when + auth.expires:
        raise SqsError("RequestExpired", f"Request has expired: the presigned URL signed at "
                       f"{auth.amz_date} for {auth.expires} s ended before the server's time "
                       f"{clock}")
    too_old = auth.expires is None and now - when > MAX_SKEW_S
    if too_old or when - now > MAX_SKEW_S:
        raise SqsError("SignatureDoesNotMatch",
                       f"Signature expired: {auth.amz_date} is more than 15 minutes from the "
                       f"server's time {clock}")


def _payloads(req: Signed, auth: _Auth) -> list[str]:
    """The payload hashes the signature may use. The body must be signed; a presigned
    URL with no body may also have been signed over UNSIGNED-PAYLOAD (nothing is left
    unsigned then)."""
    actual = hashlib.sha256(req.body).hexdigest()
    declared = req.headers.get("X-Amz-Content-SHA256")
    if declared is not None and declared != actual and not (
            declared == _UNSIGNED and auth.expires is not None and not req.body):
        why = "an unsigned payload" if declared == _UNSIGNED else "a body hash that differs"
        raise SqsError("SignatureDoesNotMatch", f"the request has {why}: the body must be signed")
    if auth.expires is not None and not req.body:
        return [actual, _UNSIGNED]
    return [actual]


def _canonical_request(req: Signed, auth: _Auth, payload: str) -> str:
    headers = []
    for name in auth.signed:
        values: list[str] = req.headers.getall(name, []) if hasattr(req.headers, "getall") \
            else [v for v in [req.headers.get(name)] if v is not None]
        if not values:
            raise SqsError("IncompleteSignature", f"signed header {name!r} is missing")
        headers.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    query = req.raw_query if auth.expires is None else _without_signature(req.raw_query)
    return "\n".join([req.method.upper(), canonical_path(req.raw_path),
                      canonical_query(query), "\n".join(headers) + "\n",
                      ";".join(auth.signed), payload])


def _without_signature(raw_query: str) -> str:
    """A presigned URL's query as it was signed: without its X-Amz-Signature."""
    return "&".join(p for p in raw_query.split("&")
                    if unquote_plus(p.partition("=")[0]) != "X-Amz-Signature")


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
