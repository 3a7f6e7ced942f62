"""Errors a user can act on.

Every error hookcli raises on purpose is a :class:`HookcliError`: a one-line
message plus an optional hint saying what to do about it. The command line turns
them into a single ``Error: …`` line; library users can catch them by type.

>>> err = UnknownModelError("unknown model 'resnet5'", hint="run 'hookcli models'")
>>> str(err)
"unknown model 'resnet5'. Hint: run 'hookcli models'"
>>> err.exit_code
2
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping


def first_line(err: BaseException | Warning | str) -> str:
    """The first line of an exception's (or a warning's) message, or its type name when it has none; where torch
    says which of its C++ source files raised it, that is left out.

    >>> first_line(UserWarning("The array is not writable (Triggered internally at /pytorch/csrc/numpy.cpp:213.)"))
    'The array is not writable'
    """
    lines = str(err).strip().splitlines()
    line = _TORCH_SOURCE.sub("", lines[0]) if lines else ""
    return line or ("" if isinstance(err, str) else type(err).__name__)


_TORCH_SOURCE = re.compile(r"\s*\(Triggered internally at [^()]*\)\.?$")


class HookcliError(Exception):
    """Base class: a message, an optional hint, and the exit code the CLI uses.

    ``exit_code`` is 2 for bad usage (refused before any work starts) and 1 for
    failures found while running.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if not self.hint:
            return self.message
        return f"{self.message}{'' if self.message.endswith(('.', '?', '!')) else '.'} Hint: {self.hint}"


class UsageProblem(HookcliError):
    """The request itself is wrong; nothing was run."""

    exit_code = 2


class UnknownModelError(UsageProblem):
    """The model name is not one hookcli can build."""


class WeightsError(HookcliError):
    """Weights could not be found, downloaded or loaded."""


class UnknownWeightsError(WeightsError, UsageProblem):
    """The weights name is not one of the model's (refused before any work, so a usage error)."""


class UnknownLayerError(UsageProblem):
    """A layer selector matches no module of the model."""


class LayerNotRunError(HookcliError):
    """A selected layer exists but never ran during the forward pass."""


class CaptureError(HookcliError):
    """What a layer produced cannot be stored as batch-first tensors."""


class MemoryLimitError(HookcliError):
    """The result would not fit in memory the way it was asked for."""


class InputError(UsageProblem):
    """Input paths are missing or hold no images."""


class ImageError(HookcliError):
    """An image file exists but cannot be decoded."""


class VideoError(HookcliError):
    """A video file or folder of frames cannot be read, or the video reader is not installed."""


class FeatureFileError(UsageProblem):
    """A file given to read is not a readable safetensors file."""


class OutputExistsError(UsageProblem):
    """The output path exists and overwriting was not allowed."""


class ConfigError(UsageProblem):
    """A config preset cannot be read or holds an unknown option."""


class DeviceError(UsageProblem):
    """The requested device is not available."""


def check_choice(name: str, value, choices) -> None:
    """Refuse ``value`` for option ``name`` unless it is one of ``choices``."""
    if value not in choices:
        raise UsageProblem(f"{name} must be one of {', '.join(map(str, choices))}, not '{value}'", hint=RANGE_HINT)


def check_whole(name: str, value, low: int, high: int | None = None, *, optional: bool = False) -> None:
    """Refuse ``value`` for option ``name`` unless it is a whole number from ``low`` (to ``high``), or None if
    ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageProblem(f"{name} must be a whole number of at least {low}, not {value!r}", hint=RANGE_HINT)
    if high is not None and value > high:
        raise UsageProblem(f"{name} must be at most {high}, not {value!r}", hint=RANGE_HINT)


def seconds_from_environment(
    name: str, default: float, low: float, high: float, environ: Mapping[str, str] | None = None
) -> float:
    """The seconds the environment variable ``name`` gives (``default`` when it is unset or empty), refused unless a
    number from ``low`` to ``high``; ``environ`` in the place of the process's environment.

    >>> seconds_from_environment("HOOKCLI_NO_SUCH_TIMEOUT", 120.0, 1.0, 86400.0)
    120.0
    """
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:  # NaN fails it too
        raise UsageProblem(
            f"{name} must be a number of seconds from {low:g} to {high:g}, not '{text}'",
            hint=f"unset it for the default of {default:g} s",
        )
    return seconds


#: What to do about a value an option does not take.
RANGE_HINT = "see --help for the values each option takes"


def install_hint(err: BaseException) -> str | None:
    """What to do about an error that says the installed packages do not fit together, or None.

    A torchvision built for another torch fails as it loads its operators
    (``operator torchvision::nms does not exist``).

    >>> install_hint(RuntimeError("operator torchvision::nms does not exist"))[:45]
    'torch and torchvision are builds that do not '
    """
    text = str(err)
    if "torchvision::" in text and "does not exist" in text:
        return (
            "torch and torchvision are builds that do not match: install them as a pair, from one index "
            '(pip install --force-reinstall "torch" "torchvision")'
        )
    return None


#: What a model's own refusal of an input's size speaks of (``Wrong image height!``, ``Given input size: …``,
#: ``mat1 and mat2 shapes cannot be multiplied``, ``… at non-singleton dimension 1``).
_SIZE_WORDS = re.compile(r"\b(sizes?|shapes?|height|width|dimensions?|dims?)\b", re.IGNORECASE)
#: Where a running out of memory says so, whatever it names besides.
_MEMORY_WORDS = re.compile(r"out of memory|allocate", re.IGNORECASE)


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says that memory ran out (a device's or the host's), whatever it names besides."""
    return bool(_MEMORY_WORDS.search(str(err)))


#: Where torch.compile's errors come from: a graph break or a guard on a value, whose words may speak of sizes.
_COMPILERS = ("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses")


def compiler_error(err: BaseException) -> bool:
    """Whether ``err`` comes from torch.compile (a graph break, a guard on a value), not from the model's own code."""
    return type(err).__module__.startswith(_COMPILERS)


def size_refusal(err: BaseException) -> str | None:
    """The first line of ``err`` where it is a model refusing the size of its input in its own words (an assertion,
    a ValueError or a RuntimeError that speaks of a size, a shape or a dimension, raised outside hookcli), or None:
    another failure, to be said as it was raised (a missing operator, a CUDA error, running out of memory, a bug).

    >>> size_refusal(AssertionError("Wrong image height! Expected 224 but got 32!"))
    'Wrong image height! Expected 224 but got 32!'
    >>> size_refusal(RuntimeError("CUDA error: no kernel image is available")) is None
    True
    >>> size_refusal(type("Unsupported", (RuntimeError,), {"__module__": "torch._dynamo.exc"})("data-dependent size"))
    """
    if not isinstance(err, RuntimeError | ValueError | AssertionError) or isinstance(err, NotImplementedError):
        return None
    if compiler_error(err):  # torch.compile's words; the model's own, where it refused, are the first cause
        first: BaseException = err
        seen = {id(err)}
        while (cause := first.__cause__ or first.__context__) is not None and id(cause) not in seen:
            first, seen = cause, seen | {id(cause)}
        return None if compiler_error(first) else size_refusal(first)
    words = first_line(err).rstrip(".")
    if not _SIZE_WORDS.search(words) or out_of_memory(err):
        return None
    trace = err.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    raised_in = os.path.abspath(trace.tb_frame.f_code.co_filename) if trace is not None else ""
    return None if raised_in.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep) else words


def never_runs(what: str, layer: str) -> LayerNotRunError:
    """The refusal of ``layer``, which the model defines and its forward never calls, for ``what`` (``ablate``,
    ``--intervene 'spare=zero'``)."""
    return LayerNotRunError(
        f"{what}: the forward never runs {layer}",
        hint="the model defines it but does not call it (in eval mode); hookcli layers lists what runs",
    )


def input_kind(inputs) -> str:
    """What a run's ``inputs`` are, in its messages: ``videos`` when they are clips cut from videos (rows that name
    their ``frames``), else ``images``."""
    return "videos" if len(inputs) and hasattr(inputs[0], "frames") else "images"


def nothing_read(inputs) -> HookcliError:
    """The failure of a run none of whose ``inputs`` gave a row: a :class:`VideoError` for videos
    (:func:`input_kind`), else an :class:`ImageError`."""
    kind = input_kind(inputs)
    hint = "every input was skipped, each with its reason (on stderr; in Python, the Skipped events)"
    return (VideoError if kind == "videos" else ImageError)(f"none of the input {kind} could be read", hint=hint)
