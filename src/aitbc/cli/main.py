"""The ``aitbc`` command line: parse, build, run, and turn user errors into one line."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from aitbc import __version__
from aitbc.cli.common import err
from aitbc.errors import AitbcError

app = typer.Typer(
    name="aitbc",
    help="Train one model across many untrusted GPU providers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aitbc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    _state["debug"] = debug


def _register() -> None:
    # Imported here so each command module stays importable on its own.
    from aitbc.cli import ipfs, simulate

    app.add_typer(ipfs.app, name="ipfs")
    app.command("simulate")(simulate.simulate)


_register()


def main() -> None:
    try:
        app()
    except AitbcError as e:
        if _state["debug"]:
            raise
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
