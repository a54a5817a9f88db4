"""The ``okq`` commands: serve (a node), fleet (a local fleet), and those that talk
to a node: items, queues, stats, dead letters, export / import, shell workers, keys.

Every client command takes the group's ``--output json`` for scripts, exits non-zero
with a one-line message on errors, and never shows a traceback for a user
mistake (a bad flag, a missing queue, an unreachable node).

``context`` holds what they share (the context, output, errors), ``tables`` how
they show things; ``items``, ``queues``, ``export_import``, ``keys``, ``serve`` and
``fleet`` the commands. Each is loaded when it is asked for (``LazyGroup``): a
command's start-up pays only for its own module.
"""

from __future__ import annotations

import importlib

import click

#: Each command's name and where it lives (module, attribute).
COMMANDS = {
    "produce": ("okq.commands.items", "produce"),
    "lease": ("okq.commands.items", "lease"),
    "complete": ("okq.commands.items", "complete"),
    "renew": ("okq.commands.items", "renew"),
    "retry": ("okq.commands.items", "retry"),
    "items": ("okq.commands.items", "items"),
    "work": ("okq.commands.items", "work"),
    "queues": ("okq.commands.queues", "queues"),
    "stats": ("okq.commands.queues", "stats"),
    "purge": ("okq.commands.queues", "purge"),
    "dead": ("okq.commands.queues", "dead"),
    "export": ("okq.commands.export_import", "export_"),
    "import": ("okq.commands.export_import", "import_"),
    "keys": ("okq.commands.keys", "keys"),
    "serve": ("okq.commands.serve", "serve"),
    "fleet": ("okq.commands.fleet", "fleet"),
}


#: The commands that run a node rather than talk to one: the group's client options
#: (``--url``, ``-o``, ...) are not theirs (``serve`` has a ``--namespace`` of its own).
NODE_COMMANDS = frozenset({"serve", "fleet"})


class LazyGroup(click.Group):
    """A group whose commands (``COMMANDS``) are imported on first use. A client
    command also takes the group's options after its name (``okq stats jobs -o
    json``), as ``late_options`` gives them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attr)
            if cmd_name not in NODE_COMMANDS:
                late_options(command, self.params)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


def late_options(command: click.Command, group_params: list[click.Parameter]) -> None:
    """Give ``command`` (and each command of it, if it is a group) the group's options,
    to be written after its name: a value given there replaces the group's (env
    variables and defaults are read by the group alone). An option whose flag the
    command has already is left out."""
    taken = {opt for p in command.params for opt in getattr(p, "opts", ())}
    for param in group_params:
        if isinstance(param, click.Option) and param.expose_value and param.name \
                and not taken & set(param.opts):
            command.params.append(_late(param))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            late_options(sub, group_params)


def _late(param: click.Option) -> click.Option:
    """A copy of the group's ``param`` that sets the group's value (on the context's
    ``Ctx``) when given, and is hidden in the command's help but for ``-o``."""
    name = param.name or ""

    def given(ctx: click.Context, _: click.Parameter, value: object) -> None:
        if value is not None:
            from okq.commands.context import Ctx

            setattr(ctx.find_object(Ctx), name, value)

    return click.Option(param.opts, type=param.type, default=None, expose_value=False,
                        callback=given, help=param.help, hidden=name != "output")
