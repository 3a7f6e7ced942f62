"""The ``hookcli`` group: errors as one ``Error: …`` line (exit 2 for bad usage, 1 for failures at run time;
``--debug`` shows the traceback instead), Python warnings as one ``Note: …`` line each, SIGTERM unwound like
Ctrl-C (temporary files go, exit 143), ``--version`` and ``--debug``.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

import click

from hookcli.cli.declared import CONTEXT_SETTINGS
from hookcli.console import Terminated, notes_and_sigterm, printable
from hookcli.errors import HookcliError, first_line, install_hint
from hookcli.version import __version__

__all__ = ["main"]


#: What click (8.2 and later) raises for a group called with no arguments.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _HookcliGroup(click.Group):
    """A group whose errors are single lines, and tracebacks only with ``--debug``."""

    debug = False

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        self.debug = os.environ.get("HOOKCLI_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
        with notes_and_sigterm(lambda text: click.echo(text, err=True), debug=lambda: self.debug):
            try:
                result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except _NO_ARGS_IS_HELP as err:  # bare `hookcli`: the help is what was asked for
                click.echo(err.ctx.get_help())
                sys.exit(0)
            except click.UsageError as err:
                where = f"'{err.ctx.command_path} --help'" if err.ctx else "'hookcli --help'"
                said = self._usage_message(err).rstrip(".")
                _exit_with_error(f"{said}{'' if said.endswith(('?', '?)')) else '.'} Hint: see {where}", err.exit_code)
            except click.ClickException as err:
                _exit_with_error(err.format_message(), err.exit_code)
            except HookcliError as err:
                if self.debug:
                    traceback.print_exc()
                    sys.exit(err.exit_code)
                _exit_with_error(str(err), err.exit_code)
            except (KeyboardInterrupt, click.Abort):
                click.echo("Aborted.", err=True)
                sys.exit(130)
            except Terminated:
                click.echo("Terminated.", err=True)
                sys.exit(128 + signal.SIGTERM)
            except BrokenPipeError:
                # The reader went away (e.g. `| head`); stop quietly like other Unix tools.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(1)
            except Exception as err:
                if self.debug:
                    raise
                hint = f"Hint: {install_hint(err) or 'rerun with --debug for the traceback'}"
                _exit_with_error(f"{type(err).__name__}: {first_line(err).rstrip('.')}. {hint}", 1)
        sys.exit(result if isinstance(result, int) else 0)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # --debug is the group's, taken wherever it comes before "--": the hints say to rerun a command with it.
        end = args.index("--") if "--" in args else len(args)
        if "--debug" in args[:end]:
            args = ["--debug", *(arg for arg in args[:end] if arg != "--debug"), *args[end:]]
        return super().parse_args(ctx, args)

    def _usage_message(self, err: click.UsageError) -> str:
        """Click's message; for an option of another command, which commands take it."""
        if not isinstance(err, click.NoSuchOption):
            return err.format_message()
        root = err.ctx.find_root().command_path if err.ctx else "hookcli"
        owners = [
            f"'{root} {name}'"
            for name, command in self.commands.items()
            if any(
                err.option_name in (*p.opts, *p.secondary_opts)
                for p in command.params
                if isinstance(p, click.Option) and not p.hidden
            )
        ]
        if not owners:
            return err.format_message()
        listed = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
        return f"No such option: {err.option_name} (it belongs to {listed})"


def _exit_with_error(message: str, code: int) -> None:
    click.echo(f"Error: {printable(message)}", err=True)
    sys.exit(code)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    root = ctx.find_root().command
    if value and isinstance(root, _HookcliGroup):
        root.debug = True


@click.group(name="hookcli", cls=_HookcliGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="hookcli")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    callback=_set_debug,
    is_eager=True,
    help="Show full tracebacks and warnings (also HOOKCLI_DEBUG=1).",
)
def main() -> None:
    """See inside PyTorch vision models: hook any layer, save what it returns.

    \b
      hookcli models                                     # what can be loaded
      hookcli layers --model vgg16_bn                    # what can be hooked
      hookcli extract --model vgg16_bn --layer features.18 img.jpg
    """
