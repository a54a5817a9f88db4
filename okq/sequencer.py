"""Sequencer mode: one node per shard batches the fleet's writes.

Without it every node writes every object it touches, and N nodes race each
other's compare-and-swaps on a queue's manifest and head lease object: every
lost race is a paid request, a re-read and a retry. In sequencer mode the
queues are split into ``shards`` (a hash of the queue's name); each shard has a
*role object* in the store naming the node that holds it. The other nodes send
the state changes of that shard's queues (produce, lease, renew, complete,
retry, purge, queue changes) to the holder over an internal endpoint
(``POST /internal/v1/forward``, msgpack, signed with the fleet's signing key),
and the holder applies them through its cells: the whole fleet shares one group
commit per object.

The role is an optimisation only. Every write is still a CAS on the bucket;
two nodes that both believe they hold a role cost contention and nothing else,
and a node that cannot reach a holder writes directly (today's path).

The role object (``{ns}/roles/sequencer-{shard}``, msgpack)::

    {"holder": node id, "url": where it is reached, "epoch": claims so far,
     "members": {node id: url} of nodes heard from lately, "nonce": per write}

Life of a role (docs/DESIGN.md, "Sequencer mode"):

- *claim*: a node that needs a shard with no role object creates it (create-only);
- *renew*: the holder rewrites it (If-Match) every third of ``role_ttl``;
- *lapse*: a role object that has not changed for ``role_ttl`` (by the
  observer's own monotonic clock: no clocks are compared), beyond what its
  holder last vouched for in its answers, may be claimed with If-Match on the
  version seen; a holder that cannot renew (cut off from the store) vouches for
  less and less and steps down after ``role_ttl``;
- *dead holder*: a node whose forward finds the holder's port refusing
  connections, or another node answering there (421), does not wait for the
  lapse: the holder's process is gone, and the node claims at once. Nodes
  listed in ``members`` take turns by a hash of the epoch (the first at once,
  the next 0.3 s later, ...) so that they do not all race for the same CAS;
- *hung holder*: a forward that has waited ``PROBE_AFTER``, or any forward to a
  holder not heard from for that long, makes the sender ping the holder
  (``okq.forwarding``); a holder that does not answer within ``PROBE_TIMEOUT`` is
  claimed
  like a dead one (the waiting forward answers ``outcome_unknown``);
- *release*: a holder that shuts down cleanly deletes its role objects.

A forward names its namespace, the node it is meant for and its sender's
sequence number under the fleet signature: the receiver refuses one meant for
another node or namespace (421) and one it has seen (401, ``ReplayGuard``).

While a node holds a shard its cached manifests and lease objects of the
shard's queues are *trusted* for ``trusted_max_age`` rather than 0.2 s: every
write comes through it, so an idle long poll costs the store nothing but a
re-read every ``trusted_max_age`` (see ``Runtime.trusted``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import random
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack

from okq.errors import (
    CASConflict,
    ObjectNotFound,
    StorageError,
    Unauthorized,
)
from okq.fleetwire import (
    Misdirected,
    ReplayGuard,
)
from okq.keys import split_partition
from okq.store.base import Store

log = logging.getLogger("okq.sequencer")

#: Gap between the turns of successive claimants of a dead holder's role.
CLAIM_TURN = 0.3
#: A dead holder's id is remembered this long (its process is gone for good).
DEAD_MEMORY = 600.0


def role_prefix(ns: str) -> str:
    """What every sequencer role object's key starts with: the shard number follows."""
    return f"{ns}/roles/sequencer-"


def role_key(ns: str, shard: int) -> str:
    return f"{role_prefix(ns)}{shard}"


def shard_of(queue: str, shards: int) -> int:
    """The shard a queue belongs to: a stable hash of its name. Partition ``p`` of a
    queue (``okq.partitions``) is ``p`` shards after the queue's, so that its
    partitions fall on as many shards, and holders, as there are."""
    if shards <= 1:
        return 0
    base, partition = split_partition(queue)
    return (zlib.crc32(base.encode()) + partition) % shards


@dataclass
class RoleRecord:
    holder: str
    url: str
    epoch: int
    members: dict[str, str] = field(default_factory=dict)
    nonce: str = ""

    def encode(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self))  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, data: bytes) -> RoleRecord:
        raw = msgpack.unpackb(data)
        return cls(holder=str(raw["holder"]), url=str(raw["url"]), epoch=int(raw["epoch"]),
                   members={str(k): str(v) for k, v in raw.get("members", {}).items()},
                   nonce=str(raw.get("nonce", "")))


@dataclass
class _Shard:
    """What this node knows of one shard's role."""

    record: RoleRecord | None = None
    etag: str | None = None
    seen_at: float = 0.0  # monotonic time this version was first seen
    held: bool = False
    renewed_at: float = 0.0  # monotonic time before this node's last write of it landed
    vouched: str = ""  # the nonce of the version its holder last vouched for
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sequencer:
    """This node's view of the sequencer roles (its forwards: ``okq.forwarding``)."""

    def __init__(self, store: Store, namespace: str, keys: list[bytes], *,
                 shards: int = 1, role_ttl: float = 45.0, url: str | None = None,
                 node_id: str | None = None) -> None:
        self.store = store
        self.ns = namespace
        self.keys = keys
        self.shards = shards
        self.ttl = role_ttl
        self.url = url or ""
        self.id = node_id or secrets.token_hex(6)
        self._shards = [_Shard() for _ in range(shards)]
        self._dead: dict[str, float] = {}  # holder id -> when it was found dead or hung
        self._dead_seen: dict[str, str] = {}  # holder id -> its role's version read since
        self._members: dict[str, tuple[str, float]] = {}  # id -> (url, last heard)
        self._session: aiohttp.ClientSession | None = None
        self._renewer: asyncio.Task[None] | None = None
        self.on_gain: list[Callable[[int], None]] = []
        self.forwards: dict[str, int] = {}  # outcome -> count, for metrics
        self.claims = 0
        self.sent = 0  # forwards numbered so far (ReplayGuard)
        self.guard = ReplayGuard()
        self.stopping = False

    # -- life -------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))
        self._renewer = asyncio.ensure_future(self._renew_loop())

    async def stop(self) -> None:
        """Stop renewing and give the roles up, so another node takes them at once."""
        self.stopping = True
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        for n, sh in enumerate(self._shards):
            if sh.held and sh.etag is not None:
                sh.held = False
                try:
                    await self.store.delete(role_key(self.ns, n), if_match=sh.etag)
                except (StorageError, OSError) as exc:
                    log.info("could not release sequencer role %d: %s", n, exc)
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The connections to the other nodes (``okq.forwarding``)."""
        assert self._session is not None, "sequencer not started"
        return self._session

    def held(self) -> list[int]:
        return [n for n, sh in enumerate(self._shards) if self._fresh(sh)]

    def holds(self, queue: str) -> bool:
        """Whether this node holds the queue's role and renewed it within ``role_ttl``:
        a holder that cannot renew (cut off from the store) neither trusts its caches
        nor vouches for its role to the nodes that forward to it."""
        return self._fresh(self._shards[shard_of(queue, self.shards)])

    def known(self, queue: str) -> bool:
        """Whether this node holds the queue's role or knows a live holder of it."""
        sh = self._shards[shard_of(queue, self.shards)]
        return sh.held or self._live(sh)

    def vouch(self, queue: str) -> tuple[float, str]:
        """Seconds the others may take this node's role of ``queue`` as live without
        reading it (what is left of its ``role_ttl`` since the last renewal landed),
        and the nonce of that renewal, so that a node reading the role object later
        knows the version it vouched for from a newer one."""
        sh = self._shards[shard_of(queue, self.shards)]
        if not sh.held or sh.record is None:
            return 0.0, ""
        return max(0.0, self.ttl - (time.monotonic() - sh.renewed_at)), sh.record.nonce

    def _fresh(self, sh: _Shard) -> bool:
        return sh.held and time.monotonic() - sh.renewed_at < self.ttl

    def accept(self, call: dict[str, Any]) -> None:
        """Check a forward's envelope (its signature already verified): Misdirected
        when it was meant for another namespace or node, Unauthorized when replayed."""
        if call.get("ns") != self.ns or call.get("to") != self.id:
            raise Misdirected(f"meant for node {call.get('to')!r} of namespace "
                              f"{call.get('ns')!r}; this is {self.id!r} of {self.ns!r}")
        seq = call.get("seq")
        if not isinstance(seq, int):
            raise Unauthorized("fleet forward without a sequence number")
        self.guard.check(str(call.get("from", "")), seq)

    def heard_from(self, node: str, url: str) -> None:
        """A forward came from ``node``: it is a member for the next renewals."""
        if node and url:
            self._members[node] = (url, time.monotonic())

    # -- routing ----------------------------------------------------------------------
    async def route(self, queue: str) -> RoleRecord | None:
        """Where the queue's changes go: None for here, else its holder's role."""
        n = shard_of(queue, self.shards)
        sh = self._shards[n]
        if sh.held:
            return None
        if self._live(sh):
            assert sh.record is not None
            return sh.record
        await self._resolve(n)
        if sh.held or sh.record is None:
            return None
        return sh.record

    def _live(self, sh: _Shard) -> bool:
        """Whether the shard has a holder known to be alive: not dead, not lapsed."""
        return (sh.record is not None and sh.record.holder not in self._dead
                and not self._lapsed(sh))

    def _lapsed(self, sh: _Shard) -> bool:
        return sh.record is not None and time.monotonic() - sh.seen_at > self.ttl

    def holder_unreachable(self, queue: str, holder: RoleRecord, why: str) -> None:
        """A forward to ``holder`` found it gone (``why``): claim its role."""
        sh = self._shards[shard_of(queue, self.shards)]
        if sh.record is not None and sh.record.holder == holder.holder:
            self._dead[holder.holder] = time.monotonic()
            log.warning("sequencer %s at %s %s: claiming its role", holder.holder, holder.url,
                        why)

    def vouched_for(self, queue: str, holder: RoleRecord, vouched: float, nonce: str) -> None:
        """The holder answered that its role's version ``nonce`` is good for ``vouched``
        more seconds: as good as seeing it renewed, so a node with traffic never
        re-reads a live holder's role; a holder that cannot renew vouches for less
        and less."""
        sh = self._shards[shard_of(queue, self.shards)]
        if sh.record is not None and sh.record.holder == holder.holder:
            sh.seen_at = max(sh.seen_at, time.monotonic() - self.ttl + vouched)
            sh.vouched = nonce

    def stale_view(self, queue: str) -> None:
        """The node we forwarded to says it does not hold the role: read it again."""
        sh = self._shards[shard_of(queue, self.shards)]
        if not sh.held:
            sh.record = None

    async def _resolve(self, n: int) -> None:
        """Learn the shard's holder from the store; claim the role when it has none,
        when it lapsed or when its holder is dead."""
        sh = self._shards[n]
        async with sh.lock:
            if sh.held or self._live(sh):
                return  # resolved by another request meanwhile
            for _ in range(5):
                if await self._resolve_once(n, sh):
                    return
            log.warning("sequencer role %d: could not settle a holder; writing directly", n)

    async def _resolve_once(self, n: int, sh: _Shard) -> bool:
        rec, etag = await self._read(n, sh)
        if rec is None:
            return await self._claim(n, sh, None, None)
        if rec.holder == self.id:  # ours after all: a renewal proves it and dates it
            return await self._take_back(n, sh, rec, etag)
        if self.url and rec.url == self.url:  # its holder was on this address before us
            self._dead[rec.holder] = time.monotonic()
        dead = rec.holder in self._dead
        if not dead and not self._lapsed(sh):
            return True  # a live holder: forward to it
        await asyncio.sleep(self._turn(rec) * CLAIM_TURN)
        _, etag2 = await self._read(n, sh)
        if etag2 != etag:
            return False  # someone claimed or renewed meanwhile: look again
        return await self._claim(n, sh, rec, etag)

    async def _take_back(self, n: int, sh: _Shard, rec: RoleRecord, etag: str | None) -> bool:
        was = sh.held
        fresh = dataclasses.replace(rec, members=self._live_members(),
                                    nonce=secrets.token_hex(8))
        if not await self._write(n, sh, fresh, etag):
            return False
        if not was:
            for fn in self.on_gain:
                fn(n)
        return True

    def _turn(self, rec: RoleRecord) -> int:
        """This node's place among the claimants of a dead holder's role."""
        others = [m for m in rec.members if m != rec.holder and m not in self._dead]
        order = sorted(others, key=lambda m: hashlib.sha256(f"{rec.epoch}:{m}".encode())
                       .hexdigest())
        return min(order.index(self.id) if self.id in order else len(order), 5)

    async def _read(self, n: int, sh: _Shard) -> tuple[RoleRecord | None, str | None]:
        try:
            blob = await self.store.get(role_key(self.ns, n))
        except ObjectNotFound:
            sh.record, sh.etag = None, None
            return None, None
        try:
            rec = RoleRecord.decode(blob.data)
        except (ValueError, KeyError, TypeError, msgpack.ExtraData) as exc:
            log.warning("sequencer role %d unreadable (%s): claiming it", n, exc)
            rec = RoleRecord(holder="", url="", epoch=0)
            self._dead[""] = time.monotonic()
        if blob.etag != sh.etag and rec.nonce != sh.vouched:
            sh.seen_at = time.monotonic()  # a version this node has not heard of: new
        if rec.holder in self._dead:
            first = self._dead_seen.setdefault(rec.holder, blob.etag)
            if first != blob.etag:  # renewed since it was found dead: hung, not dead
                del self._dead[rec.holder], self._dead_seen[rec.holder]
        sh.record, sh.etag = rec, blob.etag
        return rec, blob.etag

    async def _claim(self, n: int, sh: _Shard, old: RoleRecord | None,
                     etag: str | None) -> bool:
        if not self.url:
            return True  # cannot be reached: never hold a role; write directly
        rec = RoleRecord(holder=self.id, url=self.url, epoch=(old.epoch + 1) if old else 1,
                         members=self._live_members(), nonce=secrets.token_hex(8))
        if not await self._write(n, sh, rec, etag):
            return False
        self.claims += 1
        log.info("holding sequencer role %d (epoch %d)", n, rec.epoch)
        for fn in self.on_gain:
            fn(n)
        return True

    async def _write(self, n: int, sh: _Shard, rec: RoleRecord, etag: str | None) -> bool:
        """Write the role object over version ``etag`` (absent: None); True when ours."""
        key, data = role_key(self.ns, n), rec.encode()
        began = time.monotonic()
        try:
            if etag is None:
                new = await self.store.put(key, data, if_none_match=True)
            else:
                new = await self.store.put(key, data, if_match=etag)
        except CASConflict:
            return False
        except StorageError:  # ambiguous: ours if the object now carries our nonce
            current, _ = await self._read(n, sh)
            ok = current is not None and current.nonce == rec.nonce
            sh.held = ok
            if ok:
                sh.renewed_at = began
            return ok
        sh.record, sh.etag, sh.seen_at, sh.held = rec, new, time.monotonic(), True
        sh.renewed_at = began
        return True

    def _live_members(self) -> dict[str, str]:
        now = time.monotonic()
        for node, (_, heard) in list(self._members.items()):
            if now - heard > 2 * self.ttl:
                del self._members[node]
        for node, when in list(self._dead.items()):
            if now - when > DEAD_MEMORY:
                del self._dead[node]
                self._dead_seen.pop(node, None)
        members = {node: url for node, (url, _) in self._members.items()
                   if node not in self._dead}
        members[self.id] = self.url
        return members

    async def _renew_loop(self) -> None:
        pause = self.ttl / 3
        while not self.stopping:
            await asyncio.sleep(pause * random.uniform(0.9, 1.0))
            renewed = [await self._renew(n, sh) for n, sh in enumerate(self._shards) if sh.held]
            pause = self.ttl / 3 if all(renewed) else min(1.0, self.ttl / 3)

    async def _renew(self, n: int, sh: _Shard) -> bool:
        """Renew a held role; False when the store could not be reached (try again
        soon). A holder that has not renewed for ``role_ttl`` steps down: the others
        may claim it by then, and nothing it cached can be trusted."""
        old = sh.record
        assert old is not None
        rec = dataclasses.replace(old, members=self._live_members(), nonce=secrets.token_hex(8))
        try:
            ok = await self._write(n, sh, rec, sh.etag)
        except (StorageError, OSError) as exc:
            log.warning("could not renew sequencer role %d: %s", n, exc)
            if not self._fresh(sh):
                log.warning("sequencer role %d unrenewed for %.0f s: stepping down", n, self.ttl)
                sh.held = False
            return False
        if not ok:
            log.warning("lost sequencer role %d: another node holds it", n)
            sh.held, sh.record = False, None
        return True

    def count(self, outcome: str) -> None:
        """One more forward with this outcome (``okq_sequencer_forwards``)."""
        self.forwards[outcome] = self.forwards.get(outcome, 0) + 1

