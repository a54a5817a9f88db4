"""API keys: who may do what, in which namespace, on which queues.

A key has a role and acts in one namespace, on queues whose names start with one
of its prefixes (none: every queue of the namespace):

=============  ==============================================================
role           may call
=============  ==============================================================
``admin``      everything in its namespace, keys included
``producer``   ``queue.produce``, and the reads
``consumer``   ``queue.lease``, ``renew``, ``complete``, ``retry``, and the reads
``read-only``  the reads: ``queue.stats``, ``queues.list``, ``queues.info``,
               ``items.list``, ``auth.whoami``, ``fleet.status``
=============  ==============================================================

Keys are made by an admin (``keys.create``, ``okq keys create``) and kept in the
store at ``_auth/keys/{id}``, outside every namespace, as the SHA-256 of their
secret: whoever reads the bucket learns who may do what, not a usable key. A key
reads ``okq_<id>_<secret>``; a node finds it by its id and compares hashes in
constant time. Nodes remember a key they looked up for ``ttl`` seconds (5 by
default), so a deleted key stops working on every node within that long.

The node's ``--api-keys`` are operator keys: admin in every namespace (a request
names its namespace with ``X-Okq-Namespace``, the node's own by default). They
make the first keys of a namespace. While no operator key is set and
``--require-api-keys`` is off, a request without a key acts as admin in the
node's namespace, as before access control existed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgpack

from okq.errors import Forbidden, FormatError, InvalidRequest, ObjectNotFound, Unauthorized
from okq.keys import API_KEYS_PREFIX, api_key_key, check_name
from okq.store import Store, list_all

ROLES = ("admin", "producer", "consumer", "read-only")
READS = frozenset({"queue.stats", "queues.list", "queues.info", "items.list", "auth.whoami",
                   "fleet.status"})
#: The operations of each role (``/v1/<operation>``).
ALLOWED: dict[str, frozenset[str]] = {
    "admin": frozenset({"*"}),
    "producer": READS | {"queue.produce"},
    "consumer": READS | {"queue.lease", "queue.renew", "queue.complete", "queue.retry"},
    "read-only": READS,
}
KEY_RE = re.compile(r"okq_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
MAX_PREFIXES = 20
#: Keys a node remembers (found and not found), oldest forgotten first.
CACHE_SIZE = 10_000


#: The request header that names the namespace a request acts in (an operator key's
#: choice; a namespace key's own, which the header may repeat but not change).
NAMESPACE_HEADER = "X-Okq-Namespace"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as. ``namespace`` None: any (an operator key)."""

    key_id: str
    role: str
    namespace: str | None
    prefixes: tuple[str, ...] = ()

    def may(self, operation: str) -> bool:
        allowed = ALLOWED[self.role]
        return "*" in allowed or operation in allowed

    def covers(self, queue: str) -> bool:
        return not self.prefixes or queue.startswith(self.prefixes)

    def check_queue(self, queue: str, field: str) -> None:
        """Forbidden unless this key may act on ``queue``."""
        if not self.covers(queue):
            raise Forbidden(f"this key acts only on queues starting with "
                            f"{', '.join(map(repr, self.prefixes))}; {field} is {queue!r}",
                            field=field)

    def within(self, prefixes: list[str]) -> bool:
        """Whether every queue that ``prefixes`` allow, this key allows too (a key
        makes, lists and deletes only keys no wider than itself)."""
        if not self.prefixes:
            return True
        return bool(prefixes) and all(p.startswith(self.prefixes) for p in prefixes)

    def check_namespace(self, namespace: str, field: str = NAMESPACE_HEADER) -> None:
        """Forbidden unless this key acts in ``namespace`` (named by ``field``): the
        details name the field, the namespace asked for and the key's own."""
        if self.namespace is not None and namespace != self.namespace:
            raise Forbidden(f"this key acts in namespace {self.namespace!r}, not {namespace!r}",
                            field=field, namespace=namespace, key_namespace=self.namespace)


def open_principal() -> Principal:
    """A request without a key on a node that asks for none: anything, anywhere
    (development, or a node only trusted clients can reach)."""
    return Principal("(none)", "admin", None)


@dataclass(frozen=True)
class StoredKey:
    """A key as the store keeps it: its secret's hash, never the secret."""

    id: str
    namespace: str
    role: str
    prefixes: tuple[str, ...]
    hash: str
    created_ms: int
    name: str = ""

    def principal(self) -> Principal:
        return Principal(self.id, self.role, self.namespace, self.prefixes)

    def encode(self) -> bytes:
        body = {"f": "apikey", "v": 1, "id": self.id, "ns": self.namespace, "role": self.role,
                "prefixes": list(self.prefixes), "hash": self.hash,
                "created": self.created_ms, "name": self.name}
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    @classmethod
    def decode(cls, data: bytes) -> StoredKey:
        try:
            raw = msgpack.unpackb(data, raw=False)
            if not isinstance(raw, dict) or raw.get("f") != "apikey" or raw.get("v") != 1:
                raise ValueError("not an API key object of version 1")
            key = cls(str(raw["id"]), str(raw["ns"]), str(raw["role"]),
                      tuple(str(p) for p in raw["prefixes"]), str(raw["hash"]),
                      int(raw["created"]), str(raw.get("name", "")))
        except (ValueError, KeyError, TypeError, msgpack.ExtraData) as exc:
            raise FormatError(f"malformed API key object: {exc}", data=data) from None
        if key.role not in ROLES:
            raise FormatError(f"API key {key.id} has an unknown role {key.role!r}", data=data)
        return key


def _not_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_new_key(role: str, prefixes: list[str], name: str) -> None:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}; got {role!r}",
                             field="role")
    if len(prefixes) > MAX_PREFIXES:
        raise InvalidRequest(f"prefixes: at most {MAX_PREFIXES}", field="prefixes")
    for n, prefix in enumerate(prefixes):
        if not prefix or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", prefix):
            raise InvalidRequest(f"prefixes[{n}] must be 1-128 letters, digits, '.', '_' or "
                                 f"'-'; got {prefix!r}", field=f"prefixes[{n}]")
    if len(name) > 200:
        raise InvalidRequest("name: at most 200 characters", field="name")


class KeyRing:
    """The keys a node accepts: its operator keys and the store's keys (cached)."""

    def __init__(self, store: Store, operator_keys: frozenset[str], *, required: bool,
                 ttl: float = 5.0) -> None:
        self.store = store
        self.operator = {digest(k): k for k in operator_keys}
        self.required = required or bool(operator_keys)
        self.ttl = ttl
        self._cache: OrderedDict[str, tuple[StoredKey | None, float]] = OrderedDict()

    async def principal(self, presented: str) -> Principal:
        """Who ``presented`` is; Unauthorized for anything that is not a live key.

        A header's bytes that are not UTF-8 reach here as lone surrogates (how
        aiohttp decodes them): such a string is no key, and cannot be hashed."""
        if _not_utf8(presented):
            raise Unauthorized("a valid API key is required: the one presented is not "
                               "UTF-8 text", field="Authorization")
        found = self._operator(presented)
        if found is not None:
            return found
        m = KEY_RE.fullmatch(presented)
        key = await self._lookup(m[1]) if m else None
        if key is None or not hmac.compare_digest(key.hash, digest(m[2] if m else "")):
            raise Unauthorized("a valid API key is required: this one is unknown, deleted or "
                               "mistyped")
        return key.principal()

    def _operator(self, presented: str) -> Principal | None:
        wanted = digest(presented)
        for known in self.operator:
            if hmac.compare_digest(known, wanted):
                return Principal("operator", "admin", None)
        return None

    async def _lookup(self, key_id: str) -> StoredKey | None:
        cached = self._cache.get(key_id)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self.ttl:
            return cached[0]
        try:
            key: StoredKey | None = StoredKey.decode((await self.store.get(
                api_key_key(key_id))).data)
        except ObjectNotFound:
            key = None
        self._cache[key_id] = (key, now)
        self._cache.move_to_end(key_id)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return key

    # -- management --------------------------------------------------------------------
    async def create(self, namespace: str, role: str, prefixes: list[str],
                     name: str = "") -> tuple[str, StoredKey]:
        """A new key; returns it (the only time its secret is seen) and what is kept."""
        check_name(namespace, "namespace")
        check_new_key(role, prefixes, name)
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        stored = StoredKey(key_id, namespace, role, tuple(prefixes), digest(secret),
                           int(time.time() * 1000), name)
        await self.store.put(api_key_key(key_id), stored.encode(), if_none_match=True)
        return f"okq_{key_id}_{secret}", stored

    async def list(self, namespace: str | None) -> list[StoredKey]:
        """The keys of ``namespace`` (None: every namespace's)."""
        out = []
        async for info in list_all(self.store, API_KEYS_PREFIX):
            try:
                key = StoredKey.decode((await self.store.get(info.key)).data)
            except (ObjectNotFound, FormatError):
                continue  # deleted meanwhile, or not a key: not listed
            if namespace is None or key.namespace == namespace:
                out.append(key)
        return sorted(out, key=lambda k: k.created_ms)

    async def find(self, key_id: str, namespace: str | None) -> StoredKey | None:
        """The key ``key_id`` of ``namespace`` (None: any), read fresh; None if there is
        none (another namespace's key is not this caller's to see)."""
        if not re.fullmatch(r"[0-9a-f]{16}", key_id):
            raise InvalidRequest("id must be a key id (16 hex digits)", field="id")
        try:
            key = StoredKey.decode((await self.store.get(api_key_key(key_id))).data)
        except ObjectNotFound:
            return None
        return key if namespace is None or key.namespace == namespace else None

    async def delete(self, key: StoredKey) -> None:
        """Delete a key ``find`` returned."""
        await self.store.delete(api_key_key(key.id))
        self._cache.pop(key.id, None)


def describe(key: StoredKey) -> dict[str, Any]:
    """A key as the API shows it: everything but its hash."""
    return {"id": key.id, "namespace": key.namespace, "role": key.role,
            "prefixes": list(key.prefixes), "name": key.name, "created_ms": key.created_ms}
