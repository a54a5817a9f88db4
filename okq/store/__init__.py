"""Storage: one narrow protocol, backends chosen from a URL, and wrappers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from okq.store.base import Blob, ListPage, ObjectInfo, Store, list_all
from okq.store.counting import CountingStore
from okq.store.faulty import FaultyStore, SimulatedCrash
from okq.store.file import FileStore
from okq.store.memory import MemoryStore
from okq.store.selfcheck import check_conditional_writes

if TYPE_CHECKING:
    from okq.store.s3 import S3Store


def __getattr__(name: str) -> Any:
    """``S3Store`` loads aioboto3 (a second of imports) only when it is asked for:
    ``file://`` and ``memory://`` users never pay for it."""
    if name == "S3Store":
        from okq.store.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Blob",
    "CountingStore",
    "FaultyStore",
    "FileStore",
    "ListPage",
    "MemoryStore",
    "ObjectInfo",
    "S3Store",
    "SimulatedCrash",
    "Store",
    "check_conditional_writes",
    "list_all",
    "open_store",
]


def open_store(
    url: str, *, endpoint_url: str | None = None, region: str | None = None, pool_size: int = 64
) -> Store:
    """Open the store a URL names.

    * ``memory://`` — process-local, for tests;
    * ``file://DIR`` or a plain path — the embedded default;
    * ``s3://bucket[/prefix][?endpoint_url=http://host:port]`` — S3 or any
      compatible server; credentials and region come from the AWS environment.
    """
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryStore(url)
    if parsed.scheme == "file":
        path = parsed.netloc + parsed.path
        return FileStore(Path(path).expanduser())
    if parsed.scheme == "":
        return FileStore(Path(url).expanduser())
    if parsed.scheme == "s3":
        query = parse_qs(parsed.query)
        endpoint = endpoint_url or next(iter(query.get("endpoint_url", [])), None)
        base = f"s3://{parsed.netloc}{parsed.path}"
        from okq.store.s3 import S3Store

        return S3Store(base, endpoint_url=endpoint, region=region, pool_size=pool_size)
    raise ValueError(f"unknown store URL scheme {parsed.scheme!r} in {url!r}")
