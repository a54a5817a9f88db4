"""HAProxy in front of local okq nodes, run from deploy/haproxy/haproxy.cfg itself.

The deploy file's servers and bind address are swapped for local ones and
nothing else is changed, so what the tests and the fault campaign measure is the
configuration users deploy.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from okq.dev.nginx import Balancer
from okq.dev.servers import HOST, ServerMissing

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


class HaproxyServer(Balancer):
    """HAProxy in the foreground (``-db``) on ``HOST:port`` in front of ``upstreams``."""

    name = "haproxy"

    def start(self) -> Self:
        binary = haproxy_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "haproxy.cfg"
        conf.write_text(local_config(self.port, self.upstreams))
        return self.launch([binary, "-db", "-f", str(conf)])
