"""``--event-loop``: which loop each choice makes, and what happens without uvloop."""

from __future__ import annotations

import asyncio
import importlib
import types

import pytest

from okq import loops


def _made(loop: loops.Loop) -> asyncio.AbstractEventLoop:
    made = loop.factory()
    made.close()
    return made


def test_asyncio_is_the_standard_librarys_loop() -> None:
    loop = loops.choose("asyncio")
    assert loop.name == "asyncio"
    assert type(_made(loop)).__module__.startswith("asyncio.")


def test_auto_and_uvloop_take_uvloop_where_it_is_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    for choice in ("auto", "uvloop"):
        loop = loops.choose(choice)  # type: ignore[arg-type]
        assert loop.name == f"uvloop {uvloop.__version__}"
        assert isinstance(_made(loop), uvloop.Loop)


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import uvloop`` fails, as where it is not installed."""
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        if name == "uvloop":
            raise ModuleNotFoundError("No module named 'uvloop'")
        return real(name, package)

    monkeypatch.setattr(loops.importlib, "import_module", import_module)


@pytest.mark.usefixtures("no_uvloop")
def test_auto_without_uvloop_is_asyncio() -> None:
    loop = loops.choose("auto")
    assert loop.name == "asyncio"
    assert type(_made(loop)).__module__.startswith("asyncio.")


@pytest.mark.usefixtures("no_uvloop")
def test_uvloop_asked_for_and_missing_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"--event-loop uvloop: uvloop is not installed .*"
                       r"--event-loop asyncio"):
        loops.choose("uvloop")


def test_an_unknown_choice_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--event-loop must be one of auto, uvloop, asyncio"):
        loops.choose("trio")  # type: ignore[arg-type]
