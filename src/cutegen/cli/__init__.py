"""The `cutegen` command line. The only place that reads environment variables.

Each command lives in a module of this package and registers itself on `app`; this module wires them
together and turns a `CutegenError` into its one-paragraph message and exit status 2, with no
traceback (the message already says what to fix).
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

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
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmd"):
            importlib.import_module(f"{__name__}.{info.name}")


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        # Standalone mode: usage errors print click's message and exit 2, typer.Exit/sys.exit set the
        # status; only our own errors need catching here.
        app(args=argv, prog_name="cutegen")
    except SystemExit as done:
        if done.code not in (0, None):  # success returns, so in-process callers can go on
            raise
    except CutegenError as err:
        from rich.markup import escape  # the message is text: "cutegen[ray]" is no style tag

        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_USER_ERROR)
