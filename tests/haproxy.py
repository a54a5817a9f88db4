"""HAProxy in front of local okq nodes, run from deploy/haproxy/haproxy.cfg itself.

The deploy file's servers and bind address are swapped for local ones and
nothing else is changed, so what the tests and the fault campaign measure is the
configuration users deploy.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from okq.dev.servers import HOST, Process, Server, ServerMissing, port_answers

DEPLOY_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "haproxy.cfg"
_SERVER = re.compile(r"^[ \t]*server \S+ \S+[ \t]*$", re.MULTILINE)
_BIND = re.compile(r"^([ \t]*)bind \S+[ \t]*$", re.MULTILINE)


def haproxy_binary() -> str:
    """haproxy on PATH, else Debian's /usr/sbin/haproxy."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise ServerMissing("no `haproxy` binary: install it with `apt-get install haproxy`")
    return found


def local_config(port: int, upstreams: Sequence[str], deploy: str | None = None) -> str:
    """deploy/haproxy/haproxy.cfg listening on ``HOST:port`` over ``upstreams``."""
    text = DEPLOY_CONFIG.read_text() if deploy is None else deploy
    servers = _SERVER.findall(text)
    if not servers or not text.rstrip().endswith(servers[-1].strip()) \
            or len(_BIND.findall(text)) != 1:
        raise ValueError("the HAProxy configuration must have one bind and end with "
                         "its backend's server lines")
    indent = servers[0][: len(servers[0]) - len(servers[0].lstrip())]
    lines = "\n".join(f"{indent}server node{i} {u}" for i, u in enumerate(upstreams, 1))
    text = _SERVER.sub("", text).rstrip() + "\n" + lines + "\n"
    return _BIND.sub(lambda m: f"{m.group(1)}bind {HOST}:{port}", text)


class HaproxyServer(Server):
    """HAProxy in the foreground (``-db``) on ``HOST:port`` in front of ``upstreams``."""

    def __init__(self, root: Path, port: int, upstreams: Sequence[str],
                 start_timeout: float = 15.0) -> None:
        self.root = root
        self.port = port
        self.upstreams = list(upstreams)
        self.start_timeout = start_timeout
        self.url = f"http://{HOST}:{port}"
        self.process: Process | None = None

    def start(self) -> Self:
        binary = haproxy_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "haproxy.cfg"
        conf.write_text(local_config(self.port, self.upstreams))
        self.process = Process("haproxy", [binary, "-db", "-f", str(conf)],
                               self.root / "haproxy.out", cwd=self.root)
        self.process.start()
        deadline = time.monotonic() + self.start_timeout
        while not port_answers(self.port):
            if not self.process.alive() or time.monotonic() > deadline:
                tail = self.process.tail(20)
                self.stop()
                raise RuntimeError(f"haproxy did not listen on {self.url}:\n{tail}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: HAProxy's hard stop (SIGUSR1 would wait for every long poll)."""
        if self.process is not None:
            self.process.stop(timeout)
