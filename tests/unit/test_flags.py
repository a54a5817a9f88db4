"""Settings as flags (okq/flags.py), one builder for ``okq serve`` and
``okq-compactor``: the same flag reads the same way in both, and a value
Settings refuses, from a flag or from its OKQ_* variable, is a usage error that
names the flag (exit status 2) before anything starts."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from compactor.cli import main as compactor_main
from okq.cli import main as okq_main
from okq.flags import settings_options


@pytest.mark.parametrize(("args", "env"), [
    (["serve", "--log-level", "loud"], {}),
    (["serve"], {"OKQ_LOG_LEVEL": "loud"}),
])
def test_serve_refuses_an_unknown_log_level_naming_the_flag(args: list[str],
                                                            env: dict[str, str]) -> None:
    """It used to start logging with it, and stop on a traceback (ValueError:
    Unknown level) instead of a usage error."""
    result = CliRunner().invoke(okq_main, args, env=env)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "--log-level: " in result.output and "'loud'" in result.output, result.output


def test_the_compactor_refuses_an_unknown_log_level_from_the_environment() -> None:
    result = CliRunner().invoke(compactor_main, ["--once", "--store", "memory://"],
                                env={"OKQ_LOG_LEVEL": "loud"})
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "--log-level: " in result.output, result.output


def test_a_log_level_in_any_case_is_taken() -> None:
    from okq.settings import Settings

    assert Settings(log_level="warning").log_level == "WARNING"


def _types(help_text: str) -> dict[str, str]:
    return dict(re.findall(r"^  (--[a-z0-9-]+) ([A-Z]+)", help_text, re.MULTILINE))


def test_both_commands_show_a_shared_setting_alike() -> None:
    """The compactor's flags are okq serve's, as one builder makes them: a number
    is a number in both (the compactor's --s3-timeout used to read as TEXT)."""
    serve = CliRunner().invoke(okq_main, ["serve", "--help"]).output
    compactor = CliRunner().invoke(compactor_main, ["--help"]).output
    shared = {"--store", "--endpoint-url", "--s3-timeout", "--namespace", "--log-level"}
    assert {k: v for k, v in _types(compactor).items() if k in shared} == {
        k: v for k, v in _types(serve).items() if k in shared}
    assert _types(compactor)["--s3-timeout"] == "FLOAT"
    for flag in shared | {"--self-check / --no-self-check"}:
        line = re.search(rf"^  {flag}\b.*$", compactor, re.MULTILINE)
        assert line is not None, flag


def test_a_subset_keeps_the_order_it_is_given() -> None:
    @click.command()
    @settings_options(["namespace", "store"])
    def command(**flags: object) -> None: ...

    assert [p.name for p in command.params] == ["namespace", "store"]
