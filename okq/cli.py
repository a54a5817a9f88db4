"""The ``okq`` command line. ``okq serve`` starts a node."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import click
from aiohttp import web
from pydantic import ValidationError

from okq.errors import OkqError
from okq.settings import Settings
from okq.store import open_store


def _settings_options(fn: Any) -> Any:
    """One flag per Settings field, with its description and env var in --help."""
    for name, field in reversed(list(Settings.model_fields.items())):
        flag = "--" + name.replace("_", "-")
        env = f"OKQ_{name.upper()}"
        default = field.default if field.default is not None else "none"
        if name == "signing_keys":
            default = "a random development key"
        text = f"{field.description} [env {env}; default: {default}]"
        if field.annotation is bool:
            fn = click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=text)(fn)
        else:
            fn = click.option(flag, name, default=None, help=text)(fn)
    return fn


@click.group()
@click.version_option(package_name="okq")
def main() -> None:
    """okq: a durable message queue on object storage."""


@main.command()
@_settings_options
def serve(**flags: Any) -> None:
    """Run an okq node: the lease API over HTTP."""
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise click.UsageError(f"--{where.replace('_', '-')}: {err['msg']}") from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(run_node(settings))
    except (OkqError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


async def run_node(settings: Settings) -> None:
    from okq.server.app import create_app

    store = open_store(settings.store, endpoint_url=settings.endpoint_url)
    app = create_app(settings, store)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=30)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        port = sockets[0].getsockname()[1] if sockets else settings.port
        logging.getLogger("okq").info(
            "okq listening on http://%s:%s (store %s, namespace %s)",
            settings.host, port, store.url, settings.namespace,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.getLogger("okq").info("stopping: finishing in-flight requests")
    finally:
        await runner.cleanup()  # stop accepting, finish requests, flush batches


if __name__ == "__main__":
    main()
