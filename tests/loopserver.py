"""A test server that runs its own asyncio event loop in a daemon thread, so that
synchronous and asynchronous tests alike can start it (tests/s3proxy.py,
tests/forwardtap.py): a subclass sets itself up in ``_setup`` and down in
``_teardown``, both run on that loop."""

from __future__ import annotations

import abc
import asyncio
import threading
from typing import Self

from tests.servers import Server


class LoopServer(Server):
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @abc.abstractmethod
    async def _setup(self) -> None: ...

    @abc.abstractmethod
    async def _teardown(self) -> None: ...

    def start(self) -> Self:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name=type(self).__name__,
                                        daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._setup(), loop).result(10)
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._teardown(), loop).result(30)
        asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        loop.close()
