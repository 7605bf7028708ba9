"""The ``aitbc`` command line: parse, build, run, and turn user errors into one line."""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import typer
from rich.markup import escape

from aitbc import __version__
from aitbc.cli.common import err, shown
from aitbc.errors import AitbcError

try:  # typer >= 0.22 vendors click; its parser errors derive from TyperException
    from typer.exceptions import TyperException as ParserError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException as ParserError  # type: ignore[assignment]

app = typer.Typer(
    name="aitbc",
    help="Train one model across many untrusted GPU providers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)


def _flags_without_placeholder() -> None:
    """typer's rich help shows every option's type, a flag's too (``--json <bool>``): a flag
    takes no value, so it shows none."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_aitbc", False):  # typer < 0.22 shows no types: nothing to do
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and not self.count and self.metavar is None else shown(self, ctx)

    display_type_rich._aitbc = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_placeholder()


def _help_paragraphs_reflowed() -> None:
    """typer's rich help joins a command's first paragraph into one line but keeps the
    docstring's line breaks in the others, so prose wrapped at 90 columns broke mid-sentence
    at 80. Each later paragraph becomes one line that the terminal's width wraps, unless it
    is laid out on purpose (click's ``\\b`` marker, or an indented line)."""
    from typer import rich_utils

    joined = getattr(rich_utils, "_fix_linebreaks", None)
    if joined is None or getattr(joined, "_aitbc", False):  # another typer: it shows what it shows
        return

    def reflowed(paragraphs: list[str], markup_mode: Any) -> str:
        return joined([_one_line(p) for p in paragraphs], markup_mode)

    reflowed._aitbc = True  # type: ignore[attr-defined]
    rich_utils._fix_linebreaks = reflowed


def _one_line(paragraph: str) -> str:
    lines = paragraph.split("\n")
    if paragraph.startswith("\b") or any(line.startswith((" ", "\t")) for line in lines):
        return paragraph
    return " ".join(line.strip() for line in lines)


_help_paragraphs_reflowed()

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aitbc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    ca_cert: str | None = typer.Option(
        None,
        "--ca-cert",
        help="CA certificate an https:// coordinator's certificate must chain to (sets AITBC_CA_CERT).",
    ),
) -> None:
    _state["debug"] = debug
    if ca_cert:  # every client (the SDK's agents, the worker's) reads it from there
        os.environ["AITBC_CA_CERT"] = ca_cert


def _register() -> None:
    # Imported here so each command module stays importable on its own.
    from aitbc.cli import chain, demo, ipfs, ledger, market, services, simulate, stack, training, wallet

    app.add_typer(ipfs.app, name="ipfs")
    app.command("simulate")(simulate.simulate)
    app.add_typer(wallet.app, name="wallet")
    app.add_typer(ledger.app, name="ledger")
    app.add_typer(chain.app, name="chain")
    app.add_typer(services.coordinator_app, name="coordinator")
    app.add_typer(services.worker_app, name="worker")
    app.add_typer(training.app, name="distributed-training")
    app.add_typer(market.app, name="market")
    for name in ("up", "down", "status"):
        app.command(name)(getattr(stack, name))
    app.command("demo")(demo.demo)


_register()


def _warning_line(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """Our own warnings (a corpus cut to ``--max-bytes``) as one ``warning:`` line on stderr;
    other packages' as Python shows them."""
    if category.__module__.startswith("aitbc"):
        err.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False)
    else:
        _show_warning(message, category, *args, **kwargs)


_show_warning = warnings.showwarning
warnings.showwarning = _warning_line


def main() -> None:
    """Run the CLI. Every user error ends as one line on stderr and a non-zero exit:
    our own errors (``AitbcError``) and the parser's (unknown option, bad number). With
    ``--json`` the error is also one JSON object on stdout, ``{"error": code, "detail":
    text}`` (the API's error shape), so a script reading stdout sees it."""
    try:
        rv = app(standalone_mode=False)
    except AitbcError as e:  # the SDK's errors too (AgentError is one)
        if _state["debug"]:
            raise
        # The coordinator's 422 (a value it refuses) is a usage error, as the CLI's own are.
        _fail(_message(e), 2 if getattr(e, "status", None) == 422 else e.exit_code, _code(e))
    except typer.Abort:
        _fail("aborted", 1, "aborted")
    except ParserError as e:  # the parser's usage errors
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":
            err.print(e.format_message(), markup=False, highlight=False)
            sys.exit(e.exit_code)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _fail(e.format_message() + hint, e.exit_code, "usage")
    except KeyboardInterrupt:
        _fail("interrupted", 130, "interrupted")
    sys.exit(rv if isinstance(rv, int) else 0)


def _message(e: AitbcError) -> str:
    """The error's one line: for the SDK's errors, their detail without the code."""
    from aitbc_agent_sdk.errors import AgentError  # loaded on the error path only

    return e.detail if isinstance(e, AgentError) else str(e)


def _code(e: AitbcError) -> str:
    """The error's stable code: the coordinator's (``unknown_run``), a unit's (``bad_amount``),
    else one named after its kind (``usage``, ``not_found``, ``integrity``, ``error``)."""
    from aitbc.errors import IntegrityError, NotFoundError, UsageError

    code = getattr(e, "code", None)
    if isinstance(code, str) and code:
        return code
    for kind, name in ((UsageError, "usage"), (NotFoundError, "not_found"), (IntegrityError, "integrity")):
        if isinstance(e, kind):
            return name
    return "error"


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among the command's options (not after ``--``)."""
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def _fail(message: str, code: int, error: str = "error") -> None:
    if _wants_json(sys.argv[1:]):
        sys.stdout.write(json.dumps({"error": error, "detail": message}) + "\n")
        sys.stdout.flush()
    err.print(f"[red]error:[/red] {escape(shown(message))}", highlight=False)  # a coordinator's words too
    sys.exit(code)


if __name__ == "__main__":
    main()
