"""The `cutegen` command line. The only place that reads environment variables.

Each command lives in a module of this package and registers itself on `app`; this module wires them
together and turns a `CutegenError` into its one-paragraph message and exit status 2, with no
traceback (the message already says what to fix).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

import typer
from rich.console import Console
from rich.markup import escape

from cutegen import __version__
from cutegen.errors import CutegenError

app = typer.Typer(
    name="cutegen",
    help="Turn a PyTorch reference program into a faster, verified CuTe GPU kernel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)

EXIT_USER_ERROR = 2


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cutegen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """cutegen: generate, test and refine CuTe kernels for PyTorch programs."""


def _register() -> None:
    # Imported for their side effect of adding commands to `app`.
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmd"):
            importlib.import_module(f"{__name__}.{info.name}")


def main(argv: list[str] | None = None) -> None:
    _register()
    args = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in args  # stdout then carries one JSON object on every exit, errors included
    try:
        if as_json:
            _main_for_json(args)
        else:
            # Standalone mode: usage errors print click's message and exit 2, typer.Exit/sys.exit set
            # the status; only our own errors need catching here.
            app(args=args, prog_name="cutegen")
    except SystemExit as done:
        if done.code not in (0, None):  # success returns, so in-process callers can go on
            raise
    except CutegenError as err:
        if as_json:
            _echo_exit(EXIT_USER_ERROR, "usage_error", str(err))
        # escaped: the message is text ("cutegen[ray]" is no style tag)
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_USER_ERROR)


def _main_for_json(args: list[str]) -> None:
    """Run a command that was asked for --json so that a command line click rejects (an unknown
    option, a missing argument) also answers with a JSON object on stdout; its message goes to stderr."""
    try:
        status = app(args=args, prog_name="cutegen", standalone_mode=False)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as err:  # click's usage errors (typer carries its own click)
        code = getattr(err, "exit_code", EXIT_USER_ERROR)
        _echo_exit(code, "usage_error", err.format_message() if hasattr(err, "format_message") else str(err))
        if hasattr(err, "show"):
            err.show()
        sys.exit(code)
    if isinstance(status, int) and status:  # a typer.Exit's code, returned outside standalone mode
        sys.exit(status)


def _echo_exit(status: int, reason: str, message: str) -> None:
    """The JSON object of an exit that is not the command's own answer (no verdict came)."""

    typer.echo(json.dumps({"exit_status": status, "reason": reason, "message": message}))
