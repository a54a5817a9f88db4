"""An okq node served from a thread of the test process, on a store of one kind.

The node runs on its own event loop in its own thread, as a separate server
would: an async test (on pytest-asyncio's loop), a sync test, a blocking boto3
call and okq's ``SyncClient`` all reach it over loopback HTTP, and none of them
can stall it by blocking their own thread.

Stores: ``memory`` (the default), ``file`` (a folder the caller gives), or
``moto`` (moto's S3 server in a thread of this process, on a free loopback port,
through okq's aioboto3 client: moto checks no signatures, and okq is given a
dummy identity so that nothing is ever signed with a real one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar

from aiohttp import web

from okq.client import SyncClient
from okq.server.app import create_app
from okq.server.state import advertise
from okq.settings import Settings
from okq.store import open_store

T = TypeVar("T")

STORE_KINDS = ("memory", "file", "moto")
HOST = "127.0.0.1"
BUCKET = "okq-testing"
REGION = "us-east-1"
#: The S3 identity okq and boto3 use against moto: moto checks no signatures.
DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
             "AWS_EC2_METADATA_DISABLED": "true"}
#: Variables that would give an S3 client a real identity beside the dummy one.
AWS_IDENTITY = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
MOTO_MISSING = ("--okq-store=moto needs moto's S3 server: pip install 'okq[testing]' "
                "(moto[s3], flask, flask-cors)")


class MotoS3:
    """moto's S3 server in a thread of this process, on a free loopback port, with
    ``bucket`` made. It reads no credentials; okq's S3 client does, from the
    environment, which ``start`` sets to a dummy identity until ``stop``."""

    def __init__(self, bucket: str = BUCKET) -> None:
        self.bucket = bucket
        self.endpoint = ""
        self._server: Any = None
        self._saved: dict[str, str | None] = {}

    def start(self) -> Self:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:
            raise RuntimeError(MOTO_MISSING) from exc
        for name in (*DUMMY_AWS, *AWS_IDENTITY):
            self._saved[name] = os.environ.pop(name, None)
        os.environ.update(DUMMY_AWS)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request
        self._server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._make_bucket()
        return self

    def _make_bucket(self) -> None:
        import boto3
        from botocore.exceptions import ClientError

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                          aws_access_key_id="test", aws_secret_access_key="test")
        try:
            s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:  # moto keeps its buckets per process, not per server
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        finally:
            s3.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()


class OkqNode:
    """An okq node (``okq serve``'s application) on a free loopback port, served by
    its own event loop in a thread of this process.

    ``url``: the node's base URL, for ``okq.client.Client`` and boto3 alike;
    ``store_url``: where its state lives; ``sqs_access_key`` / ``sqs_secret`` /
    ``sqs_region``: the SQS API's one key (admin, in the node's namespace);
    ``settings``: the node's ``okq.settings.Settings``.
    """

    def __init__(self, kind: str = "memory", folder: Path | None = None,
                 **settings: Any) -> None:
        if kind not in STORE_KINDS:
            raise ValueError(f"unknown okq store kind {kind!r}: one of {', '.join(STORE_KINDS)}")
        if kind == "file" and folder is None:
            raise ValueError("a file store needs a folder")
        self.kind = kind
        self.folder = folder
        self.overrides = settings
        self.url = ""
        self.store_url = ""
        self.sqs_access_key = "AKIDOKQTESTING"
        self.sqs_secret = secrets.token_hex(16)
        self.sqs_region = REGION
        self.moto: MotoS3 | None = None
        self.settings: Settings | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._admin: SyncClient | None = None

    def start(self) -> Self:
        try:
            if self.kind == "moto":
                self.moto = MotoS3().start()
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name="okq-testing-node")
            self._thread.start()
            self.url = self.run(self._serve())
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the node's event loop and wait for its result."""
        assert self._loop is not None, "the node is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _store(self) -> tuple[str, str | None]:
        """The store's URL and S3 endpoint (moto's, or none)."""
        name = uuid.uuid4().hex
        if self.kind == "memory":
            return f"memory://{name}", None
        if self.kind == "file":
            return f"file://{self.folder}", None
        assert self.moto is not None
        return f"s3://{self.moto.bucket}/{name}?client=aioboto3", self.moto.endpoint

    async def _serve(self) -> str:
        self.store_url, endpoint = self._store()
        fields: dict[str, Any] = {
            "store": self.store_url, "endpoint_url": endpoint, "host": HOST, "port": 0,
            "signing_keys": secrets.token_hex(32),
            "sqs_keys": f"{self.sqs_access_key}:{self.sqs_secret}",
            "sqs_region": self.sqs_region, **self.overrides}
        self.settings = settings = Settings(**fields)
        store = open_store(settings.store, endpoint_url=settings.endpoint_url, region=REGION,
                           timeout=settings.s3_timeout)
        app = create_app(settings, store)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5)
        try:
            await runner.setup()  # opens the engine: the store's self-check
        except BaseException:
            await store.close()
            raise
        self._runner = runner
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = int(runner.addresses[0][1])
        advertise(app, HOST, port)
        return f"http://{HOST}:{port}"

    def admin(self) -> SyncClient:
        """A blocking client of this node that lives as long as the node (the queue
        factory's): it works from sync and async tests alike."""
        if self._admin is None:
            self._admin = SyncClient(self.url)
        return self._admin

    def stop(self) -> None:
        """Finish the node's requests, close its store, end its thread (and moto)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._loop is not None:
            if self._runner is not None:
                self.run(self._runner.cleanup())
                self._runner = None
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            self._loop.close()
            self._loop = None
        if self.moto is not None:
            self.moto.stop()
            self.moto = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
