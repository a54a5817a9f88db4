"""Settings as command-line flags, for ``okq serve`` (every field) and
``okq-compactor`` (the fields it uses): one flag per :class:`Settings` field,
with its description, its ``OKQ_*`` variable and its default in ``--help``, a
number's type checked by click; and the flags given back as Settings, a value
Settings refuses a usage error that names its flag."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from okq.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

#: What --help says a field defaults to, where its default is not a value.
DEFAULT_TEXT = {"signing_keys": "a random development key"}


def settings_options(names: Iterable[str] | None = None) -> Callable[[F], F]:
    """A decorator adding a flag for each Settings field of ``names`` (default:
    all), in that order; a flag not given is None, so Settings reads the
    environment for it."""

    def add(fn: F) -> F:
        for name in reversed(list(Settings.model_fields if names is None else names)):
            fn = _option(name)(fn)
        return fn

    return add


def _option(name: str) -> Callable[[F], F]:
    field = Settings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    default = DEFAULT_TEXT.get(name, field.default if field.default is not None else "none")
    text = f"{field.description} [env OKQ_{name.upper()}; default: {default}]"
    if field.annotation is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=text)
    return click.option(flag, name, type=_click_type(field.annotation), default=None,
                        help=text)


def _click_type(annotation: Any) -> click.ParamType[Any, Any]:
    """INTEGER or FLOAT for numeric settings (so --help says so and a bad number is
    a usage error); text for the rest. Ranges and choices stay with Settings, which
    names them."""
    kinds = {a for a in typing.get_args(annotation) if a is not type(None)} or {annotation}
    if kinds == {int}:
        return click.INT
    if kinds == {float}:
        return click.FLOAT
    return click.STRING


def settings_from(flags: Mapping[str, Any]) -> Settings:
    """Settings from the flags given (the environment for the others); a value it
    refuses is a usage error naming the flag (exit status 2)."""
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise click.UsageError(f"--{where.replace('_', '-')}: {err['msg']}") from None
