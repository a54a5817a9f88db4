"""The ``okq`` command line. ``okq serve`` starts a node (okq/commands/serve.py).

Each command's module is imported when the command runs (``LazyGroup``): ``okq
stats`` does not load the node, ``okq serve`` not the client.
"""

from __future__ import annotations

import click

from okq.commands import LazyGroup
from okq.commands.context import Ctx


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="okq")
@click.option("--url", envvar="OKQ_URL", default="http://127.0.0.1:7878", show_default=True,
              help="the node to talk to [env OKQ_URL]")
@click.option("--api-key", envvar="OKQ_API_KEY", default=None,
              help="API key, when the node requires one [env OKQ_API_KEY]")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: machine-readable output for scripts")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="seconds to wait for the node")
@click.option("--namespace", "namespace", envvar="OKQ_CLIENT_NAMESPACE", default=None,
              help="the namespace to act in, for an operator key (a namespace's key acts "
              "in its own) [env OKQ_CLIENT_NAMESPACE]")
@click.option("--ca-file", envvar="OKQ_CA_FILE", default=None,
              help="PEM file of the CA that signed an https node's certificate [env "
              "OKQ_CA_FILE]")
@click.pass_context
def main(ctx: click.Context, url: str, api_key: str | None, output: str,
         timeout: float, namespace: str | None, ca_file: str | None) -> None:
    """okq: a durable message queue on object storage.

    `okq serve` runs a node; the other commands talk to one. Their options
    above may also come after the command: `okq stats jobs -o json`.
    """
    ctx.obj = Ctx(url, api_key, output, timeout, namespace, ca_file)


if __name__ == "__main__":
    main()
