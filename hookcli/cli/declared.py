"""The command line's option declarations, shared by the commands: groups of Click options as decorators, the
types that hand a value to the library's own parser, and preset files (``--config``) read as defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from hookcli.cli.presets import read_config
from hookcli.errors import ConfigError
from hookcli.options.compare import COMPARE_OPTIONS
from hookcli.options.declaring import Option
from hookcli.options.grid import drawing_options
from hookcli.options.run import LARGE_INPUT, STATS_CHOICES, declared

__all__ = [
    "comparing_options",
    "declared_option",
    "grid_drawing_options",
    "run_option",
    "stats_choice_options",
    "clip_options",
    "config_option",
    "CONTEXT_SETTINGS",
    "LAYER_HELP",
    "model_options",
    "Parsed",
    "preprocess_options",
    "REGION",
    "rows_output_options",
    "run_options",
]


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Parsed(click.ParamType):
    """A value read by an option's ``parser`` (:data:`hookcli.options.run.RUN_OPTIONS`); its ValueError is a usage
    error."""

    def __init__(self, name: str, parser: Callable[[Any], Any]) -> None:
        self.name, self._parser = name, parser

    def convert(self, value, param, ctx):
        try:
            return self._parser(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


def model_options(function=None, *, weights: str | None = None, required: bool = True):
    """--model, --weights (``weights`` instead of the declared default) and --seed, shared by every command that
    builds a model (``required``: that command always does)."""
    if function is None:
        return lambda f: model_options(f, weights=weights, required=required)
    return _options(
        function,
        [
            click.option(
                "--model",
                "-m",
                required=required,
                metavar="NAME",
                help="A torchvision name ('hookcli models'), timm:NAME, hf:ORG/NAME or hf:/folder, "
                "open_clip:ARCH, or FILE.py:FUNCTION / package.module:FUNCTION (runs that code).",
            ),
            declared_option(declared("weights"), default=weights),
            declared_option(declared("seed")),
        ],
    )


def _load_config(ctx: click.Context, param: click.Parameter, value) -> None:
    """Eager: a preset's options become this command's defaults, so flags given still win."""
    if value is None:
        return

    # A preset is shared by every process of a run; --part differs between them.
    params = {
        p.name: p
        for p in ctx.command.params
        if isinstance(p, click.Option) and p.name not in ("config", "help", "part")
    }
    allowed = {max(p.opts, key=len).lstrip("-").replace("-", "_"): name for name, p in params.items()}
    options = read_config(value, allowed=allowed)
    for name, given in options.items():
        options[name] = _config_value(
            params[name], [given] if params[name].multiple and isinstance(given, str) else given, ctx, value
        )
    ctx.default_map = {**(ctx.default_map or {}), **options}


def _config_value(param: click.Option, given, ctx: click.Context, config: str):
    """A preset's value as the option would take it from the command line; anything else is the preset's error."""
    takes_list = param.multiple or isinstance(param.type, Parsed)  # Parsed: --mean [0.5, 0.5, 0.5]
    wrong = (
        (isinstance(given, list) and not takes_list)
        or isinstance(given, dict)
        or (isinstance(param.type, click.types.IntParamType) and isinstance(given, float))
    )
    try:
        if not wrong:
            return param.type_cast_value(ctx, given)
    except Exception as err:  # click's own BadParameter, or what a converter raises on an odd TOML type
        reason = err.format_message() if isinstance(err, click.ClickException) else repr(given)
        raise ConfigError(
            f"config '{config}' has a bad value for '{param.name}': {reason}",
            hint=f"give what --{param.name.replace('_', '-')} takes (see --help)",
        ) from None
    raise ConfigError(
        f"config '{config}' has a bad value for '{param.name}': {given!r}",
        hint=f"give what --{param.name.replace('_', '-')} takes (see --help)",
    )


def config_option(function):
    return click.option(
        "--config",
        "-c",
        type=click.Path(dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load_config,
        help="TOML preset of any options below; flags given here win.",
    )(function)


def _options(function, decorators):
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def declared_option(option: Option, *, command: str = "", default: Any = None, **words: str):
    """The Click option of a declared one (:mod:`hookcli.options`): its flags, type, bounds or choices, default and
    help; ``command`` picks the help that command gives, ``default`` overrides the declared one, and ``words`` fill
    the help's ``{placeholders}``."""
    settings: dict[str, Any] = {"help": option.help_for(command).format(**words) if words else option.help_for(command)}
    kind = _click_type(option)
    if kind is not None:
        settings["type"] = kind
    if option.kind == "flag" and "/" not in option.flags[0]:
        settings["is_flag"] = True
    chosen = option.default if default is None else default
    if "/" in option.flags[0] or chosen is not None and not (option.kind == "flag" and chosen is False):
        settings["default"] = chosen  # a --x/--no-x pair's None: decided later (and shown as no default)
    if option.show_default:
        settings["show_default"] = True
    if option.metavar and option.kind != "parsed":
        settings["metavar"] = option.metavar
    if option.multiple:
        settings["multiple"] = True
    return click.option(*option.flags, option.name, **settings)


def _click_type(option: Option) -> Any:
    """The Click type of a declared option's values; None for text and flags."""
    if option.kind == "int":
        high = None if option.high is None else int(option.high)
        return int if option.low is None else click.IntRange(min=int(option.low), max=high)
    if option.kind == "float":
        return click.FloatRange(option.low, option.high)
    if option.kind == "choice":
        return click.Choice(option.choices or ())
    if option.kind == "parsed":
        assert option.parser is not None, "a parsed option names its parser"
        return Parsed(option.metavar or "VALUE", option.parser)
    return None


def _declared(*names: str, **words: str) -> list:
    return [declared_option(declared(name), **words) for name in names]


def preprocess_options(function):
    """--resize, --crop, --mean, --std, --interpolation: override the weights' preprocessing; --fast-decode and
    --decode: how images are decoded."""
    return _options(function, _declared("resize", "crop", "mean", "std", "interpolation", "fast_decode", "decode"))


def stats_choice_options(function):
    """What statistics gather: --top, --top-by, --quantiles, --pca, --components (``stats``' own options)."""
    return _options(function, _declared(*STATS_CHOICES))


def clip_options(function):
    """--clip-length, --frame-stride, --clips-per-video: how rows are cut from videos (video and flow models)."""
    return _options(function, _declared("clip_length", "frame_stride", "clips_per_video"))


def run_options(function=None, *, stored: str = "what is stored is --dtype", edited: bool = True, paired: bool = False):
    """Device, batching, decode workers, inputs and their errors, overwriting, interventions, progress.

    ``stored`` ends the help of --precision: what the command stores, whatever the compute precision. ``edited``:
    the command's forward may be compiled or edited (--compile, --intervene, --capture-edited). ``paired``: its
    inputs come in pairs from options of its own (no IMAGES, --recursive or --on-error: a pair is never split).
    """
    if function is None:
        return lambda f: run_options(f, stored=stored, edited=edited, paired=paired)
    inputs = () if paired else ("recursive", "on_error")
    return _options(
        function,
        [
            *_declared("device"),
            declared_option(declared("batch_size"), command="patch" if paired else ""),
            declared_option(declared("precision"), stored=stored),
            *_declared("memory_format", *(("compile",) if edited else ()), "workers", *inputs, "force"),
            *(_declared("intervene", "capture_edited") if edited else ()),
            click.option(
                "--quiet", "-q", is_flag=True, help="No progress bar, and no notes of images decoded though damaged."
            ),
            *(() if paired else (click.argument("images", nargs=-1),)),
        ],
    )


def rows_output_options(function):
    """-o FILE|DIR/|-, --shard-size, --part, --dtype: where the rows of extract and grad go."""
    return _options(
        function,
        [
            click.option(
                "--output",
                "-o",
                metavar="PATH",
                help="Output safetensors file: any name but one ending in another format's suffix (.pt, "
                ".npy, .json…), which is refused; DIR/ (or an existing folder) for shards + index; - for stdout "
                f"[<model>-<layer>.safetensors, or a folder <model>-<layer>/ above {LARGE_INPUT} images].",
            ),
            *_declared("shard_size", "part", "dtype"),
        ],
    )


def run_option(name: str, command: str = ""):
    """The Click option of the run option ``name`` as ``command`` declares it."""
    return declared_option(declared(name), command=command)


#: --region, of grad and cam.
REGION = declared_option(declared("region"))


LAYER_HELP = (
    "Layer path (features.18), glob (layer3.*.conv2, features.**), type:Conv2d, or . for the model's "
    "own output; PATH=NAME renames. Repeat."
)


def comparing_options(function):
    """The options of ``compare`` that say how to compare (:data:`hookcli.options.compare.COMPARE_OPTIONS`)."""
    return _options(function, [declared_option(option) for option in COMPARE_OPTIONS])


def grid_drawing_options(command: str):
    """The options of ``grid`` that choose and draw tensors and images, as ``command`` takes them (``report`` takes
    them too, and its own)."""
    return lambda function: _options(function, [declared_option(option) for option in drawing_options(command)])
