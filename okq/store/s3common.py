"""What both S3 clients (s3.py: aioboto3, obstore.py: obstore) share: their
constructor's arguments, the bucket and prefix an ``s3://bucket/prefix`` URL
names, and where an okq key lives in that bucket. Each client opens its own
connection in :meth:`S3Common._open`; errors are worded by s3errors.py."""

from __future__ import annotations

import abc

from okq.errors import CASConflict, ObjectNotFound
from okq.store.base import DEFAULT_S3_TIMEOUT, ObjectInfo, split_s3_url, validate_key

DEFAULT_REGION = "us-east-1"


class S3Common(abc.ABC):
    """The part of an S3 store that does not depend on its client library."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        pool_size: int = 64,
        timeout: float = DEFAULT_S3_TIMEOUT,
    ) -> None:
        """``url``: ``s3://bucket[/prefix]``; ``endpoint_url``: a server other than
        AWS's (MinIO, SeaweedFS, moto); ``region`` (default us-east-1);
        ``pool_size``: connections kept open; ``timeout``: seconds one request
        may take, connecting included."""
        self.url = url
        self.bucket, self.prefix = split_s3_url(url)
        self.endpoint_url = endpoint_url
        self.region = region or DEFAULT_REGION
        self._open(pool_size, timeout)

    @abc.abstractmethod
    def _open(self, pool_size: int, timeout: float) -> None:
        """Set up the client's connection (lazily or not); called once, last."""

    def _key(self, key: str) -> str:
        """An okq key's full name in the bucket (refused if it could escape)."""
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unkey(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo:
        """The object's size and ETag (the store protocol's ``head``)."""

    async def _check_etag(self, key: str, if_match: str) -> None:
        """The check before a conditional DELETE (not every server honours If-Match
        on one): CASConflict unless ``key`` is there with ETag ``if_match``. A
        missing key is a lost condition."""
        try:
            info = await self.head(key)
        except ObjectNotFound:
            raise CASConflict(f"{key!r} is gone", key=key) from None
        if info.etag != if_match:
            raise CASConflict(f"{key!r} changed", key=key)
