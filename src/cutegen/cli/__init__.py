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
        # Without standalone mode click returns a command's exit status instead of exiting.
        code = app(args=argv, standalone_mode=False)
    except CutegenError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_USER_ERROR)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(err.exit_code)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)
