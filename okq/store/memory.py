"""``memory://`` — a process-local store for unit tests.

All methods run to completion without awaiting, so each is atomic on the event
loop; conditional writes are exact.
"""

from __future__ import annotations

import bisect
import time

from okq.errors import CASConflict, ObjectNotFound
from okq.store.base import Blob, ListPage, ObjectInfo, etag_of, validate_key


class MemoryStore:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._objects: dict[str, tuple[bytes, str, float]] = {}
        self._keys: list[str] = []  # sorted

    async def get(self, key: str) -> Blob:
        try:
            data, etag, _ = self._objects[key]
        except KeyError:
            raise ObjectNotFound(f"no object {key!r}", key=key) from None
        return Blob(data, etag)

    async def head(self, key: str) -> ObjectInfo:
        try:
            data, etag, mtime = self._objects[key]
        except KeyError:
            raise ObjectNotFound(f"no object {key!r}", key=key) from None
        return ObjectInfo(key, etag, len(data), mtime)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        validate_key(key)
        current = self._objects.get(key)
        if if_none_match and current is not None:
            raise CASConflict(f"{key!r} already exists", key=key)
        if if_match is not None and (current is None or current[1] != if_match):
            raise CASConflict(f"{key!r} changed", key=key)
        etag = etag_of(data)
        if current is None:
            bisect.insort(self._keys, key)
        self._objects[key] = (bytes(data), etag, time.time())
        return etag

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        current = self._objects.get(key)
        if if_match is not None and (current is None or current[1] != if_match):
            raise CASConflict(f"{key!r} changed", key=key)
        if current is not None:
            del self._objects[key]
            self._keys.pop(bisect.bisect_left(self._keys, key))

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        lo = bisect.bisect_right(self._keys, start_after) if start_after else 0
        lo = max(lo, bisect.bisect_left(self._keys, prefix))
        items: list[ObjectInfo] = []
        for key in self._keys[lo:]:
            if not key.startswith(prefix):
                break
            if len(items) == limit:
                return ListPage(items, items[-1].key)
            data, etag, mtime = self._objects[key]
            items.append(ObjectInfo(key, etag, len(data), mtime))
        return ListPage(items, None)

    async def close(self) -> None:
        return None
