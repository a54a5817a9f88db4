"""``okq serve``: run a node. Its flags (``okq.flags``: one per Settings field) and
the node are loaded only when ``okq serve`` runs or shows its --help: ``okq --help``
and the client commands do not pay for the node's settings and server."""

from __future__ import annotations

import logging
import signal
import sys
import typing
from typing import TYPE_CHECKING, Any

import click

from okq.errors import OkqError

if TYPE_CHECKING:
    from okq.settings import Settings


class _FlagsOnFirstUse(click.Command):
    """A command whose flags are the node's settings (``okq.flags.settings_options``),
    made when first asked for: ``okq --help`` lists the command without them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._params: list[click.Parameter] | None = None
        super().__init__(*args, **kwargs)

    @property
    def params(self) -> list[click.Parameter]:
        if self._params is None:
            from okq.flags import settings_options

            self._params = click.command()(settings_options()(_no_body)).params
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        self._params = value or None  # click's constructor gives [] for "none yet"


def _no_body(**flags: Any) -> None:
    """Where settings_options puts the flags, to be taken from."""


@click.command(cls=_FlagsOnFirstUse)
def serve(**flags: Any) -> None:
    """Run an okq node: the lease API over HTTP."""
    import asyncio

    from okq.flags import settings_from
    from okq.store import exit_past_native_threads

    settings = settings_from(flags)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from okq.loops import choose

    try:
        loop = choose(settings.event_loop)
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            runner.run(run_node(settings, loop.name))
    except (OkqError, ValueError, OSError) as exc:
        _exit_with_error(str(exc))
    exit_past_native_threads(0)  # everything is closed: see its docstring


def _exit_with_error(message: str) -> typing.NoReturn:
    """Say why the node could not run, in click's words, and exit with status 1: past
    native threads (a missing bucket, found by the start-up self-check, used to end
    in SIGABRT now and then when the interpreter finalised; see
    ``exit_past_native_threads``)."""
    from okq.store import exit_past_native_threads

    click.echo(f"Error: {' '.join(message.split())}", err=True)
    exit_past_native_threads(1)
    sys.exit(1)


#: The cyclic garbage collector's thresholds in a node: a young collection per 50,000
#: allocations rather than 700. A lease of 100 items allocates thousands of objects,
#: nearly all freed by reference counting; collecting every 700 cost about 3 % of a
#: node's instructions per message (benchmarks/bench_node_instructions.py).
GC_THRESHOLDS = (50_000, 20, 20)


def _settle_gc() -> None:
    """Move what start-up made (modules, the app, settings) out of the collector's
    sight for good (``gc.freeze``) and collect young objects less often."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def run_node(settings: Settings, loop_name: str = "asyncio") -> None:
    import asyncio

    from aiohttp import web

    from okq.server.app import create_app
    from okq.server.listener import listen
    from okq.server.state import advertise
    from okq.store import FileStore, open_store

    store = open_store(settings.store, endpoint_url=settings.endpoint_url,
                       timeout=settings.s3_timeout)
    if isinstance(store, FileStore):  # its writes then never make a lock stripe
        await asyncio.to_thread(store.make_lock_stripes)
    app = create_app(settings, store)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=30)
    try:
        await runner.setup()  # the store's self-check: a missing bucket fails here
    except BaseException:
        await store.close()  # nothing else was started; its connections were
        raise
    _settle_gc()
    server = None
    try:
        server = await listen(runner, settings)
        sockets = list(server.sockets or ())
        port = sockets[0].getsockname()[1] if sockets else settings.port
        scheme = "https" if settings.tls_cert else "http"
        advertise(app, settings.host, port, scheme)
        logging.getLogger("okq").info(
            "okq listening on %s://%s:%s (store %s, namespace %s, event loop %s)",
            scheme, settings.host, port, store.url, settings.namespace, loop_name,
        )
        from okq import native  # compiled or pure: said once, a warning when pure

        logging.getLogger("okq").log(logging.INFO if native.COMPILED else logging.WARNING,
                                     "%s", native.describe())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.getLogger("okq").info("stopping: finishing in-flight requests")
    finally:
        if server is not None:
            server.close()  # stop accepting
        await runner.cleanup()  # finish requests, flush batches
