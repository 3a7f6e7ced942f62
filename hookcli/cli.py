"""The ``hookcli`` command line: parses options, calls the library, formats results.

Only this module imports Click. Heavy libraries (torch, torchvision) are imported
inside the commands that need them, so ``hookcli --help`` starts at once.
Errors become one ``Error: …`` line: exit 2 for bad usage, 1 for failures at
run time; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from hookcli import __version__
from hookcli.errors import HookcliError, first_line

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: Above this many images, extract without -o writes a shard folder instead of one file.
LARGE_INPUT = 10_000


class _HookcliGroup(click.Group):
    """A group whose errors are single lines, and tracebacks only with ``--debug``."""

    debug = False

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        self.debug = bool(os.environ.get("HOOKCLI_DEBUG"))
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            where = f"'{err.ctx.command_path} --help'" if err.ctx else "'hookcli --help'"
            _exit_with_error(f"{err.format_message().rstrip('.')}. Hint: see {where}", err.exit_code)
        except click.ClickException as err:
            _exit_with_error(err.format_message(), err.exit_code)
        except HookcliError as err:
            if self.debug:
                raise
            _exit_with_error(str(err), err.exit_code)
        except (KeyboardInterrupt, click.Abort):
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # The reader went away (e.g. `| head`); stop quietly like other Unix tools.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as err:
            if self.debug:
                raise
            text = first_line(err)
            _exit_with_error(f"{type(err).__name__}: {text.rstrip('.')}. Hint: rerun with --debug for the traceback", 1)
        sys.exit(result if isinstance(result, int) else 0)


def _exit_with_error(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_root().command.debug = True


@click.group(name="hookcli", cls=_HookcliGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="hookcli")
@click.option(
    "--debug", is_flag=True, expose_value=False, callback=_set_debug, is_eager=True,
    help="Show full tracebacks (also HOOKCLI_DEBUG=1).",
)
def main() -> None:
    """See inside PyTorch vision models: hook any layer, save what it returns.

    \b
      hookcli models                                     # what can be loaded
      hookcli layers --model vgg16_bn                    # what can be hooked
      hookcli extract --model vgg16_bn --layer features.18 img.jpg
    """


# -- shared option types and groups -----------------------------------------------------------


class _FloatTriple(click.ParamType):
    """Three floats as ``R,G,B`` (or one value for all three); accepts a list from a config."""

    name = "R,G,B"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = value if isinstance(value, list) else str(value).replace(" ", "").split(",")
        try:
            numbers = tuple(float(p) for p in parts)
        except (TypeError, ValueError):
            self.fail(f"'{value}' is not a number or three comma-separated numbers", param, ctx)
        if len(numbers) == 1:
            numbers = numbers * 3
        if len(numbers) != 3:
            self.fail(f"'{value}' has {len(numbers)} values; give one or three (R,G,B)", param, ctx)
        return numbers


class _Device(click.ParamType):
    name = "DEVICE"

    def convert(self, value, param, ctx):
        from hookcli.device import DEVICE_PATTERN

        if not DEVICE_PATTERN.fullmatch(str(value).strip().lower()):
            self.fail(f"'{value}' is not a device; use auto, cpu, cuda, cuda:N or mps", param, ctx)
        return str(value).strip().lower()


def _model_options(function=None, *, weights: str = "DEFAULT"):
    """--model, --weights (default ``weights``) and --seed, shared by every command that builds a model."""
    if function is None:
        return lambda f: _model_options(f, weights=weights)
    function = click.option(
        "--seed", type=int, default=0, show_default=True, help="Random seed for --weights none."
    )(function)
    function = click.option(
        "--weights", "-w", default=weights, show_default=True, metavar="WEIGHTS",
        help="DEFAULT, a torchvision weights name (IMAGENET1K_V1), none (random init) or a "
        ".pth/.pt/.safetensors state dict.",
    )(function)
    function = click.option(
        "--model", "-m", required=True, metavar="NAME", help="torchvision model name ('hookcli models')."
    )(function)
    return function


def _load_config(ctx: click.Context, param: click.Parameter, value) -> None:
    """Eager: a preset's options become this command's defaults, so flags given still win."""
    if value is None:
        return
    from hookcli.config import read_config

    allowed = {
        max(p.opts, key=len).lstrip("-").replace("-", "_"): p.name
        for p in ctx.command.params
        if isinstance(p, click.Option) and p.name not in ("config", "help")
    }
    ctx.default_map = {**(ctx.default_map or {}), **read_config(value, allowed=allowed)}
    ctx.meta["hookcli.config"] = value


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the user set option ``name`` (flag, environment or config), not just its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


# -- hookcli models -----------------------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def models(as_json: bool) -> None:
    """List the models hookcli can load and their weights.

    \b
      hookcli models
      hookcli models --json | python -c 'import json,sys; print(len(json.load(sys.stdin)))'
    """
    import torchvision.models

    from hookcli.models import list_models, weights_names

    rows = []
    for name in list_models():
        default = torchvision.models.get_model_weights(name).DEFAULT.name
        rows.append({"model": name, "default": default, "weights": weights_names(name)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["model"]) for r in rows)
    for r in rows:
        click.echo(f"{r['model']:<{width}}  {' '.join(r['weights'])} (default {r['default']})")


# -- hookcli layers -----------------------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@_model_options(weights="none")
@click.option("--input-size", type=click.IntRange(min=1), help="Side of the square dummy input [weights' crop size].")
@click.option("--depth", type=click.IntRange(min=1), help="Only paths with at most this many components.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.option("--nl", "as_nl", is_flag=True, help="Newline-delimited JSON, one layer per line.")
def layers(model, weights, seed, input_size, depth, as_json, as_nl) -> None:
    """List every layer --layer accepts, in forward order, with output shapes.

    Shapes come from one forward of a zero image (batch 1). Layers the model
    never calls in eval mode come last, with calls 0. Weights do not change the
    layout, so random ones (the default here) describe it without a download.

    \b
      hookcli layers --model resnet50 --depth 2
      hookcli layers --model vgg16_bn --weights none --nl | grep BatchNorm
    """
    if as_json and as_nl:
        raise click.UsageError("--json and --nl cannot be used together")
    import torch

    from hookcli.layers import describe_layers
    from hookcli.models import load_model

    loaded = load_model(model, weights, seed=seed)
    size = input_size or loaded.preprocess.crop
    rows = [r for r in describe_layers(loaded.module, torch.zeros(1, 3, size, size))
            if depth is None or r.path.count(".") < depth]
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    elif as_nl:
        for r in rows:
            click.echo(json.dumps(r.to_dict()))
    else:
        _print_layer_table(rows)


def _print_layer_table(rows) -> None:
    table = [("path", "type", "output", "params", "calls")]
    for r in rows:
        shape = json.dumps(r.output).replace(" ", "") if r.output is not None else "-"
        table.append((r.path, r.type, shape, f"{r.params:,}", str(r.calls)))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2]),
                 row[3].rjust(widths[3]), row[4].rjust(widths[4])]
        click.echo("  ".join(cells).rstrip())


# -- option groups shared by the commands that run a model on images ------------------------------


def _config_option(function):
    return click.option(
        "--config", "-c", type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
        callback=_load_config, help="TOML preset of any options below; flags given here win.",
    )(function)


def _preprocess_options(function):
    """--resize, --crop, --mean, --std, --interpolation: override the weights' preprocessing; --fast-decode."""
    for decorator in reversed([
        click.option("--resize", type=click.IntRange(min=1), help="Resize the shorter side to this [weights' value]."),
        click.option("--crop", type=click.IntRange(min=1), help="Centre-crop to this square [weights' value]."),
        click.option("--mean", type=_FloatTriple(), help="Normalisation mean [weights' value]."),
        click.option("--std", type=_FloatTriple(), help="Normalisation std [weights' value]."),
        click.option("--interpolation", type=click.Choice(["bilinear", "bicubic", "nearest"]),
                     help="Resize interpolation [weights' value]."),
        click.option("--fast-decode", is_flag=True,
                     help="Decode JPEGs at a reduced scale (1/2, 1/4, 1/8) that keeps the shorter side at least "
                     "twice --resize, then resize as usual: several times faster for large photos; pixel values "
                     "differ slightly."),
    ]):
        function = decorator(function)
    return function


def _run_options(function):
    """Device, batching, decode workers, inputs and their errors, overwriting, progress."""
    for decorator in reversed([
        click.option("--device", "-d", type=_Device(), default="auto", show_default=True,
                     help="auto, cpu, cuda, cuda:N, mps."),
        click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Images per forward."),
        click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
                     help="Compute precision: bf16 (CPU or GPU) and fp16 (GPU) autocast trade accuracy for speed; "
                     "what is stored is --dtype."),
        click.option("--memory-format", type=click.Choice(["auto", "channels_last", "contiguous"]), default="auto",
                     show_default=True, help="auto: channels-last for convolutional models on CPU and CUDA "
                     "(faster, exact to fp32 rounding)."),
        click.option("--compile", "compile_", is_flag=True,
                     help="torch.compile the forward, cut after the last requested layer (falls back to eager, "
                     "with a note, where hooks are needed)."),
        click.option("--workers", "-j", type=click.IntRange(min=0),
                     help="Processes decoding images while the model runs; 0 decodes in the main process. "
                     "[GPU: one per spare core up to 8; CPU: 0 up to 4 cores, then a quarter of them]"),
        click.option("--recursive", "-r", is_flag=True, help="Look for images in sub-folders of folder inputs."),
        click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
                     help="For unreadable images: stop, or skip them (listed on stderr and in the metadata)."),
        click.option("--force", "-f", is_flag=True,
                     help="Overwrite existing outputs (a folder output: replace a different run)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
        click.argument("images", nargs=-1),
    ]):
        function = decorator(function)
    return function


def _rows_output_options(function):
    """-o FILE|DIR/|-, --shard-size, --dtype: where the rows of extract and grad go."""
    for decorator in reversed([
        click.option("--output", "-o", metavar="PATH",
                     help="Output .safetensors file; DIR/ (or an existing folder) for shards + index; - for stdout "
                     f"[<model>-<layer>.safetensors, or a folder <model>-<layer>/ above {LARGE_INPUT} images]."),
        click.option("--shard-size", type=click.IntRange(min=1),
                     help="Images (rows) per shard in a folder output [about 128 MiB of features per shard]."),
        click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32",
                     show_default=True, help="Stored dtype."),
    ]):
        function = decorator(function)
    return function


class _Job:
    """What every model-running command prepares: inputs, model, settings; output checks done before the model loads."""

    def __init__(self, ctx: click.Context, options: dict, *, kind: str = "", output: str | None = None,
                 check_output: bool = True) -> None:
        if _given(ctx, "seed") and options["weights"].strip().lower() != "none":
            raise click.UsageError("--seed only applies to --weights none (pretrained and file weights are fixed)")
        output = output or options.get("output")
        self.to_stdout = output == "-"
        self.folder = bool(output) and not self.to_stdout and (output.endswith(("/", os.sep)) or Path(output).is_dir())
        if options.get("shard_size") and output and not self.folder:
            raise click.UsageError("--shard-size applies to a folder output (-o DIR/)")
        if self.to_stdout and sys.stdout.isatty():
            raise click.UsageError("refusing to write binary safetensors data to a terminal; pipe or redirect -o -")
        from hookcli.images import gather_inputs

        self.paths = gather_inputs(options["images"], recursive=options["recursive"])
        self.folder = self.folder or (not output and len(self.paths) > LARGE_INPUT)
        self.options, self.output, self.kind = options, output, kind
        if output and not self.to_stdout and check_output:
            self._check(output)

        from hookcli.device import resolve_device
        from hookcli.extract import RunSettings, default_workers
        from hookcli.models import load_model

        self.device = resolve_device(options["device"])
        self.loaded = load_model(options["model"], options["weights"], seed=options["seed"])
        workers = options["workers"]
        if workers is None:
            workers = default_workers(self.device, len(self.paths), options["batch_size"])
        self.settings = RunSettings(
            preprocess=self.loaded.preprocess.replace(
                resize=options["resize"], crop=options["crop"], mean=options["mean"], std=options["std"],
                interpolation=options["interpolation"], fast_decode=options["fast_decode"] or None),
            capture=options.get("capture", "output"), device=self.device, batch_size=options["batch_size"],
            workers=workers, pool=options.get("pool"), dtype=options.get("dtype", "float32"),
            on_error=options["on_error"], precision=options["precision"], memory_format=options["memory_format"],
            compile=options["compile_"], fuse=options.get("fuse", False),
        )
        from hookcli.speed import check_precision

        check_precision(self.settings.precision, self.device)

    def _check(self, output: str) -> None:
        from hookcli.shards import check_folder_target
        from hookcli.store import check_writable

        if self.folder:
            check_folder_target(output)
        else:
            check_writable(output, force=self.options["force"])

    def resolve_layers(self, selectors):
        from hookcli.extract import default_output_name
        from hookcli.layers import resolve_layers

        selected = resolve_layers(self.loaded.module, selectors, model_name=self.loaded.name)
        if not self.output:
            self.output = str(default_output_name(self.loaded.name, selected, folder=self.folder, kind=self.kind))
            self._check(self.output)
        return selected

    def write_rows(self, selected, batches, *, identity_extra=None, extra_metadata=None, keep=False):
        """Run ``batches(start, hooks)`` into the output; with ``keep``, return in-memory features of a -o - run."""
        options = self.options
        with _progress(len(self.paths), options["quiet"]) as advance:
            if self.folder:
                from hookcli.shards import extract_to_folder

                def resumed(done: int) -> None:
                    if done:
                        click.echo(f"Continuing: {done} of {len(self.paths)} inputs are already in {self.output}",
                                   err=True)
                        advance(done)

                writer = extract_to_folder(
                    self.loaded, selected, self.paths, self.settings, self.output,
                    shard_size=options["shard_size"], force=options["force"], on_batch=_batch_reporter(advance),
                    on_start=resumed, batches=batches, identity_extra=identity_extra, extra_metadata=extra_metadata)
                click.echo(str(writer.index_path))
                return None
            from hookcli.extract import collect_rows

            hooks: list = []
            run = collect_rows(batches(0, hooks), self.paths, hooks, _batch_reporter(advance))
        return self._write_file(selected, run, extra_metadata, keep)

    def _write_file(self, selected, run, extra_metadata, keep):
        from hookcli.errors import ImageError
        from hookcli.extract import build_metadata
        from hookcli.store import ArrayFeatures, write_safetensors

        if not run.inputs:
            raise ImageError("none of the input images could be read", hint="see the skipped inputs above")
        metadata = build_metadata(self.loaded, selected, self.settings, keys=list(run.tensors), calls=run.calls,
                                  omitted=run.omitted, inputs=run.inputs, skipped=run.skipped, targets=run.targets,
                                  fused=run.fused, extra=extra_metadata)
        if self.to_stdout:
            write_safetensors(run.tensors, metadata, sys.stdout.buffer)
            if keep:
                return ArrayFeatures({k: v.float().numpy() if v.dtype.is_floating_point else v.numpy()
                                      for k, v in run.tensors.items()}, metadata, name="stdout")
            return None
        write_safetensors(run.tensors, metadata, self.output, force=self.options["force"])
        click.echo(self.output)
        return None


def _note(text: str) -> None:
    click.echo(f"Note: {text}", err=True)


def _no_compile_for_gradients(job: _Job) -> None:
    if job.settings.compile:
        _note("--compile: gradients need the eager graph with hooks; running eagerly")


def _batch_reporter(advance):
    """on_batch callback: advance the progress bar, note each skipped input on stderr."""

    def report(batch) -> None:
        for _, error in batch.failures:
            click.echo(f"Skipped: {error}", err=True)
        advance(len(batch.indices) + len(batch.failures))

    return report


_LAYER_HELP = "Layer path (features.18), glob (layer3.*.conv2, features.**), type:Conv2d; PATH=NAME renames. Repeat."


# -- hookcli extract ----------------------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@_config_option
@_model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=_LAYER_HELP)
@click.option("--capture", type=click.Choice(["output", "input", "both"]), default="output", show_default=True,
              help="What to save of each layer.")
@_preprocess_options
@_rows_output_options
@click.option("--pool", type=click.Choice(["avg", "max"]),
              help="Store global pooling: [N,C,H,W] -> [N,C] over H,W; tokens [N,T,D] -> [N,D] over T.")
@click.option("--grid", "grid_dir", metavar="DIR", help="Also render feature-map PNGs into DIR (as hookcli grid).")
@click.option("--fuse/--no-fuse", default=True, show_default=True,
              help="On the CPU, run each convolution outside the hooked layers together with its BatchNorm, "
              "activation and residual add, as one kernel (equal to fp32 rounding); --no-fuse runs every module "
              "as written.")
@_run_options
@click.pass_context
def extract(ctx, **options) -> None:
    """Capture layers of a model on images and save them to safetensors.

    IMAGES are files, folders (--recursive for sub-folders) or - to read image
    paths from stdin, one per line. Rows follow input order. The written path is
    printed on stdout (with -o - the file's bytes are).

    With -o DIR/ rows stream into shards of --shard-size images plus an index,
    DIR/index.jsonl, and memory stays flat however many images there are.
    Running the same command again after an interruption continues where it
    stopped.

    \b
      hookcli extract --model vgg16_bn --layer features.18 img.jpg
      hookcli extract -m resnet50 -l 'layer3.*.conv2' -l avgpool=pooled photos/ -o feats.safetensors
      find photos -name '*.jpg' | hookcli extract -m resnet50 -l layer3 --pool avg - -o feats/
      hookcli extract --config configs/vgg16_bn-features18.toml img.jpg --grid grids/
    """
    from hookcli.extract import iter_batches

    job = _Job(ctx, options)
    selected = job.resolve_layers(options["layer"])

    def batches(start, hooks):
        return iter_batches(job.loaded, selected, job.paths, job.settings, start=start, capture_hooks=hooks,
                            on_note=_note)

    grid_dir = options["grid_dir"]
    features = job.write_rows(selected, batches, keep=bool(grid_dir))
    if grid_dir:
        from hookcli.grids import GridOptions
        from hookcli.shards import open_features

        with features if job.to_stdout else open_features(job.output) as written:
            _render_grids(written, GridOptions(), grid_dir, force=options["force"], quiet=options["quiet"],
                          echo=not job.to_stdout)


# -- hookcli grad -------------------------------------------------------------------------------


def _parse_target(job: _Job, spec: str):
    from hookcli.gradients import parse_target
    from hookcli.models import num_classes

    return parse_target(spec, job.loaded.categories, num_classes(job.loaded.module))


@main.command(context_settings=CONTEXT_SETTINGS)
@_config_option
@_model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=_LAYER_HELP)
@click.option("--target", "-t", default="top1", show_default=True, metavar="CLASS|topK",
              help="Logit to take gradients of: a class index, a class name of the weights, or each image's "
              "top prediction (topK: the K highest, one gradient each).")
@_preprocess_options
@_rows_output_options
@_run_options
@click.pass_context
def grad(ctx, **options) -> None:
    """Save layer activations and the gradient of a target logit with respect to them.

    Keys are <layer> (the activation) and <layer>@grad (d logit / d activation;
    <layer>@grad#k for each of topK); the metadata lists each image's targets
    with logit and probability. The gradient is exact also when in-place
    operations follow the layer. Inputs, outputs and options as for extract.

    \b
      hookcli grad -m resnet50 -l layer4 --target top1 img.jpg
      hookcli grad -m vgg16_bn -l features.40 --target 'golden retriever' photos/ -o grads/
    """
    from hookcli.gradients import iter_gradient_batches

    job = _Job(ctx, options, kind=".grad")
    _no_compile_for_gradients(job)
    target = _parse_target(job, options["target"])
    selected = job.resolve_layers(options["layer"])

    def batches(start, hooks):
        return iter_gradient_batches(job.loaded, selected, job.paths, job.settings, target, start=start,
                                     capture_hooks=hooks)

    job.write_rows(selected, batches, identity_extra={"target": target.describe()},
                   extra_metadata={"target": target.describe()})


# -- hookcli cam --------------------------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@_config_option
@_model_options
@click.option("--layer", "-l", metavar="PATH", help="Layer to take the map at [the last convolutional stage; "
              "ViT: the last block's ln_1].")
@click.option("--method", type=click.Choice(["gradcam", "gradcam++", "xgradcam", "layercam"]), default="gradcam",
              show_default=True)
@click.option("--target", "-t", default="top1", show_default=True, metavar="CLASS|topK",
              help="Class the map explains: an index, a class name of the weights, or topK.")
@click.option("--output", "-o", metavar="DIR", help="Folder for cams.safetensors and the overlay PNGs [<model>-cam].")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Overlay opacity.")
@click.option("--cmap", default="inferno", show_default=True, help="Heat-map colormap (any matplotlib name).")
@_preprocess_options
@_run_options
@click.pass_context
def cam(ctx, **options) -> None:
    """Class-activation maps (Grad-CAM and friends) with an overlay PNG per image.

    Writes DIR/cams.safetensors (key cam: [N, h, w] maps at the layer's
    resolution, ReLU'd, not normalised; cam#k for each of topK; targets with
    logits and probabilities in the metadata) and DIR/<index>_<name>.png: the
    map upsampled over the image the model saw, captioned with the class and
    its score. Written paths are printed.

    \b
      hookcli cam -m resnet50 img.jpg -o cams/
      hookcli cam -m vit_b_16 --method gradcam++ --target 'tabby cat' photos/ -o cams/
    """
    import torch

    from hookcli.gradients import default_cam_layer, iter_cam_batches
    from hookcli.render import check_cmap

    from hookcli.store import refuse_existing

    check_cmap(options["cmap"])
    folder = Path(options["output"] or f"{options['model']}-cam")
    refuse_existing([folder / "cams.safetensors"], force=options["force"])  # before the model loads
    # The folder is created once everything is checked; PNGs already in it are refused below.
    job = _Job(ctx, options, output=str(folder / "cams.safetensors"), check_output=False)
    _no_compile_for_gradients(job)
    target = _parse_target(job, options["target"])
    if options["layer"]:
        layer = _single_layer(job, options["layer"])
    else:
        crop = job.settings.preprocess.crop
        layer = default_cam_layer(job.loaded, torch.zeros(1, 3, crop, crop))
    names = [_cam_png_name(i, p, k, target.count) for i, p in enumerate(job.paths) for k in range(target.count)]
    refuse_existing([folder / "cams.safetensors", *(folder / n for n in names)], force=options["force"])
    folder.mkdir(parents=True, exist_ok=True)
    method = options["method"]
    overlays = _CamOverlays(job, folder, target, method, layer, options)

    def batches(start, hooks):
        for batch in iter_cam_batches(job.loaded, layer, job.paths, job.settings, target, method, start=start,
                                      capture_hooks=hooks):
            overlays.draw(batch)
            yield batch

    job.write_rows({layer: "cam"}, batches,
                   extra_metadata={"target": target.describe(), "method": method, "cam_layer": layer})
    for path in overlays.written:
        click.echo(str(path))


def _single_layer(job: _Job, selector: str) -> str:
    from hookcli.layers import resolve_layers

    chosen = resolve_layers(job.loaded.module, [selector], model_name=job.loaded.name)
    if len(chosen) != 1:
        raise click.UsageError(f"cam takes one layer, and '{selector}' matches {len(chosen)}")
    return next(iter(chosen))


def _cam_png_name(index: int, path, k: int, count: int) -> str:
    from hookcli.grids import safe_name

    return f"{index:05d}_{safe_name(Path(path).stem)}" + (f".top{k + 1}" if count > 1 else "") + ".png"


class _CamOverlays:
    """Draws each batch's maps over the images the model saw, as the batches go by."""

    def __init__(self, job: _Job, folder: Path, target, method: str, layer: str, options: dict) -> None:
        self.job, self.folder, self.target, self.method, self.layer = job, folder, target, method, layer
        self.alpha, self.cmap, self.force = options["alpha"], options["cmap"], options["force"]
        self.written: list[Path] = []

    def draw(self, batch) -> None:
        import numpy as np
        from PIL import Image

        from hookcli.images import load_rgb, model_view
        from hookcli.render import add_title, overlay
        from hookcli.store import atomic_path

        spec = self.job.settings.preprocess
        for row, index in enumerate(batch.indices):
            photo = np.asarray(model_view(load_rgb(self.job.paths[index]), resize=spec.resize, crop=spec.crop,
                                          interpolation=spec.interpolation))
            for k, chosen in enumerate(batch.targets[row]):
                heat = batch.features["cam" if self.target.count == 1 else f"cam#{k}"][row].numpy()
                label = f"{chosen['name']} ({chosen['class']})" if chosen["name"] else f"class {chosen['class']}"
                caption = [label, f"logit {chosen['logit']:.2f}",
                           f"p {chosen['probability']:.1%}", f"{self.method} at {self.layer}"]
                pixels = add_title(overlay(photo, heat, cmap=self.cmap, alpha=self.alpha), caption)
                path = self.folder / _cam_png_name(index, self.job.paths[index], k, self.target.count)
                with atomic_path(path, force=self.force) as temporary:
                    Image.fromarray(pixels).save(temporary, format="PNG", compress_level=1)
                self.written.append(path)


# -- hookcli info -------------------------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--json", "as_json", is_flag=True, help="Everything as one JSON object.")
@click.option("--no-stats", is_flag=True, help="Skip min/mean/max/zeros (reads no tensor data).")
def info(file, as_json, no_stats) -> None:
    """Show the tensors, metadata and value statistics of a safetensors file.

    Statistics (min, mean and max over finite values, share of zeros, count of
    NaN/inf) are read a row at a time. DIR is a shard folder written with
    extract -o DIR/ (or its index.jsonl); - reads a file from stdin.

    \b
      hookcli info vgg16_bn-features.18.safetensors
      hookcli extract -m resnet18 -l layer4 img.jpg -o - | hookcli info - --json
    """
    from hookcli.shards import open_features
    from hookcli.store import format_bytes
    from hookcli.summary import describe_file

    with open_features(file) as features:
        described = describe_file(features, stats=not no_stats)
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    count = len(described["tensors"])
    click.echo(f"{described['file']}  {format_bytes(described['bytes'])}  {count} tensor{'s' if count != 1 else ''}")
    header = ("key", "dtype", "shape", "size") + (() if no_stats else ("min", "mean", "max", "zeros", "nan/inf"))
    table = [header]
    for t in described["tensors"]:
        row = (t["key"], t["dtype"], json.dumps(t["shape"]).replace(" ", ""), format_bytes(t["bytes"]))
        if not no_stats:
            st = t["stats"]
            row += (*(_number(st[k]) for k in ("min", "mean", "max")),
                    "-" if st["zeros"] is None else f"{st['zeros']:.1%}", str(st["nonfinite"]))
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        click.echo("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    if described["metadata"]:
        click.echo("metadata:")
        for line in _pretty_metadata(described["metadata"]):
            click.echo(line)


def _number(value) -> str:
    return "-" if value is None else f"{value:.4g}"


_METADATA_ORDER = ("format", "producer", "model", "weights", "layers", "capture", "preprocess", "device", "versions")


def _pretty_metadata(metadata: dict) -> list[str]:
    """hookcli's keys first in a fixed order; objects one entry per line; long lists shortened (--json has all)."""
    ordered = sorted(metadata, key=lambda k: (_METADATA_ORDER.index(k) if k in _METADATA_ORDER else 99, k))
    lines = []
    for key in ordered:
        value = metadata[key]
        if isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
            lines.append(f"  {key}:")
            lines.extend(f"    {k}: {json.dumps(v)}" for k, v in value.items())
        elif isinstance(value, list):
            shown = [*value[:5], f"... {len(value) - 7} more", *value[-2:]] if len(value) > 10 else value
            lines.append(f"  {key}: ({len(value)})")
            lines.extend(f"    {item if isinstance(item, str) else json.dumps(item)}" for item in shown)
        else:
            lines.append(f"  {key}: {value if isinstance(value, str) else json.dumps(value)}")
    return lines


# -- hookcli grid -------------------------------------------------------------------------------


class _ChannelRange(click.ParamType):
    """``A:B`` (either end may be left out) or one channel ``K``, as a slice."""

    name = "A:B|K"

    def convert(self, value, param, ctx):
        if isinstance(value, slice):
            return value
        text = str(value).strip()
        try:
            if ":" not in text:
                index = int(text)
                return slice(index, index + 1 if index != -1 else None)
            start, stop = text.split(":")
            return slice(int(start) if start else None, int(stop) if stop else None)
        except ValueError:
            self.fail(f"'{value}' is not a channel range; use A:B, A:, :B or one index K", param, ctx)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--output", "-o", "out_dir", metavar="DIR", help="Folder for the PNGs [<file stem>_grids].")
@click.option("--key", "-k", "keys", multiple=True, metavar="GLOB", help="Tensors to draw (globs as for --layer). Repeat.")
@click.option("--image", "-i", "images", multiple=True, metavar="INDEX|NAME",
              help="Images (rows) to draw: row index or input file name. Repeat. [all]")
@click.option("--channels", type=_ChannelRange(), help="Channel range, e.g. 0:64, or one channel K.")
@click.option("--top", type=click.IntRange(min=1), help="Only the K channels with the highest mean activation.")
@click.option("--columns", type=click.IntRange(min=1), help="Tiles per row [about square].")
@click.option("--padding", type=click.IntRange(min=0), default=2, show_default=True, help="Pixels between tiles.")
@click.option("--cmap", default="viridis", show_default=True, help="Any matplotlib colormap (gray, viridis, magma…).")
@click.option("--scale", type=click.Choice(["channel", "grid"]), default="channel", show_default=True,
              help="Normalise each channel alone, or the whole grid with one range.")
@click.option("--min-tile", type=click.IntRange(min=1), default=32, show_default=True,
              help="Enlarge small maps (nearest neighbour) to at least this many pixels.")
@click.option("--title/--no-title", default=True, show_default=True, help="Caption strip with key, input and shape.")
@click.option("--overlay", is_flag=True,
              help="Blend the mean activation (or --channels K) over the input image instead of tiling.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Overlay opacity.")
@click.option("--overlay-cmap", default="inferno", show_default=True,
              help="Colormap of the overlay heat map (lightness should rise with value).")
@click.option("--force", "-f", is_flag=True, help="Overwrite existing PNGs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def grid(file, out_dir, keys, images, channels, top, columns, padding, cmap, scale, min_tile, title, overlay,
         alpha, overlay_cmap, force, quiet) -> None:
    """Render feature-map grids (PNG) from a safetensors file, one per tensor and image.

    [N, C, H, W] tensors become tiled channel maps, [N, T, D] ViT tokens are
    folded back to a square grid (class token dropped), [N, D] vectors become
    a strip. Written paths are printed, one per line. DIR is a shard folder
    written with extract -o DIR/ (or its index.jsonl); - reads a file from stdin.

    \b
      hookcli grid vgg16_bn-features.18.safetensors --channels 0:64 --cmap gray
      hookcli grid feats.safetensors -k 'layer3*' -i 0 --top 16 --overlay
      hookcli extract -m resnet18 -l layer2 img.jpg -o - | hookcli grid - -o grids/
    """
    from hookcli.grids import GridOptions
    from hookcli.shards import open_features

    options = GridOptions(keys=keys, images=images, channels=channels, top=top, columns=columns, padding=padding,
                          cmap=cmap, scale=scale, min_tile=min_tile, title=title, overlay=overlay, alpha=alpha,
                          overlay_cmap=overlay_cmap)
    if out_dir is None:
        out_dir = "grids" if file == "-" else f"{Path(file).name.removesuffix('.safetensors') or 'features'}_grids"
    with open_features(file) as features:
        _render_grids(features, options, out_dir, force=force, quiet=quiet, echo=True)


def _render_grids(features, options, out_dir, *, force: bool, quiet: bool, echo: bool) -> None:
    from hookcli.grids import plan_grids, write_grids

    jobs = plan_grids(features, options, out_dir, force=force)
    with _progress(len(jobs), quiet) as advance:

        def written(path: Path) -> None:
            if echo:
                click.echo(str(path))
            advance(1)

        write_grids(features, jobs, options, force=force, on_written=written,
                    on_skip=_note)


class _progress:
    """A tqdm bar on stderr, only when stderr is a terminal and not --quiet; yields an advance(n) callable."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.bar = total, quiet, None

    def __enter__(self):
        if self.quiet or not sys.stderr.isatty():
            return lambda n: None
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, unit="img", file=sys.stderr, dynamic_ncols=True)
        return self.bar.update

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.close()
