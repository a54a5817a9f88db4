"""The Python client for an okq node: async ``Client`` and a thin ``SyncClient``.
``Worker``, which runs a handler over leased items, is ``okq.worker.Worker`` (also
importable from here); ``Client`` is one of the ``okq.worker.Queues`` it runs on.

Errors come back as okq's own exception classes (``okq.errors``), chosen by the
``code`` of the error body, so ``except LeaseLost`` works the same in library
mode and over HTTP. No node answering (refused, reset, timed out, or a load
balancer's 502 / 503 / 504) is ``Unavailable``.

Calls go over the client's own keep-alive HTTP/1.1 connections (``okq.httpconn``:
about a third less CPU per call than aiohttp's client session), or through the
aiohttp session given as ``session``. ``health`` uses an aiohttp session either way.

A call that fails with a retryable error (``okq.retrying``) is sent again with
exponential backoff and jitter (``backoff``: 5 tries in all by default), unless
it may have taken effect and is not harmless to repeat: an unkeyed produce, a
purge, a create, a delete, a redrive or a key change whose outcome is unknown is
never sent twice; it raises ``OutcomeUnknown`` instead, and logs a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeGuard, TypeVar

import aiohttp
import msgpack
import msgspec
from pydantic import BaseModel
from yarl import URL

from okq import httpconn, replies
from okq import wire as s
from okq.clock import assume_utc
from okq.errors import BY_CODE, OkqError, OutcomeUnknown, Overloaded, QueueExists, Unavailable
from okq.retrying import DEFAULT_BACKOFF, Backoff, maybe_done, retryable
from okq.worker import Worker as Worker  # the worker loop lives in okq.worker

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

#: An item to produce: its payload (bytes or text), a ``ProduceItem``, or a dict
#: ``{"payload": bytes | str, "headers": {str: str}, "key": str, "delay": seconds}``
#: (or ``"enqueue_at": datetime`` instead of ``delay``), every key but payload optional.
Item = bytes | str | s.ProduceItem | Mapping[str, Any]
ITEM_KEYS = ("payload", "headers", "key", "delay", "enqueue_at", "group")

log = logging.getLogger("okq.client")

#: Calls that are harmless to send twice: reads, leases (an item leased to nobody
#: comes back at its lease timeout), and the fenced lease transitions and updates.
#: A produce is, when every item carries an idempotency key.
REPEATABLE = frozenset({
    "queue.lease", "queue.renew", "queue.complete", "queue.retry", "queue.stats",
    "items.list", "queues.list", "queues.info", "queues.update", "keys.list",
})
#: Statuses a load balancer answers for a node that is down or did not answer.
GATEWAY = frozenset({502, 503, 504})


def _repeatable(path: str, body: dict[str, Any]) -> bool:
    if path == "queue.produce":
        return all(isinstance(i, dict) and i.get("key") for i in body.get("items", ()))
    return path in REPEATABLE


class _NotAReply(Exception):
    """A 2xx body that is not the reply okq gives (the client names the culprit)."""


def _unpacked(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False) if raw else None
    except Exception:
        return None


def _validated(model: type[M]) -> Callable[[bytes], M]:
    """A reader of a reply body as ``model``."""
    def read(raw: bytes) -> M:
        decoded = _unpacked(raw)
        if not isinstance(decoded, dict):
            raise _NotAReply
        return model.model_validate(decoded)
    return read


def _checked(read: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """``read``, with a body that it cannot decode as a reply it does not know."""
    def checked(raw: bytes) -> T:
        try:
            return read(raw)
        except msgspec.DecodeError:
            raise _NotAReply from None
    return checked


_leased_items = _checked(replies.leased_items)
_produced_ids = _checked(replies.produced_ids)


def _items(items: Sequence[Item]) -> list[dict[str, Any]]:
    """The items of a produce as the wire carries them; a lone payload or dict, which
    would be read as a list of its letters or keys, is a TypeError."""
    if isinstance(items, (str, bytes, bytearray, memoryview, Mapping, s.ProduceItem)):
        raise TypeError(f"items must be a list of items, not a {type(items).__name__}: "
                        "to produce one item, pass [item]")
    return [_item(i) for i in items]


def _item(value: Item) -> dict[str, Any]:
    if type(value) is bytes:
        return {"bytes": value}
    if isinstance(value, s.ProduceItem):
        return value.model_dump(exclude_none=True)
    if isinstance(value, str):
        return {"utf8": value}
    if isinstance(value, Mapping):
        return _dict_item(value)
    if isinstance(value, (bytearray, memoryview)):
        return {"bytes": bytes(value)}
    raise TypeError(f"an item is bytes, str, a dict or a ProduceItem, not "
                    f"{type(value).__name__}")


def _dict_item(value: Mapping[str, Any]) -> dict[str, Any]:
    """An item given as a dict (``Item``) as the wire carries it."""
    unknown = [k for k in value if k not in ITEM_KEYS]
    if unknown:
        raise TypeError(f"unknown item key {unknown[0]!r}; an item takes "
                        f"{', '.join(ITEM_KEYS)}")
    payload = value.get("payload")
    if isinstance(payload, str):
        out: dict[str, Any] = {"utf8": payload}
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        out = {"bytes": bytes(payload)}
    else:
        raise TypeError("an item's payload must be bytes or str, not "
                        f"{type(payload).__name__}")
    for name in ("headers", "key", "delay", "group"):
        if value.get(name) is not None:
            out[name] = value[name]
    at = value.get("enqueue_at")
    if at is not None:
        if not isinstance(at, datetime):
            raise TypeError(f"enqueue_at must be a datetime, not {type(at).__name__}")
        out["enqueue_at"] = assume_utc(at)
    return out


class Client:
    """``async with Client("http://127.0.0.1:7878") as c: await c.produce("q", ["hi"])``"""

    def __init__(
        self,
        url: str = "http://127.0.0.1:7878",
        *,
        timeout: float = 60.0,
        session: aiohttp.ClientSession | None = None,
        api_key: str | None = None,
        namespace: str | None = None,
        ssl: ssl_.SSLContext | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        """``namespace``: where an operator key acts (a namespace key acts in its own);
        ``ssl``: how to check an HTTPS node (default: the system's certificates);
        ``backoff``: how retryable failures are tried again (``okq.retrying.NO_RETRIES``
        turns retries off)."""
        self.url = url.rstrip("/")
        self.backoff = backoff
        self.api_key = api_key
        self.namespace = namespace
        self.ssl = ssl
        self.timeout = timeout
        self._session = session
        self._own = session is None
        # Without a session of the caller's, calls go over okq.httpconn's connections.
        self._pool: tuple[str, httpconn.Pool, bytes] | None = None
        # What every call sends alike, made once: its URL, headers and timeout.
        self._urls: dict[str, URL] = {}
        self._targets: dict[str, bytes] = {}
        self._headers: tuple[tuple[str | None, str | None], dict[str, str]] | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._pool is not None:
            self._pool[1].close()
            self._pool = None
            await asyncio.sleep(0)  # the aborted transports close their sockets on the next turn
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100, ssl=self.ssl or True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                cookie_jar=aiohttp.DummyCookieJar(),  # okq sets none: none to keep or send
            )
        return self._session

    async def call(self, path: str, body: dict[str, Any], model: type[M],
                   *, wait: float = 0.0, repeatable: bool | None = None) -> M:
        """POST a msgpack body to ``/v1/{path}``; parse the reply as ``model``. A
        retryable failure is tried again (see the module docstring); ``repeatable``
        says whether the call is harmless to send twice (default: by ``path``)."""
        return await self._call(path, body, _validated(model), wait, repeatable)

    async def _call(self, path: str, body: dict[str, Any], read: Callable[[bytes], T],
                    wait: float = 0.0, repeatable: bool | None = None) -> T:
        """``call``, with the reply body read by ``read``."""
        tries = 0
        while True:
            tries += 1
            try:
                return await self._call_once(path, body, read, wait)
            except OkqError as exc:
                if not retryable(exc) or tries >= self.backoff.attempts:
                    raise
                safe = _repeatable(path, body) if repeatable is None else repeatable
                if maybe_done(exc) and not safe:
                    raise self._unknown(path, body, exc) from exc
                delay = self.backoff.delay(tries, exc)
                log.info("%s to %s failed: %s; trying again in %.2f s (try %d of %d)",
                         path, self.url, exc, delay, tries + 1, self.backoff.attempts)
                await asyncio.sleep(delay)

    def _unknown(self, path: str, body: dict[str, Any], exc: OkqError) -> OutcomeUnknown:
        """The error of a call that may have taken effect and is not sent again."""
        what = f"{path} of queue {body['queue_name']!r}" if "queue_name" in body else path
        hint = ("; it is not sent again, as its items carry no idempotency keys: give "
                "each item a key ({'payload': ..., 'key': ...}) to let the client retry it safely"
                if path == "queue.produce" else "; it is not sent again")
        message = f"{what} may or may not have taken effect ({exc.message}){hint}"
        log.warning("%s", message)
        return OutcomeUnknown(message, url=self.url, status=exc.details.get("status"))

    async def _call_once(self, path: str, body: dict[str, Any], read: Callable[[bytes], T],
                         wait: float) -> T:
        data = msgpack.packb(body, use_bin_type=True, datetime=True)
        reply = await (self._post(path, data, wait) if self._own
                       else self._post_aiohttp(path, data, wait))
        status, raw = reply.status, reply.body
        if status >= 400:
            decoded = _unpacked(raw)
            raise _error(status, decoded, reply.retry_after) if _is_error_body(decoded) \
                else self._not_okq(status, "no okq error body")
        try:
            return read(raw)
        except _NotAReply:
            raise self._not_okq(status, "a reply that is not an okq reply") from None

    async def _post(self, path: str, data: bytes, wait: float) -> httpconn.Reply:
        """A call over okq.httpconn's connections, its failures as okq errors (those of
        ``_post_aiohttp`` alike)."""
        pool, head = self._connections()
        try:
            async with asyncio.timeout(self.timeout + wait):
                return await pool.post(self._target(path), head, data)
        except httpconn.TlsFailed as exc:
            raise self._tls_failed(exc) from exc
        except httpconn.ConnectFailed as exc:
            raise self._unreachable(exc) from exc
        except (httpconn.Hangup, OSError, TimeoutError) as exc:
            hung_up = isinstance(exc, httpconn.Hangup) and not exc.answered
            raise await self._no_answer(exc, hung_up) from exc

    def _connections(self) -> tuple[httpconn.Pool, bytes]:
        """The connections to ``self.url`` and the header lines every call sends, made
        again when the URL, key or namespace changed."""
        key = f"{self.url} {self.api_key} {self.namespace}"
        if self._pool is not None and self._pool[1].loop is not asyncio.get_running_loop():
            self._pool[1].close()  # a client used again under another event loop
            self._pool = None
        if self._pool is None or self._pool[0] != key:
            url = URL(self.url)
            if url.scheme not in ("http", "https") or not url.host:
                raise OkqError(f"{self.url} is not an http:// or https:// URL", url=self.url)
            port = url.port or (443 if url.scheme == "https" else 80)
            tls = (self.ssl or ssl_.create_default_context()) if url.scheme == "https" else None
            host = f"[{url.host}]" if ":" in url.host else url.host
            lines = [f"Host: {host}" + ("" if url.is_default_port() else f":{port}")]
            lines += [f"{k}: {v}" for k, v in self._made_headers().items()]
            head = "".join(f"{line}\r\n" for line in lines).encode("latin-1")
            if self._pool is not None:
                self._pool[1].close()
            self._pool = (key, httpconn.Pool(url.host, port, tls), head)
        return self._pool[1], self._pool[2]

    def _target(self, path: str) -> bytes:
        """The request target of ``/v1/{path}`` under ``self.url``'s own path."""
        text = f"{self.url}/v1/{path}"
        target = self._targets.get(text)
        if target is None:
            target = self._targets[text] = self._url(path).raw_path_qs.encode("latin-1")
        return target

    async def _post_aiohttp(self, path: str, data: bytes, wait: float) -> httpconn.Reply:
        """A call through the caller's aiohttp session."""
        try:
            async with self._http().post(self._url(path), data=data, headers=self._made_headers(),
                                         timeout=self._timeout(wait)) as resp:
                return httpconn.Reply(resp.status, await resp.read(),
                                      resp.headers.get("Retry-After"))
        except aiohttp.ClientSSLError as exc:
            raise self._tls_failed(exc) from exc
        except aiohttp.ClientConnectorError as exc:
            raise self._unreachable(exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            hung_up = isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
            raise await self._no_answer(exc, hung_up) from exc

    def _tls_failed(self, exc: BaseException) -> OkqError:
        return OkqError(f"TLS with {self.url} failed: {exc}", url=self.url)

    def _unreachable(self, exc: BaseException) -> Unavailable:
        """No connection: nothing was sent."""
        return Unavailable(f"cannot reach okq at {self.url}: {exc}", sent=False, url=self.url)

    async def _no_answer(self, exc: BaseException, hung_up: bool) -> OkqError:
        """No whole reply after the call was sent (it may have taken effect); a server
        that hung up on plain HTTP and speaks TLS gets the https:// URL named."""
        if hung_up and await self._speaks_tls():
            https = "https://" + self.url.removeprefix("http://")
            return OkqError(f"{self.url} hung up: the server there seems to speak TLS; use "
                            f"{https}", url=self.url, tls=True)
        what = str(exc) or type(exc).__name__
        return Unavailable(f"no answer from okq at {self.url}: {what}", url=self.url)

    async def _speaks_tls(self) -> bool:
        """Whether an ``http://`` node that hung up on a call completes a TLS handshake
        (nothing is sent, the certificate is not checked): then the URL should have
        been ``https://``, a mistake not worth retrying."""
        url = URL(self.url)
        if url.scheme != "http" or not url.host:
            return False
        probe = ssl_.create_default_context()
        probe.check_hostname = False
        probe.verify_mode = ssl_.CERT_NONE
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, url.port, ssl=probe), 5)
        except (OSError, TimeoutError):  # ssl.SSLError is an OSError
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def _url(self, path: str) -> URL:
        text = f"{self.url}/v1/{path}"
        url = self._urls.get(text)
        if url is None:  # parsed once a path (and url: it may have been changed)
            url = self._urls[text] = URL(text)
        return url

    def _made_headers(self) -> dict[str, str]:
        """The headers of a call, made again only when the key or namespace changed."""
        who = (self.api_key, self.namespace)
        if self._headers is None or self._headers[0] != who:
            headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            if self.namespace:
                headers["X-Okq-Namespace"] = self.namespace
            self._headers = (who, headers)
        return self._headers[1]

    def _timeout(self, wait: float) -> aiohttp.ClientTimeout:
        total = self.timeout + wait
        timeout = self._timeouts.get(total)
        if timeout is None:
            if len(self._timeouts) > 64:  # many long-poll lengths: keep a few
                self._timeouts.clear()
            timeout = self._timeouts[total] = aiohttp.ClientTimeout(total=total)
        return timeout

    def _not_okq(self, status: int, what: str) -> OkqError:
        """The reply of something that is not an okq node (a wrong URL or port), or of a
        load balancer whose nodes did not answer (502, 503, 504)."""
        if status in GATEWAY:
            return Unavailable(f"{self.url} answered HTTP {status} with {what}: no okq node "
                               "answered behind it", status=status, url=self.url)
        return OkqError(f"{self.url} answered HTTP {status} with {what}; is it an okq node?",
                        status=status, url=self.url, not_okq=True)

    # -- items ---------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[Item]) -> list[str]:
        """Produce ``items`` (a list: see ``Item``); their ids, once they are durable."""
        body = {"queue_name": queue, "items": _items(items)}
        return await self._call("queue.produce", body, _produced_ids)

    async def produce_reply(self, queue: str, items: Sequence[Item]) -> s.ProduceResponse:
        """``produce``, with the node's whole reply: the ids and ``duplicates``, how many
        items were already there under their idempotency keys (nothing added for them)."""
        body = {"queue_name": queue, "items": [_item(i) for i in items]}
        return await self.call("queue.produce", body, s.ProduceResponse)

    async def lease(self, queue: str, batch_size: int = 1, *, lease_timeout: float | None = None,
                    request_timeout: float = 0.0) -> list[s.LeasedItemOut]:
        body: dict[str, Any] = {"queue_name": queue, "batch_size": batch_size,
                                "request_timeout": request_timeout}
        if lease_timeout is not None:
            body["lease_timeout"] = lease_timeout
        return await self._call("queue.lease", body, _leased_items, request_timeout)

    async def renew(self, queue: str, token: str, lease_timeout: float | None = None) -> datetime:
        body: dict[str, Any] = {"queue_name": queue, "token": token}
        if lease_timeout is not None:
            body["lease_timeout"] = lease_timeout
        return (await self.call("queue.renew", body, s.RenewResponse)).lease_deadline

    async def complete(self, queue: str, tokens: Sequence[str]) -> int:
        body = {"queue_name": queue, "tokens": list(tokens)}
        return (await self.call("queue.complete", body, s.CompleteResponse)).completed

    async def complete_and_produce(self, queue: str, token: str, out_queue: str,
                                   items: Sequence[Item]) -> list[str]:
        """Complete one delivery and produce ``items`` to ``out_queue`` in one step."""
        body = {"queue_name": queue, "tokens": [token],
                "outputs": {"queue_name": out_queue, "items": _items(items)}}
        reply = await self.call("queue.complete", body, s.CompleteResponse)
        return reply.output_ids or []

    async def retry(self, queue: str, token: str, *, retry_at: datetime | None = None,
                    dead: bool = False, error: str | None = None,
                    count_attempt: bool = True) -> bool:
        """Release a leased item: ready again at ``retry_at`` (now by default), or
        dead-lettered with ``dead``. True when it was dead-lettered (``dead``, or out
        of attempts): moved to the dead-letter queue, or dropped when the queue has
        none."""
        item: dict[str, Any] = {"token": token, "dead": dead}
        if not count_attempt:
            item["count_attempt"] = False
        if retry_at is not None:
            item["retry_at"] = retry_at.isoformat()
        if error is not None:
            item["error"] = error[:4096]
        reply = await self.call("queue.retry", {"queue_name": queue, "items": [item]},
                                s.RetryResponse)
        return reply.dead_lettered > 0

    async def stats(self, queue: str) -> s.StatsResponse:
        return await self.call("queue.stats", {"queue_name": queue}, s.StatsResponse)

    async def purge(self, queue: str) -> None:
        await self.call("queue.purge", {"queue_name": queue}, s.PurgeResponse)

    async def list_items(self, queue: str, *, limit: int = 100,
                         start_after: str | None = None) -> s.ItemsListResponse:
        body: dict[str, Any] = {"queue_name": queue, "limit": limit}
        if start_after is not None:
            body["start_after"] = start_after
        return await self.call("items.list", body, s.ItemsListResponse)

    async def redrive(self, dead_queue: str, limit: int = 1000,
                      destination: str | None = None) -> int:
        body: dict[str, Any] = {"queue_name": dead_queue, "limit": limit}
        if destination is not None:
            body["destination"] = destination
        return (await self.call("dead.redrive", body, s.RedriveResponse)).moved

    # -- queues ----------------------------------------------------------------
    async def create_queue(self, name: str, *, exist_ok: bool = False,
                           **settings: Any) -> s.QueueInfoOut:
        """Create a queue. With ``exist_ok`` an existing queue is left as it is (its
        settings unchanged, whatever ``settings`` say) and its info returned, as
        ``Engine.create_queue(..., exist_ok=True)`` does in library mode."""
        try:
            return await self.call("queues.create", {"name": name, **settings},
                                   s.QueueInfoOut)
        except QueueExists:
            if not exist_ok:
                raise
        return await self.queue_info(name)

    async def list_queues(self) -> list[s.QueueInfoOut]:
        return (await self.call("queues.list", {}, s.QueuesListResponse)).queues

    async def queue_info(self, name: str) -> s.QueueInfoOut:
        return await self.call("queues.info", {"name": name}, s.QueueInfoOut)

    async def update_queue(self, name: str, **settings: Any) -> s.QueueInfoOut:
        return await self.call("queues.update", {"name": name, **settings}, s.QueueInfoOut)

    async def delete_queue(self, name: str) -> None:
        await self.call("queues.delete", {"name": name}, s.DeleteResponse)

    # -- API keys (admin) ---------------------------------------------------------------
    async def create_key(self, role: str, prefixes: Sequence[str] = (),
                         name: str = "") -> s.KeyCreated:
        """A new key of this client's namespace; ``.key`` is its secret, shown once."""
        return await self.call("keys.create", {"role": role, "prefixes": list(prefixes),
                                               "name": name}, s.KeyCreated)

    async def list_keys(self) -> list[s.KeyOut]:
        return (await self.call("keys.list", {}, s.KeysListResponse)).keys

    async def delete_key(self, key_id: str) -> bool:
        return (await self.call("keys.delete", {"id": key_id}, s.KeyDeleteResponse)).deleted

    async def health(self) -> bool:
        try:
            async with self._http().get(f"{self.url}/health") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False


def _is_error_body(body: Any) -> TypeGuard[dict[str, Any]]:
    """okq's ``{code, message, details}`` error shape."""
    return isinstance(body, dict) and isinstance(body.get("code"), str) and \
        isinstance(body.get("message"), str)


def _error(status: int, body: dict[str, Any], retry_after: str | None) -> OkqError:
    code, message = str(body.get("code", "")), str(body.get("message", f"HTTP {status}"))
    details = body.get("details") or {}
    cls = BY_CODE.get(code, OkqError)
    if cls is Overloaded:
        return Overloaded(message, retry_after=float(retry_after or 1))
    err = cls.__new__(cls)
    OkqError.__init__(err, message, **details)
    if "field" in details:
        err.field = details["field"]  # type: ignore[attr-defined]
    return err


class SyncClient:
    """The same calls, blocking. One background event loop keeps connections alive."""

    def __init__(self, url: str = "http://127.0.0.1:7878", *, timeout: float = 60.0,
                 api_key: str | None = None, namespace: str | None = None,
                 ssl: ssl_.SSLContext | None = None, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="okq-sync-client")
        self._thread.start()
        self._client = Client(url, timeout=timeout, api_key=api_key, namespace=namespace,
                              ssl=ssl, backoff=backoff)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)
        return lambda *a, **kw: self._run(method(*a, **kw))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
