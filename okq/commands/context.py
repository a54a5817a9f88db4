"""What every client command shares: the context from the group's options, the
consoles, errors as one-line messages, text-or-JSON output, --at times, batches
and progress bars."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from okq.clock import assume_utc
from okq.errors import OkqError, Unauthorized

if TYPE_CHECKING:
    from okq.client import Client

T = TypeVar("T")
BATCH = 500


@dataclass
class Ctx:
    url: str
    api_key: str | None
    output: str
    timeout: float
    namespace: str | None = None
    ca_file: str | None = None

    @property
    def json(self) -> bool:
        return self.output == "json"

    def client(self) -> Client:
        import ssl

        from okq.client import Client

        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        return Client(self.url, timeout=self.timeout, api_key=self.api_key,
                      namespace=self.namespace, ssl=context)


# Nothing okq prints is markup: payloads, file names and errors are shown as they are.
# Piped output is not cut to 80 columns: ids and tokens must survive a pipe.
out = Console(markup=False, highlight=False,
              width=None if sys.stdout.isatty() else max(200, Console().width))
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    err.print(Text("error:", style="red"), " ".join(message.split()))
    sys.exit(code)


def run(fn: Callable[..., Awaitable[T]]) -> Callable[..., T | None]:
    """Run an async command body with a client; turn okq's errors into messages."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        import asyncio

        from pydantic import ValidationError

        ctx: Ctx = click.get_current_context().find_object(Ctx)  # type: ignore[assignment]

        async def body() -> T:
            async with ctx.client() as client:
                return await fn(ctx, client, *args, **kwargs)

        try:
            return asyncio.run(body())
        except Unauthorized as exc:
            fail(f"{exc.message}; give it with --api-key or OKQ_API_KEY")
        except OkqError as exc:
            field = exc.details.get("field")
            hint = " (check --url or OKQ_URL)" if exc.details.get("not_okq") else ""
            fail(f"{exc.message}{hint}" + (f" (field: {field})" if field and field not in
                                           exc.message else ""))
        except ValidationError as exc:
            first = exc.errors()[0]
            fail(f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        except (OSError, ValueError) as exc:
            fail(str(exc))
        return None

    return wrapper


def emit(ctx: Ctx, data: Any, text: Callable[[], None]) -> None:
    if ctx.json:
        click.echo(json.dumps(plain(data), indent=None))
    else:
        text()


def plain(data: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [plain(d) for d in data]
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    return data


def when(value: str | None, field: str) -> datetime | None:
    """An RFC 3339 time, or +SECONDS from now."""
    from okq import wire as s

    if value is None:
        return None
    try:
        if value.startswith("+"):
            parsed = datetime.now(UTC) + timedelta(seconds=float(value[1:]))
        else:
            parsed = assume_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{value!r} is not an RFC 3339 time or +SECONDS",
                                 param_hint=field) from None
    if not s.MIN_TIME <= parsed <= s.MAX_TIME:
        raise click.BadParameter(f"{value!r} is outside 1970-01-01 .. 9000-01-01",
                                 param_hint=field)
    return parsed


def batches(items: Iterator[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _NullProgress:
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...


class _RichProgress:
    def __init__(self, total: int | None, what: str) -> None:
        from rich.progress import Progress

        self.p = Progress(console=err)
        self.p.start()
        self.task = self.p.add_task(what, total=total)

    def advance(self, n: int) -> None:
        self.p.advance(self.task, n)

    def close(self) -> None:
        self.p.stop()


def progress(ctx: Ctx, total: int | None, what: str) -> Any:
    """A progress bar on a terminal for large inputs; nothing otherwise."""
    if ctx.json or not err.is_terminal or (total is not None and total < 1000):
        return _NullProgress()
    return _RichProgress(total, what)
