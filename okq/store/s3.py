"""``s3://bucket/prefix`` — any S3-compatible server, through aioboto3.

Settings come from the usual AWS environment (credentials, region) plus an
optional endpoint URL. One client with a connection pool sized to the expected
concurrency serves every call. botocore's own retries are off: a retried
conditional PUT whose first attempt landed comes back 412, so retries belong
to okq, which resolves ambiguity by re-reading.

Errors are translated on the HTTP status, not botocore's code strings (a HEAD
412 arrives as code '412'): 412, 409 (ConditionalRequestConflict) and 404 on a
conditional write become CASConflict; 404 elsewhere ObjectNotFound; everything
else StorageError, in one line (okq/store/s3errors.py: status, operation, key,
the S3 error code and message); no credentials found says what to set.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from okq.errors import CASConflict, ObjectNotFound, StorageError
from okq.store.base import Blob, ListPage, ObjectInfo
from okq.store.s3common import S3Common
from okq.store.s3errors import NO_CONNECTION, TIMED_OUT, no_credentials, s3_error, s3_failed


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _etag(value: str) -> str:
    return value.strip('"')


class S3Store(S3Common):
    def _open(self, pool_size: int, timeout: float) -> None:
        """One pooled client, made at the first call."""
        self._config = AioConfig(
            max_pool_connections=pool_size,
            retries={"total_max_attempts": 1},
            connect_timeout=timeout,
            read_timeout=timeout,
            s3={"addressing_style": "path"},
        )
        self._client: Any = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    stack = AsyncExitStack()
                    session = aioboto3.Session()
                    self._client = await stack.enter_async_context(
                        session.client(
                            "s3",
                            endpoint_url=self.endpoint_url,
                            region_name=self.region,
                            config=self._config,
                        )
                    )
                    self._stack = stack
        return self._client

    def _translate(self, exc: Exception, key: str, conditional: bool,
                   op: str) -> StorageError:
        if isinstance(exc, NoCredentialsError):
            return no_credentials("none in the environment, ~/.aws or a role", key)
        if isinstance(exc, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
            return s3_failed(op, key, TIMED_OUT)
        if isinstance(exc, EndpointConnectionError):
            return s3_failed(op, key, NO_CONNECTION)
        if not isinstance(exc, ClientError):
            return s3_failed(op, key, str(exc) or type(exc).__name__)
        status = _status(exc)
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code == "NoSuchBucket":
            # A missing bucket is a misconfiguration, not a lost condition or
            # a missing object (S3 and moto answer 404 for it).
            return s3_error(status, code, message, op, key, self.bucket)
        if status in (412, 409) or (status == 404 and conditional):
            return CASConflict(f"conditional write to {key!r} lost ({status})", key=key)
        if status == 404:
            return ObjectNotFound(f"no object {key!r}", key=key)
        return s3_error(status, "" if code == str(status) else code, message, op, key,
                        self.bucket)

    async def get(self, key: str) -> Blob:
        s3 = await self._s3()
        try:
            resp = await s3.get_object(Bucket=self.bucket, Key=self._key(key))
            async with resp["Body"] as body:
                data = await body.read()
        except (TimeoutError, ClientError, BotoCoreError, OSError) as exc:
            raise self._translate(exc, key, False, "GET") from exc
        return Blob(data, _etag(resp["ETag"]))

    async def head(self, key: str) -> ObjectInfo:
        s3 = await self._s3()
        try:
            resp = await s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except (TimeoutError, ClientError, BotoCoreError, OSError) as exc:
            raise self._translate(exc, key, False, "HEAD") from exc
        modified = resp["LastModified"].timestamp()
        return ObjectInfo(key, _etag(resp["ETag"]), int(resp["ContentLength"]), modified)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        s3 = await self._s3()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match}"'
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        conditional = if_match is not None or if_none_match
        try:
            resp = await s3.put_object(**kwargs)
        except (TimeoutError, ClientError, BotoCoreError, OSError) as exc:
            raise self._translate(exc, key, conditional, "PUT") from exc
        return _etag(resp["ETag"])

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        s3 = await self._s3()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if if_match is not None:
            # Check first, then delete conditionally where the server can.
            await self._check_etag(key, if_match)
            kwargs["IfMatch"] = f'"{if_match}"'
        try:
            await s3.delete_object(**kwargs)
        except (TimeoutError, ClientError, BotoCoreError, OSError) as exc:
            err = self._translate(exc, key, if_match is not None, "DELETE")
            if isinstance(err, ObjectNotFound):
                return
            raise err from exc

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        s3 = await self._s3()
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": full_prefix,
            "MaxKeys": limit,
        }
        if start_after is not None:
            # A position, not necessarily a valid key (it may be the prefix itself).
            kwargs["StartAfter"] = f"{self.prefix}/{start_after}" if self.prefix else start_after
        try:
            resp = await s3.list_objects_v2(**kwargs)
        except (TimeoutError, ClientError, BotoCoreError, OSError) as exc:
            raise self._translate(exc, prefix, False, "LIST") from exc
        items = [
            ObjectInfo(
                self._unkey(o["Key"]),
                _etag(o["ETag"]),
                int(o["Size"]),
                o["LastModified"].timestamp(),
            )
            for o in resp.get("Contents", [])
        ]
        truncated = bool(resp.get("IsTruncated")) and bool(items)
        return ListPage(items, items[-1].key if truncated else None)

    async def close(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._client = None
