"""The command line's option declarations, shared by the commands: groups of Click options as decorators, the
types that hand a value to the library's own parser, and preset files (``--config``) read as defaults.
"""

from __future__ import annotations

import click

from hookcli.run.options import RunOptions

__all__ = [
    "grid_drawing_options",
    "clip_options",
    "config_option",
    "CONTEXT_SETTINGS",
    "DEFAULTS",
    "LAYER_HELP",
    "model_options",
    "Parsed",
    "preprocess_options",
    "REGION",
    "rows_output_options",
    "run_options",
]


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


DEFAULTS = RunOptions()


class Parsed(click.ParamType):
    """A value read by the library's parser ``module.function`` (imported on use); its ValueError is a usage error."""

    def __init__(self, name: str, module: str, function: str) -> None:
        self.name, self._where = name, (module, function)

    def convert(self, value, param, ctx):
        from importlib import import_module

        try:
            return getattr(import_module(self._where[0]), self._where[1])(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


_TRIPLE = Parsed("R,G,B", "hookcli.inputs.preprocess", "parse_triple")


def model_options(function=None, *, weights: str = DEFAULTS.weights):
    """--model, --weights (default ``weights``) and --seed, shared by every command that builds a model."""
    if function is None:
        return lambda f: model_options(f, weights=weights)
    return _options(
        function,
        [
            click.option(
                "--model",
                "-m",
                required=True,
                metavar="NAME",
                help="A torchvision name ('hookcli models'), timm:NAME, hf:ORG/NAME or hf:/folder, "
                "open_clip:ARCH, or FILE.py:FUNCTION / package.module:FUNCTION (runs that code).",
            ),
            click.option(
                "--weights",
                "-w",
                default=weights,
                show_default=True,
                metavar="WEIGHTS",
                help="DEFAULT (the model's own), a weights name (IMAGENET1K_V1; a timm or OpenCLIP "
                "pretrained tag), none (random init) or a .pth/.pt/.safetensors state dict.",
            ),
            click.option("--seed", type=int, default=0, show_default=True, help="Random seed for --weights none."),
        ],
    )


def _load_config(ctx: click.Context, param: click.Parameter, value) -> None:
    """Eager: a preset's options become this command's defaults, so flags given still win."""
    if value is None:
        return
    from hookcli.cli.presets import read_config

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
    from hookcli.errors import ConfigError

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


def preprocess_options(function):
    """--resize, --crop, --mean, --std, --interpolation: override the weights' preprocessing; --fast-decode and
    --decode: how images are decoded."""
    from hookcli.inputs.preprocess import DECODERS, INTERPOLATIONS

    return _options(
        function,
        [
            click.option(
                "--resize", type=click.IntRange(min=1), help="Resize the shorter side to this [weights' value]."
            ),
            click.option("--crop", type=click.IntRange(min=1), help="Centre-crop to this square [weights' value]."),
            click.option("--mean", type=_TRIPLE, help="Normalisation mean [weights' value]."),
            click.option("--std", type=_TRIPLE, help="Normalisation std [weights' value]."),
            click.option(
                "--interpolation", type=click.Choice(INTERPOLATIONS), help="Resize interpolation [weights' value]."
            ),
            click.option(
                "--fast-decode",
                is_flag=True,
                help="Decode JPEGs at a reduced scale (1/2, 1/4, 1/8) that keeps the shorter side at least "
                "twice --resize, then resize as usual: several times faster for large photos; pixel values "
                "differ slightly.",
            ),
            click.option(
                "--decode",
                type=click.Choice(DECODERS),
                default=DEFAULTS.decode,
                show_default=True,
                help="Where images are decoded and preprocessed: cpu (decode workers, Pillow), or device "
                "(the workers only read files; JPEGs are decoded batched on the run's device, nvJPEG on CUDA, "
                "and every image resized there). Pixel values differ slightly; recorded in the metadata.",
            ),
        ],
    )


def clip_options(function):
    """--clip-length, --frame-stride, --clips-per-video: how rows are cut from videos (video and flow models)."""
    return _options(
        function,
        [
            click.option(
                "--clip-length", type=click.IntRange(1, 4096), help="Video models: frames in a clip (a row) [16]."
            ),
            click.option(
                "--frame-stride",
                type=click.IntRange(1, 4096),
                default=DEFAULTS.frame_stride,
                show_default=True,
                help="Frames between a clip's frames; optical flow: between a pair's two.",
            ),
            click.option(
                "--clips-per-video",
                type=click.IntRange(0, 4096),
                default=DEFAULTS.clips_per_video,
                show_default=True,
                help="Video models: clips spread evenly over each video (1: the middle "
                "one); 0: every clip, one after another.",
            ),
        ],
    )


def run_options(function=None, *, stored: str = "what is stored is --dtype"):
    """Device, batching, decode workers, inputs and their errors, overwriting, progress.

    ``stored`` ends the help of --precision: what the command stores, whatever the compute precision.
    """
    if function is None:
        return lambda f: run_options(f, stored=stored)
    from hookcli.run.settings import ON_ERROR
    from hookcli.run.speed import MEMORY_FORMATS, PRECISIONS

    return _options(
        function,
        [
            click.option(
                "--device",
                "-d",
                type=Parsed("DEVICE", "hookcli.run.device", "parse_device"),
                default=DEFAULTS.device,
                show_default=True,
                help="auto, cpu, cuda, cuda:N, mps.",
            ),
            click.option(
                "--batch-size",
                "-b",
                type=click.IntRange(min=1),
                default=DEFAULTS.batch_size,
                show_default=True,
                help="Images per forward.",
            ),
            click.option(
                "--precision",
                type=click.Choice(PRECISIONS),
                default=DEFAULTS.precision,
                show_default=True,
                help="Compute precision: bf16 (CPU or GPU) and fp16 (GPU) autocast trade accuracy for speed; "
                f"{stored}.",
            ),
            click.option(
                "--memory-format",
                type=click.Choice(MEMORY_FORMATS),
                default=DEFAULTS.memory_format,
                show_default=True,
                help="auto: channels-last for convolutional models on CPU and CUDA (faster, exact to fp32 rounding).",
            ),
            click.option(
                "--compile",
                "compile",
                is_flag=True,
                help="torch.compile the forward, cut after the last requested layer (falls back to eager, "
                "with a note, where hooks are needed).",
            ),
            click.option(
                "--workers",
                "-j",
                type=click.IntRange(min=0),
                help="Processes decoding images while the model runs; 0 decodes in the main process. "
                "[GPU: one per spare core up to 8; CPU: 0 up to 4 cores, then a quarter of them]",
            ),
            click.option("--recursive", "-r", is_flag=True, help="Look for images in sub-folders of folder inputs."),
            click.option(
                "--on-error",
                type=click.Choice(ON_ERROR),
                default=DEFAULTS.on_error,
                show_default=True,
                help="For unreadable images: stop, or skip them (listed on stderr and in the metadata).",
            ),
            click.option(
                "--force",
                "-f",
                is_flag=True,
                help="Overwrite existing outputs (a folder output: replace a different run).",
            ),
            click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
            click.argument("images", nargs=-1),
        ],
    )


def rows_output_options(function):
    """-o FILE|DIR/|-, --shard-size, --dtype: where the rows of extract and grad go."""
    from hookcli.run.outputs import LARGE_INPUT
    from hookcli.run.settings import DTYPES

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
            click.option(
                "--shard-size",
                type=click.IntRange(min=1),
                help="Images (rows) per shard in a folder output [about 128 MiB of features per shard].",
            ),
            click.option(
                "--part",
                metavar="K/N",
                help="Folder output shared by N processes: this one starts with the K-th block of shards, then "
                "takes any shard no process holds [from torchrun or Slurm when they start it].",
            ),
            click.option(
                "--dtype", type=click.Choice(DTYPES), default=DEFAULTS.dtype, show_default=True, help="Stored dtype."
            ),
        ],
    )


#: --region, of grad and cam.
REGION = click.option(
    "--region",
    metavar="X0,Y0,X1,Y1",
    help="Segmentation models: score the target class over "
    "this box (fractions of the image, 0 to 1) instead of over its predicted mask.",
)


LAYER_HELP = (
    "Layer path (features.18), glob (layer3.*.conv2, features.**), type:Conv2d, or . for the model's "
    "own output; PATH=NAME renames. Repeat."
)


def grid_drawing_options(function):
    """The options of ``grid`` that choose and draw tensors and images; ``report`` takes them too."""
    return _options(
        function,
        [
            click.option(
                "--key",
                "-k",
                "keys",
                multiple=True,
                metavar="GLOB",
                help="Tensors to draw (globs as for --layer). Repeat.",
            ),
            click.option(
                "--image",
                "-i",
                "images",
                multiple=True,
                metavar="INDEX|NAME|A:B",
                help="Images (rows) to draw: row index, range A:B of indices, or input file name. Repeat. [all]",
            ),
            click.option(
                "--channels",
                type=Parsed("A:B|K", "hookcli.pictures.options", "parse_channels"),
                help="Channel range, e.g. 0:64 (':' for all), or one channel K. [all; the first 64 of wider layers]",
            ),
            click.option(
                "--top", type=click.IntRange(min=1), help="Only the K channels with the highest mean activation."
            ),
            click.option(
                "--columns", type=click.IntRange(min=1), help="Tiles per row [fewest blank places, about 3:2]."
            ),
            click.option(
                "--padding", type=click.IntRange(min=0), default=2, show_default=True, help="Pixels between tiles."
            ),
            click.option(
                "--cmap", default="viridis", show_default=True, help="Any matplotlib colormap (gray, viridis, magma…)."
            ),
            click.option(
                "--scale",
                type=click.Choice(["channel", "grid"]),
                default="channel",
                show_default=True,
                help="Normalise each channel alone, or the whole grid with one range.",
            ),
            click.option(
                "--min-tile",
                type=click.IntRange(min=1),
                default=32,
                show_default=True,
                help="Enlarge small maps (nearest neighbour) to at least this many pixels.",
            ),
            click.option(
                "--title/--no-title", default=True, show_default=True, help="Caption strip with key, input and shape."
            ),
            click.option(
                "--plain",
                is_flag=True,
                help="Just the tiles: no caption, channel numbers or colour bar, and no "
                "enlargement past --min-tile (for pictures to process further).",
            ),
            click.option(
                "--overlay",
                is_flag=True,
                help="Blend the mean activation (or --channels K) over the input image instead of tiling.",
            ),
            click.option(
                "--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Overlay opacity."
            ),
            click.option(
                "--overlay-cmap",
                default="inferno",
                show_default=True,
                help="Colormap of the overlay heat map (lightness should rise with value).",
            ),
            click.option(
                "--frame",
                type=click.IntRange(min=0),
                metavar="T",
                help="Only frame T (from 0) of video clips, drawn as channel maps. [all: a column per frame]",
            ),
            click.option(
                "--flow-as-channels",
                is_flag=True,
                help="Draw optical-flow fields as their dx and dy maps, not in colour.",
            ),
        ],
    )
