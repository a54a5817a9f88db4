"""A queue's manifest as stored: a head, and chunks of its segment list.

A publish appends a segment to the manifest's tail; once the tail holds
``per_chunk`` segments, the write that would grow it further cuts them into a
chunk object first (create-only, immutable) and the head references the chunk by
id. A publish therefore writes a head of at most ``per_chunk`` segments and one
reference per chunk, whatever the backlog, and a chunk is written once per
``per_chunk`` publishes. A compaction that unlists segments of a chunk writes a
new chunk of the rest (joined with a neighbour where they fit in one); the
compactor collects chunks no manifest references (docs/DESIGN.md, "Manifests").

:class:`ManifestCodec` is the per-queue half the manifest's Cell needs: it reads
the chunks a head references before the head is decoded (each once: they never
change), and writes new ones before a head referencing them.
"""

from __future__ import annotations

import asyncio
import time

from okq.cell import Cell
from okq.clock import Clock, SystemClock
from okq.errors import CASConflict, FormatError, ObjectNotFound
from okq.keys import chunk_key, manifest_key
from okq.model import (
    Chunk,
    Manifest,
    decode_chunk,
    encode_chunk,
    encode_manifest,
    manifest_chunk_ids,
    manifest_from,
    unpack_manifest,
)
from okq.store.base import Store

#: How long a chunk stays in memory after the last head that referenced it was
#: read or written (seconds): a write or a read racing the change still finds it.
KEEP_UNREFERENCED = 120.0
#: Chunks a cold reader GETs at once (a 10M backlog in segments of 1,000 is 82).
READ_AT_ONCE = 32


class ManifestCodec:
    """Encodes and decodes one queue's manifest, holding the chunks it references."""

    def __init__(self, store: Store, ns: str, queue: str, clock: Clock, per_chunk: int) -> None:
        self.store = store
        self.ns = ns
        self.queue = queue
        self.clock = clock
        self.per_chunk = per_chunk  # 0: cut no chunks (a manifest without stays format 1)
        self.chunks: dict[str, Chunk] = {}  # every chunk known to be stored
        self._seen: dict[str, float] = {}  # chunk id -> when a head last referenced it
        self._pruned = time.monotonic()
        self._latest: list[Chunk] | list[str] = []  # the chunks of the last head read or written
        self._raw: tuple[bytes, dict[str, object]] | None = None  # the last head unpacked

    # -- reading -----------------------------------------------------------------
    async def load(self, data: bytes) -> None:
        """Read the chunks the head in ``data`` references that are not in memory.
        ObjectNotFound when one is gone (the Cell reads the head again)."""
        raw = unpack_manifest(data)
        self._raw = (data, raw)
        ids = manifest_chunk_ids(raw)
        missing = [cid for cid in ids if cid not in self.chunks]
        for at in range(0, len(missing), READ_AT_ONCE):
            some = missing[at:at + READ_AT_ONCE]
            blobs = await asyncio.gather(
                *(self.store.get(chunk_key(self.ns, self.queue, cid)) for cid in some))
            for cid, blob in zip(some, blobs, strict=True):
                c = decode_chunk(blob.data)
                if c.id != cid:
                    raise FormatError(f"chunk object {cid} holds chunk {c.id}", data=blob.data)
                self.chunks[cid] = c
                self._seen[cid] = time.monotonic()
        self._referenced(ids)

    def decode(self, data: bytes) -> Manifest:
        raw = self._raw[1] if self._raw is not None and self._raw[0] is data else \
            unpack_manifest(data)
        return manifest_from(raw, self.chunks, data)

    # -- writing -----------------------------------------------------------------
    async def prepare(self, m: Manifest) -> None:
        """Cut and join chunks as the head about to be written wants them, and write
        those not stored yet (create-only: an id is new, so "already there" means an
        earlier attempt of this process wrote it)."""
        new = m.pack_chunks(self.per_chunk, self.clock.now_ms(), self.chunks.__contains__)
        if new:
            await asyncio.gather(*(self._write(c) for c in new))
        self._latest = m.chunks  # kept in memory while it is the last head written
        self._prune()

    async def _write(self, c: Chunk) -> None:
        try:
            await self.store.put(chunk_key(self.ns, self.queue, c.id),
                                 encode_chunk(self.queue, c), if_none_match=True)
        except CASConflict:
            pass  # an ambiguous write of ours landed
        self.chunks[c.id] = c
        self._seen[c.id] = time.monotonic()

    # -- memory ------------------------------------------------------------------
    def _referenced(self, ids: list[str]) -> None:
        """Note that a head read references ``ids`` (it may be decoded later)."""
        now = time.monotonic()
        for cid in ids:
            self._seen[cid] = now
        self._latest = ids
        self._prune()

    def _prune(self) -> None:
        """Now and then, forget the chunks that neither the last head read or written
        references nor any head read in the last KEEP_UNREFERENCED seconds."""
        now = time.monotonic()
        if now - self._pruned < KEEP_UNREFERENCED / 4:
            return
        self._pruned = now
        for cid in [cid for cid, at in self._seen.items() if now - at > KEEP_UNREFERENCED]:
            del self._seen[cid]
        keep = {c if isinstance(c, str) else c.id for c in self._latest}
        for cid in [cid for cid in self.chunks if cid not in self._seen and cid not in keep]:
            del self.chunks[cid]


async def read_manifest(store: Store, ns: str, queue: str) -> Manifest:
    """A queue's manifest read fresh, with its chunks (ObjectNotFound: no queue).
    For tools and tests: a Cell of its own reads it, as an engine's would."""
    codec = ManifestCodec(store, ns, queue, SystemClock(), 0)
    cell: Cell[Manifest] = Cell(store, manifest_key(ns, queue), SystemClock(), encode_manifest,
                                codec.decode, load=codec.load)
    m = await cell.read(0)
    if m is None:
        raise ObjectNotFound(f"no manifest of {queue!r}", key=manifest_key(ns, queue))
    return m
