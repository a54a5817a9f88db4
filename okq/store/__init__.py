"""Storage: one narrow protocol, backends chosen from a URL, and wrappers."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from okq.store.base import DEFAULT_S3_TIMEOUT, Blob, ListPage, ObjectInfo, Store, list_all
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
    "DEFAULT_S3_TIMEOUT",
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


#: The S3 client of s3:// stores unless the URL names one (docs/PERFORMANCE.md
#: has the measurement that chose it).
DEFAULT_S3_CLIENT = "obstore"


def open_file_store(path: Path) -> FileStore:
    """The file store at ``path``. A missing directory is made, as ``mkdir`` makes one
    (a warning says a new, empty store begins there), but only where its parent
    directory exists: a path whose parent is missing is far more often a typo than a
    new store, and a typo must not start an empty store in place of the real one."""
    path = path.expanduser()
    if not path.exists():
        parent = path.absolute().parent
        if not parent.is_dir():
            raise ValueError(
                f"the file store {path} does not exist, nor does its parent directory "
                f"{parent}: check the path; to start a new store there, create {parent} first")
        logging.getLogger("okq.store").warning(
            "the file store %s does not exist: starting a new, empty store there", path)
    elif not path.is_dir():
        raise ValueError(f"the file store {path} is not a directory")
    return FileStore(path)


def open_store(
    url: str, *, endpoint_url: str | None = None, region: str | None = None, pool_size: int = 64,
    timeout: float = DEFAULT_S3_TIMEOUT,
) -> Store:
    """Open the store a URL names.

    * ``memory://`` — process-local, for tests;
    * ``file://DIR`` or a plain path — the embedded default (``open_file_store``: a
      missing DIR is made only where its parent directory exists);
    * ``s3://bucket[/prefix][?endpoint_url=http://host:port][&client=obstore]`` — S3
      or any compatible server; credentials and region come from the AWS
      environment. ``client`` picks the S3 client: ``obstore`` (the default: Rust,
      a fifth of aioboto3's CPU per call; okq/store/obstore.py) or ``aioboto3``.
      ``timeout`` bounds each S3 request, in seconds (both clients).
    """
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryStore(url)
    if parsed.scheme in ("file", ""):
        return open_file_store(Path(parsed.netloc + parsed.path if parsed.scheme else url))
    if parsed.scheme == "s3":
        query = parse_qs(parsed.query)
        endpoint = endpoint_url or next(iter(query.get("endpoint_url", [])), None)
        base = f"s3://{parsed.netloc}{parsed.path}"
        client = next(iter(query.get("client", [])), DEFAULT_S3_CLIENT)
        if client == "obstore":
            from okq.store.obstore import ObstoreS3Store

            return ObstoreS3Store(base, endpoint_url=endpoint, region=region, pool_size=pool_size,
                                  timeout=timeout)
        if client != "aioboto3":
            raise ValueError(f"unknown S3 client {client!r} in {url!r}: aioboto3 or obstore")
        from okq.store.s3 import S3Store

        return S3Store(base, endpoint_url=endpoint, region=region, pool_size=pool_size,
                       timeout=timeout)
    raise ValueError(f"unknown store URL scheme {parsed.scheme!r} in {url!r}")


def exit_past_native_threads(code: int = 0) -> None:
    """End the process now, without interpreter finalisation, when a native S3
    client ran in it; return otherwise.

    obstore's Rust runtime keeps worker threads that Python does not know of. One
    that touches Python while the interpreter finalises is ended by CPython 3.11
    in a way Rust cannot unwind, and the process aborts (SIGABRT, about one exit
    in thirty here) after everything had closed cleanly (the known pyo3 runtime
    issue). Callers have closed their stores and flushed their work first; this
    flushes the logs and the standard streams and leaves with ``code``.
    """
    native = sys.modules.get("okq.store.obstore")
    if native is None or not getattr(native, "OPENED", False):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)

