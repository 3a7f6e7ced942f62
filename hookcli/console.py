r"""What the command line does for a terminal: escape text, turn warnings into notes, stop cleanly on SIGTERM.

Library code never prints; these helpers sit between it and the terminal
(``hookcli.cli`` uses them, and they import no Click).

>>> print(printable("key\x1b[31m\tred\nnext"))
key\x1b[31m\tred\nnext
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import BinaryIO

from hookcli.errors import first_line

__all__ = ["Captured", "Terminated", "counted", "notes_and_sigterm", "printable", "stderr_captured", "stdout_for_data"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # and lone surrogates, which no terminal can print
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with its control characters (C0, DEL, C1) and lone surrogates escaped: one line that cannot drive
    the terminal (or fail to encode)."""
    return _CONTROL.sub(lambda match: _NAMED_ESCAPES.get(match[0], _escaped(ord(match[0]))), text)


def counted(count: int, noun: str) -> str:
    """``1 image``, ``3 images``: a count and its noun, in messages.

    >>> counted(1, "frame"), counted(0, "frame")
    ('1 frame', '0 frames')
    """
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread: it unwinds like Ctrl-C (no ``except Exception`` stops it)."""


#: Warnings that are not notes: what a library says of its own future (torch's ``torch.jit.script_method is
#: deprecated``, Python 3.12's ``use of fork() may lead to deadlocks`` when decode workers fork, see
#: :mod:`hookcli.run.batches`), whatever filters the user or a test runner set.
LIBRARY_NEWS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

#: How torch's compiler begins its word that TF32 tensor cores are left off (filtered for the API too, by
#: :mod:`hookcli.run.speed`).
TF32_LEFT_OFF = "TensorFloat32 tensor cores for float32 matrix multiplication"
#: What torch says of the machine that is no note about the run: that CUDA could not start (``CUDA initialization:
#: Unexpected error from cudaGetDeviceCount() … out of memory`` under a memory limit; the run goes on without it, as
#: ``--device auto`` does on a machine without a GPU, and ``hookcli doctor`` gives the reason), that its
#: compiler finds TF32 tensor cores left off (``--precision fp32`` leaves them off on purpose), and that its
#: compiler's guards run slower on Python 3.13.0 (a bug of that release; ``hookcli doctor`` says so).
_MACHINE_WORDS = re.compile(f"CUDA initialization: |{TF32_LEFT_OFF}|Guards may run slower on Python ")


def _arithmetic(message, category: type[Warning], filename: str) -> bool:
    """Whether a warning is numpy's about its arithmetic on the values: from its Python code (empty or too short
    slices), or from its ufuncs (``overflow encountered in reduce``, which name the caller's file)."""
    if not issubclass(category, RuntimeWarning):
        return False
    return f"{os.sep}numpy{os.sep}" in filename or _UFUNC_WARNING.match(str(message)) is not None


#: What numpy's ufuncs say of their floating-point errors.
_UFUNC_WARNING = re.compile(r"(overflow|underflow|invalid value|divide by zero) encountered in ")


@contextlib.contextmanager
def notes_and_sigterm(echo: Callable[[str], None], *, debug: Callable[[], bool] = bool) -> Iterator[None]:
    """While inside: each Python warning is one ``Note:`` line through ``echo``, once (Python's own text while
    ``debug()`` is true), and SIGTERM raises :class:`Terminated` so that every cleanup runs (temporary files go).

    Deprecations (:data:`LIBRARY_NEWS`) are news for the authors of the code that raised them, not about the
    user's run, and so are numpy's warnings about its arithmetic (``overflow encountered in reduce``, ``Degrees of
    freedom <= 0``), whose outcome, NaN or infinity, hookcli shows in its own words where it shows the number:
    they are shown only while ``debug()`` is true, as are torch's words of the machine (:data:`_MACHINE_WORDS`).
    """
    shown, show_warning, pid = set(), warnings.showwarning, os.getpid()

    def note(message, category, filename, lineno, file=None, line=None):
        text = f"Note: {printable(first_line(message))}"
        if debug():
            show_warning(message, category, filename, lineno, file, line)
        elif issubclass(category, LIBRARY_NEWS) or _arithmetic(message, category, filename):
            return
        elif _MACHINE_WORDS.match(str(message)):
            return
        elif text not in shown:
            shown.add(text)
            echo(text)

    def terminate(signum, frame):
        # A forked worker (decoding images) stops as on Ctrl-C: quietly, leaving the message to this process.
        raise Terminated if os.getpid() == pid else KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    on_sigterm = signal.signal(signal.SIGTERM, terminate) if in_main_thread else None
    warnings.showwarning = note
    try:
        yield
    finally:
        warnings.showwarning = show_warning
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if on_sigterm is None else on_sigterm)


@contextlib.contextmanager
def stdout_for_data() -> Iterator[BinaryIO]:
    """While inside, standard output carries only what is written to the stream this yields: anything else
    written to it (a model's ``print``, a library writing to file descriptor 1 from C) goes to standard error.

    Where ``sys.stdout`` is a real file descriptor, descriptor 1 is pointed at
    standard error and the data goes through a copy of the old one; otherwise
    (a test runner's buffer) Python's ``sys.stdout`` is swapped for
    ``sys.stderr``.
    """
    stream = sys.stdout
    stream.flush()
    try:
        descriptor = stream.fileno()
        errors = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        sys.stdout = sys.stderr
        try:
            yield stream.buffer
        finally:
            sys.stdout = stream
        return
    data = os.fdopen(os.dup(descriptor), "wb")
    kept = os.dup(descriptor)
    os.dup2(errors, descriptor)
    try:
        yield data
    finally:
        with contextlib.suppress(OSError):
            stream.flush()
        os.dup2(kept, descriptor)
        os.close(kept)
        with contextlib.suppress(OSError):  # a reader gone away: the caller has said so already
            data.close()


class Captured:
    """What :func:`stderr_captured` kept: ``text``, once its block has ended."""

    text: str = ""


@contextlib.contextmanager
def stderr_captured() -> Iterator[Captured]:
    """While inside, what is written to file descriptor 2 is kept instead of shown, and is the yielded object's
    ``text`` once the block ends: what a C library prints there (libjpeg's warnings about a damaged JPEG), which
    Python's ``sys.stderr`` never sees, so that the caller can say it in its own words, naming the file, or not at
    all. Whatever another thread writes to standard error meanwhile is kept too: hold the block around the call
    alone. Where there is no descriptor 2, nothing is kept.

    >>> with stderr_captured() as said:
    ...     _ = os.write(2, b"Corrupt JPEG data: 3 extraneous bytes before marker 0xda\\n")
    >>> said.text
    'Corrupt JPEG data: 3 extraneous bytes before marker 0xda\\n'
    """
    captured = Captured()
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()  # Python's own text, written before the block, goes where it was going
    try:
        shown = os.dup(2)
    except OSError:
        yield captured
        return
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(shown, 2)
            os.close(shown)
            kept.seek(0)
            captured.text = kept.read().decode(errors="replace")
