"""Real S3 servers on loopback for the test suite: moto's and SeaweedFS's.

Both are context managers with ``start()`` / ``stop()`` and an ``endpoint``
URL; the conftest wraps them in lazily started session fixtures. Nothing here
talks to anything but 127.0.0.1, and clients use dummy credentials
(:func:`ensure_dummy_credentials`), so no request can reach AWS.

SeaweedFS's launcher lives in the package (``okq.dev.servers``, which
``okq fleet`` uses too); this module gives it the test bucket by default.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Self

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from okq.dev import servers as devservers
from okq.dev.servers import GRPC_OFFSET, HOST, Server, free_port_pairs, weed_binary
from okq.dev.servers import port_answers as _port_answers

__all__ = [
    "BUCKET", "DUMMY_CREDENTIALS", "GRPC_OFFSET", "HOST", "MotoServer", "SeaweedServer",
    "Server", "_port_answers", "create_bucket", "ensure_dummy_credentials", "free_port_pairs",
    "s3_client", "weed_binary",
]

BUCKET = "okq-test"
DUMMY_CREDENTIALS = devservers.DUMMY_CREDENTIALS


def ensure_dummy_credentials() -> None:
    """Give boto a dummy identity if the environment has none."""
    # Never let botocore go looking for instance metadata either.
    for name, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(name, value)


def s3_client(endpoint: str) -> Any:
    """A plain boto3 client for setup work (bucket creation, probes)."""
    ensure_dummy_credentials()
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        config=Config(
            retries={"total_max_attempts": 1},
            connect_timeout=2,
            read_timeout=10,
            s3={"addressing_style": "path"},
        ),
    )


def create_bucket(endpoint: str, bucket: str = BUCKET) -> None:
    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise
    finally:
        client.close()


def _loopback_only(endpoint: str) -> str:
    if not endpoint.startswith(f"http://{HOST}:"):
        raise AssertionError(f"test endpoints must be on {HOST}, got {endpoint!r}")
    return endpoint


# -- moto -----------------------------------------------------------------------


class MotoServer(Server):
    """moto's S3 server in a thread of this process, on a free loopback port.

    Functional tests only: its conditional writes are not atomic under
    concurrency (see tests/stores.py).
    """

    def __init__(self, bucket: str = BUCKET) -> None:
        self.bucket = bucket
        self.endpoint = ""
        self._server: Any = None

    def start(self) -> Self:
        from moto.server import ThreadedMotoServer

        ensure_dummy_credentials()
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        self._server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = _loopback_only(f"http://{host}:{port}")
        create_bucket(self.endpoint, self.bucket)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None



# -- SeaweedFS ------------------------------------------------------------------


class SeaweedServer(devservers.SeaweedServer):
    """``weed mini`` on loopback in a temporary directory, with the test bucket ready."""

    def __init__(self, bucket: str = BUCKET, start_timeout: float = 60.0) -> None:
        super().__init__(bucket, start_timeout)

    def start(self) -> Self:
        ensure_dummy_credentials()
        return super().start()


if __name__ == "__main__":  # a quick manual probe: python -m tests.servers
    with SeaweedServer() as weed:
        print(f"SeaweedFS up at {weed.endpoint} in {weed.startup_seconds:.2f}s")
    with MotoServer() as moto:
        print(f"moto up at {moto.endpoint}")
