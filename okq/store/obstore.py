"""``s3://bucket/prefix?client=obstore`` — the same S3 contract through obstore.

obstore wraps the Rust ``object_store`` crate: request signing, HTTP and XML
parsing run in native code, outside the GIL, where aiobotocore spends
milliseconds of Python CPU per call. This store keeps :class:`okq.store.s3.S3Store`'s
behaviour call for call, and the conformance suite runs it on moto and SeaweedFS.

What differs underneath, and how the contract is still kept:

* Retries are off (``max_retries=0``), as in s3.py: a retried conditional PUT
  whose first attempt landed comes back 412, so retries belong to okq.
* Errors: obstore raises ``FileNotFoundError`` for 404, ``PreconditionError`` /
  ``AlreadyExistsError`` for lost conditions (it already turns a 404 on
  If-Match into ``PreconditionError``), and carries the HTTP status and the
  server's XML only in the message, inside a debug dump of 25-40 lines. They
  are translated as s3.py translates botocore's: ``NoSuchBucket`` is a plain
  StorageError, 412 / 409 / 404-on-a-condition CASConflict, 404 ObjectNotFound,
  anything else (timeouts, refused connections, 5xx) StorageError, each with
  one line of okq/store/s3errors.py (status, operation, key, the S3 error code
  and message), never the dump. A failed request to the instance metadata
  service (no credentials in the environment) says which variables to set.
* ``object_store`` has no If-Match on DELETE: a conditional delete checks the
  ETag with a HEAD, as s3.py does, then sends the DELETE with If-Match on a
  URL obstore presigns, through aiohttp. Only a sequencer leaving cleanly
  deletes conditionally, so this path is rare.
* ``object_store`` lists by path segment (prefix ``p`` does not match ``p0/x``)
  and cannot set ``max-keys``. A listing asks for the prefix's parent and
  filters, and a page holds at most 999 keys, so the 1000th key of the
  server's page (servers send 1000) tells whether more follow without a
  second request. A ``limit=1`` listing still makes the server send up to 1000
  keys.
* PUTs are single requests (never multipart), so an ETag stays the MD5 of the
  body whatever its size.

Credentials come from the AWS environment variables (and web identity, ECS
and instance metadata, as ``object_store`` reads them); unlike aioboto3 it does
not read ``~/.aws`` profile files.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import re
from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
from obstore.store import S3Store as _ObjectStoreS3

from okq.errors import CASConflict, ObjectNotFound, StorageError
from okq.store.base import Blob, ListPage, ObjectInfo
from okq.store.s3common import S3Common
from okq.store.s3errors import (
    CREDENTIALS_HELP,
    TIMED_OUT,
    no_credentials,
    s3_error,
    s3_failed,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from obstore import ObjectMeta, PutMode
    from obstore.store import S3Config

#: Keys a page holds at most: one fewer than a server's page, so the key after
#: a full page arrives with it (see the module docstring).
PAGE_CAP = 999
#: How long closing waits for native calls whose callers were cancelled.
CLOSE_WAIT = 30.0
T = TypeVar("T")


def _no_credentials() -> bool:
    """Whether only the metadata service could supply an identity, and it is off."""
    env = os.environ
    if env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() != "true":
        return False
    sources = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
               "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
    return not any(env.get(name) for name in sources)


#: Whether this process opened an obstore store: okq.store.exit_past_native_threads.
OPENED = False

_STATUS = re.compile(r"status code: (\d{3})")
#: The body a server sent with its status: up to the debug dump.
_BODY = re.compile(r"status code: \d{3}[^:]*: (.*?)(?:\n\nDebug source:|$)", re.S)
_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
#: A request for an identity to the instance metadata service (169.254.169.254).
_METADATA = re.compile(r"Error performing \w+ \S*/latest/(?:api/token|meta-data/)")
#: The operating system's reason for a failed connection, in the debug dump.
_OS_REASON = re.compile(r'kind: \w+,\s*message: "([^"]+)"')
#: The first line's cause: "Error performing GET URL in 1.2ms - CAUSE".
_CAUSE = re.compile(r" in [\d.]+\S* - ([^\n]+)")

#: What the store's calls raise for a failed request: obstore's own errors, and
#: FileNotFoundError (an OSError) for a 404.
_FAILURES = (BaseError, OSError, TimeoutError)


def _status_of(text: str) -> int:
    """The HTTP status obstore wrote into its message (0 when there was none)."""
    found = _STATUS.search(text)
    return int(found.group(1)) if found else 0


def _etag(value: str | None) -> str:
    return (value or "").strip('"')


def _said(text: str) -> tuple[str, str]:
    """The S3 error code and message a server sent, or ("", its body's first line)."""
    found = _BODY.search(text)
    body = found.group(1).strip() if found else ""
    code, message = _CODE.search(body), _MESSAGE.search(body)
    if code:
        return code.group(1), message.group(1) if message else ""
    return "", body.splitlines()[0][:200] if body else ""


def _cause(text: str) -> str:
    """Why a request got no answer, in a few words."""
    if "timed out" in text or "Timeout" in text:
        return TIMED_OUT
    reason = _OS_REASON.search(text)
    if reason:
        return reason.group(1)
    found = _CAUSE.search(text)
    return found.group(1).strip() if found else text.splitlines()[0][:200]


class ObstoreS3Store(S3Common):
    def _open(self, pool_size: int, timeout: float) -> None:
        """object_store's client (it connects at the first request), and an aiohttp
        session made at the first conditional delete."""
        self._timeout = timeout
        config: S3Config = {"region": self.region}
        endpoint_url = self.endpoint_url
        if endpoint_url is not None:
            config["endpoint"] = endpoint_url
        self._store = _ObjectStoreS3(
            self.bucket,
            config=config,
            client_options={
                "allow_http": bool(endpoint_url and endpoint_url.startswith("http://")),
                "timeout": timedelta(seconds=timeout),
                "connect_timeout": timedelta(seconds=timeout),
                "pool_max_idle_per_host": str(pool_size),
            },
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=timeout)},
        )
        self._http: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._inflight: set[asyncio.Future[Any]] = set()
        # Read when object_store reads its identity: at construction, from the env.
        self._no_identity = _no_credentials()
        global OPENED
        OPENED = True

    def _check_identity(self, key: str) -> None:
        """Refuse before any request when only the metadata service could give an
        identity and it is off: object_store would ask it (169.254.169.254) anyway."""
        if self._no_identity:
            raise StorageError("no AWS credentials: AWS_EC2_METADATA_DISABLED is set and "
                               "no AWS_ACCESS_KEY_ID, web identity or container role is; "
                               + CREDENTIALS_HELP, key=key)

    def _key(self, key: str) -> str:
        self._check_identity(key)
        return super()._key(key)

    def _translate(self, exc: BaseException, key: str, conditional: bool,
                   op: str) -> StorageError:
        """Map an obstore failure onto okq's errors exactly as s3.py maps botocore's,
        each in one line (okq/store/s3errors.py)."""
        text = str(exc)
        status = _status_of(text)
        if _METADATA.search(text):
            answer = f"HTTP {status}" if status else _cause(text)
            return no_credentials(f"the instance metadata service answered {answer}", key)
        code, message = _said(text)
        if code == "NoSuchBucket":  # a misconfiguration, not a lost condition
            return s3_error(status, code, message, op, key, self.bucket)
        lost = isinstance(exc, PreconditionError | AlreadyExistsError)
        if lost or status in (412, 409) or (status == 404 and conditional):
            return CASConflict(f"conditional write to {key!r} lost ({status})", key=key)
        if isinstance(exc, FileNotFoundError) or status == 404:
            if conditional:
                return CASConflict(f"conditional write to {key!r} lost (404)", key=key)
            return ObjectNotFound(f"no object {key!r}", key=key)
        if status:
            return s3_error(status, code, message, op, key, self.bucket)
        return s3_failed(op, key, _cause(text))

    async def _native(self, call: Awaitable[T]) -> T:
        """Await a call into obstore, which runs on to its end even when the caller
        is cancelled, and which :meth:`close` waits for: a native call still running
        when the interpreter exits takes the GIL during finalisation, and Python
        3.11 ends such a thread in a way the Rust code cannot unwind (SIGABRT)."""
        task = asyncio.ensure_future(call)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def _get(self, key: str) -> tuple[bytes, str | None]:
        resp = await obstore.get_async(self._store, key)
        return bytes(await resp.bytes_async()), resp.meta["e_tag"]

    async def get(self, key: str) -> Blob:
        try:
            data, etag = await self._native(self._get(self._key(key)))
        except _FAILURES as exc:
            raise self._translate(exc, key, False, "GET") from exc
        return Blob(data, _etag(etag))

    async def head(self, key: str) -> ObjectInfo:
        try:
            meta = await self._native(obstore.head_async(self._store, self._key(key)))
        except _FAILURES as exc:
            raise self._translate(exc, key, False, "HEAD") from exc
        return ObjectInfo(key, _etag(meta["e_tag"]), int(meta["size"]),
                          meta["last_modified"].timestamp())

    def _info(self, meta: ObjectMeta) -> ObjectInfo:
        return ObjectInfo(
            self._unkey(meta["path"]),
            _etag(meta["e_tag"]),
            int(meta["size"]),
            meta["last_modified"].timestamp(),
        )

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        full = self._key(key)
        mode: PutMode = "overwrite"
        if if_match is not None:
            mode = {"e_tag": f'"{if_match}"'}
        elif if_none_match:
            mode = "create"
        try:
            result = await self._native(obstore.put_async(self._store, full, data, mode=mode,
                                                          use_multipart=False))
        except _FAILURES as exc:
            raise self._translate(exc, key, mode != "overwrite", "PUT") from exc
        return _etag(result["e_tag"])

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        full = self._key(key)
        if if_match is not None:
            await self._delete_if_match(key, full, if_match)
            return
        try:
            await self._native(obstore.delete_async(self._store, full))
        except _FAILURES as exc:
            err = self._translate(exc, key, False, "DELETE")
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    async def _delete_if_match(self, key: str, full: str, if_match: str) -> None:
        """HEAD-check, then DELETE with If-Match where the server honours it (as
        s3.py does); object_store cannot send If-Match on a DELETE, so the request
        goes to a presigned URL. A missing key is a lost condition."""
        await self._check_etag(key, if_match)
        try:
            url = await self._native(obstore.sign_async(
                self._store, "DELETE", full, timedelta(seconds=max(self._timeout, 60))
            ))
            http = await self._session()
            async with http.delete(url, headers={"If-Match": f'"{if_match}"'}) as resp:
                status, body = resp.status, await resp.text()
        except (*_FAILURES, aiohttp.ClientError) as exc:
            raise self._translate(exc, key, True, "DELETE") from exc
        if status >= 300:
            failure = f"status code: {status}: {body}"
            raise self._translate(StorageError(failure), key, True, "DELETE")

    async def _session(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._http is None:
                self._http = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self._timeout)
                )
            return self._http

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        self._check_identity(prefix)
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        # object_store lists whole path segments: ask for the parent, keep what
        # starts with the prefix, and stop once the names are past it.
        parent, _, partial = full_prefix.rpartition("/")
        offset = None
        if start_after:
            # A position, not necessarily a valid key (it may be the prefix itself).
            offset = f"{self.prefix}/{start_after}" if self.prefix else start_after
        cap = max(1, min(limit, PAGE_CAP))
        items: list[ObjectInfo] = []

        async def walk() -> None:
            stream = obstore.list(self._store, parent or None, offset=offset,
                                  chunk_size=cap + 1)
            async for chunk in stream:
                if self._take(chunk, full_prefix, len(parent) + 1 if parent else 0,
                              partial, items, cap):
                    break

        try:
            await self._native(walk())
        except _FAILURES as exc:
            raise self._translate(exc, prefix, False, "LIST") from exc
        if len(items) > cap:
            del items[cap:]
            return ListPage(items, items[-1].key)
        return ListPage(items, None)

    def _take(
        self,
        chunk: Sequence[ObjectMeta],
        full_prefix: str,
        name_at: int,
        partial: str,
        items: builtins.list[ObjectInfo],  # the method ``list`` shadows the builtin here
        cap: int,
    ) -> bool:
        """Add the chunk's keys under ``full_prefix`` to ``items``; True when the
        page is full (one key over ``cap``) or the listing has passed the prefix.

        The names compared are the first path component below the parent, so the
        stop is right for byte order (S3) and directory-tree order (SeaweedFS).
        """
        for meta in chunk:
            path: str = meta["path"]
            if not path.startswith(full_prefix):
                name = path[name_at:].split("/", 1)[0]
                if name > partial and not name.startswith(partial):
                    return True
                continue
            items.append(self._info(meta))
            if len(items) > cap:
                return True
        return False

    async def close(self) -> None:
        if self._inflight:  # calls whose callers gave up: let them end first
            await asyncio.wait(list(self._inflight), timeout=CLOSE_WAIT)
        if self._http is not None:
            await self._http.close()
            self._http = None
