"""The one narrow storage protocol every backend implements.

Atomicity promises, which every backend must keep and the conformance suite
checks:

* ``put(..., if_none_match=True)`` creates the key only if it does not exist;
  of any number of concurrent creators exactly one succeeds, the rest get
  :class:`~okq.errors.CASConflict`.
* ``put(..., if_match=etag)`` replaces the object only if its current ETag is
  ``etag``; of concurrent writers holding the same ETag exactly one succeeds.
  A missing key is a lost condition (``CASConflict``), whatever the server's
  status for it (moto answers 404, SeaweedFS 412).
* ``put`` with neither condition overwrites unconditionally.
* ``get`` returns the bytes and ETag of one complete version of the object.
* ``list`` pages through keys in lexicographic order; keys created or deleted
  during a listing may or may not appear.

ETags are content hashes: A -> B -> A is invisible to If-Match, so every state
object okq writes carries its own version counter and nonce.

Any :class:`~okq.errors.StorageError` from a write other than ``CASConflict``
is ambiguous: the write may have landed. Callers resolve it by re-reading.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlparse

#: Seconds one S3 request may take (connecting included) before it fails as a
#: StorageError, which okq's callers retry or resolve by re-reading: the longest
#: one request that never answers stalls a queue (docs/OPERATIONS.md). Above the
#: 1-6 s a losing conditional write can wait on SeaweedFS.
DEFAULT_S3_TIMEOUT = 10.0


def etag_of(data: bytes) -> str:
    """An object's ETag as S3 makes it for a single-part PUT: the MD5 of its bytes."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class Blob:
    """One version of an object: its bytes and its ETag. A store that hashes the
    bytes for the ETag (the file store) leaves it to the first read of ``etag``:
    the reader of a segment, which never asks, does not pay for it (an MD5 of
    every leased byte)."""

    __slots__ = ("_etag", "data")

    def __init__(self, data: bytes, etag: str | None = None) -> None:
        self.data = data
        self._etag = etag

    @property
    def etag(self) -> str:
        if self._etag is None:
            self._etag = etag_of(self.data)
        return self._etag

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Blob):
            return NotImplemented
        return self.data == other.data and self.etag == other.etag

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Blob(data={self.data!r}, etag={self.etag!r})"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    etag: str
    size: int
    last_modified: float  # seconds since the epoch, by the store's clock


@dataclass(frozen=True, slots=True)
class ListPage:
    items: list[ObjectInfo]
    next_start_after: str | None  # None when this is the last page


@runtime_checkable
class Store(Protocol):
    """An object store: keys are ``/``-separated strings, values are bytes."""

    url: str

    async def get(self, key: str) -> Blob:
        """Return the object. Raises ObjectNotFound."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Return the object's metadata. Raises ObjectNotFound."""
        ...

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        """Write the object and return its new ETag. Raises CASConflict.

        ``want_etag=False``: the caller has no use for the ETag (a segment's
        writer), and a store that would hash the bytes to make one (the file
        store: an MD5 of every produced byte) returns "" instead."""
        ...

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete the object; deleting a missing key is not an error unless
        ``if_match`` is given, in which case it raises CASConflict."""
        ...

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        """One page of keys under ``prefix``, after ``start_after``, in order."""
        ...

    async def close(self) -> None: ...


async def list_all(store: Store, prefix: str, *, page: int = 1000) -> AsyncIterator[ObjectInfo]:
    """Every object under ``prefix``, following pages."""
    start: str | None = None
    while True:
        result = await store.list(prefix, start_after=start, limit=page)
        for info in result.items:
            yield info
        if result.next_start_after is None:
            return
        start = result.next_start_after


def validate_key(key: str) -> str:
    """Refuse keys that could escape a directory or confuse a listing."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"invalid object key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith(".tmp-"):
            raise ValueError(f"invalid object key {key!r}")
    return key


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket[/prefix]`` -> (bucket, prefix without slashes at its ends)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"expected s3://bucket[/prefix], got {url!r}")
    return parsed.netloc, parsed.path.strip("/")

