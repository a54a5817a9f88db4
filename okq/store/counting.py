"""A wrapper that counts requests and bytes by operation."""

from __future__ import annotations

from collections import Counter

from okq.store.base import Blob, ListPage, ObjectInfo, Store

#: Operations that S3 bills at the PUT/LIST rate.
PUT_CLASS = ("put", "list")


class CountingStore:
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.requests: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()  # bytes sent to the store
        self.bytes_out: Counter[str] = Counter()  # bytes received from it

    def reset(self) -> None:
        self.requests.clear()
        self.bytes_in.clear()
        self.bytes_out.clear()

    @property
    def put_class(self) -> int:
        return sum(self.requests[op] for op in PUT_CLASS)

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    async def get(self, key: str) -> Blob:
        self.requests["get"] += 1
        blob = await self.inner.get(key)
        self.bytes_out["get"] += len(blob.data)
        return blob

    async def head(self, key: str) -> ObjectInfo:
        self.requests["head"] += 1
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        self.requests["put"] += 1
        self.bytes_in["put"] += len(data)
        return await self.inner.put(key, data, if_match=if_match, if_none_match=if_none_match,
                                    want_etag=want_etag)

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        self.requests["delete"] += 1
        await self.inner.delete(key, if_match=if_match)

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        self.requests["list"] += 1
        return await self.inner.list(prefix, start_after=start_after, limit=limit)

    async def close(self) -> None:
        await self.inner.close()
