"""What every command that runs something shares: printing the events a run reports (a progress bar on a
terminal, written paths on stdout, notes on stderr), calling the library, and which options were given.

:mod:`hookcli.api` is imported when a command runs (``--help`` and the refusals made while parsing go without it).
"""

from __future__ import annotations

import contextlib
import sys

import click

from hookcli.console import printable, stdout_for_data
from hookcli.errors import HookcliError
from hookcli.events import Advanced, Damaged, Note, Skipped, Started, Wrote
from hookcli.run.launch import detect_part

__all__ = ["Reporter", "given_options", "launched_part", "library", "run_command"]


class Reporter:
    """Prints a run's events: written paths on stdout, notes and skipped inputs on stderr, a bar on a terminal.
    ``quiet`` (``-q``) leaves out the bar and the notes of images decoded though damaged. A skip said already (each
    pair of frames of one video, skipped for one reason) is not said again."""

    def __init__(
        self, quiet: bool = False, *, echo_paths: bool = True, launched: bool = False, bar: bool = True
    ) -> None:
        self.quiet, self.echo_paths, self.bar = quiet, echo_paths, None
        self.skips: set[str] = set()
        self.launched = launched  # one of many processes started together: the work done is theirs, not earlier
        self.show_bar = bar and not quiet  # of many processes, the first draws it

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __call__(self, event) -> None:
        if isinstance(event, Started):
            self.close()
            if event.done and event.output and not self.launched:
                click.echo(f"Continuing: {event.done} of {event.total} inputs are already in {event.output}", err=True)
            if self.show_bar and sys.stderr.isatty():
                from tqdm import tqdm  # about 60 ms: loaded when a bar is first drawn, not for --help or a pipe

                self.bar = tqdm(total=event.total, initial=event.done, unit="img", file=sys.stderr, dynamic_ncols=True)
        elif isinstance(event, Advanced) and self.bar is not None:
            self.bar.update(event.count)
        elif isinstance(event, Skipped) and event.error not in self.skips:
            self.skips.add(event.error)
            click.echo(f"Skipped: {printable(event.error)}", err=True)
        elif isinstance(event, Note):
            click.echo(f"Note: {printable(event.text)}", err=True)
        elif isinstance(event, Damaged) and not self.quiet:
            click.echo(
                f"Note: '{printable(event.input)}' is damaged ({printable(event.detail)}); decoded anyway", err=True
            )
        elif isinstance(event, Wrote) and self.echo_paths:
            if self.bar is not None:  # on a terminal the path gets a line of its own, above the bar
                self.bar.clear()
            click.echo(printable(str(event.path)))
            if self.bar is not None:
                self.bar.refresh()


def run_command(command: str, options: dict, *args) -> None:
    """Call the library's ``command`` with the parsed options; print what it reports."""
    api = library()
    quiet, model = options.pop("quiet"), options.pop("model")
    options["output"] = options["output"] or api.DEFAULT_OUTPUT
    to_stdout = options["output"] == "-" and command != "cam"  # stdout carries the file's bytes
    part = launched_part()
    with (
        contextlib.closing(
            Reporter(quiet, echo_paths=not to_stdout, launched=part is not None, bar=part is None or part.index == 0)
        ) as reporter,
        stdout_for_data() if to_stdout else contextlib.nullcontext() as data,
    ):
        if data is not None:  # a model's own prints must not land among the file's bytes
            options["output"] = data
        getattr(api, command)(model, *args, progress=reporter, **options)


def library():
    """:mod:`hookcli.api`, imported when a command runs: ``--help`` and the refusals made while parsing go without
    its imports (about 30 ms)."""
    from hookcli import api

    return api


def launched_part():
    """The part torchrun or Slurm started this process as (processes after the first show no progress bar)."""
    try:
        return detect_part()
    except HookcliError:
        return None  # said when the run plans


def given_options(ctx: click.Context) -> list[str]:
    """The options given on the command line or in a preset, not left at their defaults."""
    return [
        name for name in ctx.params if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    ]
