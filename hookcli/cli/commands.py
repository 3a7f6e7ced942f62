"""The commands: each parses its options, calls :mod:`hookcli.api` and prints what it reports.

:mod:`hookcli.api` is imported when a command runs (``--help`` and the
refusals made while parsing go without it), and loads the heavier layers
(numpy, Pillow, torch) when the command needs them, so ``models`` and the
refusals made while checking answer without them, and a command loads only
what it uses (``info`` and ``grid`` never load torch).
"""

from __future__ import annotations

import contextlib
import json
import sys

import click

from hookcli.cli import printing
from hookcli.cli.app import main
from hookcli.cli.declared import (
    CONTEXT_SETTINGS,
    LAYER_HELP,
    REGION,
    clip_options,
    comparing_options,
    config_option,
    declared_option,
    grid_drawing_options,
    model_options,
    preprocess_options,
    rows_output_options,
    run_option,
    run_options,
)
from hookcli.compare_options import COMPARE_OPTIONS
from hookcli.console import printable, stdout_for_data
from hookcli.errors import HookcliError
from hookcli.events import Advanced, Damaged, Note, Skipped, Started, Wrote
from hookcli.families import FAMILIES
from hookcli.grid_options import GRID_OPTIONS
from hookcli.models.specs import LISTED_SOURCES
from hookcli.options import SAVED_STATS_OPTIONS, declared
from hookcli.run.launch import detect_part

__all__ = ["cam", "compare", "extract", "grad", "grid", "info", "layers", "models", "report", "stats"]


class _Reporter:
    """Prints a run's events: written paths on stdout, notes and skipped inputs on stderr, a bar on a terminal.
    ``quiet`` (``-q``) leaves out the bar and the notes of images decoded though damaged."""

    def __init__(
        self, quiet: bool = False, *, echo_paths: bool = True, launched: bool = False, bar: bool = True
    ) -> None:
        self.quiet, self.echo_paths, self.bar = quiet, echo_paths, None
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
        elif isinstance(event, Skipped):
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


def _run(command: str, options: dict, *args) -> None:
    """Call the library's ``command`` with the parsed options; print what it reports."""
    api = _library()
    quiet, model = options.pop("quiet"), options.pop("model")
    options["output"] = options["output"] or api.DEFAULT_OUTPUT
    to_stdout = options["output"] == "-" and command != "cam"  # stdout carries the file's bytes
    part = _launched_part()
    with (
        contextlib.closing(
            _Reporter(quiet, echo_paths=not to_stdout, launched=part is not None, bar=part is None or part.index == 0)
        ) as reporter,
        stdout_for_data() if to_stdout else contextlib.nullcontext() as data,
    ):
        if data is not None:  # a model's own prints must not land among the file's bytes
            options["output"] = data
        getattr(api, command)(model, *args, progress=reporter, **options)


def _library():
    """:mod:`hookcli.api`, imported when a command runs: ``--help`` and the refusals made while parsing go without
    its imports (about 30 ms)."""
    from hookcli import api

    return api


def _launched_part():
    """The part torchrun or Slurm started this process as (processes after the first show no progress bar)."""
    try:
        return detect_part()
    except HookcliError:
        return None  # said when the run plans


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("pattern", required=False)
@click.option(
    "--source",
    type=click.Choice(LISTED_SOURCES),
    default="torchvision",
    show_default=True,
    help="Where the models come from.",
)
@click.option("--family", type=click.Choice(FAMILIES), help="Only the models of this family.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def models(pattern: str | None, source: str, family: str | None, as_json: bool) -> None:
    """List the models hookcli can load, their family and their weights.

    Every torchvision family: classification, detection (and instance
    segmentation, keypoints), segmentation, video, optical_flow and quantized
    (CPU only). Read from a cache of torchvision's model registry, models.json
    in $HOOKCLI_CACHE_DIR (default $XDG_CACHE_HOME/hookcli or
    ~/.cache/hookcli), without importing torch; it is rebuilt when
    torchvision changes.

    --source timm lists timm's architectures and their pretrained tags,
    --source open_clip OpenCLIP's; --source hf the models in the local
    Hugging Face cache. PATTERN is a glob on the name (timm's own syntax for
    timm: 'vit_*', '*dino*').

    \b
      hookcli models --family video
      hookcli models --source timm 'convnext_*'
      hookcli models --json | python -c 'import json,sys; print(len(json.load(sys.stdin)))'
    """
    rows = _library().models(family, pattern=pattern, source=source)
    if not rows:
        from hookcli.models.catalog import no_models_note  # loaded already, by hookcli.api

        click.echo(f"Note: {no_models_note(source, pattern, family)}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [("model", "family", "weights")]
    table += [(r["model"], r["family"], _weights_cell(r)) for r in rows]
    for line in printing.table_lines(table):
        click.echo(line)


def _weights_cell(row: dict) -> str:
    if not row["weights"]:
        return "none (random only)"
    if row["weights"] == [row["default"]]:
        return row["default"]
    shown = row["weights"][:6]
    more = f" +{len(row['weights']) - len(shown)} more" if len(row["weights"]) > len(shown) else ""
    return f"{' '.join(shown)}{more} (default {row['default']})"


@main.command(context_settings=CONTEXT_SETTINGS)
@model_options(weights="none")
@click.option("--input-size", type=click.IntRange(min=1), help="Side of the square dummy input [weights' crop size].")
@click.option("--frames", type=click.IntRange(1, 1024), help="Frames of the dummy clip of a video model [16].")
@click.option("--depth", type=click.IntRange(min=1), help="Only paths with at most this many components.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.option("--nl", "as_nl", is_flag=True, help="Newline-delimited JSON, one layer per line.")
def layers(model, weights, seed, input_size, frames, depth, as_json, as_nl) -> None:
    """List every layer --layer accepts, in forward order, with output shapes.

    Shapes come from one forward of the family's input, all zeros, batch 1: an
    image; for detection a list of one image; for video a clip; for optical
    flow a pair of frames. Layers the model
    never calls in eval mode come last, with calls 0. Weights do not change the
    layout, so random ones (the default here) describe it without a download.

    \b
      hookcli layers --model resnet50 --depth 2
      hookcli layers --model vgg16_bn --weights none --nl | grep BatchNorm
    """
    if as_json and as_nl:
        raise click.UsageError("--json and --nl cannot be used together")
    rows = _library().layers(model, weights=weights, seed=seed, input_size=input_size, depth=depth, frames=frames)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    elif as_nl:
        for r in rows:
            click.echo(json.dumps(r.to_dict()))
    else:
        table = [("path", "type", "output", "params", "calls")]
        for r in rows:
            shape = json.dumps(r.output).replace(" ", "") if r.output is not None else "-"
            table.append((r.path, r.type, shape, f"{r.params:,}", str(r.calls)))
        for line in printing.table_lines(table, right=(3, 4)):
            click.echo(line)


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=LAYER_HELP)
@run_option("capture")
@preprocess_options
@rows_output_options
@run_option("pool")
@run_option("grid")
@run_option("fuse")
@clip_options
@run_option("pair_with")
@run_option("flow")
@run_option("detections")
@run_options
def extract(**options) -> None:
    """Capture layers of a model on images and save them to safetensors.

    IMAGES are files, folders (--recursive for sub-folders) or - to read image
    paths from stdin, one per line. Rows follow input order. The written path is
    printed on stdout (with -o - the file's bytes are). For video models they
    are videos (files, or folders of frames), and a row is a clip; for optical
    flow a row is a pair of frames of a video.

    With -o DIR/ rows stream into shards of --shard-size images plus an index,
    DIR/index.jsonl, and memory stays flat however many images there are.
    Running the same command again after an interruption continues where it
    stopped. Any number of processes may run the same command on one folder
    (torchrun, srun, job arrays, or shells): each computes the shards it
    claims.

    \b
      hookcli extract --model vgg16_bn --layer features.18 img.jpg
      hookcli extract -m resnet50 -l 'layer3.*.conv2' -l avgpool=pooled photos/ -o feats.safetensors
      find photos -name '*.jpg' | hookcli extract -m resnet50 -l layer3 --pool avg - -o feats/
      hookcli extract --config configs/vgg16_bn-features18.toml img.jpg --grid grids/
      hookcli extract -m r3d_18 -l layer3 --clip-length 16 --clips-per-video 4 walk.mp4
      hookcli extract -m fasterrcnn_resnet50_fpn -l backbone.body.layer3 --detections street.jpg
      torchrun --nproc-per-node 8 -m hookcli extract -m resnet50 -l avgpool data-{00..99}.tar -o feats/
    """
    _run("extract", options, options.pop("layer"), options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=LAYER_HELP)
@run_option("target", "grad")
@preprocess_options
@rows_output_options
@clip_options
@REGION
@run_options
def grad(**options) -> None:
    """Save layer activations and the gradient of a target logit with respect to them.

    Keys are <layer> (the activation) and <layer>@grad (d logit / d activation;
    <layer>@grad#k for each of topK); the metadata lists each image's targets
    with logit and probability. The gradient is exact also when in-place
    operations follow the layer. Inputs, outputs and options as for extract.

    \b
      hookcli grad -m resnet50 -l layer4 --target top1 img.jpg
      hookcli grad -m vgg16_bn -l features.40 --target 'golden retriever' photos/ -o grads/
    """
    _run("grad", options, options.pop("layer"), options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option(
    "--layer",
    "-l",
    metavar="PATH",
    help="Layer to take the map at [the last convolutional stage; ViT: the last block's ln_1].",
)
@run_option("method")
@run_option("target", "cam")
@click.option("--output", "-o", metavar="DIR", help="Folder for cams.safetensors and the overlay PNGs [<model>-cam].")
@run_option("alpha")
@run_option("cmap")
@REGION
@preprocess_options
@run_options(stored="the maps are stored as float32")
def cam(**options) -> None:
    """Class-activation maps (Grad-CAM and friends) with an overlay PNG per image.

    Writes DIR/cams.safetensors (key cam: [N, h, w] maps at the layer's
    resolution, ReLU'd, not normalised; cam#k for each of topK; targets with
    logits and probabilities in the metadata) and DIR/<index>_<name>.png: the
    map upsampled over the image the model saw, captioned with the class and
    its score. Written paths are printed. Detection models: the map of a
    detection's score, drawn with its box; segmentation models: of a class's
    mask (or of the class over --region).

    \b
      hookcli cam -m resnet50 img.jpg -o cams/
      hookcli cam -m vit_b_16 --method gradcam++ --target 'tabby cat' photos/ -o cams/
      hookcli cam -m fasterrcnn_resnet50_fpn --target top3 street.jpg -o cams/
      hookcli cam -m deeplabv3_resnet50 --target person --region 0,0,0.5,1 group.jpg -o cams/
    """
    _run("cam", options, options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options(required=False)
@click.option("--layer", "-l", multiple=True, metavar="SELECTOR", help=LAYER_HELP)
@declared_option(declared("keys", GRID_OPTIONS), command="stats")
@run_option("top")
@run_option("top_by")
@run_option("quantiles")
@run_option("pca")
@preprocess_options
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="Statistics file [<model>-<layer>.stats.safetensors; of saved features, <their name>.stats.safetensors].",
)
@run_option("shard_size", "stats")
@run_option("part")
@run_option("fuse")
@clip_options
@run_option("pair_with")
@run_options(stored="statistics are gathered in float64 from float32 values")
def stats(**options) -> None:
    """Statistics of each channel of layers over every input, in one pass: dataset examples, quantiles, PCA.

    With --model and --layer, the model runs over IMAGES (as for extract) and
    nothing but the statistics is kept; without --model, IMAGES is one source
    of saved features (a file, a shard folder or -), its tensors chosen with
    -k. For each layer key K of C channels the file holds K@count, K@mean,
    K@std, K@min, K@max and K@zeros (the share of exact zeros) over every
    value of each channel; K@quantiles at --quantiles; each channel's --top
    inputs with the highest maximum (or --top-by mean) of its map, with
    where the maximum is and the map itself (K@top_values, K@top_rows into
    the inputs, K@top_at, K@top_maps); and, unless --no-pca, the covariance
    of the channels pooled over positions and its principal components
    (K@cov, K@pca_values, K@pca_vectors). Memory does not grow with the
    number of inputs. Each shard's statistics are kept in FILE.parts/ until
    the last is done, so a run killed part-way continues where it stopped,
    and any number of processes may share one run (torchrun, Slurm, --part):
    they write the same file as one process. grid, report and info read it.

    \b
      hookcli stats -m resnet50 -l layer3 -l layer4 photos/ -o stats.safetensors
      hookcli stats -m vit_b_16 -l encoder.layers.encoder_layer_11 --top 16 --quantiles 0.5,0.995 photos/
      hookcli stats feats/ -k layer3 -o layer3.stats.safetensors
      torchrun --nproc-per-node 4 -m hookcli stats -m resnet50 -l layer4 --shard-size 2048 data.tar -o s.safetensors
    """
    images = options.pop("images")
    if options["model"] is not None:
        if not options["layer"]:
            raise click.UsageError("--layer is needed with --model (repeat it for more layers)")
        if options["keys"]:
            raise click.UsageError("-k chooses tensors of saved features; with --model choose layers with --layer")
        options.pop("keys")
        _run("stats", options, options.pop("layer"), images)
        return
    given = _given_options(click.get_current_context())
    asked = [name for name in given if name not in (*SAVED_STATS_OPTIONS, "keys", "output", "quiet", "images")]
    if asked:
        raise click.UsageError(
            f"--{asked[0].replace('_', '-')} applies when --model runs a model; saved features are already computed"
        )
    if len(images) != 1:
        raise click.UsageError(f"give one source of saved features (a file, a folder or -), not {len(images)}")
    quiet, api = options.pop("quiet"), _library()
    chosen = {name: options[name] for name in given if name in (*SAVED_STATS_OPTIONS, "keys")}
    with contextlib.closing(_Reporter(quiet)) as reporter:
        api.stats(features=images[0], output=options["output"] or api.DEFAULT_OUTPUT, progress=reporter, **chosen)


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options(required=False)
@click.option("--layer", "-l", multiple=True, metavar="SELECTOR", help=LAYER_HELP)
@click.option(
    "--model2", metavar="NAME", help="A second model, run over the same images in one pass [the first model]."
)
@click.option(
    "--layer2", "layers2", multiple=True, metavar="SELECTOR", help="The second side's layers (as --layer) [--layer]."
)
@declared_option(declared("keys", GRID_OPTIONS), command="compare")
@click.option(
    "--key2",
    "keys2",
    multiple=True,
    metavar="GLOB",
    help="Saved features: the tensors of the second side (of the second source, or of the one) [as -k].",
)
@click.option(
    "--merge",
    is_flag=True,
    help="IMAGES are linear-cka comparison files over disjoint inputs: merge them into one, as if one run had seen "
    "them all.",
)
@comparing_options
@preprocess_options
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="Comparison file [<model>-<layer>.compare.safetensors; of saved features, <their name>.compare.safetensors].",
)
@run_option("shard_size", "compare")
@run_option("part")
@run_option("fuse")
@clip_options
@run_option("pair_with")
@run_options(stored="similarities are computed in float64")
def compare(**options) -> None:
    """How alike layers and models are: CKA or RSA of every pair of representations.

    With --model and --layer, the model runs over IMAGES (as for extract);
    its layers are compared with themselves, or with --layer2 of --model2,
    run over the same images in one pass. Without --model, IMAGES is one or
    two sources of saved features (files, shard folders, -), the same rows in
    the same order, their tensors chosen with -k and --key2. The file holds
    the matrix under the method's name, float64 [rows, columns], the labels
    in its rows and columns metadata. --method linear-cka (exact, from running
    sums; its sums are kept so that files over disjoint inputs merge),
    minibatch-cka (the unbiased estimator over the run's batches; maps whole
    by default) or rsa (RDMs of the first --rsa-rows inputs, compared by rank
    correlation). A representation with no spread has no CKA: its entries are
    NaN, and a note names it. Resumable and shared by many processes as stats
    is. --merge joins linear-cka files made over disjoint inputs.

    \b
      hookcli compare -m resnet18 -l 'layer*' photos/ -o cka.safetensors
      hookcli compare -m resnet18 -l layer4 --model2 resnet50 --layer2 'layer*' photos/ -o r18-r50.safetensors
      hookcli compare feats/ -k 'layer*' --method rsa --rsa-rows 500 -o rsa.safetensors
      hookcli compare a/ b/ -k layer4 --key2 'blocks.*' -o ab.safetensors
      hookcli compare --merge part1.safetensors part2.safetensors -o all.safetensors
    """
    images = options.pop("images")
    if options.pop("merge"):
        given = _given_options(click.get_current_context())
        asked = [name for name in given if name not in ("merge", "output", "force", "quiet", "images")]
        if asked:
            raise click.UsageError(f"--merge takes comparison files, -o and --force alone, not --{asked[0]}")
        api = _library()
        with contextlib.closing(_Reporter(options["quiet"])) as reporter:
            api.compare(merge=list(images), output=options["output"] or "merged.compare.safetensors",
                        force=options["force"], progress=reporter)  # fmt: skip
        return
    if options["model"] is not None:
        if not options["layer"]:
            raise click.UsageError("--layer is needed with --model (repeat it for more layers)")
        if options["keys"] or options["keys2"]:
            raise click.UsageError("-k and --key2 choose tensors of saved features; with --model give --layer2")
        options.pop("keys"), options.pop("keys2")
        options["layers2"] = options["layers2"] or None
        _run("compare", options, options.pop("layer"), images)
        return
    given = _given_options(click.get_current_context())
    saved = (*SAVED_STATS_OPTIONS, *(option.name for option in COMPARE_OPTIONS), "keys", "keys2", "output")
    asked = [name for name in given if name not in (*saved, "quiet", "images")]
    if asked:
        raise click.UsageError(
            f"--{asked[0].replace('_', '-')} applies when --model runs a model; saved features are already computed"
        )
    if not 1 <= len(images) <= 2:
        raise click.UsageError(f"give one or two sources of saved features (files, folders or -), not {len(images)}")
    chosen = {name: options[name] for name in given if name in saved and name not in ("output", "quiet")}
    api = _library()
    with contextlib.closing(_Reporter(options["quiet"])) as reporter:
        api.compare(
            features=images[0],
            features2=images[1] if len(images) == 2 else None,
            output=options["output"] or api.DEFAULT_OUTPUT,
            progress=reporter,
            **chosen,
        )


def _given_options(ctx: click.Context) -> list[str]:
    """The options given on the command line or in a preset, not left at their defaults."""
    return [
        name for name in ctx.params if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    ]


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--json", "as_json", is_flag=True, help="Everything as one JSON object.")
@click.option(
    "--no-stats",
    is_flag=True,
    help="Skip min/mean/max/zeros (reads no tensor data; of a statistics file, only what its checks read).",
)
def info(file, as_json, no_stats) -> None:
    """Show the tensors, metadata and value statistics of a safetensors file.

    Statistics (min, mean and max over finite values, share of zeros, count of
    NaN/inf) are read a row at a time. A statistics file (hookcli stats) is
    checked, then shown by its layers: layout, channels, positions, values a
    channel and examples kept, and a summary of each layer's channels (lowest,
    mean and highest value, share of zeros, channels zero everywhere, principal
    components that explain 90% of the variance). DIR is a shard folder written with
    extract -o DIR/ (or its index.jsonl); - reads a file from stdin. Control
    characters in names and metadata are shown escaped (\\x1b, \\n). --json is
    strict JSON: NaN and ±inf (in metadata) are the strings "NaN", "Infinity"
    and "-Infinity".

    \b
      hookcli info vgg16_bn-features.18.safetensors
      hookcli extract -m resnet18 -l layer4 img.jpg -o - | hookcli info - --json
    """
    described = _library().info(file, stats=not no_stats, progress=_Reporter(quiet=True))
    if as_json:
        click.echo(printing.info_json(described))
        return
    for line in printing.info_lines(described, stats=not no_stats):
        click.echo(line)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--output", "-o", metavar="DIR", help="Folder for the PNGs [<file stem>_grids].")
@grid_drawing_options
@click.option("--force", "-f", is_flag=True, help="Overwrite existing PNGs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def grid(file, output, quiet, **options) -> None:
    """Render feature-map grids (PNG) from a safetensors file, one per tensor and image.

    [N, C, H, W] tensors become tiled channel maps, each numbered with its
    channel, [N, T, D] ViT tokens are folded back to a square grid (class
    token dropped), [N, D] vectors and [N, C, 1, 1] pooled channels become a
    strip of values. [N, C, T, H, W] video clips become a table, a row per
    channel and a column per frame (--frame T: that frame's channel maps).
    In a file of the optical_flow family, [N, 2, H, W] flow fields are drawn
    in colour: the hue is the direction, white to full colour the length,
    with a colour wheel. Rows of their own sizes (detection, segmentation)
    are each drawn at their own size, and a detection file's final
    detections (extract --detections) as one picture an image: the boxes
    over the photo, each with its class index and score. A colour bar
    states the scale. Layers wider than 64 channels draw their first 64
    unless --channels or --top says otherwise. A statistics file (hookcli
    stats) gives a picture a layer and channel: its dataset examples, each
    input's photo as the model saw it with the channel's map over it and the
    map's largest value ringed.
    Written paths are printed, one per line. DIR is a shard folder
    written with extract -o DIR/ (or its index.jsonl); - reads a file from stdin.

    \b
      hookcli grid vgg16_bn-features.18.safetensors --channels 0:64 --cmap gray
      hookcli grid feats.safetensors -k 'layer3*' -i 0 --top 16 --overlay
      hookcli grid clips.safetensors -k layer2 --frame 3 --channels 0:16
      hookcli extract -m resnet18 -l layer2 img.jpg -o - | hookcli grid - -o grids/
    """
    with contextlib.closing(_Reporter(quiet)) as reporter:
        api = _library()
        api.grid(file, output=output or api.DEFAULT_OUTPUT, progress=reporter, **options)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--output", "-o", metavar="DIR", help="Folder for the pages [<file stem>_report].")
@click.option(
    "--page-size",
    type=click.IntRange(min=1),
    help="Images (rows) per page. [20] Of a statistics file: channels per page. [64]",
)
@grid_drawing_options
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing report.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def report(file, output, page_size, quiet, **options) -> None:
    """Write a static HTML report: each image's pictures, statistics and targets, and the file's metadata.

    One page per --page-size images: DIR/index.html (with a summary of the
    file), then DIR/page-00002.html, … linked to each other. Pages stand
    alone (pictures embedded, nothing fetched) and open from file://. The
    path of index.html is printed. The options below are grid's; --image
    also takes a range A:B of row indices. A detection file's final
    detections are listed for each image (class index, score, box) beside
    their picture. A statistics file (hookcli stats) gives a page of each
    layer's channels at a time: a sortable table of them, its principal
    components, and each channel's quantiles and dataset examples.

    \b
      hookcli report feats.safetensors -o report/
      hookcli report feats/ -k layer3 -i 0:100 --top 16 --page-size 10
      hookcli cam -m resnet50 img.jpg -o cams/ && hookcli report cams/cams.safetensors
    """
    with contextlib.closing(_Reporter(quiet)) as reporter:
        api = _library()
        api.report(file, output=output or api.DEFAULT_OUTPUT, page_size=page_size, progress=reporter, **options)
