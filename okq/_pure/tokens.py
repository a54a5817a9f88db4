"""Lease tokens (receipt handles): who may renew, complete or retry a delivery.

A token names one delivery: (namespace, queue, segment, index, delivery
counter ``v``). It is signed under the fleet-wide key list: the first key
signs, every key verifies, so keys rotate by prepending a new one and later
dropping the old. The namespace is inside the signed text, so a token from one
namespace is refused in another. ``kid`` is the first 4 bytes of SHA-256 of the
signing key.

Two layouts; every node verifies both, and signs the one its signer was made
for (``TokenSigner(keys, version=...)``, ``--token-format``):

* version 2 (the default): ``HEAD "." index "." v "." MAC`` where ``HEAD`` is
  ``base64url(msgpack([kid, ns, queue, segment]))``, ``index`` and ``v`` are
  canonical decimals (no "+", no leading zero, "-" only before a non-zero
  number; okq's own are never negative), and ``MAC`` is 32 lowercase hex digits:
  keyed BLAKE2b (16-byte digest, personalisation ``okq-token-v2``) of the
  token's text before its last dot. A lease's tokens of one segment share
  ``HEAD`` and the MAC state after it, so each costs a format and a hash.
* version 1: ``base64url(msgpack([kid, ns, queue, segment, index, v])) "."
  base64url(mac[:16])`` with HMAC-SHA256 (from ``cryptography``); what nodes
  before version 2 sign and the only one they read.

This is the pure-Python implementation and the source of the compiled one:
callers reach either through okq/tokens.py.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac as std_hmac
import importlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
from cryptography.hazmat.primitives import constant_time, hashes, hmac
from mypy_extensions import mypyc_attr

from okq.errors import InvalidRequest, InvalidToken

__all__ = ["FORMATS", "MAC_BYTES", "Delivery", "TokenSigner", "by_lease_object", "generate_key",
           "key_id", "shared_head"]

MAC_BYTES: Final = 16
#: The token layouts every node reads; a signer writes one of them.
FORMATS: Final = (1, 2)
_PERSON_V2: Final = b"okq-token-v2"
#: One packer for every token (msgpack.packb makes one per call; ``pack`` holds the GIL).
_PACKER: Final = msgpack.Packer(use_bin_type=True)


def _c_signer() -> Any:
    """The C signer of version 2 tokens (okq/_native/signv2.c), for this module as
    the build compiled it; None for the pure module, or a build without it."""
    if __name__ != "okq._compiled.tokens":
        return None
    try:
        return importlib.import_module("okq._compiled.signv2").sign
    except ImportError:
        return None


#: ``sign(key, person, prefix, deliveries, minted, head)``: the tokens
#: ``_sign_many_v2`` makes, and its records, made in C; None: made here.
_C_SIGN: Any = _c_signer()


@dataclass(slots=True, unsafe_hash=True, init=False)
class Delivery:
    """What a token names; never changed once made. Not ``frozen``: a lease of 100
    items makes 100 of these, and a frozen dataclass takes four times as long to
    make (each field set through ``object.__setattr__``). ``__init__`` is written
    out: a compiled build makes it native (a generated one is interpreted, 200 ns
    against 35)."""

    namespace: str
    queue: str
    segment: str
    index: int
    v: int

    def __init__(self, namespace: str, queue: str, segment: str, index: int, v: int) -> None:
        self.namespace = namespace
        self.queue = queue
        self.segment = segment
        self.index = index
        self.v = v


#: What the record of minted tokens keeps of each: a Delivery's fields, in order.
_Named = tuple[str, str, str, int, int]

_TO_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE: Final = bytes.maketrans(b"-_", b"+/")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).translate(_TO_URLSAFE).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Strict: only the canonical encoding decodes, so no two strings name one token."""
    raw = text.encode("ascii")  # UnicodeEncodeError is a ValueError
    if b"+" in raw or b"/" in raw:
        raise ValueError("not base64url")
    data = binascii.a2b_base64(raw.translate(_FROM_URLSAFE) + b"=" * (-len(raw) % 4),
                               strict_mode=True)
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


def _mac_bytes(text: str) -> bytes | None:
    """The MAC a token's second part spells, or None when it spells no MAC at all."""
    try:
        mac = _unb64(text)
    except ValueError:  # binascii.Error and non-ASCII text are ValueErrors
        return None
    return mac if len(mac) == MAC_BYTES else None


#: A token body is a msgpack array of six: [kid, namespace, queue, segment, index, v].
_HEAD: Final = b"\x96"
_SMALL_INTS: Final[list[bytes]] = [_PACKER.pack(i) for i in range(4096)]


def _packed_int(value: int) -> bytes:
    if 0 <= value < 4096:
        return _SMALL_INTS[value]
    packed: bytes = _PACKER.pack(value)
    return packed


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:4]


@mypyc_attr(native_class=False)  # compiled methods, but an instance's can be replaced (tests)
class TokenSigner:
    #: Tokens this signer minted lately, and what they name: a completion usually
    #: reaches the node that leased, and a token this process signed needs no MAC
    #: check (its key list never changes). Bounded: older tokens verify the long way.
    #: Kept in two plain dicts of up to half as many each, the newer filling while
    #: the older is read too; when the newer is full the older is dropped whole
    #: (an ordered dict that forgets one entry at a time costs more per insert).
    #: Each is kept as a tuple (namespace, queue, segment, index, v), not a Delivery:
    #: a tuple of strings and ints leaves the cyclic collector's sight at its first
    #: collection, where tens of thousands of Delivery objects made each full
    #: collection of a busy node's heap milliseconds longer.
    REMEMBER = 50_000

    def __init__(self, keys: list[bytes], version: int = 2) -> None:
        if version not in FORMATS:
            raise ValueError(f"token format {version} is not one of {FORMATS}")
        if not keys:
            raise ValueError("at least one signing key is needed")
        for key in keys:
            if len(key) < 16:
                raise ValueError("signing keys must be at least 16 bytes")
        self.keys = list(keys)
        self._by_id = {key_id(k): k for k in reversed(self.keys)}
        # One keyed HMAC per key, copied per token: keying costs more than hashing.
        self._hmacs = {k: hmac.HMAC(k, hashes.SHA256()) for k in self.keys}
        self._blakes = {k: hashlib.blake2b(key=k, digest_size=MAC_BYTES, person=_PERSON_V2)
                        for k in self.keys}
        self.version = version
        self._kid = key_id(self.keys[0])
        self._minted: dict[str, _Named] = {}
        self._older: dict[str, _Named] = {}

    def _mac(self, key: bytes, body: bytes) -> bytes:
        h = self._hmacs[key].copy()
        h.update(body)
        return h.finalize()[:MAC_BYTES]

    def sign(self, d: Delivery) -> str:
        return self.sign_many(d.namespace, d.queue, d.segment, [(d.index, d.v)])[0]

    def sign_many(self, namespace: str, queue: str, segment: str,
                  deliveries: Sequence[tuple[int, int]]) -> list[str]:
        """Tokens for deliveries ``(index, v)`` of one segment: each the token
        :meth:`sign` gives, with the shared head (and in version 2 its MAC state)
        made once."""
        if self.version == 2:
            return self._sign_many_v2(namespace, queue, segment, deliveries)
        head: bytes = _HEAD + _PACKER.pack(self._kid) + _PACKER.pack(namespace) + \
            _PACKER.pack(queue) + _PACKER.pack(segment)
        keyed = self._hmacs[self.keys[0]]
        minted = self._minted
        tokens: list[str] = []
        for index, v in deliveries:
            body = head + _packed_int(index) + _packed_int(v)
            h = keyed.copy()
            h.update(body)
            token = f"{_b64(body)}.{_b64(h.finalize()[:MAC_BYTES])}"
            minted[token] = (namespace, queue, segment, index, v)
            tokens.append(token)
        self._forget_oldest()
        return tokens

    def _sign_many_v2(self, namespace: str, queue: str, segment: str,
                      deliveries: Sequence[tuple[int, int]]) -> list[str]:
        prefix = _b64(_PACKER.pack([self._kid, namespace, queue, segment])) + "."
        c_sign = _C_SIGN
        if c_sign is not None and type(deliveries) is list:
            try:
                tokens: list[str] = c_sign(self.keys[0], _PERSON_V2, prefix, deliveries,
                                           self._minted, (namespace, queue, segment))
            except (OverflowError, TypeError):
                pass  # an index past 2**63 - 1, or not a list of tuples: signed below
            else:
                self._forget_oldest()
                return tokens
        keyed = self._blakes[self.keys[0]].copy()
        keyed.update(prefix.encode())
        minted = self._minted
        tokens = []
        for index, v in deliveries:
            tail = f"{index}.{v}"
            h = keyed.copy()
            h.update(tail.encode())
            token = f"{prefix}{tail}.{h.hexdigest()}"
            minted[token] = (namespace, queue, segment, index, v)
            tokens.append(token)
        self._forget_oldest()
        return tokens

    def _forget_oldest(self) -> None:
        """Keep the record of minted tokens to its bound, the older half leaving together."""
        if len(self._minted) >= self.REMEMBER // 2:
            self._older = self._minted
            self._minted = {}

    def verify(self, token: object, namespace: str, field: str = "token") -> Delivery:
        """Return the delivery a token names, or raise InvalidToken."""
        if not isinstance(token, str):  # a compiled build checks its arguments' types
            raise InvalidToken(f"{field} is not an okq lease token", field=field)
        return self.verify_many([token], namespace, None,
                                field.replace("{", "{{").replace("}", "}}"))[0]

    def verify_many(self, tokens: Sequence[object], namespace: str, queue: str | None,
                    field_pattern: str) -> list[Delivery]:
        """:meth:`verify` each of ``tokens`` (the n-th's field is
        ``field_pattern.format(n=n)``, made only for an error); with ``queue``, each
        must name that queue. Raises for the first that fails."""
        minted, older = self._minted, self._older
        out: list[Delivery] = []
        for n, token in enumerate(tokens):
            if not isinstance(token, str):
                field = field_pattern.format(n=n)
                raise InvalidRequest(f"{field} must be a string", field=field)
            named = minted.get(token)
            if named is None:
                named = older.get(token)
            if named is not None and named[0] == namespace:
                d = Delivery(named[0], named[1], named[2], named[3], named[4])
            else:
                d = self._verify(token, namespace, field_pattern.format(n=n))
            if queue is not None and d.queue != queue:
                field = field_pattern.format(n=n)
                raise InvalidToken(f"{field} belongs to queue {d.queue!r}, not {queue!r}",
                                   field=field)
            out.append(d)
        return out

    def _verify(self, token: str, namespace: str, field: str) -> Delivery:
        if token.count(".") == 3:
            return self._verify_v2(token, namespace, field)
        try:
            body_text, mac_text = token.split(".")
            body = _unb64(body_text)
            kid, ns, queue, segment, index, v = msgpack.unpackb(body)
        except Exception as exc:
            raise InvalidToken(f"{field} is not an okq lease token", field=field) from exc
        key = self._by_id.get(kid) if isinstance(kid, bytes) else None
        if key is None:
            raise InvalidToken(f"{field} was signed with an unknown key", field=field)
        # From here the token is well formed: whatever is wrong with its MAC text
        # (an edited character, a cut, a non-canonical spelling) is a bad signature.
        mac = _mac_bytes(mac_text)
        if mac is None or not constant_time.bytes_eq(self._mac(key, body), mac):
            raise InvalidToken(f"{field} has a bad signature", field=field)
        if ns != namespace:
            raise InvalidToken(f"{field} belongs to another namespace", field=field)
        if not (isinstance(queue, str) and isinstance(segment, str) and isinstance(index, int)
                and isinstance(v, int)):
            raise InvalidToken(f"{field} is malformed", field=field)
        return Delivery(ns, queue, segment, index, v)

    def _verify_v2(self, token: str, namespace: str, field: str) -> Delivery:
        signed, _, mac = token.rpartition(".")
        head_text, index_text, v_text = signed.split(".")
        try:
            head = msgpack.unpackb(_unb64(head_text))
        except Exception as exc:
            raise InvalidToken(f"{field} is not an okq lease token", field=field) from exc
        index, v = _decimal(index_text), _decimal(v_text)
        if not isinstance(head, list) or len(head) != 4 or index is None or v is None:
            raise InvalidToken(f"{field} is not an okq lease token", field=field)
        kid, ns, queue, segment = head
        key = self._by_id.get(kid) if isinstance(kid, bytes) else None
        if key is None:
            raise InvalidToken(f"{field} was signed with an unknown key", field=field)
        h = self._blakes[key].copy()
        h.update(signed.encode())
        # Any MAC text but the exact lowercase hex spelling is a bad signature.
        if not std_hmac.compare_digest(h.hexdigest(), mac if mac.isascii() else ""):
            raise InvalidToken(f"{field} has a bad signature", field=field)
        if ns != namespace:
            raise InvalidToken(f"{field} belongs to another namespace", field=field)
        if not (isinstance(queue, str) and isinstance(segment, str)):
            raise InvalidToken(f"{field} is malformed", field=field)
        return Delivery(ns, queue, segment, index, v)


def _decimal(text: str) -> int | None:
    """A canonical decimal (ASCII digits, no leading zero, "-" only before a
    non-zero number, no "+", space or underscore), so that no two strings name
    one token; None for anything else."""
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()) or (len(digits) > 1 and digits[0] == "0") \
            or text == "-0":
        return None
    return int(text)


def by_lease_object(ds: list[Delivery]) -> list[tuple[str, str, list[int], list[Delivery]]]:
    """Deliveries by the lease object they change: (queue, segment, their positions in
    ``ds``, they), in the order each object is first named. A lease's tokens come
    back together, so a run of one segment is one group."""
    groups: dict[tuple[str, str], tuple[list[int], list[Delivery]]] = {}
    queue = segment = ""
    at: list[int] = []
    members: list[Delivery] = []
    for n, d in enumerate(ds):
        if not at or d.segment != segment or d.queue != queue:
            queue, segment = d.queue, d.segment
            found = groups.get((queue, segment))
            if found is None:
                at, members = [], []
                groups[(queue, segment)] = (at, members)
            else:
                at, members = found
        at.append(n)
        members.append(d)
    return [(key[0], key[1], group[0], group[1]) for key, group in groups.items()]


def shared_head(tokens: Sequence[object]) -> str | None:
    """The head that every one of ``tokens`` starts with (its text up to and with its
    first "."): the tokens of one lease of one segment share theirs. None when
    they do not all share one, or one is not a string."""
    if not tokens:
        return None
    first = tokens[0]
    if not isinstance(first, str):
        return None
    cut = first.find(".")
    if cut < 0:
        return None
    head = first[:cut + 1]
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(head):
            return None
    return head


def generate_key() -> bytes:
    """A fresh random signing key."""
    return secrets.token_bytes(32)
